"""Every sample project through the whole pipeline: instrument → run (method level) → report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fecomlite.server.client import live_client
from fecomlite.store import Store

PROJECTS = sorted(p.parent for p in (Path(__file__).parents[1] / "projects").glob("*/train.py"))
FAST = ["--repeat", "1", "--idle", "0.5", "--tail", "0.3", "--gate-max-wait", "2"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("pipeline-home")
    yield folder
    client = live_client(folder)
    if client is not None:
        client.shutdown()


def fecomlite(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    return subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=600,
    )


def test_there_are_sample_projects():
    assert len(PROJECTS) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_project_runs_instrumented_and_reports(project: Path, home: Path, tmp_path: Path):
    run = fecomlite(home, tmp_path, "run", str(project / "train.py"), "--home", str(home), *FAST)
    assert run.returncode == 0, run.stdout + run.stderr
    with Store(home / "store.sqlite", create=False) as store:
        run_id = store.latest_run_id()
        assert store.run(run_id)["status"] == "finished"
        log = next(iter(sorted((home / "logs").glob("train-*/rep-1.log"))[-1:]), None)
        assert log is not None and "accuracy" in log.read_text()
    out = tmp_path / "report"
    report = fecomlite(home, tmp_path, "report", str(run_id), "--store",
                       str(home / "store.sqlite"), "--out", str(out))
    assert report.returncode == 0, report.stdout + report.stderr
    html = (out / "index.html").read_text()
    apis = {row["api"]: row for row in json.loads((out / "report.json").read_text())["apis"]}
    assert apis and all(api in html for api in apis)
    if project.name == "torch_cnn":
        names = set(apis)
        assert any(n.startswith("torch.nn.") and n.endswith("__call__") for n in names), names
        assert any(n.endswith(".backward") for n in names), names
        assert any(n.endswith(".step") for n in names), names
        for name in names:
            if name.endswith((".backward", ".step")):
                energy = apis[name]["energy"]["cpu-package"]
                assert energy["provenance"] == "estimated" and energy["above_idle_J"] >= 0
                assert apis[name]["memory"]["rss_peak_max_B"] > 0
