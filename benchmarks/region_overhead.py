"""Nanoseconds a `fecomlite.region` adds inside a run, side by side with a probe's.

Three loops run alternately in one process, as inside `fecomlite run` (FECOMLITE_RUN set, no
server: events are spooled): the bare loop body, the body inside `with region:` (one object,
entered every iteration, the way a training loop marks its steps), the body inside the
decorator, and the body called through the probe (`__fecomlite__.call`). Prints the median added
ns per iteration of each and the region/probe ratio.

    python benchmarks/region_overhead.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import _results

os.environ.pop("FECOMLITE_URL", None)
os.environ["FECOMLITE_RUN"] = "bench"
os.environ["FECOMLITE_SPOOL"] = os.path.join(tempfile.mkdtemp(), "bench.spool")

import fecomlite  # noqa: E402 - after the environment is set
import fecomlite.runtime.probe as __fecomlite__  # noqa: E402


def step(i: int) -> int:
    return i


def bare(n: int) -> None:
    for i in range(n):
        step(i)


def with_region(n: int) -> None:
    mark = fecomlite.region("step")
    for i in range(n):
        with mark:
            step(i)


decorated_step = fecomlite.region("decorated")(step)


def decorated(n: int) -> None:
    for i in range(n):
        decorated_step(i)


def probed(n: int) -> None:
    for i in range(n):
        __fecomlite__.call("bench.py:1:0", step, i)


def alternate(loops: dict, calls: int, rounds: int) -> dict[str, list[float]]:
    """ns per iteration of each loop, round after round, so that noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(rounds):
        for name, loop in loops.items():
            start = time.perf_counter_ns()
            loop(calls)
            times[name].append((time.perf_counter_ns() - start) / calls)
        __fecomlite__.flush()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200_000)
    _results.add_option(parser, "region_overhead")
    args = parser.parse_args()
    loops = {"bare": bare, "region": with_region, "decorator": decorated, "probe": probed}
    times = alternate(loops, args.calls, args.rounds)
    added = {
        name: statistics.median(t - b for t, b in zip(times[name], times["bare"], strict=True))
        for name in ("region", "decorator", "probe")
    }
    native = "C" if __fecomlite__._native is not None else "pure Python"
    print(f"bare loop body:            {statistics.median(times['bare']):7.1f} ns")
    print(f"probe ({native} hot path):    +{added['probe']:7.1f} ns per call")
    for name, label in (("region", "region (with)"), ("decorator", "region (decorator)")):
        ratio = added[name] / added["probe"]
        print(f"{label:26s} +{added[name]:7.1f} ns per region, {ratio:4.2f}x the probe")
    print(f"({args.rounds} alternating rounds of {args.calls:,}, median; target: +300 ns or less)")
    _results.write(args.json, "region_overhead", {
        "calls": args.calls, "rounds": args.rounds, "native": native,
        "bare_ns": statistics.median(times["bare"]), "added_ns": added,
        "ratio_to_probe": {name: added[name] / added["probe"] for name in ("region", "decorator")},
        "per_iteration_ns": times})


if __name__ == "__main__":
    main()
