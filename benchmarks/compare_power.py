"""Whether `fecomlite report A B` sees a real change and only a real one (issue 30's targets):
runs of one deterministic PyTorch project, laid out as a project is (`scripts/train.py` reading
`config.json` from the root), some of identical code, one where a single API (`torch.mm`) does
1.5x the work, one with busy loops on every CPU. Every pair is compared as the CLI compares it
(`analyse_pair`, `compare_runs`) and the verdicts are counted:

- identical code: any "higher"/"lower" is a false verdict (target: none);
- the changed run against each identical one: `torch.mm` should read changed in every domain
  compared, and any other API's verdict is false (their code did not change);
- the busy run against each identical one: "not comparable: load" or no verdict, never one.

    python benchmarks/compare_power.py [--same 4] [--steps 1500] [--keep DIR]
    python benchmarks/compare_power.py --again DIR   # compare DIR's runs again, no new runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import _results
from _folders import work_folder

TRAIN = """
import json
from pathlib import Path

import torch

config = json.loads((Path(__file__).resolve().parents[1] / "config.json").read_text())
torch.manual_seed(0)
w = torch.randn(256, 256)
xm = torch.randn(config["mm_rows"], 256)
x = torch.randn(256, 256)
lin = torch.nn.Linear(256, 64)
opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
total = 0.0
for step in range(config["steps"]):
    torch.mm(xm, w)
    h = torch.tanh(torch.matmul(x, w))
    loss = lin(h).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += float(h.sum())
print(json.dumps({"steps": config["steps"], "total": round(total, 3)}))
"""
CHANGED_API = "torch.mm"
ROWS = 1024
CHANGE = 1.5
VERDICTS = ("higher", "lower")


def busy() -> None:
    """A busy loop: one CPU's worth of load."""
    while True:
        pass


def one_run(project: Path, home: Path, steps: int, rows: int, loaded: bool) -> int:
    """One `fecomlite run` of the project (3 repetitions, default careful settings; a busy run's
    gate waits 10 s, not 120 s, for a quiet that will not come); its id."""
    (project / "config.json").write_text(json.dumps({"steps": steps, "mm_rows": rows}))
    loops = [multiprocessing.Process(target=busy, daemon=True)
             for _ in range(os.cpu_count() or 1)] if loaded else []
    for p in loops:
        p.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    try:
        subprocess.run([sys.executable, "-m", "fecomlite.cli", "run", "--home", str(home),
                        "--quiet", "--format", "json",
                        *(["--gate-max-wait", "10"] if loaded else []), "scripts/train.py"],
                       cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
    finally:
        for p in loops:
            p.terminate()
            p.join()
    from fecomlite.store import Store

    with Store(home / "store.sqlite") as store:
        return int(store.runs()[-1]["id"])


def make_runs(folder: Path, same: int, steps: int) -> dict[str, list[int]]:
    """The runs, interleaved so that a drift of the machine over the experiment touches every
    kind: identical ones around the changed and the busy one."""
    from fecomlite.server.client import live_client

    project, home = folder / "project", folder / "home"
    (project / "scripts").mkdir(parents=True, exist_ok=True)
    (project / "scripts" / "train.py").write_text(TRAIN)
    plan = ["same"] * same
    plan.insert(min(2, same), "changed")
    plan.insert(min(4, len(plan)), "busy")
    runs: dict[str, list[int]] = {"same": [], "changed": [], "busy": []}
    try:
        for kind in plan:
            rows = int(ROWS * CHANGE) if kind == "changed" else ROWS
            runs[kind].append(one_run(project, home, steps, rows, kind == "busy"))
            print(f"  run {runs[kind][-1]}: {kind}", flush=True)
    finally:
        client = live_client(home)
        if client is not None:
            client.shutdown()
    (folder / "runs.json").write_text(json.dumps(runs))
    return runs


def verdicts(store: Any, a: int, b: int) -> dict[str, dict[str, str]]:
    """API → domain → the verdict of `fecomlite report a b`."""
    from fecomlite.report.compare import analyse_pair, compare_runs

    ra, rb, notes = analyse_pair(store, a, b)
    data = compare_runs(ra, rb, notes, store).json
    return {row["api"]: {d: e["verdict"] for d, e in row["energy"].items()}
            for row in data["apis"]}


def counted(folder: Path) -> dict[str, Any]:
    """Every pair's verdicts, counted by kind of pair."""
    from fecomlite.store import Store

    runs = json.loads((folder / "runs.json").read_text())
    figures: dict[str, Any] = {"runs": runs, "same": [], "changed": [], "busy": []}
    with Store(folder / "home" / "store.sqlite") as store:
        for a, b in itertools.combinations(runs["same"], 2):
            found = verdicts(store, a, b)
            false = sorted(f"{api} {d}: {v}" for api, ds in found.items() for d, v in ds.items()
                           if v in VERDICTS)
            figures["same"].append({"pair": [a, b], "compared": _compared(found),
                                    "false": false})
        for a, b in itertools.product(runs["same"], runs["changed"]):
            found = verdicts(store, a, b)
            target = found.get(CHANGED_API, {})
            figures["changed"].append({
                "pair": [a, b], "target": target,
                "detected": bool(target) and all(v == "higher" for v in target.values()
                                                 if not v.startswith("not comparable")),
                "false": sorted(f"{api} {d}: {v}" for api, ds in found.items() if api !=
                                CHANGED_API for d, v in ds.items() if v in VERDICTS)})
        for a, b in itertools.product(runs["same"], runs["busy"]):
            found = verdicts(store, a, b)
            figures["busy"].append({"pair": [a, b], "verdicts": dict(Counter(
                v for ds in found.values() for v in ds.values()))})
    return figures


def _compared(found: dict[str, dict[str, str]]) -> int:
    return sum(1 for ds in found.values() for v in ds.values()
               if v in (*VERDICTS, "within noise"))


def printed(figures: dict[str, Any]) -> list[str]:
    same, changed = figures["same"], figures["changed"]
    lines = [f"identical code: {sum(1 for p in same if not p['false'])} of {len(same)} pairs "
             f"without a verdict; {sum(len(p['false']) for p in same)} false verdicts in "
             f"{sum(p['compared'] for p in same)} (API, domain) comparisons"]
    lines += [f"  {p['pair']}: {f}" for p in same for f in p["false"]]
    lines.append(f"{CHANGED_API} at {CHANGE}x: detected in "
                 f"{sum(p['detected'] for p in changed)} of {len(changed)} pairs; other APIs' "
                 f"verdicts {sum(len(p['false']) for p in changed)}")
    lines += [f"  {p['pair']}: {CHANGED_API} {p['target']}" for p in changed]
    lines += [f"  {p['pair']}: {f}" for p in changed for f in p["false"]]
    lines += [f"busy against quiet {p['pair']}: {p['verdicts']}" for p in figures["busy"]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--same", type=int, default=4, help="runs of identical code")
    parser.add_argument("--steps", type=int, default=1500, help="training steps a repetition")
    parser.add_argument("--keep", type=Path, help="run here and keep the project and home")
    parser.add_argument("--again", type=Path, help="compare this folder's runs again")
    _results.add_option(parser, "compare_power")
    args = parser.parse_args()
    with work_folder("fecomlite-power-", args.keep, args.again) as folder:
        if args.again is None:
            make_runs(folder, args.same, args.steps)
        figures = counted(folder)
        for line in printed(figures):
            print(line)
        _results.write(args.json, "compare_power", figures)


if __name__ == "__main__":
    main()
