"""`fecomlite.report.heap`: the report's malloc tuning takes on glibc and is a no-op elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _glibc() -> bool:
    try:
        return sys.platform == "linux" and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith(
            "glibc")
    except ValueError:
        return False


def test_freed_memory_is_kept_on_glibc_and_nothing_changes_elsewhere():
    """glibc accepts both settings (mallopt returns 1 for each: the constants are glibc's);
    another C library or system is left as it is. Run in a child, not to tune this one."""
    code = "from fecomlite.report.heap import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(_glibc())


def test_the_report_command_keeps_freed_memory(monkeypatch, tmp_path):
    """`fecomlite report` asks for it before it opens the store (here: none, an error)."""
    import typer

    from fecomlite.report import command

    called = []
    monkeypatch.setattr("fecomlite.report.heap.keep_freed_memory", lambda: called.append(1) or True)
    with pytest.raises(typer.Exit):
        command.report_command(runs=[1], store=tmp_path / "none.sqlite", out=tmp_path / "r")
    assert called == [1]
