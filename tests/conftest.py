"""Shared fixtures: a fecomlite home whose measurement server is shut down after the module."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fecomlite.server.client import live_client

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; the browser tests use it through Playwright


def browser_missing() -> str | None:
    """Why the `browser` tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed (pip install -e '.[test]')"
    if not CHROMIUM.exists():
        return (f"no Chromium at {CHROMIUM}: as root, `apt-get install -y chromium` "
                "(without root these tests are skipped; everything else runs)")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = browser_missing()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.skip(reason=f"browser test: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def _no_user_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite never writes into the user's fecomlite home: a probe called in the test process
    itself (no server: it spools, at exit too) or a program started without a home of its own
    would write spool files to $FECOMLITE_HOME (else ./.fecomlite, the repository). They go to a
    session folder instead, kept set to the process's end (the probe's last flush is at exit);
    tests that need a home of their own still set one."""
    os.environ["FECOMLITE_HOME"] = str(tmp_path_factory.mktemp("session-home"))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    """A fresh FECOMLITE_HOME; `fecomlite run` starts its server there, and it is stopped after."""
    folder = tmp_path_factory.mktemp("fecomlite-home")
    yield folder
    client = live_client(folder)
    if client is not None:
        client.shutdown()


def run_cli(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """`fecomlite ARGS` as a user runs it: a new process, no FECOMLITE_ variables inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
