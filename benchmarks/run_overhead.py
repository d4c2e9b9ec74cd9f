"""Wall time of `fecomlite run --repeat 1` on a ~5 s PyTorch script with a warm server, side by
side with the plain script and with the peers' trackers around the same work, rounds alternated:
CodeCarbon's OfflineEmissionsTracker, Zeus's ZeusMonitor window and carbontracker's
CarbonTracker epoch, each where it is installed in `--peers-python` and starts on this machine
(else the reason it cannot is printed and written).

The script's work is fixed (matmul steps counted once to take ~5 s here), so any slowdown of
the program itself shows. Before every command the machine is left alone for `--pause` seconds
(not timed, the same for every case), as between a user's runs: the server's rolling idle
estimate can only be of a machine it saw idle. Before the rounds, one `fecomlite run` warms
the server, the instrumented copy and the idle baseline, as a user's second run finds them.
Prints each median, its ratio to the plain script, and where each `fecomlite run` spent its
time, phase by phase (each run's, then their medians): start-up (interpreter, imports, preparing
the program, reaching the server: until the server created the run), baseline (the server's
rolling estimate, reused or measured), gate, program, tail, summary (finishing the run, the
summary, exit); each command's CPU seconds (its process tree's) and the server's CPU during a
`fecomlite run`; and what reaching a warm server costs (`ensure_server`, timed here before each
round). fecomlite runs with its bytecode cached, as an installed package has it: a
`PYTHONDONTWRITEBYTECODE` in the environment is dropped for the commands (else every fecomlite
module is compiled from source in every process, which no installed copy does: +0.07 s of CPU
in the program's start-up alone, here).

    python benchmarks/run_overhead.py [--rounds R] [--seconds S] [--pause P]
        [--peers-python PYTHON] [--json PATH]

The peers are large (pandas, scikit-learn, matplotlib): install them apart, e.g.
`python -m venv --system-site-packages /tmp/peers && /tmp/peers/bin/pip install codecarbon
zeus carbontracker`, and pass `--peers-python /tmp/peers/bin/python`.
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
from typing import Any

import _results

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

PEER = """
import runpy, sys
{setup}
try:
    sys.argv = [sys.argv[1], *sys.argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    {stop}
"""

PEERS = {  # name: (wrapper file, its source): each tracker around the whole script
    "codecarbon offline tracker": ("peer_codecarbon.py", PEER.format(
        setup="from codecarbon import OfflineEmissionsTracker\n"
              "tracker = OfflineEmissionsTracker(country_iso_code='USA', log_level='error', "
              "save_to_file=False)\ntracker.start()",
        stop="tracker.stop()")),
    "zeus ZeusMonitor window": ("peer_zeus.py", PEER.format(
        setup="from zeus.monitor import ZeusMonitor\n"
              "monitor = ZeusMonitor(approx_instant_energy=True)\n"
              "monitor.begin_window('program')",
        stop="monitor.end_window('program')")),
    "carbontracker epoch": ("peer_carbontracker.py", PEER.format(
        setup="from carbontracker.tracker import CarbonTracker\n"
              "tracker = CarbonTracker(epochs=1, monitor_epochs=1, verbose=0, log_dir=None)\n"
              "tracker.epoch_start()",
        stop="tracker.epoch_end(); tracker.stop()")),
}
RUN = "fecomlite run --repeat 1"


def wall(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int, int, float]:
    """Seconds the command took, when it began and ended (CLOCK_MONOTONIC, the server's), and
    the CPU seconds of its process tree."""
    before = os.times()
    began = time.monotonic_ns()
    subprocess.run(
        argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ended = time.monotonic_ns()
    after = os.times()
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    return (ended - began) / 1e9, began, ended, cpu


def cpu_seconds(pid: int | None) -> float:
    """A process's CPU seconds so far (all its threads'); 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def peers_that_start(
    python: str, folder: Path, script: Path, env: dict[str, str]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each peer's command where one step of the work runs under it, else why it cannot."""
    cases, skipped = {}, {}
    for name, (file, source) in PEERS.items():
        (folder / file).write_text(source)
        argv = [python, str(folder / file), str(script)]
        tried = subprocess.run([*argv, "1"], cwd=folder, env=env, capture_output=True, text=True)
        if tried.returncode == 0:
            cases[name] = [*argv]
        else:
            lines = [line for line in tried.stderr.splitlines() if line.strip()]
            skipped[name] = lines[-1] if lines else f"exit code {tried.returncode}"
            print(f"{name}: cannot run here ({skipped[name]}); its column is skipped")
    return cases, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--pause", type=float, default=6.0, help="idle seconds before each")
    parser.add_argument("--peers-python", default=sys.executable,
                        help="the interpreter the peers' trackers are installed in")
    _results.add_option(parser, "run_overhead")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fecomlite-bench-"))
    project, home = folder / "proj", folder / "home"
    project.mkdir()
    script = project / "work.py"
    script.write_text(WORK)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FECOMLITE_") and k != "PYTHONDONTWRITEBYTECODE"}
    counted = subprocess.run(
        [sys.executable, str(script), f"seconds={options.seconds}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    steps = counted.stdout.strip().splitlines()[-1]
    fecomlite_run = [sys.executable, "-m", "fecomlite.cli", "run", "--home", str(home),
                     "--repeat", "1", "--quiet", str(script), steps]
    peers, skipped = peers_that_start(options.peers_python, folder, script, env)
    cases = {"plain python": [sys.executable, str(script), steps], RUN: fecomlite_run,
             **{name: [*argv, steps] for name, argv in peers.items()}}
    try:
        server = ensure_server(home)
        wall(fecomlite_run, folder, env)  # warm: the import and bytecode caches, the baseline
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpus: dict[str, list[float]] = {name: [] for name in cases}
        spans: list[tuple[int, int, float]] = []
        reach: list[float] = []
        loads: list[float] = []
        for _ in range(options.rounds):
            for name, argv in cases.items():
                time.sleep(options.pause)
                loads.append(os.getloadavg()[0])
                if name == RUN:
                    began = time.perf_counter()
                    ensure_server(home)
                    reach.append(time.perf_counter() - began)
                served = cpu_seconds(server.pid)
                seconds, began_ns, ended_ns, cpu = wall(argv, folder, env)
                times[name].append(seconds)
                cpus[name].append(cpu)
                if name == RUN:
                    spans.append((began_ns, ended_ns, cpu_seconds(server.pid) - served))
        with Store(home / "store.sqlite") as store:
            runs = [r["id"] for r in store.runs()][1:]
            phases = [_phases(store, run, *span) for run, span in zip(runs, spans, strict=True)]
    finally:
        client = live_client(home)
        if client is not None:
            client.shutdown()
    _print_and_write(options, steps, times, cpus, phases, reach, loads, skipped)


def _print_and_write(
    options: argparse.Namespace,
    steps: str,
    times: dict[str, list[float]],
    cpus: dict[str, list[float]],
    phases: list[dict[str, Any]],
    reach: list[float],
    loads: list[float],
    skipped: dict[str, str],
) -> None:
    plain = statistics.median(times["plain python"])
    plain_cpu = statistics.median(cpus["plain python"])
    server_cpu = [p["server_cpu_s"] for p in phases]
    print(
        f"{options.rounds} rounds of {steps} steps, {options.pause:g} s idle before each "
        f"command, {os.cpu_count()} CPUs, 1-min load before the commands "
        f"{min(loads):.2f}-{max(loads):.2f} (each: "
        + " ".join(f"{x:.1f}" for x in loads) + ")"
    )
    figures: dict[str, Any] = {"steps": int(steps), "rounds": options.rounds,
                               "load_before_commands": [min(loads), max(loads)],
                               "loads_before_each": loads, "skipped": skipped, "cases": {}}
    for name, values in times.items():
        median = statistics.median(values)
        shown = ", ".join(f"{v:.2f}" for v in values)
        cpu = statistics.median(cpus[name])
        with_server = [c + s for c, s in zip(cpus[name], server_cpu, strict=True)]
        served = (f", {statistics.median(with_server):.2f} s with the server's"
                  if name == RUN else "")
        print(f"{name:<28} median {median:6.2f} s  {median / plain:5.2f}x plain  ({shown}); "
              f"CPU {cpu:.2f} s ({cpu / plain_cpu:.2f}x plain{served})")
        figures["cases"][name] = {"median_s": median, "ratio_to_plain": median / plain,
                                  "walls_s": values, "cpu_s": cpus[name],
                                  "cpu_ratio_to_plain": cpu / plain_cpu}
    for phase in phases:
        print(f"run {phase['run']}: " + ", ".join(
            f"{key} {value:.2f} s" for key, value in phase.items() if key.endswith("_s"))
            + f"; baseline: {phase['baseline']}")
    medians = {key: statistics.median(p[key] for p in phases)
               for key in phases[0] if key.endswith("_s")}
    print("phases, medians: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items())
          + f"; program - plain {medians['program_s'] - plain:+.2f} s")
    print("reaching the warm server (ensure_server): "
          + ", ".join(f"{s * 1000:.0f} ms" for s in reach))
    figures["fecomlite_phases"] = phases
    figures["fecomlite_phase_medians"] = medians
    figures["ensure_server_s"] = reach
    _results.write(options.json, "run_overhead", figures)


def _phases(
    store: Store, run: int, began_ns: int, ended_ns: int, server_cpu_s: float
) -> dict[str, Any]:
    """Where one `fecomlite run --repeat 1` spent its time, from the store's stamps and the
    command's (both CLOCK_MONOTONIC); the server's CPU seconds during the command."""
    row = store.run(run)
    (rep,) = store.repetitions(run)
    gate = json.loads(rep["gate"]) if isinstance(rep["gate"], str) else rep["gate"]
    waited = float(gate.get("waited_s", 0))
    before_program = (rep["t_start_ns"] - row["t_start_ns"]) / 1e9
    refused = (store.result(run, "rolling_idle") or {}).get("refused")
    return {
        "run": run,
        "start_up_s": (row["t_start_ns"] - began_ns) / 1e9,
        "baseline_s": before_program - waited,
        "gate_s": waited,
        "program_s": (rep["t_end_ns"] - rep["t_start_ns"]) / 1e9,
        "tail_s": (rep["tail_end_ns"] - rep["t_end_ns"]) / 1e9,
        "summary_s": (ended_ns - rep["tail_end_ns"]) / 1e9,
        "server_cpu_s": server_cpu_s,
        "baseline": described(store.result(run, "idle_baseline") or {})
        + (f" (rolling estimate refused: {refused})" if refused else ""),
    }


if __name__ == "__main__":
    main()
