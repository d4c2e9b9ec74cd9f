"""Issue 30 item 3: bounds in every mode. No API is given more power than its domain's ceiling,
in a quick run or a careful one, whatever the sensor read (an estimate can read above its own
model maximum) and whatever intensities the fit gave; a quick run says so on every surface, and
its ± rest on the idle σ its few readings allow, not on the σ they happened to show."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from report_helpers import build_run
from rich.console import Console
from test_figures_invariants import SHARE_IDLE_W, SHARE_MAX_W, add_process_share

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.analysis.run_mode import idle_sigma_bound
from fecomlite.report.build import build_report
from fecomlite.report.render import render_page
from fecomlite.report.summary import summary_csv, summary_json, summary_table
from fecomlite.store import Store

QUICK_SETTINGS = {"repeat": 1, "idle_s": 1.0, "gate": False, "tail_s": 0.5}
CEILING_W = SHARE_MAX_W - SHARE_IDLE_W


def analysed(tmp_path, reps: int, quick: bool, method: str):
    with Store(tmp_path / f"{reps}-{quick}-{method}.sqlite") as store:
        run_id = build_run(store, reps=reps)
        add_process_share(store, run_id, 3.0)  # reads up to 3 × 24 W: far above its 7 W ceiling
        if quick:
            store.update_run(run_id, settings={**store.run(run_id)["settings"], **QUICK_SETTINGS})
        a = analyse_run(store, run_id, method)
        return a, build_report(store, run_id, method, analysis=a)


@pytest.mark.parametrize("reps, quick", [(1, True), (3, False)])
@pytest.mark.parametrize("method", ["overlap", "intensity"])
def test_no_api_draws_more_than_its_domains_ceiling(tmp_path, reps, quick, method) -> None:
    a, _ = analysed(tmp_path, reps, quick, method)
    process = next(d for d in a.domains if d["domain"] == "cpu-process")
    assert process["ceiling_W"] == pytest.approx(CEILING_W)
    # the intensity table's cut is the same ceiling
    assert a.intensities["cpu-process"].get("ceiling_W", CEILING_W) == pytest.approx(CEILING_W)
    assert process["program_J"] / process["program_s"] > CEILING_W  # the sensor read above it
    for row in a.apis + a.sites:
        e = row["energy"]["cpu-process"]
        assert e["raw_above_idle_J"] <= CEILING_W * row["total_time_s"] * (1 + 1e-9), row
    per_call = a.calls["energy_J"]["cpu-process"] / a.calls["duration_s"].clip(1e-12)
    assert per_call.max() <= CEILING_W * (1 + 1e-9)
    # what no call could take at the ceiling is the program's outside calls, and still adds up
    own = sum(r["energy"]["cpu-process"]["raw_self_J"] for r in a.apis)
    assert own + process["outside_calls_J"] == pytest.approx(process["program_J"], rel=1e-9)


def test_a_quick_run_says_so_on_every_surface(tmp_path) -> None:
    a, report = analysed(tmp_path, 1, True, "auto")
    assert a.mode["mode"] == "quick" and "one repetition" in a.mode["text"]
    assert report.json["mode"]["mode"] == "quick"
    for text in (*report.csv.values(), summary_csv(a)):
        assert {r["run_mode"] for r in csv.DictReader(io.StringIO(text))} == {"quick"}
    assert json.loads(summary_json(a))["mode"]["mode"] == "quick"
    html = render_page("report.html.j2", report.context, report.charts)
    assert 'id="quick-badge">quick run<' in html and "quick run, rough figures" in html
    console = Console(record=True, width=300)
    console.print(summary_table(a))
    assert "quick run" in console.export_text()
    careful, report = analysed(tmp_path, 3, False, "auto")
    assert careful.mode["mode"] == "careful" and "quick run" not in render_page(
        "report.html.j2", report.context, report.charts)


def test_the_idle_sigma_is_no_tighter_than_its_readings_allow(tmp_path) -> None:
    # a few readings' σ may be far too small: its 95 % bound, widest for the fewest readings
    bounds = [idle_sigma_bound(1.0, n) for n in (5, 10, 30, 300)]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] > 1.0 and bounds[0] > 2.0
    assert idle_sigma_bound(1.0, None) == 1.0
    a, _ = analysed(tmp_path, 1, True, "auto")
    package = next(d for d in a.domains if d["domain"] == "cpu-package")
    assert package["idle_sigma_W"] == pytest.approx(idle_sigma_bound(0.4, 30))  # build_run's
    assert math.isfinite(package["noise_J"]) and package["noise_J"] > 0.4 * package["program_s"]


def test_parts_each_zero_within_noise_add_to_zero_not_below_idle() -> None:
    from fecomlite.analysis.noise_floor import BEYOND_NOISE, WITHIN_NOISE
    from fecomlite.analysis.run_analysis import cross_domain

    def part(raw: float) -> dict:
        return {"raw_above_idle_J": raw, "above_idle_J": 0.0, "uncertainty_J": 1.0,
                "provenance": "estimated", "total_J": 10.0}

    # each 2.5σ below zero (≈ 0), the sum 3.5σ of the sum's noise below: still zero
    both = cross_domain({"cpu-package": part(-2.5), "dram": part(-2.5)})
    assert both["below_zero"] == WITHIN_NOISE and both["above_idle_J"] == 0.0
    one_beyond = cross_domain({"cpu-package": part(-4.0), "dram": part(-2.5)})
    assert one_beyond["below_zero"] == BEYOND_NOISE and math.isnan(one_beyond["above_idle_J"])


def test_a_card_below_the_baseline_says_so_not_within_noise() -> None:
    from fecomlite.report.build import _no_share

    assert "below the idle baseline" in _no_share({"program_J": -3.72, "noise_J": 0.2})
    assert "within noise" in _no_share({"program_J": -0.1, "noise_J": 0.2})
