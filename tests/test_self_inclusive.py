"""Issue 30 item 4: nested calls. A generated run whose calls wrap others (a model's `__call__`
around its LSTM around the trace's matmuls): self energies add up to the program's energy in
calls, inclusive is never below self, and the "self % of program" column with the program
outside calls makes 100 % on every surface (JSON, CSV, HTML, the terminal table)."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
from report_helpers import TableParser, build_run
from rich.console import Console
from stored_events import events_table, plain_calls

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.build import build_report
from fecomlite.report.render import render_page
from fecomlite.report.summary import summary_csv, summary_table
from fecomlite.store import Store

OUTER = ("net.py:40:8", "torch.nn.Module.__call__", "model", "out = model(x)")
INNER = ("net.py:12:12", "torch.nn.LSTM.__call__", "self.lstm", "h = self.lstm(x)")


def nest_calls(store: Store, run_id: int) -> None:
    """Per repetition, an outer call around the first two thirds of the calls and an inner
    one around the first third, on the calls' own thread (nesting is per thread)."""
    manifest = {key: {"file": key.split(":")[0], "line": int(key.split(":")[1]),
                      "col": int(key.split(":")[2]), "api": api, "written": written,
                      "kind": "method", "function": "main", "source": source}
                for key, api, written, source in (OUTER, INNER)}
    ids = store.site_ids(run_id, [OUTER[0], INNER[0]], manifest)
    for rep in sorted({r["rep"] for r in store.repetitions(run_id)}):
        spans = events_table(store).db.execute(
            "SELECT t_start_ns, t_end_ns FROM events WHERE run_id=? AND rep=? ORDER BY "
            "t_start_ns", (run_id, rep)).fetchall()
        third = len(spans) // 3
        store.add_events(run_id, rep, 1234, plain_calls(
            [ids[OUTER[0]], ids[INNER[0]]],
            [spans[0][0] - 1000, spans[0][0] - 500],
            [spans[2 * third - 1][1] + 1000, spans[third - 1][1] + 500]))


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("nested") / "store.sqlite"
    with Store(path) as store:
        run_id = build_run(store, reps=2)
        nest_calls(store, run_id)
        a = analyse_run(store, run_id)
        report = build_report(store, run_id, analysis=a)
    return a, report


def test_self_adds_up_to_the_energy_in_calls_and_inclusive_is_never_below_it(nested) -> None:
    a, _ = nested
    assert a.calls["depth"].max() == 2  # the trace's calls sit two levels deep
    for d in a.domains:
        key = d["domain"]
        scale = 1.0 + abs(d["program_J"])
        own = sum(r["energy"][key]["raw_self_J"] for r in a.apis)
        assert own == pytest.approx(d["in_calls_J"], abs=1e-6 * scale)
        for r in a.apis:
            e = r["energy"][key]
            assert e["raw_above_idle_J"] >= e["raw_self_J"] - 1e-9 * scale, (r["api"], e)
        outer = next(r for r in a.apis if r["api"] == OUTER[1])["energy"][key]
        inner = next(r for r in a.apis if r["api"] == INNER[1])["energy"][key]
        assert outer["raw_above_idle_J"] >= inner["raw_above_idle_J"] > inner["raw_self_J"]


def test_self_percentages_make_100_and_inclusive_ones_do_not(nested) -> None:
    a, report = nested
    for d in a.domains:
        key = d["domain"]
        shares = [r["energy"][key]["share"] for r in report.json["apis"]]
        total = sum(s for s in shares if s is not None) + d["outside_calls_share"]
        assert total == pytest.approx(1.0, abs=1e-6)
        inclusive = sum(r["energy"][key]["inclusive_share"] or 0.0 for r in report.json["apis"])
        assert inclusive > 1.0 + 0.1 * d["in_calls_J"] / d["program_J"] - 1e-9
    # the CSV holds both shares, named
    rows = list(csv.DictReader(io.StringIO(report.csv["apis"])))
    for d in a.domains:
        assert sum(float(r[f"{d['domain']} share"] or 0) for r in rows) + d[
            "outside_calls_share"] == pytest.approx(1.0, abs=1e-6)
        assert f"{d['domain']} inclusive_share" in rows[0]


def test_every_table_names_self_and_inclusive(nested) -> None:
    a, report = nested
    html = render_page("report.html.j2", report.context, report.charts)
    parser = TableParser()
    parser.feed(html)
    table = parser.tables["apis-table"]
    for d in a.domains:
        assert {f"{d['domain']}:self", f"{d['domain']}:above", f"{d['domain']}:share"} <= set(
            table["columns"])
    assert ">self<" in html and ">inclusive<" in html and ">self % of program<" in html
    # the footer row closes the self column: the program outside calls, shown as a figure
    assert "(program outside calls)" in html.split("<tfoot>")[1].split("</tfoot>")[0]
    assert "Top APIs by self energy" in html
    header = summary_csv(a).splitlines()[0].split(",")
    for d in a.domains:
        assert {f"{d['domain']}_self_J", f"{d['domain']}_inclusive_J",
                f"{d['domain']}_self_share"} <= set(header)
    console = Console(record=True, width=300)
    console.print(summary_table(a, top=100))
    text = console.export_text()
    assert text.count("self / inclusive") == len(a.domains)
    assert math.isfinite(np.sum([d["outside_calls_share"] for d in a.domains]))
