"""How long attribution takes as the number of call events grows (the report must be ready in
≤ 20 s for a run of 1,000,000 events).

    python benchmarks/attribution_speed.py [N ...]

A generated hour-long run: a counter read every 4 ms that updates every 100 ms, calls on two
threads, each tenth call a parent of the nine after it, 50 APIs. Prints seconds per phase and
events per second, for each N, side by side.
"""

from __future__ import annotations

import argparse
import time

import _results
import numpy as np

from fecomlite.analysis import attribution as at

MS = 1_000_000


def generated(n: int, seconds: float = 3600.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    parents = n // 10
    span = int(seconds * 1e9)
    slot = span // parents  # one parent per slot, alternating threads, children inside it
    t0p = np.arange(parents, dtype=np.int64) * slot
    t1p = t0p + int(slot * 0.8)
    children = t0p[:, None] + (np.arange(9) * slot * 0.08).astype(np.int64)
    t0 = np.concatenate((t0p, children.ravel()))
    t1 = np.concatenate((t1p, children.ravel() + int(slot * 0.05)))
    thread = np.concatenate((np.arange(parents) % 2, np.repeat(np.arange(parents) % 2, 9)))
    reads = np.arange(-1e9, span + 1e9, 4 * MS).astype(np.int64)
    counter = np.floor(reads / (100 * MS)) * 30.0  # 300 W
    return reads, counter, t0, t1, thread, rng.integers(0, 50, t0.size)


def main(sizes: list[int]) -> dict[str, dict[str, float]]:
    figures = {}
    print(f"{'events':>10}{'intervals s':>13}{'overlap s':>11}{'auto s':>9}{'events/s':>12}")
    for n in sizes:
        reads, counter, t0, t1, thread, group = generated(n)
        start = time.perf_counter()
        iv = at.counter_intervals(reads, counter)
        t_iv = time.perf_counter() - start
        start = time.perf_counter()
        at.attribute(iv, t0, t1, idle_W=100.0, thread=thread, group=group, method="overlap")
        t_overlap = time.perf_counter() - start
        start = time.perf_counter()
        at.attribute(iv, t0, t1, idle_W=100.0, thread=thread, group=group, method="auto")
        t_auto = time.perf_counter() - start
        print(f"{t0.size:>10}{t_iv:>13.2f}{t_overlap:>11.2f}{t_auto:>9.2f}"
              f"{t0.size / t_auto:>12.0f}")
        figures[str(t0.size)] = {"intervals_s": t_iv, "overlap_s": t_overlap, "auto_s": t_auto}
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[10_000, 100_000, 1_000_000])
    _results.add_option(parser, "attribution_speed")
    options = parser.parse_args()
    _results.write(options.json, "attribution_speed", {"events": main(options.sizes)})
