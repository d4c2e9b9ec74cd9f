"""Each original sample project runs to the end, deterministically, writing only under its cwd.

These run the untouched projects; the instrumented runs are tested elsewhere. Each project runs in
a temporary copy with its working directory in another temporary folder, so a project that
writes beside its own script (instead of under the working directory) is caught.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECTS_DIR = Path(__file__).resolve().parents[1] / "projects"
ENTRY_SCRIPT = "train.py"
PROJECTS = sorted(p.parent.name for p in PROJECTS_DIR.glob(f"*/{ENTRY_SCRIPT}"))
FINAL_LINE = re.compile(r"^accuracy (\d\.\d{3})\b")
MIN_ACCURACY = 0.6  # well above chance for every project: a broken training loop falls below
CHEAP_PROJECT = "torch_mlp_jit"
RUN_TIMEOUT_S = 120


@dataclass(frozen=True)
class ProjectRun:
    returncode: int
    stdout: str
    stderr: str
    source_dir: Path
    work_dir: Path
    source_files_before: set[str]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def _run_copy(name: str, base: Path) -> ProjectRun:
    source_dir = base / "src"
    work_dir = base / "work"
    shutil.copytree(
        PROJECTS_DIR / name, source_dir, ignore=shutil.ignore_patterns("out", "__pycache__")
    )
    source_files_before = _tree(source_dir)
    work_dir.mkdir()
    done = subprocess.run(
        [sys.executable, str(source_dir / ENTRY_SCRIPT)],
        cwd=work_dir,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return ProjectRun(
        done.returncode, done.stdout, done.stderr, source_dir, work_dir, source_files_before
    )


@pytest.fixture(scope="session")
def run_project(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ProjectRun]:
    """Runs each project once per session; later tests reuse that run."""
    runs: dict[str, ProjectRun] = {}

    def run(name: str) -> ProjectRun:
        if name not in runs:
            runs[name] = _run_copy(name, tmp_path_factory.mktemp(name))
        return runs[name]

    return run


def test_at_least_five_projects_each_documented() -> None:
    assert len(PROJECTS) >= 5, PROJECTS
    index = (PROJECTS_DIR / "README.md").read_text()
    for name in PROJECTS:
        assert (PROJECTS_DIR / name / "README.md").is_file(), name
        assert f"`{name}`" in index, f"{name} missing from projects/README.md"


def test_both_frameworks_are_covered() -> None:
    sources = {name: (PROJECTS_DIR / name / ENTRY_SCRIPT).read_text() for name in PROJECTS}
    assert any("import tensorflow" in text for text in sources.values())
    assert any("import torch" in text for text in sources.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", PROJECTS)
def test_project_runs_to_the_end(name: str, run_project: Callable[[str], ProjectRun]) -> None:
    run = run_project(name)
    assert run.returncode == 0, run.stderr[-3000:]

    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert lines, "project printed nothing"
    match = FINAL_LINE.match(lines[-1])
    assert match, f"last line is {lines[-1]!r}"
    assert float(match.group(1)) >= MIN_ACCURACY, lines[-1]

    assert _tree(run.source_dir) == run.source_files_before, "project wrote beside its script"


@pytest.mark.slow
def test_text_project_saves_under_cwd_and_reloads(
    run_project: Callable[[str], ProjectRun],
) -> None:
    run = run_project("keras_text_classifier")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (run.work_dir / "out" / "sentiment.keras").stat().st_size > 0
    assert "reloaded predictions match True" in run.stdout


@pytest.mark.slow
def test_cheap_project_prints_the_same_twice(
    run_project: Callable[[str], ProjectRun], tmp_path: Path
) -> None:
    first = run_project(CHEAP_PROJECT)
    second = _run_copy(CHEAP_PROJECT, tmp_path)
    assert first.returncode == second.returncode == 0, second.stderr[-3000:]
    assert first.stdout == second.stdout
