"""Per-API and per-site call counts and times, streamed over a run's event chunks.

Why: these figures need no sensor and no nesting, so they can be had in the memory of one chunk
however long the run (`Store.event_chunks`), where the whole-run analysis holds every call.
Each chunk gives per-group moments (count, sum, mean, sum of squared deviations) that merge
exactly with the next (Chan, Golub & LeVeque's pairwise update), in any order: chunks, processes
or stores.

Counting as the whole-run analysis does (`analysis.pieces`): a continuation (a later piece of a
layer's call) adds its time to its call, not a call. The moments are of the pieces' durations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fecomlite.runtime.batch_codec import CONTINUES, RAISED

if TYPE_CHECKING:
    from fecomlite.store import Store

NS = 1e9


@dataclass
class Moments:
    """Mergeable figures of one group's call pieces: calls (not continuations), pieces, raised
    pieces, and the pieces' durations (s) as count, mean and sum of squared deviations."""

    calls: int = 0
    pieces: int = 0
    raised: int = 0
    mean_s: float = 0.0
    m2: float = 0.0

    @property
    def total_time_s(self) -> float:
        return self.mean_s * self.pieces

    @property
    def mean_time_s(self) -> float:
        """Per call, its pieces summed (as the whole-run analysis reports it)."""
        return self.total_time_s / self.calls if self.calls else float("nan")

    @property
    def piece_variance_s2(self) -> float:
        """Sample variance of the pieces' durations."""
        return self.m2 / (self.pieces - 1) if self.pieces > 1 else float("nan")

    def merge(self, other: Moments) -> Moments:
        n = self.pieces + other.pieces
        if n == 0:
            return Moments()
        delta = other.mean_s - self.mean_s
        return Moments(
            calls=self.calls + other.calls, pieces=n, raised=self.raised + other.raised,
            mean_s=self.mean_s + delta * other.pieces / n,
            m2=self.m2 + other.m2 + delta * delta * self.pieces * other.pieces / n,
        )


def chunk_moments(group: np.ndarray, duration_s: np.ndarray,
                  status: np.ndarray) -> dict[int, Moments]:
    """Moments per group id of one chunk, vectorised."""
    if not group.size:
        return {}
    keys, idx = np.unique(group, return_inverse=True)
    idx = idx.reshape(-1)
    pieces = np.bincount(idx, minlength=keys.size)
    sums = np.bincount(idx, duration_s, keys.size)
    means = sums / pieces
    m2 = np.bincount(idx, (duration_s - means[idx]) ** 2, keys.size)
    calls = np.bincount(idx, (status & CONTINUES) == 0, keys.size)
    raised = np.bincount(idx, (status & RAISED) != 0, keys.size)
    return {int(k): Moments(int(c), int(p), int(r), float(mu), float(v)) for k, c, p, r, mu, v
            in zip(keys, calls, pieces, raised, means, m2, strict=True)}


def merge_into(total: dict[Any, Moments], part: dict[Any, Moments]) -> None:
    for key, moments in part.items():
        total[key] = total[key].merge(moments) if key in total else moments


def call_stats(store: Store, run_id: int) -> dict[str, dict[str, Moments]]:
    """{"sites": {site key: Moments}, "apis": {API: Moments}} of a run, one chunk at a time."""
    by_site: dict[int, Moments] = {}
    for chunk in store.event_chunks(run_id):
        duration = (chunk["t_end_ns"] - chunk["t_start_ns"]) / NS
        merge_into(by_site, chunk_moments(chunk["site_id"], duration, chunk["status"]))
    sites = {s["id"]: s for s in store.sites(run_id)}
    apis: dict[str, Moments] = {}
    for site_id, moments in by_site.items():
        merge_into(apis, {sites[site_id]["api"]: moments})
    return {"sites": {sites[k]["key"]: m for k, m in by_site.items()}, "apis": apis}
