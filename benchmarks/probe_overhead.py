"""Nanoseconds the probe adds to a wrapped call, measured side by side in one run.

A loop of `math.sqrt(i)` is instrumented with `--api math` semantics by hand (the exact call
shape the instrumenter emits) and timed against the original loop, alternating rounds so that
machine noise hits both alike. Prints the median added ns per call for the C hot path and the
pure-Python fallback, and the ratio to the bare call. The C path stamps with the TSC where it is
invariant; the same loop on its fallback clock (CLOCK_MONOTONIC) is timed too, and with its records
in a ring file (inside a run, so that a dead process's events are recovered).

The same loop through `dcall` (a call whose callee the instrumenter could not name, decided at
run time) with `math` not a root measures the pass-through path a non-framework callee takes:
target +30 ns or less with the C extension.

`--reference SO` times another build of the C probe in the same rounds (e.g. main's
`_fastprobe*.so`, built in a scratch copy), configured as this one and on the same clock; its
records are taken between loops, not sent, so compare its CPU figure (the flusher's work is not
on the calling thread's CPU) more than its wall figure.

    python benchmarks/probe_overhead.py [--calls N] [--rounds R] [--reference SO]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import math
import os
import statistics
import tempfile
import time

import _results

os.environ.pop("FECOMLITE_URL", None)  # no server: events are spooled, as a standalone run does
os.environ["FECOMLITE_SPOOL"] = os.path.join(tempfile.mkdtemp(), "bench.spool")

import fecomlite.runtime.probe as __fecomlite__  # noqa: E402 - after the environment is set
from fecomlite.runtime import event_ring  # noqa: E402


def original(n: int) -> float:
    total = 0.0
    for i in range(n):
        total += math.sqrt(i)
    return total


def instrumented(n: int) -> float:
    total = 0.0
    for i in range(n):
        total += __fecomlite__.call("bench.py:1:0", math.sqrt, i)
    return total


def python_fallback(n: int) -> float:
    total = 0.0
    for i in range(n):
        total += __fecomlite__._python_call("bench.py:2:0", math.sqrt, i)
    return total


def passed_through(n: int) -> float:
    total = 0.0
    for i in range(n):
        total += __fecomlite__.dcall("bench.py:3:0", math.sqrt, i)
    return total


def passed_through_python(n: int) -> float:
    total = 0.0
    for i in range(n):
        total += __fecomlite__._python_dcall("bench.py:4:0", math.sqrt, i)
    return total


def instrumented_monotonic(n: int) -> float:
    """The C path on its fallback clock (CLOCK_MONOTONIC), where the TSC is not invariant."""
    tsc = __fecomlite__._native.clock() == "tsc"
    __fecomlite__._native.use_tsc(False)
    try:
        return instrumented(n)
    finally:
        __fecomlite__._native.use_tsc(tsc)


_RING = event_ring.open_ring(os.environ["FECOMLITE_SPOOL"], "0" * 16, {})


def instrumented_ring(n: int) -> float:
    """The C path keeping its records in a ring file, as inside a run (`runtime.event_ring`;
    one ring for the whole benchmark, as one for a process's life)."""
    __fecomlite__._native.set_ring(_RING.map, _RING.sites_fd)
    try:
        return instrumented(n)
    finally:
        __fecomlite__._native.set_ring(None)  # what was not drained moves to memory


def reference_loop(path: str):
    """The same loop through `call` of another build of the C probe (`--reference`), its site
    past its sized calls as this one's is; and the build, whose records the caller takes."""
    loader = importlib.machinery.ExtensionFileLoader("_fastprobe", path)
    reference = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("_fastprobe", path, loader=loader))
    loader.exec_module(reference)
    reference.configure(__fecomlite__._before, __fecomlite__._after)
    reference.use_tsc(__fecomlite__._native.clock() == "tsc")
    reference.set_fast("bench.py:5:0", True)
    call = reference.call

    def referenced(n: int) -> float:
        total = 0.0
        for i in range(n):
            total += call("bench.py:5:0", math.sqrt, i)
        return total

    return referenced, reference


def per_call_ns(loop, n: int) -> tuple[float, float]:
    """Wall ns and the calling thread's CPU ns per call (the CPU time is what the probe itself
    costs, whatever the load: it leaves out time the thread was not running)."""
    start, cpu = time.perf_counter_ns(), time.thread_time_ns()
    loop(n)
    return (time.perf_counter_ns() - start) / n, (time.thread_time_ns() - cpu) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reference", metavar="SO",
                        help="another build's _fastprobe .so, timed in the same rounds")
    _results.add_option(parser, "probe_overhead")
    args = parser.parse_args()
    loops = {"original": original, "instrumented": instrumented, "python": python_fallback,
             "dcall": passed_through, "dcall_python": passed_through_python}
    if __fecomlite__._native is not None:
        loops["monotonic"] = instrumented_monotonic
        loops["ring"] = instrumented_ring
        if args.reference:
            loops["reference"], reference = reference_loop(args.reference)
    times: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, loop in loops.items():
            wall, on_cpu = per_call_ns(loop, args.calls)
            times[name].append(wall)
            cpu[name].append(on_cpu)
        __fecomlite__.flush()
        if "reference" in loops:
            reference.drain()
    base = statistics.median(times["original"])
    native = (f"C, {__fecomlite__._native.clock()}" if __fecomlite__._native is not None
              else "not built")
    print(f"original call:            {base:8.1f} ns")
    figures = {"calls": args.calls, "rounds": args.rounds, "native": native, "bare_call_ns": base,
               "reference": args.reference}
    labels = (("instrumented", f"probe ({native})"), ("monotonic", "probe (C, monotonic)"),
              ("ring", f"probe ({native}, ring file)"),
              ("reference", "reference build's probe"),
              ("python", "probe (pure Python)"), ("dcall", f"pass-through ({native})"),
              ("dcall_python", "pass-through (Python)"))
    for name, label in (item for item in labels if item[0] in times):
        added = statistics.median(
            t - o for t, o in zip(times[name], times["original"], strict=True)
        )
        added_cpu = statistics.median(t - o for t, o in zip(cpu[name], cpu["original"],
                                                             strict=True))
        ratio = statistics.median(times[name]) / base
        print(f"{label:24s}: +{added:7.1f} ns per call, {ratio:5.2f}x the bare call "
              f"(+{added_cpu:.1f} ns of the thread's CPU)")
        figures[name] = {"added_ns": added, "added_cpu_ns": added_cpu, "ratio_to_bare": ratio,
                         "per_call_ns": times[name], "per_call_cpu_ns": cpu[name]}
    print(f"load average: {os.getloadavg()[0]:.2f}")
    figures["load"] = os.getloadavg()[0]
    print(
        f"({args.rounds} alternating rounds of {args.calls:,} calls, median; "
        "the flusher thread running; targets: C probe +50 ns, C pass-through +30 ns or less)"
    )
    _results.write(args.json, "probe_overhead", figures)


if __name__ == "__main__":
    main()
