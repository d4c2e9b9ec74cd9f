"""A real instrumented run of millions of calls, end to end: `fecomlite run` of a PyTorch loop
laid out as a project is (the script in `scripts/`, its config at the project's root), then
`fecomlite report` of the stored run as a user runs it (default analysis: a run above
`run_analysis.STREAM_ABOVE` calls is streamed).

Why beside the synthetic stores of `long_training.py`: those go through the store's write path
and the HTTP ingest, not through the probe, its ring file, the sender, the server's folding and
the runner's summary; a real run measures that whole path, and the calls it stores are those a
program made. Prints the calls stored (against the calls the program counted), the run's wall
and CPU seconds with the plain script's, the server's peak RSS, the store's bytes per call, and
the report's seconds and peak RSS.

    python benchmarks/real_training_run.py [--calls 5000000] [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _folders import work_folder

TRAIN = """
import json
from pathlib import Path

import torch

config = json.loads((Path(__file__).resolve().parents[1] / "config.json").read_text())
x = torch.ones(8)
calls = 0
for step in range(config["steps"]):
    y = torch.add(x, 1.0)
    y = torch.mul(y, 0.5)
    y = torch.sub(y, 0.25)
    x = torch.clamp(y, 0.0, 10.0)
    calls += 4
print(json.dumps({"calls": calls, "x": float(x.sum())}))
"""
CALLS_PER_STEP = 4
MEASURE = ("import resource, subprocess, sys, json; subprocess.run(sys.argv[1:], check=True, "
           "stdout=subprocess.DEVNULL); u = resource.getrusage(resource.RUSAGE_CHILDREN); "
           "print(json.dumps([u.ru_maxrss * 1024, u.ru_utime + u.ru_stime]))")


def write_project(folder: Path, calls: int) -> Path:
    """The project: `scripts/train.py` reading `config.json` from the project's root."""
    (folder / "scripts").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"steps": calls // CALLS_PER_STEP}))
    script = folder / "scripts" / "train.py"
    script.write_text(TRAIN)
    return script


def measured(argv: list[str], cwd: Path | None = None,
             env: dict[str, str] | None = None) -> tuple[float, int, float]:
    """(seconds, peak RSS bytes of the largest process, CPU seconds of all: user + system) of a
    command, in a child of its own. The CPU seconds say what the wall seconds mean on a shared
    machine."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", MEASURE, *argv], check=True, cwd=cwd, env=env,
                         capture_output=True, text=True).stdout
    rss, cpu = json.loads(out.strip().splitlines()[-1])
    return time.perf_counter() - t, int(rss), float(cpu)


def peak_rss(pid: int | None) -> int:
    """A live process's peak RSS (VmHWM), bytes; 0 where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def real_run(calls: int, folder: Path) -> dict[str, Any]:
    """Run, store and report `calls` wrapped calls; the figures of each step."""
    from fecomlite.server.client import ensure_server, live_client
    from fecomlite.store import Store

    project, home = folder / "project", folder / "home"
    script = write_project(project, calls)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    plain_s, _, plain_cpu = measured([sys.executable, str(script)], project, env)
    server = ensure_server(home)
    try:
        run_s, run_rss, run_cpu = measured(
            [sys.executable, "-m", "fecomlite.cli", "run", "--home", str(home), "--repeat", "1",
             "--quiet", str(script)], project, env)
        server_rss = peak_rss(server.pid)
    finally:
        client = live_client(home)
        if client is not None:
            client.shutdown()
    store_path = home / "store.sqlite"
    with Store(store_path) as store:
        run_id = store.runs()[-1]["id"]
        stored = store.event_count(run_id)
        (rep,) = store.repetitions(run_id)
    gate = json.loads(rep["gate"]) if isinstance(rep["gate"], str) else rep["gate"] or {}
    program_s = (rep["t_end_ns"] - rep["t_start_ns"]) / 1e9
    report_s, report_rss, report_cpu = measured(
        [sys.executable, "-m", "fecomlite.cli", "report", str(run_id), "--store", str(store_path),
         "-o", str(folder / "report")], project, env)
    return {
        # the loop's calls, and torch.ones and x.sum around it
        "calls_made": calls // CALLS_PER_STEP * CALLS_PER_STEP + 2, "calls_stored": stored,
        "plain_s": plain_s, "plain_cpu_s": plain_cpu, "run_s": run_s, "run_cpu_s": run_cpu,
        "program_s": program_s, "gate_waited_s": float(gate.get("waited_s", 0.0)),
        "run_peak_rss": run_rss, "server_peak_rss": server_rss,
        "store_bytes": store_path.stat().st_size,
        "bytes_per_call": store_path.stat().st_size / max(stored, 1),
        "report_s": report_s, "report_cpu_s": report_cpu, "report_peak_rss": report_rss,
        "load": os.getloadavg()[0],
    }


def printed(row: dict[str, Any]) -> str:
    return (f"real run: {row['calls_stored']:,} of {row['calls_made']:,} calls stored; "
            f"`fecomlite run` {row['run_s']:.1f} s ({row['run_cpu_s']:.1f} s CPU, peak RSS "
            f"{row['run_peak_rss'] / 1e6:.0f} MB; the program {row['program_s']:.1f} s, the gate "
            f"waited {row['gate_waited_s']:.1f} s) against the plain script's "
            f"{row['plain_s']:.1f} s ({row['plain_cpu_s']:.1f} s CPU); server peak RSS "
            f"{row['server_peak_rss'] / 1e6:.0f} MB; store {row['bytes_per_call']:.1f} B/call "
            f"(the whole file, samples included); report {row['report_s']:.1f} s "
            f"({row['report_cpu_s']:.1f} s CPU), peak RSS {row['report_peak_rss'] / 1e6:.0f} MB; "
            f"load {row['load']:.2f} after")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5_000_000)
    parser.add_argument("--keep", type=Path, help="run here and keep the project and home")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with work_folder("fecomlite-real-run-", args.keep) as folder:
        row = real_run(args.calls, folder)
        print(printed(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
