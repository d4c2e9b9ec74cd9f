"""The report of a run replayed from the real H200 traces: files, tables, provenance, escaping,
and the `report` command (no browser here; test_report_browser.py drives Chromium)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from report_helpers import MIXED, build_run, hostile_sites, html_tables
from typer.testing import CliRunner

from fecomlite.analysis.datasize import api_scaling
from fecomlite.analysis.units import scaled
from fecomlite.report import tables
from fecomlite.report.build import Report, build_report
from fecomlite.report.command import report_command
from fecomlite.report.render import script_json, write_report
from fecomlite.report.timeline import MAX_POINTS
from fecomlite.store import Store


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    folder = tmp_path_factory.mktemp("report")
    with Store(folder / "store.sqlite") as store:
        run = build_run(store)
        report = build_report(store, run)
    write_report(report, folder / "out")
    return report, folder / "out"


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_writes_the_page_json_and_csv(written: tuple[Report, Path]) -> None:
    _, out = written
    assert sorted(p.name for p in out.iterdir()) == [
        "apis.csv", "index.html", "memory.csv", "report.json", "sites.csv"]
    data = json.loads((out / "report.json").read_text())
    assert {a["api"] for a in data["apis"]} == {"torch.matmul", "torch.Tensor.matmul"}
    assert len(data["sites"]) == 3


def test_page_references_nothing_outside_itself(written: tuple[Report, Path]) -> None:
    html = (written[1] / "index.html").read_text()
    # This run's own strings hold no URL, so any http(s) text would come from the page itself.
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"<(script|img|link|iframe)[^>]*\s(src|href)=", html, re.I)
    assert not re.search(r"""url\(\s*['"]?(?!#)""", html)  # only url(#clip-path) fragments
    assert "@import" not in html


def test_table_agrees_with_csv_and_json(written: tuple[Report, Path]) -> None:
    report, out = written
    html = html_tables((out / "index.html").read_text())
    data = json.loads((out / "report.json").read_text())
    for name, key in (("apis", "api"), ("sites", "key")):
        page = html[f"{name}-table"]
        columns: list[tables.Column] = report.context[f"{name[:-1]}_table"]["columns"]
        assert page["columns"] == [c.key for c in columns]
        assert "gpu_mem_above" in page["columns"]  # the run has a GPU memory gauge
        rows_csv = {r[key]: r for r in _csv(out / f"{name}.csv")}
        rows_json = {r[key]: r for r in data[name]}
        assert len(page["rows"]) == len(rows_csv) == len(rows_json)
        ident = columns.index(next(c for c in columns if c.csv == key))
        for cells in page["rows"]:
            row_id = cells[ident]["v"]
            for col, cell in zip(columns, cells, strict=True):
                from_csv = rows_csv[row_id][col.csv]
                from_json = tables.lookup(rows_json[row_id], col.path)
                if cell["v"] == "":
                    assert from_csv == "" and from_json is None, col.key
                    continue
                assert cell["v"] == from_csv, (name, col.key)
                assert cell["v"] == (repr(from_json) if isinstance(from_json, float)
                                     else str(from_json)), (name, col.key)


def test_per_call_confidence_interval_is_shown(written: tuple[Report, Path]) -> None:
    _, out = written
    html = (out / "index.html").read_text()
    row = _csv(out / "apis.csv")[0]
    low, high = float(row["gpu:0 per_call_ci95_low_J"]), float(row["gpu:0 per_call_ci95_high_J"])
    assert f"± {scaled((high - low) / 2, 'J')}" in html


def test_provenance_is_labelled_everywhere(written: tuple[Report, Path]) -> None:
    report, out = written
    html = (out / "index.html").read_text()
    # header cards, table group headers and the sensor list carry the badge and the model
    assert html.count('class="badge estimated"') >= 4
    assert "estimated · cpu-util-linear" in html and 'class="badge measured"' in html
    groups = [g for g, _, _ in report.context["api_table"]["groups"] if g]
    assert {(g.label, g.provenance) for g in groups} >= {
        ("CPU package", "estimated"), ("GPU 0", "measured"), ("all domains", "estimated")}
    # chart legends
    legends = [s["label"] for s in report.charts["bars"]["series"]]
    assert "CPU package (estimated, cpu-util-linear)" in legends
    assert "GPU 0 (measured)" in legends
    assert all("(" in s["label"] for s in report.charts["timeline"]["series"])
    # JSON and CSV
    data = json.loads((out / "report.json").read_text())
    assert {d["domain"]: d["provenance"] for d in data["domains"]} == {
        "cpu-package": "estimated", "gpu:0": "measured"}
    row = _csv(out / "apis.csv")[0]
    assert row["cpu-package provenance"] == "estimated"
    assert row["cpu-package model"] == "cpu-util-linear"
    assert row["all_domains_provenance"] == "estimated"


def test_header_shows_gate_log_idle_and_hyperparameters(written: tuple[Report, Path]) -> None:
    html = (written[1] / "index.html").read_text()
    assert "repetition 2: failed, waited 2.00 min" in html
    assert "nvml:0:energy: power_cv 0.02 over limit 0.01" in html
    assert "learning_rate" in html and "Adam" in html
    assert "Intel(R) Xeon(R) Platinum 8480+" in html and "NVIDIA H200" in html
    assert "124 W" in html  # the idle baseline


def test_user_strings_are_escaped(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store, sites=hostile_sites(), program="<script>alert(1)</script>.py")
        report = build_report(store, run)
    write_report(report, tmp_path / "out", ["html"])
    html = (tmp_path / "out" / "index.html").read_text()
    assert "<script>alert" not in html and "<img src" not in html and "<b>bold" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # exactly our three script elements, and the embedded JSON cannot close its element
    assert len(re.findall(r"<script\b", html)) == 3
    embedded = html.split('id="fecom-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in embedded and "torch.Tensor.\\u003c/script\\u003ematmul" in embedded


def test_a_run_without_calls_or_sensors_still_renders(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        report = build_report(store, store.create_run(program="idle.py"))
    write_report(report, tmp_path / "out")
    html = (tmp_path / "out" / "index.html").read_text()
    assert "No energy sensor gave usable readings" in html
    assert report.charts["timeline"]["series"] == [] and report.charts["bars"]["items"] == []
    assert json.loads((tmp_path / "out" / "report.json").read_text())["apis"] == []


def test_script_json_escapes_what_could_end_the_element() -> None:
    text = str(script_json({"s": "</script><!-- & \u2028"}))
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"s": "</script><!-- & \u2028"}


def test_many_calls_are_binned_and_the_page_stays_small(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store, MIXED, reps=1)
        report = build_report(store, run)
    timeline = report.charts["timeline"]
    assert all(len(s["v"]) <= MAX_POINTS for s in timeline["series"] + timeline["memory"])
    assert {lane["label"] for lane in timeline["lanes"]} == {
        "torch.matmul", "torch.add", "torch.nn.functional.relu", "torch.sum"}
    # 55,600 calls: too many to draw one by one, so each lane is a busy share per bin
    assert all("bins" in lane and len(lane["bins"]["busy"]) <= MAX_POINTS
               for lane in timeline["lanes"])
    assert sum(sum(lane["bins"]["calls"]) for lane in timeline["lanes"]) == 55_606
    write_report(report, tmp_path / "out", ["html"])
    assert (tmp_path / "out" / "index.html").stat().st_size < 600_000


def test_datasize_result_is_charted_when_present(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store, reps=1)
        assert build_report(store, run).context["datasize"] is None
        points = [{"fraction": f, "input_bytes": f * 8e6, "seconds": 0.1 + f,
                   "energy_J": 3 + 40 * f, "mem_added_B": f * 8e6} for f in (0.25, 0.5, 1)]
        fits = {"energy_J": {"points": 3, "linear": {"intercept": 3.0, "slope": 5e-6, "r2": 1.0},
                             "power": {"coefficient": 1e-3, "exponent": 0.8, "r2": 0.97}}}
        api_points = [{"api": "torch.optim.SGD.step", "fraction": f, "rep": rep,
                       "calls": int(240 * f), "seconds": 0.01 * 240 * f * (1 + rep / 20),
                       "in_bytes": 4096.0, "energy_J": 0.05 * f, "mem_added_B": 0.0}
                      for f in (0.25, 0.5, 1) for rep in (1, 2)]
        store.put_result(run, "datasize", {"target": "torch.matmul", "points": points,
                                           "fits": fits, "domain": "cpu-package",
                                           "provenance": "estimated",
                                           "apis": api_scaling(api_points)})
        report = build_report(store, run)
    ds = report.context["datasize"]
    assert ds["target"] == "torch.matmul" and ds["points"] == 3
    energy = report.charts["datasize-energy_J"]
    assert energy["series"][0]["points"] == [[2e6, 13.0], [4e6, 23.0], [8e6, 43.0]]
    assert [s["label"] for s in energy["series"][1:]] == [
        "linear fit (R² 1.000)", "power law (R² 0.970)"]
    assert energy["yLabel"] == "energy (cpu-package, estimated)"
    assert {"datasize-seconds", "datasize-mem_added_B"} <= report.charts.keys()
    (step,) = ds["apis"]
    assert (step["api"], step["calls"], step["calls_exponent"]) == (
        "torch.optim.SGD.step", "60 → 240", "1.00 ± 0.00")
    assert step["energy_J_exponent"] == "1.00 ± 0.00" and step["mem_added_B_exponent"] == "–"
    assert ds["energy_label"] == "cpu-package, estimated"
    write_report(report, tmp_path / "out", ["html", "csv"])
    html = (tmp_path / "out" / "index.html").read_text()
    assert 'data-chart="datasize-energy_J"' in html and 'id="datasize-apis"' in html
    rows = list(csv.DictReader((tmp_path / "out" / "datasize_apis.csv").open()))
    seconds = next(r for r in rows if r["figure"] == "seconds")
    assert float(seconds["exponent_ci95_low"]) < 1.0 < float(seconds["exponent_ci95_high"])
    assert next(r for r in rows if r["figure"] == "energy_J")["domain"] == "cpu-package"


def test_project_level_run_is_set_against_the_method_level_sum(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        build_run(store, reps=1, level="method")
        project = build_run(store, reps=1, level="project")
        report = build_report(store, project)
    levels = report.context["levels"]
    assert levels is not None and levels["method_run"] == 1 and levels["project_run"] == 2
    assert {r["domain"] for r in levels["rows"]} == {"cpu-package", "gpu:0"}
    assert len(report.charts["levels"]["items"]) == 4


# -- the command ------------------------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(report_command)
    app.callback()(lambda: None)
    return app


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(_app(), ["report-command", *args])


def test_command_writes_the_latest_run_under_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FECOMLITE_HOME", str(tmp_path / "home"))
    with Store(tmp_path / "home" / "store.sqlite") as store:
        build_run(store, reps=1)
        latest = build_run(store, reps=1)
    result = _invoke()
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "reports" / str(latest)).iterdir()) == [
        "apis.csv", "index.html", "memory.csv", "report.json", "sites.csv"]
    result = _invoke("1", "--format", "csv", "--out", "only-csv")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "only-csv").iterdir()) == [
        "apis.csv", "memory.csv", "sites.csv"]


def test_command_compares_two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Store(tmp_path / "s.sqlite") as store:
        a, b = build_run(store, reps=1), build_run(store, reps=1)
    result = _invoke(str(a), str(b), "--store", "s.sqlite")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "reports" / f"compare-{a}-{b}").iterdir()) == [
        "compare.csv", "compare.json", "index.html"]


def test_command_reports_a_missing_store_or_run(tmp_path: Path) -> None:
    result = _invoke("--store", str(tmp_path / "none.sqlite"))
    assert result.exit_code == 1 and "no run store" in result.output
    with Store(tmp_path / "s.sqlite") as store:
        build_run(store, reps=1)
    result = _invoke("7", "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code == 1 and "no run 7" in result.output
    result = _invoke("1", "2", "3", "--store", str(tmp_path / "s.sqlite"))
    assert result.exit_code != 0


def test_hyperparameters_say_where_each_was_read(tmp_path: Path) -> None:
    """The probe's `sources` go beside each value, not as a row of raw JSON."""
    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store)
        store.merge_hyperparams(run, {"epochs": 2, "sources": {
            "epochs": "range(args.epochs) around the call of train in main"}})
        report = build_report(store, run)
    rows = dict(report.context["hyperparams"])
    assert rows["epochs"] == "2 (read from range(args.epochs) around the call of train in main)"
    assert rows["optimizer"] == "Adam" and "sources" not in rows


def test_a_run_still_recording_is_reported_as_partial(tmp_path: Path) -> None:
    """`fecomlite report RUN` on a running run: what is stored so far, marked partial."""
    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store, reps=1)
        store.update_run(run, status="running", t_end_ns=None, exit_code=None)
        report = build_report(store, run)
        store.update_run(run, status="finished")
        assert build_report(store, run).context["header"]["partial"] is False
    assert report.context["header"]["partial"] is True
    assert report.context["header"]["calls"] > 0
    write_report(report, tmp_path / "out")
    assert "partial: what was stored so far" in (tmp_path / "out" / "index.html").read_text()
