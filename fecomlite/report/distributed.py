"""The report's "Ranks" section: who ran where, and per API the time of each rank.

Time, not energy, shows a straggler: every rank waits for the slowest one in a collective, so
its `all_reduce` is short while the others' are long. Per API: calls and time summed over ranks,
the mean over ranks, and the slowest rank (most time in that API) with its time.
"""

from __future__ import annotations

from typing import Any

from fecomlite.analysis import units
from fecomlite.analysis.run_analysis import RunAnalysis

MAX_ROWS = 30  # APIs shown, most time first


def rank_section(a: RunAnalysis, ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The template's context, or None for a run without ranks."""
    if not ranks:
        return None
    names = [str(r["rank"]) for r in ranks]
    rows = sorted(
        (r for r in a.apis if "rank_time" in r), key=lambda r: r["rank_time"]["sum"], reverse=True
    )
    return {
        "ranks": [{**r, "pids": ", ".join(map(str, r["pids"]))} for r in ranks],
        "names": names,
        "apis": [
            {
                "api": r["api"],
                "calls": [r["calls_by_rank"].get(n, 0) for n in names],
                "sum": units.scaled(r["rank_time"]["sum"], "s"),
                "mean": units.scaled(r["rank_time"]["mean"], "s"),
                "slowest_rank": r["rank_time"]["slowest_rank"],
                "slowest": units.scaled(r["rank_time"]["slowest"], "s"),
            }
            for r in rows[:MAX_ROWS]
        ],
        "more": max(0, len(rows) - MAX_ROWS),
    }
