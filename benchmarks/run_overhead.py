"""Wall time of `fecomlite run --repeat 1` on a ~5 s PyTorch script with a warm server, side by
side with the plain script and (when `codecarbon` is installed) with CodeCarbon's
OfflineEmissionsTracker around the same work, rounds alternated.

The script's work is fixed (matmul steps counted once to take ~5 s here), so any slowdown of
the program itself shows. Before every command the machine is left alone for `--pause` seconds
(not timed, the same for every case), as between a user's runs: the server's rolling idle
estimate can only be of a machine it saw idle. Before the rounds, one `fecomlite run` warms
the server, the instrumented copy and the idle baseline, as a user's second run finds them.
Prints each median, its ratio to the plain script, and what the runs did (baseline: the
server's rolling estimate, reused from a run or measured; gate wait; tail; the command's time
outside the run: its start-up before the run began, the summary after it ended).

    python benchmarks/run_overhead.py [--rounds R] [--seconds S] [--pause P]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fecomlite.analysis.baseline_text import described
from fecomlite.server.client import ensure_server, live_client
from fecomlite.store import Store

WORK = """
import sys, time
import torch

torch.manual_seed(0)
x = torch.randn(384, 384)
if sys.argv[1].startswith("seconds="):  # count the steps that take that long here
    limit, steps, t0 = float(sys.argv[1][8:]), 0, time.monotonic()
    while time.monotonic() - t0 < limit:
        x = torch.tanh(torch.matmul(x, x) / 384)
        steps += 1
    print(steps)
else:
    for _ in range(int(sys.argv[1])):
        x = torch.tanh(torch.matmul(x, x) / 384)
"""

CODECARBON = """
import runpy, sys
from codecarbon import OfflineEmissionsTracker

tracker = OfflineEmissionsTracker(country_iso_code="USA", log_level="error", save_to_file=False)
tracker.start()
try:
    sys.argv = [sys.argv[1], *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    tracker.stop()
"""


def wall(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--pause", type=float, default=6.0, help="idle seconds before each")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fecomlite-bench-"))
    project, home = folder / "proj", folder / "home"
    project.mkdir()
    script = project / "work.py"
    script.write_text(WORK)
    (folder / "cc.py").write_text(CODECARBON)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    counted = subprocess.run(
        [sys.executable, str(script), f"seconds={options.seconds}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    steps = counted.stdout.strip().splitlines()[-1]
    cases = {
        "plain python": [sys.executable, str(script), steps],
        "fecomlite run --repeat 1": [
            sys.executable,
            "-m",
            "fecomlite.cli",
            "run",
            "--home",
            str(home),
            "--repeat",
            "1",
            "--quiet",
            str(script),
            steps,
        ],
    }
    try:
        import codecarbon  # noqa: F401

        cases["codecarbon offline tracker"] = [
            sys.executable,
            str(folder / "cc.py"),
            str(script),
            steps,
        ]
    except ImportError:
        print("codecarbon is not installed: its column is skipped")
    ensure_server(home)
    try:
        wall(cases["fecomlite run --repeat 1"], folder, env)  # warm: copy, baseline
        times: dict[str, list[float]] = {name: [] for name in cases}
        loads: list[float] = []
        for _ in range(options.rounds):
            for name, argv in cases.items():
                time.sleep(options.pause)
                loads.append(os.getloadavg()[0])
                times[name].append(wall(argv, folder, env))
        walls = times["fecomlite run --repeat 1"]
        with Store(home / "store.sqlite") as store:
            runs = [r["id"] for r in store.runs()][1:]
            notes = [_what_it_did(store, run, w) for run, w in zip(runs, walls, strict=True)]
    finally:
        client = live_client(home)
        if client is not None:
            client.shutdown()
    plain = statistics.median(times["plain python"])
    print(
        f"{options.rounds} rounds of {steps} steps, {options.pause:g} s idle before each "
        f"command, {os.cpu_count()} CPUs, 1-min load before the commands "
        f"{min(loads):.2f}-{max(loads):.2f}"
    )
    for name, values in times.items():
        median = statistics.median(values)
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:<28} median {median:6.2f} s  {median / plain:5.2f}x plain  ({shown})")
    for run, note in zip(runs, notes, strict=True):
        print(f"run {run}: {note}")


def _what_it_did(store: Store, run: int, wall_s: float) -> str:
    reused = "baseline: " + described(store.result(run, "idle_baseline") or {})
    refused = (store.result(run, "rolling_idle") or {}).get("refused")
    parts = [reused + (f" (rolling estimate refused: {refused})" if refused else "")]
    for rep in store.repetitions(run):
        gate = json.loads(rep["gate"]) if isinstance(rep["gate"], str) else rep["gate"]
        tail = (rep["tail_end_ns"] - rep["t_end_ns"]) / 1e9
        program = (rep["t_end_ns"] - rep["t_start_ns"]) / 1e9
        before = gate.get("readings_before_run", 0)
        parts.append(
            f"gate waited {gate.get('waited_s', 0):g} s"
            + (f" (counting {before} readings from before the run)" if before else "")
            + f", program {program:.2f} s, tail {tail:.2f} s"
        )
    row = store.run(run)
    outside = wall_s - (row["t_end_ns"] - row["t_start_ns"]) / 1e9
    parts.append(f"the command outside the run {outside:.2f} s (start-up, summary)")
    return "; ".join(parts)


if __name__ == "__main__":
    main()
