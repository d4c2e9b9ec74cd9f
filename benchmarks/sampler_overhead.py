"""CPU the measurement server uses while it samples, with this machine's real sensors.

Starts a server in its own process (as `fecomlite run` does), first leaves it parked (no run),
then creates a run that watches a live child process (so the 200 Hz memory reader and the
process CPU reader work too) and measures the server's CPU time over wall time in each phase.
On a shared VM the cost of a wake-up swings with the neighbours, so the recording phase is
measured in several windows alternated with a bare Python loop that only sleeps 5 ms at a time
(the floor any 200 Hz reader pays here), and the medians are printed side by side.
Target: at most 2 % of one core while recording.

    python benchmarks/sampler_overhead.py [--seconds 20] [--windows 5]
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
from pathlib import Path

import psutil

from fecomlite.server.client import ensure_server
from fecomlite.store import Store

TARGET = 0.02


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


def bare_loop_share(seconds: float) -> float:
    """CPU share of a process that does nothing but wake up at 200 Hz."""
    loop = subprocess.Popen([sys.executable, "-c", BARE_LOOP])
    try:
        time.sleep(0.5)
        return cpu_share(psutil.Process(loop.pid), seconds)
    finally:
        loop.kill()
        loop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase, all windows")
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    window = args.seconds / args.windows

    home = Path(tempfile.mkdtemp(prefix="fecomlite-bench-"))
    client = ensure_server(home)
    server = psutil.Process(client.pid)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        sensors = client.status()["sensors"]
        time.sleep(1.0)  # let start-up work settle
        parked = cpu_share(server, args.seconds)
        run, _ = client.create_run("bench", [], "method", {}, kind="calibration")
        watched = client.watch(run, child.pid)["sensors"]
        began = time.monotonic()
        time.sleep(1.0)
        recording, bare = [], []
        for _ in range(args.windows):  # alternated, so both see the same neighbours
            recording.append(cpu_share(server, window))
            bare.append(bare_loop_share(window))
        total = time.monotonic() - began
        client.finish_run(run, "finished", 0)
        with Store(client.store_path) as store:
            rows = store.db.execute(
                "SELECT s.name, count(*) FROM samples x JOIN sensors s ON s.id=x.sensor_id "
                "WHERE s.run_id=? GROUP BY s.name ORDER BY s.name", (run,)).fetchall()
    finally:
        child.kill()
        client.shutdown()

    print(f"sensors: {', '.join(s['name'] for s in sensors)} + process: {', '.join(watched)}")
    cost = {s["name"]: s.get("read_cost_s") for s in sensors}
    print(f"  {'sensor':28s} {'samples/s':>9s} {'read cost':>10s} {'read CPU':>9s}")
    for name, n in rows:
        rate, each = n / total, cost.get(name)
        shown = f"{each * 1e6:8.1f} us {rate * each * 100:8.2f} %" if each else ""
        print(f"  {name:28s} {rate:9.1f} {shown}")
    print(f"{'phase':22s} {'CPU (median)':>12s} {'range':>15s} {'vs target 2 %':>14s}")
    for phase, shares in (("server parked", [parked]), ("server recording", recording),
                          ("bare 200 Hz sleep loop", bare)):
        mid = statistics.median(shares)
        span = f"{min(shares) * 100:.2f}–{max(shares) * 100:.2f} %"
        print(f"{phase:22s} {mid * 100:10.2f} % {span:>15s} {mid / TARGET:13.2f}x")
    ratio = statistics.median(r / b for r, b in zip(recording, bare, strict=True) if b > 0)
    print(f"recording / bare loop, window by window (median): {ratio:.2f}x")


if __name__ == "__main__":
    main()
