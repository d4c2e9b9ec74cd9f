"""A run's figures as plain JSON values and as CSV tables (one row per API or site)."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import numpy as np


def plain(value: Any) -> Any:
    """JSON-ready: numpy → Python, NaN/inf → None."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.bool_):
        return bool(value)
    return value


_ID_COLUMNS = {
    "api": ("api", "written", "sites"),
    "site": ("key", "api", "written", "file", "line", "col", "kind", "function", "source"),
}
_ENERGY_COLUMNS = ("above_idle_J", "below_zero", "total_J", "self_J", "uncertainty_J", "share",
                   "inclusive_share", "below_resolution_share", "rep_mean_J", "rep_ci95_low",
                   "rep_ci95_high", "provenance", "model", "method")
_PER_CALL_COLUMNS = ("mean", "median", "stdev", "ci95_low", "ci95_high")
_MEMORY_COLUMNS = ("rss_peak_max_B", "rss_delta_mean_B", "rss_peak_above_start_max_B",
                   "rss_transient_mean_B", "rss_below_resolution_share",
                   "rss_first_call_delta_mean_B", "gpu_mem_peak_max_B",
                   "gpu_mem_delta_mean_B", "gpu_mem_peak_above_start_max_B",
                   "gpu_mem_transient_mean_B", "gpu_mem_below_resolution_share",
                   "gpu_mem_first_call_delta_mean_B")


# calls of the row from buckets, their width; the calls kept in detail its per-call median is of
_BUCKET_COLUMNS = ("bucketed_calls", "bucket_s", "median_calls")


def table_csv(rows: list[dict[str, Any]], kind: str, mode: str) -> str:
    """One row per API / site; `run_mode` (quick or careful, `run_mode`) on every row, so that
    rough figures stay marked wherever the file goes."""
    domains = sorted({d for r in rows for d in r["energy"]})
    header = [*_ID_COLUMNS[kind], "calls", "raised", "total_time_s", "mean_time_s"]
    for d in domains:
        header += [f"{d} {c}" for c in _ENERGY_COLUMNS]
        header += [f"{d} per_call_{c}_J" for c in _PER_CALL_COLUMNS]
    header += ["all_domains_above_idle_J", "all_domains_provenance", *_MEMORY_COLUMNS,
               "run_mode"]
    bucketed = any("bucketed_calls" in r for r in rows)  # --keep: calls folded into buckets
    header += list(_BUCKET_COLUMNS) if bucketed else []
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for r in rows:
        line = [";".join(r[c]) if isinstance(r[c], list) else r[c] for c in _ID_COLUMNS[kind]]
        line += [r["calls"], r["raised"], r["total_time_s"], r["mean_time_s"]]
        for d in domains:
            e = r["energy"].get(d, {})
            line += [e.get(c, "") for c in _ENERGY_COLUMNS]
            line += [e.get("per_call", {}).get(c, "") for c in _PER_CALL_COLUMNS]
        line += [r["all_domains"]["above_idle_J"], r["all_domains"]["provenance"],
                 *(r["memory"][c] for c in _MEMORY_COLUMNS), mode]
        line += [r.get(c) for c in _BUCKET_COLUMNS] if bucketed else []
        writer.writerow(["" if isinstance(x, float) and not math.isfinite(x) else x
                         for x in line])
    return buf.getvalue()
