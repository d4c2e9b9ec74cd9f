"""The report's "Ranks" section: who ran where, and per API the time of each rank.

Time, not energy, shows a straggler: every rank waits for the slowest one in a collective, so
its `all_reduce` is short while the others' are long. Per API: calls and time summed over ranks,
the mean over ranks, the slowest rank (most time in that API) with its time, and the energy of
each rank's calls; per rank, the energy of its top-level calls (nested ones are inside them), in
the domains the report's bars add (`domains.stacked_domains`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fecomlite.analysis import units
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.report.domains import described, stacked_domains

MAX_ROWS = 30  # APIs shown, most time first


def rank_section(a: RunAnalysis, ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The template's context, or None for a run without ranks."""
    if not ranks:
        return None
    names = [str(r["rank"]) for r in ranks]
    rows = sorted(
        (r for r in a.apis if "rank_time" in r), key=lambda r: r["rank_time"]["sum"], reverse=True
    )
    keys = [d["domain"] for d in stacked_domains(a)]
    top = a.calls["parent"] < 0
    pid = a.calls["pid"]
    own = np.zeros(pid.size)
    for k in keys:
        own += np.nan_to_num(a.calls["energy_J"].get(k, np.zeros(pid.size)))
    per_rank = {str(r["rank"]): float(own[top & np.isin(pid, r["pids"])].sum()) for r in ranks}
    return {
        "ranks": [{**r, "pids": ", ".join(map(str, r["pids"])),
                   "energy": units.scaled(per_rank[str(r["rank"])], "J")} for r in ranks],
        "energy_domains": described(stacked_domains(a)),
        "energy_by_rank_J": per_rank,
        "names": names,
        "apis": [
            {
                "api": r["api"],
                "calls": [r["calls_by_rank"].get(n, 0) for n in names],
                "sum": units.scaled(r["rank_time"]["sum"], "s"),
                "mean": units.scaled(r["rank_time"]["mean"], "s"),
                "slowest_rank": r["rank_time"]["slowest_rank"],
                "slowest": units.scaled(r["rank_time"]["slowest"], "s"),
                "energy": [units.scaled(sum(r["energy_by_rank"].get(k, {}).get(n, 0.0)
                                            for k in keys), "J") for n in names],
            }
            for r in rows[:MAX_ROWS]
        ],
        "more": max(0, len(rows) - MAX_ROWS),
    }
