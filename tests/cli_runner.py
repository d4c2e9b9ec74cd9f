"""`fecomlite ARGS` in a new process, for tests that check what the CLI prints and returns.

`fecomlite.cli.app` is a click group, not a Typer app: typer's CliRunner cannot drive it, and
newer typer releases vendor click without its testing module, so the CLI runs as a user runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def invoke(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    """Run `python -m fecomlite.cli ARGS` (in `cwd`) with no FECOMLITE_ variables inherited."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    environ.update({"COLUMNS": "200", **(env or {})})
    done = subprocess.run([sys.executable, "-m", "fecomlite.cli", *args], env=environ, cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    return Result(done.returncode, done.stdout, done.stderr)
