"""A real test suite run plain and with `pytest --fecomlite` (default repetitions), side by side.

The suite is numpy's own linear-algebra tests (`numpy/linalg/tests`, shipped with numpy), copied
into a fresh project whose `[tool.fecomlite] api` names numpy: with the plugin every numpy call
in the tests is wrapped and named, each test measured. Plain and plugin runs alternate, so the
machine's noise hits both alike; printed: wall and CPU seconds (user + system, the pytest process
and its children) per run, and the median ratios. The rewrite cache is warmed by one untimed
run first (a CI job keeps `$FECOMLITE_HOME/cache` between runs, or pays it once).

    python benchmarks/pytest_plugin_overhead.py [--rounds 3] [-k EXPRESSION]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy

# numpy's slowest tests, left out: one spawns threads for 10-100 s, one a subprocess.
DEFAULT_K = "not openblas_threading and not sdot_bug and not TestCond"
PLUGIN = ["-p", "fecomlite.pytest_plugin.hooks", "--fecomlite"]


def suite(folder: Path) -> Path:
    tests = Path(numpy.__file__).parent / "linalg" / "tests"
    shutil.copytree(tests, folder / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "pyproject.toml").write_text(
        '[tool.fecomlite]\napi = ["numpy"]\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    return folder


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the children) of one pytest run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:benchmark", *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        sys.exit(f"pytest failed ({done.returncode}):\n{done.stdout[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", default=DEFAULT_K, help="pytest's -k for the suite")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fecomlite-pytest-bench-"))
    try:
        folder = suite(work / "project")
        env = {**os.environ, "FECOMLITE_HOME": str(work / "home")}
        timed(["-k", args.k, *PLUGIN], folder, env)  # warms the rewrite cache
        rows = []
        for n in range(args.rounds):
            plain = timed(["-k", args.k], folder, env)
            plugin = timed(["-k", args.k, *PLUGIN], folder, env)
            rows.append((plain, plugin))
            print(f"round {n + 1}: plain {plain[0]:.2f} s wall, {plain[1]:.2f} s CPU; "
                  f"--fecomlite {plugin[0]:.2f} s wall, {plugin[1]:.2f} s CPU; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
        wall = statistics.median(b[0] / a[0] for a, b in rows)
        cpu = statistics.median(b[1] / a[1] for a, b in rows)
        print(f"median ratio --fecomlite / plain: wall {wall:.2f}x, CPU {cpu:.2f}x "
              f"(target wall <= 1.3x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
