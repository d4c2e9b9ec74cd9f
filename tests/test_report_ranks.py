"""The report's ranks section shows each rank's energy (its top-level calls) and each API's
energy per rank in the HTML, as report.json holds it."""

from __future__ import annotations

import pytest
from test_distributed_devices import GPUS, _store

from fecomlite.analysis import units
from fecomlite.report.build import build_report
from fecomlite.report.render import render_page


def test_the_ranks_table_shows_energy_per_rank(tmp_path):
    store, run_id = _store(tmp_path / "two.sqlite", GPUS)
    report = build_report(store, run_id)
    store.close()
    ranks = report.context["ranks"]
    per_rank = ranks["energy_by_rank_J"]
    domains = {d["domain"]: d for d in report.analysis.domains}
    assert set(per_rank) == {"0", "1"}
    for rank in ("0", "1"):  # each rank's GPU energy is its own calls' (docs/distributed.md)
        assert per_rank[rank] == pytest.approx(domains[f"gpu:{rank}"]["in_calls_J"], rel=1e-6)
    html = render_page("report.html.j2", report.context, report.charts)
    table = html.split('id="rank-table"', 1)[1].split("</table>", 1)[0]
    for r in ranks["ranks"]:
        assert f'data-energy="{r["rank"]}">{r["energy"]}<' in table
    apis = html.split('id="rank-apis"', 1)[1].split("</table>", 1)[0]
    assert "energy rank 0" in apis and "energy rank 1" in apis
    row = next(a for a in report.analysis.apis if a["api"] == ranks["apis"][0]["api"])
    expected = [units.scaled(sum(split.get(n, 0.0) for split in row["energy_by_rank"].values()),
                             "J") for n in ranks["names"]]  # gpu:0 and gpu:1 both add up
    assert ranks["apis"][0]["energy"] == expected
    assert "".join(f'<td class="num">{e}</td>' for e in expected) in apis


def test_perfetto_names_each_process_with_its_rank(tmp_path):
    from fecomlite.export.perfetto import trace

    store, run_id = _store(tmp_path / "two.sqlite", GPUS)
    names = {e["pid"]: e["args"]["name"] for e in trace(store, run_id)["traceEvents"]
             if e.get("name") == "process_name" and e["pid"] != 0}
    store.close()
    assert names == {pid: f"program (rank {rank}, rep 1, pid {pid})"
                     for rank, (_, pid) in GPUS.items()}
