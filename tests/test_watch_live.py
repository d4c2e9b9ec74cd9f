"""`fecomlite watch` on a terminal: live figures drawn with rich while a real command runs (in a
pseudo-terminal, as a user sees them), the command's output above them, a clean end when the
command exits or on Ctrl-C; and what one frame shows for a given stream message."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console

from fecomlite.server.client import live_client
from fecomlite.server.watch_live import live_figures

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PROGRAM = textwrap.dedent("""
    import sys, time
    blocks = []
    try:
        time.sleep(0.5)
        for step in range(int(sys.argv[1])):
            blocks.append(bytearray(b"x") * (40 * 2**20))  # written, so resident
            print(f"step {step} done", flush=True)
            time.sleep(0.5)
        time.sleep(2)  # held at its peak, so a frame on a loaded machine still sees it
    except KeyboardInterrupt:
        print("stopped by Ctrl-C", flush=True)
        sys.exit(130)
""")


def _start_watch(home: Path, program: Path, steps: int) -> tuple[subprocess.Popen[bytes], int]:
    """`fecomlite watch -- python PROGRAM STEPS` on a pseudo-terminal, in a session of its own
    (so a Ctrl-C can go to its whole process group, as a terminal sends it)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env.update(COLUMNS="120", LINES="40", TERM="xterm-256color")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fecomlite.cli",
            "watch",
            "--home",
            str(home),
            "--",
            sys.executable,
            str(program),
            str(steps),
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    return proc, master


def _read_until(master: int, done: Callable[[str], bool], limit_s: float = 120) -> str:
    """The terminal's text (escape sequences removed) once `done(text)` or the end of output."""
    chunks, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other side closed: every process on the terminal ended
                break
            if not data:
                break
            chunks.append(data)
            if done(ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))):
                break
    return ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))


def _rss_values(text: str) -> list[float]:
    """Every `process RSS` row's value in MB, frame after frame."""
    return [float(m) for m in re.findall(r"│ process RSS\s*│\s*([\d.]+) MB", text)]


@contextlib.contextmanager
def _watching(tmp_path: Path, steps: int) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The watch of PROGRAM on a pseudo-terminal; afterwards its terminal is closed, the watch
    killed if it still runs, and the server it started stopped."""
    program = tmp_path / "grows.py"
    program.write_text(PROGRAM)
    home = tmp_path / "home"
    proc, master = _start_watch(home, program, steps)
    try:
        yield proc, master
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        client = live_client(home.resolve())
        if client is not None:
            client.shutdown()


def test_live_figures_follow_a_real_command_until_it_exits(tmp_path: Path):
    with _watching(tmp_path, 5) as (proc, master):  # +210 MB over about three seconds, then held
        text = _read_until(master, lambda t: False)
        code = proc.wait(timeout=60)
    assert code == 0, text
    rss = _rss_values(text)
    assert len(rss) >= 3, text  # redrawn while the command ran
    assert max(rss) - min(rss) >= 150  # the growth, as it happened (a frame a second at least)
    assert re.search(r"CPU package power\s*│\s*[\d.]+ m?W", text)
    assert "(share of CPU package)" in text  # the process's part, never added to anything
    assert all(f"step {i} done" in text for i in range(5))  # its output, above the figures
    assert text.index("step 4 done") < text.rindex("process RSS")
    assert "exited after" in text and "first → peak" in text  # then the summary


def test_ctrl_c_ends_the_live_watch_and_keeps_the_run(tmp_path: Path):
    with _watching(tmp_path, 200) as (proc, master):  # 100 s unless stopped
        seen = _read_until(master, lambda t: len(_rss_values(t)) >= 2 and "step 0 done" in t)
        assert len(_rss_values(seen)) >= 2, seen
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C on the terminal sends
        rest = _read_until(master, lambda t: False)
        code = proc.wait(timeout=60)
    assert code == 0, rest
    assert "watch interrupted" in rest and "Traceback" not in seen + rest
    assert rest.index("stopped by Ctrl-C") < rest.index("watch interrupted")  # drained first
    assert "step 199 done" not in rest


def _message(**calls: object) -> dict:
    return {
        "run": {"id": 7, "elapsed_s": 12.5},
        "power": [
            {
                "domain": "cpu-package",
                "provenance": "measured",
                "model": None,
                "now": 31.0,
                "idle": 6.0,
            },
            {
                "domain": "cpu-process",
                "provenance": "estimated",
                "model": "process-cpu-share",
                "now": 4.0,
                "idle": None,
            },
        ],
        "memory": [{"label": "process RSS (measured, proc:rss)", "now": 2.5e8}],
        "calls": {"total": 3, "last": None, **calls},
        "notes": ["est:cpu-package: no idle baseline, so no per-API energy estimate"],
    }


def _text(renderable: object) -> str:
    console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_a_frame_shows_each_domain_with_its_source_and_the_call_in_progress():
    text = _text(
        live_figures(_message(in_progress=[{"api": "torch.optim.SGD.step", "written": "opt.step",
                                            "elapsed_s": 0.25}]), 7, 99)
    )
    assert "run 7: watching pid 99 for 12.5 s" in text
    assert re.search(r"CPU package power\s*│\s*31.0 W \(idle 6.00 W\)\s*│ measured", text)
    assert "4.00 W (share of CPU package)" in text and "35.0 W" not in text  # never summed
    assert "torch.optim.SGD.step (opt.step) for 250 ms" in text and "250 MB" in text
    assert "no per-API energy estimate" in text
    last = {"api": "torch.Tensor.backward", "took_s": 0.5, "ago_s": 1.0}
    text = _text(live_figures(_message(last=last), 7, 99))
    assert "last call" in text and "torch.Tensor.backward took 500 ms, 1.00 s ago" in text
    waiting = _text(live_figures({**_message(), "run": {"id": 6}}, 7, 99))
    assert "waiting for the server's first figures" in waiting and "power" not in waiting
