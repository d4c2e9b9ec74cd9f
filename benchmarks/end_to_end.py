"""Each sample project timed original vs instrumented (method level), side by side in one run.

The instrumented copy runs exactly as `fecomlite run` runs it: its probe posts to a live
measurement server that samples every sensor. Original and instrumented runs alternate, so
machine noise hits both alike; the figure is the median wall time of the whole program.

    python benchmarks/end_to_end.py [--rounds 3] [PROJECT ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results

from fecomlite.runner.experiment import prepare_program, program_command, program_env
from fecomlite.runner.settings import RunSettings
from fecomlite.server.client import ensure_server

PROJECTS = Path(__file__).resolve().parents[1] / "projects"


def timed(cmd: list[str], env: dict[str, str] | None, cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="*", help="project folder names (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    _results.add_option(parser, "end_to_end")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    names = args.projects or sorted(p.parent.name for p in PROJECTS.glob("*/train.py"))
    home = Path(tempfile.mkdtemp(prefix="fecomlite-e2e-"))
    client = ensure_server(home)
    settings = RunSettings(repeat=args.rounds)
    print(f"{'project':24s} {'original':>9s} {'measured':>9s} {'slowdown':>9s} {'sites':>6s}")
    try:
        for name in names:
            script = PROJECTS / name / "train.py"
            program = prepare_program(script, [], settings, home / "work", script.parent)
            run_id, token = client.create_run(
                program=str(script), argv=[], level="method", settings=settings.to_json(),
                manifest=program.manifest.get("sites", {}),
            )
            original, measured = [], []
            with tempfile.TemporaryDirectory() as cwd:
                for rep in range(1, args.rounds + 1):
                    original.append(timed([sys.executable, str(script)], None, Path(cwd)))
                    env = program_env(client, run_id, token, rep, program, False,
                                      home / f"{name}-{rep}.spool", None)
                    client.rep_start(run_id, rep)
                    measured.append(timed(program_command(program), env, Path(cwd)))
                    client.rep_end(run_id, rep, 0)
            client.finish_run(run_id, "finished", 0)
            o, m = statistics.median(original), statistics.median(measured)
            sites = len(program.manifest.get("sites", {}))
            print(f"{name:24s} {o:8.2f}s {m:8.2f}s {m / o - 1:+8.1%} {sites:6d}")
            figures[name] = {"original_s": o, "measured_s": m, "slowdown": m / o - 1,
                             "sites": sites, "originals_s": original, "measureds_s": measured}
    finally:
        client.shutdown()
    print(f"median of {args.rounds} alternating rounds; target: +5 % or less")
    _results.write(args.json, "end_to_end", {"rounds": args.rounds, "projects": figures})


if __name__ == "__main__":
    main()
