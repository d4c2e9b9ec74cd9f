"""CPU the measurement server uses while it samples, with this machine's real sensors.

Starts two servers in their own processes (as `fecomlite run` does): one as shipped, whose
kernel-file sensors are ticked by the C thread, and one with `FECOMLITE_SAMPLER=python`, which
reads every sensor on a Python thread. First the shipped one is left parked (no run); then each in
turn records a run that watches a live child process (so the 200 Hz memory reader and the process
CPU reader work too), alternated window by window with a bare Python loop that only sleeps 5 ms
at a time (the floor any 200 Hz Python reader pays here): on a shared VM the cost of a wake-up
swings with the neighbours, so all three see the same ones, and the medians are printed side by
side. Target: at most 2 % of one core while recording.

    python benchmarks/sampler_overhead.py [--seconds 20] [--windows 5] [--watched busy]

`--watched busy` makes the watched process look like a training loop instead of sleeping: 32
threads, and a numpy loop that allocates and frees 8 MB arrays on one core, so its RSS changes
between most ticks and the tree has many members to list (and the server shares the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import _results
import psutil

from fecomlite.server.client import ServerClient, ensure_server
from fecomlite.server.runtime import SAMPLER_ENV
from fecomlite.store import Store

TARGET = 0.02
PHASES = ("server parked", "recording, C tick thread (shipped)",
          "recording, Python sampler", "bare 200 Hz Python sleep loop")


def cpu_seconds(pid: int) -> float:
    """CPU time of every live thread of `pid`, to the nanosecond (`/proc/<pid>/task/*/schedstat`);
    the user + system times psutil reads count in 10 ms ticks, too coarse for short windows."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])  # (OSError: a thread that just ended)
    return total / 1e9


def cpu_share(proc: psutil.Process, seconds: float) -> float:
    """CPU time per wall second over `seconds` (no requests run then: no thread ends)."""
    before, t0 = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    after, t1 = cpu_seconds(proc.pid), time.monotonic()
    return (after - before) / (t1 - t0)


BARE_LOOP = "import time\nwhile True: time.sleep(0.005)"
WATCHED = {
    "sleeping": "import time; time.sleep(3600)",
    "busy": "import threading, numpy as np\n"
            "stop = threading.Event()\n"
            "for _ in range(32): threading.Thread(target=stop.wait, daemon=True).start()\n"
            "while True:\n"
            "    a = np.ones((1024, 1024)); b = a @ a; del a, b\n",
}


def bare_loop_share(seconds: float) -> float:
    """CPU share of a process that does nothing but wake up at 200 Hz."""
    loop = subprocess.Popen([sys.executable, "-c", BARE_LOOP])
    try:
        time.sleep(0.5)
        return cpu_share(psutil.Process(loop.pid), seconds)
    finally:
        loop.kill()
        loop.wait()


@contextlib.contextmanager
def server(env: dict[str, str]) -> Iterator[tuple[ServerClient, psutil.Process]]:
    """A server of its own home, started with `env` added to this environment."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        client = ensure_server(Path(tempfile.mkdtemp(prefix="fecomlite-bench-")))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield client, psutil.Process(client.pid)
    finally:
        client.shutdown()


def recording_share(client: ServerClient, proc: psutil.Process, watched: int,
                    seconds: float) -> tuple[float, int]:
    """(CPU share, run id) of a server recording a run that watches `watched`."""
    run, _ = client.create_run("bench", [], "method", {}, kind="calibration")
    client.watch(run, watched)
    time.sleep(0.5)  # the process sensors are opened and the tick thread runs
    share = cpu_share(proc, seconds)
    client.finish_run(run, "finished", 0)
    return share, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase, all windows")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--watched", choices=sorted(WATCHED), default="sleeping",
                        help="what the watched process does")
    _results.add_option(parser, "sampler_overhead")
    args = parser.parse_args()
    window = args.seconds / args.windows

    child = subprocess.Popen([sys.executable, "-c", WATCHED[args.watched]])
    shares: dict[str, list[float]] = {PHASES[1]: [], PHASES[2]: [], PHASES[3]: []}
    try:
        with server({}) as (shipped, shipped_proc), \
                server({SAMPLER_ENV: "python"}) as (python, python_proc):
            sensors = shipped.status()["sensors"]
            time.sleep(1.0)  # let start-up work settle
            parked = cpu_share(shipped_proc, args.seconds)
            began = time.monotonic()
            for _ in range(args.windows):  # alternated, so all see the same neighbours
                share, run = recording_share(shipped, shipped_proc, child.pid, window)
                shares[PHASES[1]].append(share)
                shares[PHASES[2]].append(recording_share(python, python_proc, child.pid,
                                                         window)[0])
                shares[PHASES[3]].append(bare_loop_share(window))
            with Store(shipped.store_path) as store:
                rep_s = store.run(run)["t_end_ns"] - store.run(run)["t_start_ns"]
                rows = store.db.execute(
                    "SELECT s.name, count(*) FROM samples x JOIN sensors s ON s.id=x.sensor_id "
                    "WHERE s.run_id=? GROUP BY s.name ORDER BY s.name", (run,)).fetchall()
            total = time.monotonic() - began
    finally:
        child.kill()

    print(f"sensors: {', '.join(s['name'] for s in sensors)} + the watched process's "
          f"({args.watched})")
    print(f"  {'sensor':28s} {'samples/s':>9s}")
    for name, n in rows:
        print(f"  {name:28s} {n / (rep_s / 1e9):9.1f}")
    print(f"{args.windows} windows of {window:.1f} s per phase, {total:.0f} s in all")
    print(f"{'phase':34s} {'CPU (median)':>12s} {'range':>15s} {'vs target 2 %':>14s}")
    for phase, values in ((PHASES[0], [parked]), *shares.items()):
        mid = statistics.median(values)
        span = f"{min(values) * 100:.2f}–{max(values) * 100:.2f} %"
        print(f"{phase:34s} {mid * 100:10.2f} % {span:>15s} {mid / TARGET:13.2f}x")
    bare = shares[PHASES[3]]
    for phase in PHASES[1:3]:
        ratio = statistics.median(r / b for r, b in zip(shares[phase], bare, strict=True) if b)
        print(f"{phase} / bare loop, window by window (median): {ratio:.2f}x")
    _results.write(args.json, "sampler_overhead", {
        "watched": args.watched, "windows": args.windows, "window_s": window,
        "cpu_share": {phase: values for phase, values in ((PHASES[0], [parked]), *shares.items())},
        "samples_per_s": {name: n / (rep_s / 1e9) for name, n in rows}})


if __name__ == "__main__":
    main()
