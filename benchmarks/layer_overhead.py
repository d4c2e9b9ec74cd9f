"""What `--trace-layers` costs: each sample project instrumented, flag off and on, side by side.

Both variants run exactly as `fecomlite run` runs them (probe posting to a live measurement
server); they alternate round by round, so machine noise hits both alike. The figure is the
median wall time of the whole program and the ratio on/off, with the layer events counted.

    python benchmarks/layer_overhead.py [--rounds 3] [PROJECT ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from end_to_end import PROJECTS, timed

from fecomlite.experiment import prepare_program, program_env
from fecomlite.layers import ENV
from fecomlite.server.client import ensure_server
from fecomlite.settings import RunSettings
from fecomlite.store import Store

DEFAULT_PROJECTS = ("torch_cnn", "torch_mlp_jit", "keras_mlp")


def layer_events(home: Path, run_id: int) -> int:
    store = Store(home / "store.sqlite", create=False)
    row = store.db.execute(
        "SELECT count(*) FROM events e JOIN sites s ON s.id = e.site_id "
        "WHERE e.run_id=? AND s.kind='layer'",
        (run_id,),
    ).fetchone()
    return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="*", help="project folder names")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="fecomlite-layers-"))
    client = ensure_server(home)
    settings = RunSettings(repeat=args.rounds)
    print(f"{'project':16s} {'flag off':>9s} {'flag on':>9s} {'on/off':>8s} {'layer events':>13s}")
    try:
        for name in args.projects or DEFAULT_PROJECTS:
            script = PROJECTS / name / "train.py"
            program = prepare_program(script, [], settings, home / "work")
            runs = {}
            for flag in ("0", "1"):
                runs[flag] = client.create_run(
                    program=str(script), argv=[], level="method",
                    settings={**settings.to_json(), "trace_layers": flag == "1"},
                    manifest=program.manifest.get("sites", {}),
                )
            times: dict[str, list[float]] = {"0": [], "1": []}
            with tempfile.TemporaryDirectory() as cwd:
                for rep in range(1, args.rounds + 1):
                    for flag, (run_id, token) in runs.items():
                        env = program_env(client, run_id, token, rep, program, False,
                                          home / f"{name}-{flag}-{rep}.spool", None, {ENV: flag})
                        client.rep_start(run_id, rep)
                        times[flag].append(timed([sys.executable, str(program.script)], env,
                                                  Path(cwd)))
                        client.rep_end(run_id, rep, 0)
            for run_id, _ in runs.values():
                client.finish_run(run_id, "finished", 0)
            off, on = statistics.median(times["0"]), statistics.median(times["1"])
            events = layer_events(home, runs["1"][0]) // args.rounds
            print(f"{name:16s} {off:8.2f}s {on:8.2f}s {on / off - 1:+7.1%} {events:13,d}")
    finally:
        client.shutdown()
    print(f"median of {args.rounds} alternating rounds; layer events per run of the program")


if __name__ == "__main__":
    main()
