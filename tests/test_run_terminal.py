"""On a terminal the program's output reaches it byte for byte (bracketed text, partial lines,
escape sequences), the program sees a terminal as without fecomlite, and fecomlite's own lines
print user-derived paths literally."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_cli

PROGRAM = """\
import sys, time
print("[epoch 0] loss [/abs/path] [bold]x[/bold]")
print("loading [/abs/path/epoch0.pt] ...", end=" ", flush=True)
time.sleep(0.3)
print("done")
sys.stdout.write("\\x1b]8;;http://example.com\\x1b\\\\link\\x1b]8;;\\x1b\\\\\\n")
print("tty", sys.stdout.isatty(), sys.stderr.isatty(), sys.stdin.isatty())
print("[red]to stderr[/]", file=sys.stderr)
"""


def on_a_terminal(command: list[str], cwd: Path, timeout: float = 600) -> tuple[int, bytes]:
    """Run `command` with a pty as its stdin, stdout and stderr: its exit status, and every byte
    the terminal received."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    received = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # every writer gone
                    break
                if not chunk:
                    break
                received += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=60), bytes(received)
    finally:
        proc.kill()
        os.close(master)


def test_the_terminal_receives_the_programs_bytes_unchanged(home, tmp_path):
    script = tmp_path / "talk.py"
    script.write_text(PROGRAM)
    code, plain = on_a_terminal([sys.executable, str(script)], tmp_path)
    assert code == 0 and b"tty True True True" in plain
    command = [sys.executable, "-m", "fecomlite.cli", "run", "--home", str(home), "--quick",
               "--api", "json", str(script)]
    code, measured = on_a_terminal(command, tmp_path)
    assert code == 0, measured.decode(errors="replace")
    assert plain in measured  # one terminal behind stdout and stderr: in the order written
    log = next((home / "logs").glob("talk-*/rep-1.log")).read_bytes()
    assert plain.replace(b"\r\n", b"\n") == log  # the program's own bytes, no \r added


def test_user_paths_in_fecomlites_own_lines_print_literally(tmp_path):
    home = tmp_path / "[red]home[/]"
    script = tmp_path / "[/]syntax.py"  # a file `]syntax.py` in a folder `[`
    script.parent.mkdir()
    script.write_text("x = (1,\n")
    result = run_cli(tmp_path, "run", "--home", str(home), str(script), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"cannot run {script}: a syntax error" in result.stdout
    good = script.parent / "]ok[bold].py"  # `…/[/]ok[bold].py`
    good.write_text("print('fine')\n")
    try:
        result = run_cli(tmp_path, "run", "--home", str(home), "--quick", "--level", "project",
                         str(good), timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"stored in {home}/store.sqlite" in result.stdout
        assert str(good) in result.stdout
    finally:
        run_cli(tmp_path, "server", "stop", "--home", str(home), timeout=120)
