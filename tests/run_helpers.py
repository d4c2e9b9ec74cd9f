"""`fecomlite run` of a distributed program in a test: one argument list, and no process left.

torchrun starts each rank in a session of its own, so killing `fecomlite run` (what
`subprocess.run(timeout=...)` does) leaves the launcher and its ranks running. Here a run that
times out, or a test that fails while it runs, stops the whole tree: the launcher, the ranks and
their workers, found as descendants before anything is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from conftest import run_cli

# one repetition, no idle measurement, no stability gate: what a test needs of a run
QUICK = ("--repeat", "1", "--idle", "0", "--tail", "0.2", "--no-gate")
# CI's machine is slow and busy: a 2-rank torch program takes seconds here, minutes there
TIMEOUT_S = 600


def _environ(env: dict[str, str] | None) -> dict[str, str]:
    """As a user's shell has it: no FECOMLITE_ variable of the test's, and wide output."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    return {**environ, "COLUMNS": "200", **(env or {})}


def start_run(
    cwd: Path, home: Path, script: Path, *more: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`fecomlite run --home HOME QUICK MORE SCRIPT` started, as a user runs it."""
    command = [sys.executable, "-m", "fecomlite.cli", "run", "--home", str(home), *QUICK, *more]
    return subprocess.Popen(
        [*command, str(script)],
        cwd=cwd,
        env=_environ(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_tree(proc: subprocess.Popen[str]) -> None:
    """Kill `proc` and every process under it, and reap them."""
    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(tree, timeout=30)
    proc.communicate()


@contextlib.contextmanager
def running(
    cwd: Path, home: Path, script: Path, *more: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A started run whose tree is stopped however the block ends, unless it ended itself."""
    proc = start_run(cwd, home, script, *more, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            stop_tree(proc)


def fecomlite_run(
    cwd: Path, home: Path, script: Path, *more: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run to the end (TIMEOUT_S at most) and give its exit code and output."""
    with running(cwd, home, script, *more, env=env) as proc:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def report_json(cwd: Path, home: Path) -> dict[str, Any]:
    """`fecomlite report` of HOME's store into CWD/report (HTML too); its report.json."""
    out = cwd / "report"
    store = str(home / "store.sqlite")
    done = run_cli(cwd, "report", "--store", store, "--out", str(out), timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / "report.json").read_text())
