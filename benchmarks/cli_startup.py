"""Seconds from starting `fecomlite --help` (and every `fecomlite COMMAND --help`) to its exit,
side by side with a bare `python -c pass` and with the floor any typer command pays (the help of
a one-option typer command: typer, and the pydantic its parameters are parsed with), rounds
alternated so that machine noise hits all alike.

Prints the median wall time of each, and the same less the bare interpreter's start.

    python benchmarks/cli_startup.py [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import _results

from fecomlite.cli import COMMANDS

FLOOR = (  # what any typer command pays for its help: typer, and pydantic for its parameters
    "import typer\n"
    "app = typer.Typer(rich_markup_mode=None)\n"
    "@app.command()\n"
    "def main(x: int = 0) -> None: pass\n"
    "app(['--help'])\n"
)


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    _results.add_option(parser, "cli_startup")
    options = parser.parse_args()
    rounds = options.rounds
    cli = [sys.executable, "-m", "fecomlite.cli"]
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "typer floor": [sys.executable, "-c", FLOOR],
        "fecomlite --help": [*cli, "--help"],
        **{f"fecomlite {name} --help": [*cli, name, "--help"] for name in COMMANDS},
        "fecomlite server status --help": [*cli, "server", "status", "--help"],
        "fecomlite model fit --help": [*cli, "model", "fit", "--help"],
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, argv in cases.items():
            times[name].append(wall(argv))
    bare = statistics.median(times["python -c pass"])
    print(f"{rounds} rounds, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'command':<36} {'median s':>9} {'less python':>12}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<36} {median:>9.3f} {median - bare:>12.3f}")
    _results.write(options.json, "cli_startup", {
        "rounds": rounds,
        "median_s": {name: statistics.median(values) for name, values in times.items()},
        "walls_s": times})


if __name__ == "__main__":
    main()
