"""The report's energy-model section: a sweep's fitted model as stored, the breakpoints on the
energy-per-FLOP chart, measured against predicted for a configuration run, and honesty about
APIs whose shapes were not recorded. The chart is checked in real headless Chromium."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from report_helpers import build_run
from test_model_fit import ENERGY, ESTIMATED, PLANTED, grid_configs, synthetic_rows
from test_sweep import recorded_run

from fecomlite.model.command import MODEL_RESULT
from fecomlite.model.features import run_features, training_step
from fecomlite.model.fit import EnergyModels, fit_models
from fecomlite.model.network import NetworkConfig
from fecomlite.model.sweep import SWEEP_KIND
from fecomlite.report.build import build_report
from fecomlite.report.model_section import NO_SHAPES
from fecomlite.report.render import render_page, write_report
from fecomlite.store import Store

NO_OVERHEAD = {**ENERGY, "time_s": 0.0}  # energy per FLOP then depends on the cache level only


def sweep_run(store: Store, fitted: bool = True, energy: dict[str, float] = ENERGY,
              collinear: bool = False) -> int:
    """A sweep run with its table and (if `fitted`) the model `model fit --sweep` stores; with
    `collinear`, every level's bytes a fixed multiple of the FLOPs (to 0.1 %), the energy
    following them: any split of it among the levels fits."""
    configs = grid_configs(widths=(8, 32, 128, 512), depths=(1, 3), batches=(16, 256))
    rows = synthetic_rows(np.random.default_rng(3), configs, noise=0.0, energy=energy)
    rng = np.random.default_rng(4)
    for row in rows if collinear else []:
        for level, share in (("L1d", 0.5), ("L2", 0.2), ("DRAM", 0.05)):
            row[f"bytes_per_step_{level}"] = (share * row["flops_per_step"]
                                              * (1 + 1e-3 * rng.standard_normal()))
        values = run_features(row["flops_per_step"], row["params"],
                              {lv: row[f"bytes_per_step_{lv}"] for lv in ("L1d", "L2", "DRAM")},
                              row["steps"])
        joules = sum(c * {**values, "time_s": row["time_s"]}[f] for f, c in energy.items())
        row.update({"energy_J_cpu-package": joules, "energy_J_all": joules})
    sweep_id = store.create_run(kind=SWEEP_KIND, program="fc_program.py", level="project",
                                status="finished", settings={})
    for i, row in enumerate(rows):
        row["run_id"] = 1000 + i
    store.put_result(sweep_id, "sweep", {"sweep_id": sweep_id, "rows": rows,
                                         "hierarchy": PLANTED.to_json(), "domains": ESTIMATED})
    if fitted:
        models = fit_models(rows, PLANTED.to_json(), ESTIMATED,
                            source={"sweep_id": sweep_id, "runs": [r["run_id"] for r in rows]})
        store.put_result(sweep_id, MODEL_RESULT, models.to_json())
    return sweep_id


def html_of(report) -> str:
    return render_page("report.html.j2", report.context, report.charts)


def test_a_sweeps_section_shows_the_stored_model(tmp_path):
    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = sweep_run(store, collinear=True)
        saved = store.result(sweep_id, MODEL_RESULT)
        report = build_report(store, sweep_id)
    models = EnergyModels.from_json(saved)
    m = report.context["model"]
    assert m["kind"] == "sweep" and m["n"] == len(saved["points"])
    # collinear hierarchy terms: the per-level costs are not identified, and the section shows
    # the time/FLOP model with the sentence that says so, and no per-level cost
    assert models.identification["identified"] is False and m["identified"] is False
    fit = models.fits["time_flops"]
    shown = {c["feature"]: c for c in m["coefficients"]}
    assert sorted(shown) == sorted(fit.features) == ["flops", "time_s"]
    for i, feature in enumerate(fit.features):
        assert shown[feature]["coef_raw"] == pytest.approx(fit.coef[i])
        assert shown[feature]["se_raw"] == pytest.approx(fit.std_errors[i])
    assert shown["flops"]["unit"] == "pJ/FLOP" and shown["time_s"]["unit"] == "W"
    assert [(c["model"], c["r2"]) for c in m["comparison"]] == [
        (c["model"], f"{c['r2']:.3f}") for c in saved["comparison"]]
    assert m["energy_provenance"] == "estimated" and "cpu-util-linear" in m["energy_label"]
    per_flop = report.charts["model-per-flop"]
    assert [v["x"] for v in per_flop["vlines"]] == [32 << 10, 1 << 20]
    assert [v["label"].split()[0] for v in per_flop["vlines"]] == ["L1d", "L2"]
    assert per_flop["series"][1]["points"] == sorted(
        [p["max_working_set"], p["pj_per_flop"]] for p in saved["points"])
    pairs = report.charts["model-fit"]["series"][0]["points"]
    assert pairs == sorted([p["measured_J"], p["fitted_J"]] for p in saved["points"])
    assert len(per_flop["series"]) == 2  # no curve drawn from per-level costs
    html = html_of(report)
    assert 'id="model"' in html and "cpu-util-linear" in html
    assert "L1d: 32.8 kB" in html and "L2: 1.05 MB" in html
    assert 'id="model-identification"' in html and "collinear" in m["identification_note"]
    assert 'data-feature="bytes_' not in html
    # the time models that competed, the one used first and named (linear here: the time is a
    # sum of costs per FLOP, per byte and per step)
    assert m["time_model"] == models.time_model and models.time_model.startswith("linear")
    assert [t["form"] for t in m["time_models"]][0] == "linear" and m["time_models"][0]["chosen"]
    assert any(t["form"].startswith("power law") for t in m["time_models"])
    used = html.split('id="model-time-models"', 1)[1].split("</table>")[0]
    assert used.count("(used)") == 1 and "power law" in used
    assert 'id="model-left-out"' not in html  # every repetition kept: nothing to say


def test_identified_per_level_costs_are_shown_as_costs(tmp_path):
    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = sweep_run(store, energy=NO_OVERHEAD)
        models = EnergyModels.from_json(store.result(sweep_id, MODEL_RESULT))
        report = build_report(store, sweep_id)
    assert models.identification["identified"] is True, models.identification["reasons"]
    m = report.context["model"]
    assert m["identified"] and not m["identification_note"]
    assert [c["feature"] for c in m["coefficients"]] == models.memory_aware.features
    costs = {c["feature"]: c["coef_raw"] for c in m["coefficients"]}
    assert costs["bytes_L1d"] <= costs["bytes_L2"] <= costs["bytes_DRAM"]


def test_the_models_curve_steps_up_at_each_breakpoint(tmp_path):
    """Data with costlier bytes in each larger level: the curve is flat inside a level and
    jumps exactly at the cache sizes."""
    with Store(tmp_path / "store.sqlite") as store:
        report = build_report(store, sweep_run(store, energy=NO_OVERHEAD))
    curve = report.charts["model-per-flop"]["series"][2]["points"]
    assert len(curve) == 6  # two ends of each of L1d, L2, DRAM
    steps = [curve[i][1] for i in range(0, 6, 2)]
    assert [curve[i][1] for i in range(1, 6, 2)] == steps  # flat inside a level
    assert [curve[1][0], curve[3][0]] == [32 << 10, 1 << 20]
    assert steps[0] < steps[1] < steps[2]
    # no static term: the floor is the fitted compute cost per FLOP, 20 pJ
    assert min(steps) > NO_OVERHEAD["flops"] * 1e12


def test_a_sweep_without_a_fit_says_how_to_fit_one(tmp_path):
    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = sweep_run(store, fitted=False)
        report = build_report(store, sweep_id)
    assert report.context["model"]["kind"] == "unfitted"
    assert not any(key.startswith("model-") for key in report.charts)
    assert f"fecomlite model fit --sweep {sweep_id}" in html_of(report)


def test_an_ordinary_run_lists_known_apis_without_inventing_predictions(tmp_path):
    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store, reps=1)
        assert build_report(store, run).context["model"] is None  # no model in the store yet
        sweep_id = sweep_run(store)
        m = build_report(store, run).context["model"]
    assert m["kind"] == "run" and m["sweep_id"] == sweep_id and m["rows"] == []
    listed = {u["api"]: u for u in m["unpredictable"]}
    assert set(listed) == {"torch.matmul", "torch.Tensor.matmul"}  # add, relu, sum: no model
    assert all(u["why"] == NO_SHAPES and u["kind"] == "matmul" for u in listed.values())


def test_a_configuration_run_is_measured_against_predicted(tmp_path):
    config = NetworkConfig(64, 2, "rectangle", 32, 1024)
    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = sweep_run(store)
        models = EnergyModels.from_json(store.result(sweep_id, MODEL_RESULT))
        run = recorded_run(store, network=config.to_json(), parent_id=sweep_id)
        report = build_report(store, run)
    m = report.context["model"]
    (row,) = m["rows"]
    assert row["what"] == f"region:train ({config.key})"
    # recorded_run: 3.5 W above idle over the 2 s training region, estimated CPU power
    assert row["measured_J"] == pytest.approx(7.0, rel=0.02)
    assert row["measured_provenance"] == "estimated"
    step = training_step(config.layers(), PLANTED, config.optimizer)
    values = run_features(step.flops, step.params, step.bytes_by_level, config.steps)
    values["time_s"] = 2.0  # the recorded training region
    assert row["predicted_J"] == pytest.approx(models.memory_aware.predict(values), rel=1e-3)
    assert row["low_J"] < row["predicted_J"] < row["high_J"]
    assert row["in_fit"] is False
    assert row["inside"] == (row["low_J"] <= row["measured_J"] <= row["high_J"])
    assert "region:train" in html_of(report)


@pytest.mark.browser
def test_the_model_charts_draw_in_chromium(tmp_path):
    from playwright.sync_api import sync_playwright
    from test_report_browser import ARGS, ARTIFACTS, CHROMIUM

    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = sweep_run(store)
        report = build_report(store, sweep_id)
    write_report(report, tmp_path / "out", ["html"])
    page_path: Path = tmp_path / "out" / "index.html"
    points = len(report.charts["model-fit"]["series"][0]["points"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(page_path.as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        per_flop = page.locator("[data-chart='model-per-flop']")
        fit = page.locator("[data-chart='model-fit']")
        assert per_flop.get_attribute("data-drawn") == "1"
        assert fit.get_attribute("data-drawn") == "1"
        assert per_flop.locator("line.fc-vline").count() == 2
        assert per_flop.locator("text.fc-vline-label").all_text_contents() == [
            "L1d 32.8 kB", "L2 1.05 MB"]
        assert per_flop.locator("path.fc-line").count() == 1  # the model's step curve
        assert fit.locator("circle.fc-dot").count() == points
        assert fit.locator("path.fc-line").count() == 1  # y = x
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator("#model").screenshot(path=str(ARTIFACTS / "report-energy-model.png"))
        browser.close()
    assert errors == []


def test_a_sweeps_report_has_no_false_alarm_and_no_empty_sections(tmp_path):
    """A sweep run has no energy of its own (its configurations are runs): its report says so,
    lists the configurations, and shows neither "no energy sensor" nor empty call tables."""
    with Store(tmp_path / "store.sqlite") as store:
        for fitted in (True, False):
            html = html_of(build_report(store, sweep_run(store, fitted=fitted)))
            assert "No energy sensor gave usable readings" not in html
            assert 'id="sweep-note"' in html
            for empty in ('id="apis-table"', 'id="sites-table"', 'id="intensities"',
                          'id="repetitions"', 'data-chart="timeline"', 'id="load"'):
                assert empty not in html, empty
            configurations = html.split('id="model-configurations"', 1)[1].split("</table>")[0]
            assert configurations.count("<tr>") == 1 + 16  # the header and the 16 rows
            assert "rectangle-w8-d1-b16" in configurations
