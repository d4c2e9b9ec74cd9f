"""Each benchmark's figures as JSON, so a regression shows by diffing two runs' files.

`add_option(parser, NAME)` adds `--json PATH` (default `benchmarks/results/NAME.json`, a folder
git ignores: figures depend on the machine and its load of the moment); `write(path, NAME,
figures)` writes them with the date, the machine and its load. Keys are sorted and floats kept as
measured: `diff old.json new.json` lines up figure by figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def add_option(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "--json",
        type=Path,
        default=RESULTS / f"{name}.json",
        help=f"where the figures go as JSON (default: benchmarks/results/{name}.json)",
    )


def conditions() -> dict[str, Any]:
    """The machine and its load now: beside every figure, as the figures depend on them."""
    return {
        "cpus": os.cpu_count(),
        "load_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "machine": platform.machine(),
        "python": sys.version.split()[0],
    }


def write(path: Path, name: str, figures: dict[str, Any]) -> None:
    """Write `figures` (plain JSON values) to `path`, whole or not at all."""
    record = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "conditions": conditions(),
        "figures": figures,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=2, sort_keys=True, default=_plain) + "\n")
    partial.replace(path)
    print(f"figures written to {path}")


def _plain(value: Any) -> Any:
    """numpy's scalars and arrays as JSON numbers and lists; anything else as its text."""
    return value.tolist() if hasattr(value, "tolist") else str(value)
