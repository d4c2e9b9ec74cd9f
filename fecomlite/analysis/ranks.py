"""Per-rank figures of a distributed run: who ran, and each API's calls, time and energy by rank.

A rank is all the processes that carry its RANK (the rank itself and its DataLoader workers,
across repetitions). Per API the report shows the total across ranks (the analysis' row), the
split by rank (summing to it), the mean over ranks and the slowest rank: a straggler is a rank
whose time in an API stands out from the mean.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fecomlite.analysis.pieces import is_call
from fecomlite.analysis.run_analysis import RunAnalysis

UNRANKED = "unranked"  # calls of a process that carried no rank (none under torchrun)


def rank_of_calls(processes: list[dict[str, Any]], pid: np.ndarray) -> np.ndarray:
    """Each call's rank, −1 for a process without one."""
    known = {p["pid"]: p["rank"] for p in processes}
    return np.array([known.get(p, -1) for p in pid.tolist()], dtype=np.int64)


def rank_table(processes: list[dict[str, Any]], rank: np.ndarray) -> list[dict[str, Any]]:
    """One entry per rank: rank, local_rank, node, pid (its first process), pids (every
    repetition's, and workers'), device (the GPU any of them used, else "cpu"), calls."""
    out = []
    for r in sorted({p["rank"] for p in processes}):
        mine = [p for p in processes if p["rank"] == r]
        gpus = sorted({p["device"] for p in mine if p["device"] != "cpu"})
        out.append(
            {
                "rank": r,
                "local_rank": mine[0]["local_rank"],
                "node": mine[0]["node"],
                "pid": mine[0]["pid"],
                "pids": [p["pid"] for p in mine],
                "device": ",".join(gpus) or "cpu",
                "calls": int((rank == r).sum()),
            }
        )
    return out


def by_rank(rank: np.ndarray, idx: np.ndarray, values: np.ndarray | None = None) -> dict[str, Any]:
    """{rank: count (or sum of `values`)} over the calls `idx`; JSON keys, so strings."""
    ranks = rank[idx]
    out: dict[str, Any] = {}
    for r in np.unique(ranks).tolist():
        mine = idx[ranks == r]
        key = UNRANKED if r < 0 else str(r)
        out[key] = int(mine.size) if values is None else float(values[mine].sum())
    return out


def spread(per_rank: dict[str, float]) -> dict[str, Any]:
    """sum, mean over ranks, and the slowest (largest) rank with its value."""
    if not per_rank:
        return {"sum": 0.0, "mean": 0.0, "slowest_rank": None, "slowest": 0.0}
    slowest = max(per_rank, key=per_rank.__getitem__)
    total = float(sum(per_rank.values()))
    return {
        "sum": total,
        "mean": total / len(per_rank),
        "slowest_rank": slowest,
        "slowest": per_rank[slowest],
    }


def add_rank_figures(analysis: RunAnalysis, processes: list[dict[str, Any]]) -> list[dict]:
    """Add `calls_by_rank`, `time_by_rank`, `energy_by_rank` ({domain: {rank: J}}) and
    `rank_time` (sum/mean/slowest) to each API row; returns the `ranks` table. Nothing is
    added to a run without ranks."""
    if not processes:
        return []
    calls = analysis.calls
    rank = rank_of_calls(processes, calls["pid"])
    first = is_call(calls["status"])  # a call counts at its first piece
    api_index = {name: i for i, name in enumerate(analysis.api_names)}
    for row in analysis.apis:
        idx = np.flatnonzero(calls["api"] == api_index[row["api"]])
        row["calls_by_rank"] = by_rank(rank, idx[first[idx]])
        row["time_by_rank"] = by_rank(rank, idx, calls["duration_s"])
        row["rank_time"] = spread(row["time_by_rank"])
        row["energy_by_rank"] = {
            domain: by_rank(rank, idx, energy) for domain, energy in calls["energy_J"].items()
        }
    return rank_table(processes, rank[first])
