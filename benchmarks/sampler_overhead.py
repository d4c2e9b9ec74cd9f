"""CPU the measurement server uses while it samples, with this machine's real sensors.

Starts a server in its own process (as `fecomlite run` does), first leaves it parked (no run),
then creates a run that watches a live child process (so the 200 Hz memory reader and the
process CPU reader work too) and measures the server's CPU time over wall time in each phase.
Target: at most 2 % of one core while recording.

    python benchmarks/sampler_overhead.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from fecomlite.server.client import ensure_server
from fecomlite.store import Store

TARGET = 0.02


def cpu_share(proc: psutil.Process, seconds: float) -> float:
    """Process CPU time (user + system, all threads) per wall second over `seconds`."""
    before, t0 = proc.cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, t1 = proc.cpu_times(), time.monotonic()
    used = (after.user - before.user) + (after.system - before.system)
    return used / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

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
        time.sleep(1.0)
        recording = cpu_share(server, args.seconds)
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
    total = args.seconds + 1.0
    print(f"  {'sensor':28s} {'samples/s':>9s} {'read cost':>10s} {'read CPU':>9s}")
    for name, n in rows:
        rate, each = n / total, cost.get(name)
        shown = f"{each * 1e6:8.1f} us {rate * each * 100:8.2f} %" if each else ""
        print(f"  {name:28s} {rate:9.1f} {shown}")
    print(f"{'phase':12s} {'server CPU':>12s} {'vs target 2 %':>14s}")
    for phase, share in (("parked", parked), ("recording", recording)):
        print(f"{phase:12s} {share * 100:10.2f} % {share / TARGET:13.2f}x")


if __name__ == "__main__":
    main()
