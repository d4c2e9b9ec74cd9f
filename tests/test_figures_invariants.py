"""Issue 13's invariants over generated runs: the figures add up the way the analysis says, no
share is ever added into a total, no intensity exceeds its ceiling, and every surface (JSON,
CSV, the top-APIs chart) shows the same numbers."""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_helpers import CPU_IDLE_W, build_run
from rich.console import Console

from fecomlite.analysis.noise_floor import BEYOND_NOISE, NOISE_SIGMAS, WITHIN_NOISE
from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.build import build_report
from fecomlite.report.render import render_page
from fecomlite.report.summary import summary_csv, summary_table
from fecomlite.store import Store

SHARE_MAX_W, SHARE_IDLE_W = 10.0, 3.0


def add_process_share(store: Store, run_id: int, scale: float) -> None:
    """A cpu-process share sensor (model process-cpu-share) from the package estimate: the
    program's part of the package above idle, counted from 0 W."""
    sensor = store.add_sensor(run_id, name="est:cpu-process", domain="cpu-process", unit="W",
                              kind="power", provenance="estimated", model="process-cpu-share",
                              period_s=0.1)
    package = store.db.execute("SELECT id FROM sensors WHERE run_id=? AND name=?",
                               (run_id, "est:cpu-package")).fetchone()[0]
    rows = store.db.execute("SELECT t_ns, value FROM samples WHERE sensor_id=?",
                            (package,)).fetchall()
    idle = min(v for _, v in rows)
    store.add_samples([(sensor, t, scale * max(v - idle, 0.0)) for t, v in rows])
    details = {"est:cpu-process": {"model_params": {"max_w": SHARE_MAX_W,
                                                    "idle_w": SHARE_IDLE_W}}}
    store.put_result(run_id, "sensors", details)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reps=st.integers(1, 3), energy_scale=st.floats(0.5, 2.0),
       share_scale=st.floats(0.2, 3.0), method=st.sampled_from(["auto", "overlap", "intensity"]))
def test_the_figures_add_up_on_every_surface(
    tmp_path_factory: pytest.TempPathFactory, reps: int, energy_scale: float,
    share_scale: float, method: str,
) -> None:
    path = tmp_path_factory.mktemp("inv") / "store.sqlite"
    with Store(path) as store:
        run_id = build_run(store, reps=reps, energy_scale=energy_scale)
        add_process_share(store, run_id, share_scale)
        a = analyse_run(store, run_id, method)
        report = build_report(store, run_id, method, analysis=a)
    by_name = {d["domain"]: d for d in a.domains}
    assert by_name["cpu-process"]["role"] == "share" and not by_name["cpu-process"]["addable"]
    for d in a.domains:
        scale = 1.0 + abs(d["above_idle_J"]) + abs(d["program_J"])
        # Σ per-API self energy + the program outside calls = the program's above-idle energy
        # (the raw estimates: a shown figure is floored at zero, noise_floor)
        own = sum(r["energy"][d["domain"]]["raw_self_J"] for r in a.apis)
        assert own + d["outside_calls_J"] == pytest.approx(d["program_J"], abs=1e-6 * scale)
        assert d["program_J"] + d["tail_J"] + d["other_J"] == pytest.approx(
            d["above_idle_J"], abs=1e-6 * scale)
        rec = a.intensities[d["domain"]]
        ceiling = rec.get("ceiling_W")
        if ceiling is not None and math.isfinite(ceiling):
            assert all(v["intensity_W"] <= ceiling + 1e-9 for v in rec["apis"].values())
    # no share in a total: "all domains" is the disjoint domains' sum, never cpu-process
    for r in a.apis:
        assert r["all_domains"]["domains"] == ["cpu-package", "gpu:0"]
        assert r["all_domains"]["raw_above_idle_J"] == pytest.approx(
            r["energy"]["cpu-package"]["raw_above_idle_J"]
            + r["energy"]["gpu:0"]["raw_above_idle_J"])
    # the chart stacks disjoint domains only, and its bars are the JSON's self energies
    bars = report.charts["bars"]
    assert {s["key"] for s in bars["series"]} == {"cpu-package", "gpu:0"}
    json_rows = {r["api"]: r for r in report.json["apis"]}
    for item in bars["items"]:
        if item["label"] in json_rows:
            for k, v in item["values"].items():
                assert v == pytest.approx(json_rows[item["label"]]["energy"][k]["self_J"])
    # CSV and JSON agree number for number
    rows = list(csv.DictReader(io.StringIO(report.csv["apis"])))
    assert [r["api"] for r in rows] == [r["api"] for r in report.json["apis"]]
    for row, j in zip(rows, report.json["apis"], strict=True):
        for d in a.domains:
            for col in ("above_idle_J", "self_J", "share"):
                value = j["energy"][d["domain"]][col]
                text = row[f"{d['domain']} {col}"]
                assert (text == "" if value is None else float(text) == pytest.approx(value))
        assert float(row["all_domains_above_idle_J"]) == pytest.approx(
            j["all_domains"]["above_idle_J"])
    assert np.isfinite([d["program_J"] for d in a.domains]).all()


def test_a_share_above_its_whole_is_explained(tmp_path: Path) -> None:
    # the case: cpu-process above idle (15.3 J) over the package's (10.3 J), unexplained
    with Store(tmp_path / "store.sqlite") as store:
        run_id = build_run(store, reps=2)
        add_process_share(store, run_id, 5.0)
        a = analyse_run(store, run_id)
    by_name = {d["domain"]: d for d in a.domains}
    assert by_name["cpu-process"]["program_J"] > by_name["cpu-package"]["program_J"]
    assert any("exceeds the whole above idle" in n for n in a.notes)


def raise_cpu_baseline(store: Store, run_id: int, offset_w: float, sigma_w: float) -> None:
    """A busy VM's idle baseline: `offset_w` above the machine's real idle level, with a spread
    of `sigma_w`, so per-API above-idle estimates can fall below zero, by noise or beyond it."""
    store.update_run(run_id, idle={"nvml:0:energy": 124.0,
                                   "est:cpu-package": CPU_IDLE_W + offset_w})
    baseline = store.result(run_id, "idle_baseline")
    baseline["sensors"]["est:cpu-package"]["std_w"] = sigma_w
    store.put_result(run_id, "idle_baseline", baseline)


ENERGY_TEXT = re.compile(r"[-−]\s?\d[\d.,]*\s?(?:µJ|mJ|kJ|MJ|J)\b")
SHOWN = ("above_idle_J", "self_J", "rep_mean_J", "share")


def shown_figures(entry: dict) -> list[float]:
    """Every figure of a per-API energy entry that a surface shows (raw_* are not shown)."""
    per_call = entry["per_call"]
    values = [entry[k] for k in SHOWN] + [per_call[k] for k in ("sum", "mean", "median")]
    return [v for v in [*values, *entry["per_rep_J"]] if v is not None]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset_w=st.floats(0.0, 45.0), sigma_w=st.floats(0.05, 80.0),
       method=st.sampled_from(["auto", "overlap", "intensity"]))
def test_no_surface_shows_negative_energy(
    tmp_path_factory: pytest.TempPathFactory, offset_w: float, sigma_w: float, method: str,
) -> None:
    path = tmp_path_factory.mktemp("neg") / "store.sqlite"
    with Store(path) as store:
        run_id = build_run(store, reps=2)
        raise_cpu_baseline(store, run_id, offset_w, sigma_w)
        a = analyse_run(store, run_id, method)
        report = build_report(store, run_id, method, analysis=a)
    package = next(d for d in a.domains if d["domain"] == "cpu-package")
    for row in report.json["apis"] + report.json["sites"]:
        for domain, e in row["energy"].items():
            assert all(v >= 0 for v in shown_figures(e)), (domain, e)
            raw, sigma, state = e["raw_above_idle_J"], e["uncertainty_J"], e["below_zero"]
            if raw < -NOISE_SIGMAS * sigma:  # beyond noise: not shown, its domain says why
                assert state == BEYOND_NOISE and e["above_idle_J"] is None
            elif raw < 0:  # within noise: zero, the raw estimate kept apart
                assert state in (WITHIN_NOISE, BEYOND_NOISE) and e["above_idle_J"] in (0.0, None)
            else:
                assert e["above_idle_J"] == pytest.approx(raw)
        assert (row["all_domains"]["above_idle_J"] or 0.0) >= 0
    # a domain with a figure below zero beyond noise is unreliable, and says why in words
    beyond = any(r["energy"]["cpu-package"]["below_zero"] == BEYOND_NOISE
                 for r in a.apis + a.sites)
    assert beyond == any("below the idle baseline" in why for why in package["unreliable"])
    if beyond:
        assert not package["reliable"]
    # CSV (report and CLI), the CLI table and the HTML page show no negative energy
    for text in (*report.csv.values(), summary_csv(a)):
        for row in csv.DictReader(io.StringIO(text)):
            for col, value in row.items():
                if value and col.endswith(("above_idle_J", " self_J", "rep_mean_J", " share",
                                           "per_call_mean_J", "per_call_median_J")):
                    assert float(value) >= 0, (col, value)
    console = Console(record=True, width=400)
    console.print(summary_table(a, top=100))
    cli = console.export_text()
    assert not ENERGY_TEXT.search(cli), cli
    if any(e["below_zero"] and e["above_idle_J"] == 0 for r in a.apis
           for e in r["energy"].values()):
        assert "≈ 0 (noise ±" in cli
    html = render_page("report.html.j2", report.context, report.charts)
    visible = re.sub(r"<script.*?</script>", "", html, flags=re.S)
    assert not ENERGY_TEXT.search(visible), ENERGY_TEXT.search(visible)
