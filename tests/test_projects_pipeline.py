"""Every sample project through the whole pipeline: instrument → run (method level) → report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from fecomlite.store import Store

PROJECTS = sorted(p.parent for p in (Path(__file__).parents[1] / "projects").glob("*/train.py"))
FAST = ["--repeat", "1", "--idle", "0.5", "--tail", "0.3", "--gate-max-wait", "2"]


def test_there_are_sample_projects():
    assert len(PROJECTS) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_project_runs_instrumented_and_reports(project: Path, home: Path, tmp_path: Path):
    run = run_cli(tmp_path, "run", "--home", str(home), *FAST, str(project / "train.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    with Store(home / "store.sqlite", create=False) as store:
        run_id = store.latest_run_id()
        assert store.run(run_id)["status"] == "finished"
        log = next(iter(sorted((home / "logs").glob("train-*/rep-1.log"))[-1:]), None)
        assert log is not None and "accuracy" in log.read_text()
    out = tmp_path / "report"
    report = run_cli(
        tmp_path, "report", str(run_id), "--store", str(home / "store.sqlite"), "--out", str(out)
    )
    assert report.returncode == 0, report.stdout + report.stderr
    html = (out / "index.html").read_text()
    report_json = json.loads((out / "report.json").read_text())
    apis = {row["api"]: row for row in report_json["apis"]}
    reliable = {d["domain"]: d.get("reliable", True) for d in report_json["domains"]}
    why = {d["domain"]: d.get("unreliable") or [] for d in report_json["domains"]}
    assert apis and all(api in html for api in apis)
    if project.name == "torch_cnn":
        names = set(apis)
        assert any(n.startswith("torch.nn.") and n.endswith("__call__") for n in names), names
        assert any(n.endswith(".backward") for n in names), names
        assert any(n.endswith(".step") for n in names), names
        for name in names:
            if name.endswith((".backward", ".step")):
                energy = apis[name]["energy"]["cpu-package"]
                # never below zero: above idle, or 0 within its noise; where the figures cannot
                # be trusted (a busy machine, an estimate below the baseline beyond its noise)
                # the report flags the package unreliable, and says why
                assert energy["provenance"] == "estimated"
                if reliable["cpu-package"]:
                    assert energy["above_idle_J"] >= 0
                else:
                    assert why["cpu-package"]
                assert apis[name]["memory"]["rss_peak_max_B"] > 0
