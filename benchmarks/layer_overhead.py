"""What `--trace-layers` costs: each sample project instrumented, flag off and on, side by side.

Both variants run exactly as `fecomlite run` runs them (probe posting to a live measurement
server); they alternate round by round, so machine noise hits both alike. The figures are the
median wall time and the median CPU time (user + system of the program's process: less moved
by other load on a shared machine) of the whole program and their ratios on/off, with the layer
events counted. On a Keras project with a compiled `fit` the cost is the TensorFlow profiler's.

    python benchmarks/layer_overhead.py [--rounds 3] [PROJECT ...]
    python benchmarks/layer_overhead.py --micro   # µs the hooks add per layer call

`--micro` times training steps of a small PyTorch MLP (8 modules, forward and backward) in child
processes with the hooks off and on, alternating, in CPU time of the process: the cost per
layer call, without a whole program's noise.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _results
import numpy as np
from end_to_end import PROJECTS, timed

from fecomlite.runner.experiment import prepare_program, program_command, program_env
from fecomlite.runner.settings import RunSettings
from fecomlite.runtime.layers import ENV
from fecomlite.server.client import ensure_server
from fecomlite.store import Store

DEFAULT_PROJECTS = ("torch_cnn", "torch_mlp_jit", "keras_mlp")


def cpu_s() -> float:
    """CPU seconds of the waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def layer_events(home: Path, run_id: int) -> int:
    with Store(home / "store.sqlite", create=False) as store:
        layers = [s["id"] for s in store.sites(run_id) if s["kind"] == "layer"]
        return int(np.isin(store.event_columns(run_id)["site_id"], layers).sum())


MICRO_CHILD = """
import sys, time
from fecomlite.runtime import layers
if sys.argv[1] == "1":
    layers.start(lambda *a: None, None)
import torch, torch.nn as nn
net = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.ReLU())])
x = torch.randn(32, 64)
for _ in range(50):
    net(x).sum().backward()
t = time.process_time()
for _ in range(STEPS):
    net(x).sum().backward()
print((time.process_time() - t) / STEPS)
"""
MICRO_STEPS = 2000
MICRO_LAYER_CALLS = 8 * 2  # per step: 8 modules (not the outer Sequential), forward + backward


def micro(rounds: int) -> dict[str, float]:
    code = MICRO_CHILD.replace("STEPS", str(MICRO_STEPS))
    times: dict[str, list[float]] = {"0": [], "1": []}
    for _ in range(rounds):
        for flag in times:
            out = subprocess.run([sys.executable, "-c", code, flag], capture_output=True,
                                 text=True, check=True)
            times[flag].append(float(out.stdout))
    off, on = statistics.median(times["0"]), statistics.median(times["1"])
    per_call_us = (on - off) / MICRO_LAYER_CALLS * 1e6
    print(f"MLP step (8 modules, forward+backward): off {off * 1e6:.0f} µs, on {on * 1e6:.0f} µs "
          f"({on / off - 1:+.1%}); {per_call_us:.1f} µs per layer event "
          f"(median of {rounds}, CPU time)")
    return {"step_off_s": off, "step_on_s": on, "per_layer_event_us": per_call_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="*", help="project folder names")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro", action="store_true", help="µs per layer call only")
    _results.add_option(parser, "layer_overhead")
    args = parser.parse_args()
    if args.micro:
        _results.write(args.json, "layer_overhead", {"rounds": args.rounds,
                                                      "micro": micro(args.rounds)})
        return
    figures: dict[str, dict[str, float]] = {}
    home = Path(tempfile.mkdtemp(prefix="fecomlite-layers-"))
    client = ensure_server(home)
    settings = RunSettings(repeat=args.rounds)
    print(f"{'project':16s} {'wall off':>9s} {'wall on':>9s} {'on/off':>8s} "
          f"{'cpu off':>9s} {'cpu on':>9s} {'on/off':>8s} {'layer events':>13s}")
    try:
        for name in args.projects or DEFAULT_PROJECTS:
            script = PROJECTS / name / "train.py"
            program = prepare_program(script, [], settings, home / "work", script.parent)
            runs = {}
            for flag in ("0", "1"):
                runs[flag] = client.create_run(
                    program=str(script), argv=[], level="method",
                    settings={**settings.to_json(), "trace_layers": flag == "1"},
                    manifest=program.manifest.get("sites", {}),
                )
            times: dict[str, list[float]] = {"0": [], "1": []}
            cpu: dict[str, list[float]] = {"0": [], "1": []}
            with tempfile.TemporaryDirectory() as cwd:
                for rep in range(1, args.rounds + 1):
                    for flag, (run_id, token) in runs.items():
                        env = program_env(client, run_id, token, rep, program, False,
                                          home / f"{name}-{flag}-{rep}.spool", None, {ENV: flag})
                        client.rep_start(run_id, rep)
                        before = cpu_s()
                        times[flag].append(timed(program_command(program), env,
                                                  Path(cwd)))
                        cpu[flag].append(cpu_s() - before)
                        client.rep_end(run_id, rep, 0)
            for run_id, _ in runs.values():
                client.finish_run(run_id, "finished", 0)
            off, on = statistics.median(times["0"]), statistics.median(times["1"])
            c_off, c_on = statistics.median(cpu["0"]), statistics.median(cpu["1"])
            events = layer_events(home, runs["1"][0]) // args.rounds
            print(f"{name:16s} {off:8.2f}s {on:8.2f}s {on / off - 1:+7.1%} "
                  f"{c_off:8.2f}s {c_on:8.2f}s {c_on / c_off - 1:+7.1%} {events:13,d}")
            figures[name] = {"wall_off_s": off, "wall_on_s": on, "cpu_off_s": c_off,
                             "cpu_on_s": c_on, "layer_events": events}
    finally:
        client.shutdown()
    print(f"median of {args.rounds} alternating rounds; layer events per run of the program")
    _results.write(args.json, "layer_overhead", {"rounds": args.rounds, "projects": figures})


if __name__ == "__main__":
    main()
