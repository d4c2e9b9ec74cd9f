"""What running in place costs before the program starts, side by side with the work copy.

A synthetic project (FILES modules of about 120 lines, each calling torch) is prepared the way
`fecomlite run` prepares a script now (`prepare_in_place`: every module rewritten into the
cache) and the way it did before (`work_copy`: an instrumented copy, still used for notebooks),
each cold (empty cache / no copy) and warm (unchanged project), then one file edited. Then the
start of a trivial script and of one importing torch: `python script.py` against `python -m
fecomlite.instrument.hookmain script.py` with a warm cache (the probe inert: no server).

    python benchmarks/run_in_place.py [--files 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _results

from fecomlite.runner.inplace import prepare_in_place
from fecomlite.runner.workcopy import work_copy

MODULE = """\
import torch


def block_{i}(x):
    y = torch.relu(x)
{body}
    return y
"""


def make_project(root: Path, files: int) -> Path:
    body = "\n".join(f"    y = torch.add(y, {k})\n    y = y.sum() + torch.ones(3)"
                     for k in range(55))
    for i in range(files):
        (root / f"mod{i}.py").write_text(MODULE.format(i=i, body=body))
    imports = "\n".join(f"from mod{i} import block_{i}" for i in range(files))
    (root / "main.py").write_text(f"import torch\n{imports}\nprint(block_0(torch.ones(3)))\n")
    return root / "main.py"


def seconds(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    _results.add_option(parser, "run_in_place")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        project = base / "proj"
        project.mkdir()
        script = make_project(project, args.files)
        rows = []
        for name, prepare in (
            ("in place", lambda d: prepare_in_place(script, d, [])),
            ("work copy", lambda d: work_copy(script, d, [])),
        ):
            cache = base / name.replace(" ", "-")
            cold = seconds(lambda: prepare(cache))  # noqa: B023 - called at once
            warm = statistics.median(seconds(lambda: prepare(cache)) for _ in range(args.rounds))  # noqa: B023
            (project / "mod1.py").write_text((project / "mod1.py").read_text() + "\n# edited\n")
            edited = seconds(lambda: prepare(cache))  # noqa: B023
            rows.append((name, cold, warm, edited))
        lines = sum(1 for _ in project.glob("*.py")) * 120
        print(f"{args.files + 1} modules, {lines} lines")
        print(f"{'prepare':10s} {'cold':>8s} {'warm':>8s} {'1 edit':>8s}")
        for name, cold, warm, edited in rows:
            print(f"{name:10s} {cold:7.2f}s {warm:7.3f}s {edited:7.2f}s")
        starts = {label: start_up(base, label, text, args.rounds)
                  for label, text in (("a trivial script", "print('hello')\n"),
                                      ("a script importing torch", "import torch\n"))}
    _results.write(args.json, "run_in_place", {
        "modules": args.files + 1, "lines": lines, "rounds": args.rounds,
        "prepare_s": {name: {"cold": cold, "warm": warm, "one_edit": edited}
                      for name, cold, warm, edited in rows},
        "start_s": starts})


def start_up(base: Path, label: str, text: str, rounds: int) -> dict[str, float]:
    """`python script.py` against hookmain, alternating: machine noise hits both alike."""
    script = base / f"{len(text)}.py"
    script.write_text(text)
    prepared = prepare_in_place(script, base / "start-cache", [])
    env = {**os.environ, **prepared.env, "FECOMLITE_HOME": str(base / "home")}
    commands = {
        "python": [sys.executable, str(script)],
        "hookmain": [sys.executable, "-m", "fecomlite.instrument.hookmain", str(script)],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, command in commands.items():
            times[name].append(seconds(lambda: subprocess.run(  # noqa: B023
                command, env=env, check=True, capture_output=True)))  # noqa: B023
    a, b = (statistics.median(v) for v in times.values())
    print(f"start of {label}: python {a:.3f}s, hookmain {b:.3f}s ({b - a:+.3f}s)")
    return {"python": a, "hookmain": b}


if __name__ == "__main__":
    main()
