"""Runs side by side: three runs that differ by batch size, through `fecomlite report A B C`,
`--all` and `--where`; the relation of batch size to energy and peak memory in runs.json, the
CSV beside it, and the plot drawn in real headless Chromium."""

from __future__ import annotations

import csv
import json

import pytest
import typer
from report_helpers import build_run
from typer.testing import CliRunner

from fecomlite.report.command import report_command
from fecomlite.store import Store

app = typer.Typer()
app.command("report")(report_command)
app.command("unused")(lambda: None)  # two commands: typer keeps the "report" name
BATCHES = {16: (1.0, 0.0), 64: (1.4, 40e6), 256: (2.2, 160e6)}  # energy scale, RSS added (B)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Three runs of one program, batch size 16/64/256: more GPU energy and RSS as it grows,
    and one run of another kind that `--where` must leave out."""
    path = tmp_path_factory.mktemp("runs") / "store.sqlite"
    with Store(path) as store:
        for batch, (scale, extra) in BATCHES.items():
            run_id = build_run(store, energy_scale=scale)
            store.merge_hyperparams(run_id, {"batch_size": str(batch)})  # as --param gives it
            rss = store.sensor_id(run_id, "proc:rss")
            store.db.execute("UPDATE samples SET value = value + ? WHERE sensor_id=?",
                             (extra, rss))
            store.db.commit()
    return path


def report(store_path, out, *args):
    done = CliRunner().invoke(app, ["report", *args, "--store", str(store_path), "--out",
                                    str(out)], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    return json.loads((out / "runs.json").read_text())


def test_three_runs_give_batch_size_against_energy_and_memory(store_path, tmp_path):
    data = report(store_path, tmp_path, "1", "2", "3")
    assert [r["id"] for r in data["runs"]] == [1, 2, 3]
    assert data["varying"] == ["batch_size"]  # optimizer and learning rate are the same
    (rel,) = data["relations"]
    assert rel["hyperparameter"] == "batch_size" and rel["numeric"]
    assert [p["value"] for p in rel["points"]] == [16, 64, 256]
    gpu = [p["energy_J"]["gpu:0"] for p in rel["points"]]
    rss = [p["rss_peak_B"] for p in rel["points"]]
    assert gpu[0] < gpu[1] < gpu[2]
    assert rss[1] - rss[0] == pytest.approx(40e6, rel=0.01)
    assert rss[2] - rss[0] == pytest.approx(160e6, rel=0.01)
    run = data["runs"][0]
    assert run["hyperparameters"]["optimizer"] == "Adam"
    assert run["program_sha256"] is None  # bench.py does not exist here: no invented hash
    assert run["repetitions"] == 2 and run["duration_s"] > 0
    assert run["gpu_mem_peak_B"] > 0 and run["energy"]["gpu:0"]["provenance"] == "measured"
    assert run["energy"]["cpu-package"]["model"] == "cpu-util-linear"
    for e in run["energy"].values():
        assert (e["above_idle_J"] or 0) >= 0 and e["sigma_J"] >= 0
    with open(tmp_path / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["batch_size"]) for r in rows] == [16, 64, 256]
    assert float(rows[2]["energy_J_gpu:0"]) == pytest.approx(gpu[2])
    assert rows[0]["provenance_cpu-package"] == "estimated (cpu-util-linear)"


def test_all_and_where_choose_the_runs(store_path, tmp_path):
    assert [r["id"] for r in report(store_path, tmp_path / "a", "--all")["runs"]] == [1, 2, 3]
    chosen = report(store_path, tmp_path / "w", "--where", "batch_size=64")["runs"]
    assert [r["id"] for r in chosen] == [2]
    done = CliRunner().invoke(app, ["report", "--where", "batch_size=7", "--store",
                                    str(store_path), "--out", str(tmp_path / "n")])
    assert done.exit_code == 1 and "no run matches batch_size=7" in done.output


def test_two_runs_are_still_compared(store_path, tmp_path):
    done = CliRunner().invoke(app, ["report", "1", "3", "--store", str(store_path), "--out",
                                    str(tmp_path), "--format", "json"])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "compare.json").exists() and not (tmp_path / "runs.json").exists()


@pytest.mark.browser
def test_the_plot_of_energy_against_batch_size_in_chromium(store_path, tmp_path):
    from playwright.sync_api import sync_playwright

    report(store_path, tmp_path, "1", "2", "3")
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless=new", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((tmp_path / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        energy = page.locator("[data-chart='energy-batch_size'] svg circle.fc-dot")
        memory = page.locator("[data-chart='memory-batch_size'] svg circle.fc-dot")
        counts = energy.count(), memory.count()
        dots = [energy.nth(i).bounding_box() for i in range(energy.count())]
        rows = page.locator("#runs-table tbody tr").count()
        width = page.evaluate("document.documentElement.scrollWidth")
        table = page.evaluate("[document.querySelector('#runs-table').scrollWidth, "
                              "document.querySelector('#runs .table-wrap').clientWidth]")
        browser.close()
    assert errors == []
    assert rows == 3
    assert counts == (3 * 2, 3 * 2)  # (gpu:0, cpu-package) and (host RSS, GPU memory) × 3 runs
    assert width <= 1280 and table[0] <= table[1]  # the runs table fits at 1280 px
    xs = sorted({round(d["x"]) for d in dots})
    assert len(xs) == 3  # one column of points per batch size


def test_no_argument_after_a_sweep_reports_the_sweep_not_no_runs(tmp_path):
    """A store holding only a sweep (its configurations are children): the latest run to
    report is the sweep, not "no runs"."""
    import numpy as np
    from test_model_fit import ESTIMATED, PLANTED, grid_configs, synthetic_rows

    from fecomlite.model.sweep import CONFIG_KIND, SWEEP_FORMAT, SWEEP_KIND

    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        sweep_id = store.create_run(kind=SWEEP_KIND, status="finished")
        store.create_run(kind=CONFIG_KIND, status="finished", parent_id=sweep_id)
        store.put_result(sweep_id, "sweep", {
            "format": SWEEP_FORMAT, "sweep_id": sweep_id, "framework": "keras",
            "hierarchy": PLANTED.to_json(), "domains": ESTIMATED,
            "rows": synthetic_rows(np.random.default_rng(1), grid_configs(widths=(8, 64)))})
    done = CliRunner().invoke(app, ["report", "--store", str(path), "--out", str(tmp_path / "r"),
                                    "--format", "json"])
    assert done.exit_code == 0, done.output
    assert "no runs" not in done.output
    assert json.loads((tmp_path / "r" / "report.json").read_text())["run"]["id"] == sweep_id


def test_one_series_per_value_of_the_other_varying_hyperparameter():
    """hidden=256 and hidden=1024 against batch_size: two lines, each through its own runs in
    order of batch size, never one line zig-zagging between the groups."""
    from fecomlite.report.runs import _chart, _relation

    rows = [{"id": i, "hyperparameters": {"batch_size": batch, "hidden": hidden},
             "energy": {"cpu": {"above_idle_J": hidden * batch * 1e-3, "sigma_J": 0.1}},
             "rss_peak_B": hidden * 1e6, "gpu_mem_peak_B": None}
            for i, (hidden, batch) in enumerate([(256, 64), (1024, 32), (256, 32), (1024, 64),
                                                 (256, 128), (1024, 128)])]
    rel = _relation(rows, "batch_size", ["cpu"], ["hidden"])
    chart = _chart(rel, ["cpu"], "energy")
    lines = {s["label"]: s["points"] for s in chart["series"]}
    assert lines == {
        "cpu, hidden=256": [[32, 8.192], [64, 16.384], [128, 32.768]],
        "cpu, hidden=1024": [[32, 32.768], [64, 65.536], [128, 131.072]],
    }
    memory = {s["label"] for s in _chart(rel, ["cpu"], "memory")["series"]}
    assert memory == {"host RSS, hidden=256", "host RSS, hidden=1024"}
    alone = _chart(_relation(rows[:3:2], "batch_size", ["cpu"]), ["cpu"], "energy")
    assert [s["label"] for s in alone["series"]] == ["cpu"]
