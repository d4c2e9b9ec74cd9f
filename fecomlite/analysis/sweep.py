"""A run's calls swept in time order, a batch of chunks at a time, with their nesting: what lets
the attribution stream over a run of any length in the memory of a few chunks.

Why: nesting (which call a call runs inside, per thread) needs every call that is still open
when a later one starts. Chunks come by repetition and earliest start (`Store.event_chunks`); a
later chunk holds no event that starts before its own first start, so every event that starts
before it is final and can be released in start order. A batch is the calls released together
plus the calls still open from earlier batches (the *carried* calls, a per-thread open-call
stack, a few per thread); `attribution.nesting` over them gives every new call its parent, which
may be a carried call. A call whose end lies at or before the next batch's first start is
*closed*: it and all its descendants are known, so its inclusive figures are final.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from fecomlite.analysis import attribution as at

BATCH_EVENTS = 1 << 18  # calls released together: large enough that numpy's per-call work
# dominates its per-batch overhead, small enough to stay ~100 MB whatever the run
COLUMNS = ("rep", "site_id", "pid", "tid", "t_start_ns", "t_end_ns", "status")


@dataclass
class Batch:
    """The carried calls (the first `carried`) and the new ones, in start order per thread:
    columns (`COLUMNS` and `thread`, a small integer per (pid, tid)), parent (index in the
    batch, −1 for a top-level call) and closed (final after this batch; the rest are carried,
    in this order, to the next)."""

    columns: dict[str, np.ndarray]
    carried: int
    parent: np.ndarray
    closed: np.ndarray

    @property
    def size(self) -> int:
        return int(self.parent.size)

    @property
    def new(self) -> np.ndarray:
        """Mask of the calls released in this batch."""
        out = np.zeros(self.size, bool)
        out[self.carried:] = True
        return out


class Threads:
    """One small integer per (pid, tid) seen, stable over the sweep; `main_tid` moves a
    project-level `<program>` event onto its process's main thread (as the whole-run
    analysis does): {(rep, pid): tid}, applied to the events of `program_sites`."""

    def __init__(self, program_sites: Iterable[int] = (),
                 main_tid: dict[tuple[int, int], int] | None = None) -> None:
        self.codes: dict[tuple[int, int], int] = {}
        self.program_sites = np.array(sorted(program_sites), np.int64)
        self.main_tid = main_tid or {}

    def __call__(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        tid = cols["tid"]
        if self.program_sites.size and self.main_tid:
            program = np.isin(cols["site_id"], self.program_sites)
            if program.any():
                tid = tid.copy()
                for i in np.flatnonzero(program):
                    key = (int(cols["rep"][i]), int(cols["pid"][i]))
                    tid[i] = self.main_tid.get(key, tid[i])
        out = np.empty(tid.size, np.int64)
        pid = cols["pid"]
        if not tid.size:
            return out
        # a few (process, thread) pairs: picked out one by one, no sort; the first over the
        # whole batch without copying it
        p, t = int(pid[0]), int(tid[0])
        mine = (tid == t) & (pid == p)
        out[mine] = self.codes.setdefault((p, t), len(self.codes))
        left = np.flatnonzero(~mine)
        while left.size:
            if len(self.codes) > 64:  # many threads: one sort instead
                return self._sorted(pid, tid, out, left)
            p, t = int(pid[left[0]]), int(tid[left[0]])
            mine = (tid[left] == t) & (pid[left] == p)
            out[left[mine]] = self.codes.setdefault((p, t), len(self.codes))
            left = left[~mine]
        return out

    def _sorted(self, pid: np.ndarray, tid: np.ndarray, out: np.ndarray,
                left: np.ndarray) -> np.ndarray:
        from fecomlite.store.reads import distinct_pairs

        pairs, which = distinct_pairs(pid[left], tid[left])
        codes = np.array([self.codes.setdefault((int(p), int(t)), len(self.codes))
                          for p, t in pairs.tolist()], np.int64)
        out[left] = codes[which]
        return out


def _concat(parts: list[dict[str, np.ndarray]], names: Iterable[str]) -> dict[str, np.ndarray]:
    return {c: np.concatenate([p[c] for p in parts]) for c in names}


def _take(cols: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    return {c: v[idx] for c, v in cols.items()}


def released(chunks: Iterable[dict[str, np.ndarray]],
             batch_events: int = BATCH_EVENTS) -> Iterator[tuple[dict[str, np.ndarray], float]]:
    """(events, watermark) in (repetition, start) order, ties in the order read: each batch holds
    every event of its repetition that starts before the watermark not released before (+inf at
    a repetition's end)."""
    pending: list[dict[str, np.ndarray]] = []
    count, rep = 0, None
    for chunk in chunks:
        if not chunk["t_start_ns"].size:
            continue
        chunk_rep, first = int(chunk["rep"][0]), int(chunk["t_start_ns"][0])
        if rep is not None and chunk_rep != rep:
            yield from _release(pending, np.inf)
            pending, count = [], 0
        rep = chunk_rep
        if count >= batch_events:  # nothing read later starts before this chunk's first start
            pending, count = yield from _release_before(pending, first)
        pending.append({c: chunk[c] for c in COLUMNS})
        count += chunk["t_start_ns"].size
    if pending:
        yield from _release(pending, np.inf)


def _by_start(pending: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The pending chunks' events as one set of columns, by start (ties as read). Each chunk is
    by start already and few events start before an earlier chunk's last: only those move."""
    cols = _concat(pending, COLUMNS)  # fresh arrays: reordered in place
    order = np.argsort(cols["t_start_ns"], kind="stable")
    moved = np.flatnonzero(order != np.arange(order.size))
    if moved.size > order.size // 4:
        return _take(cols, order)
    source = order[moved]
    for values in cols.values():
        values[moved] = values[source]  # the right side is gathered first
    return cols


def _release(pending: list[dict[str, np.ndarray]],
             watermark: float) -> Iterator[tuple[dict[str, np.ndarray], float]]:
    yield _by_start(pending), watermark


def _release_before(
    pending: list[dict[str, np.ndarray]], watermark: int
) -> Iterator[tuple[dict[str, np.ndarray], float]]:
    cols = _by_start(pending)
    cut = int(np.searchsorted(cols["t_start_ns"], watermark, "left"))
    if cut:
        yield {c: v[:cut] for c, v in cols.items()}, float(watermark)
    rest = {c: v[cut:] for c, v in cols.items()}
    return [rest], int(rest["t_start_ns"].size)


def batches(chunks: Iterable[dict[str, np.ndarray]], threads: Threads,
            batch_events: int = BATCH_EVENTS) -> Iterator[Batch]:
    """The run's calls as `Batch`es, each call released once and carried while open."""
    carried: dict[str, np.ndarray] | None = None
    for events, watermark in released(chunks, batch_events):
        events["thread"] = threads(events)
        cols = events if carried is None else {
            c: np.concatenate((carried[c], events[c])) for c in events}
        n_carried = 0 if carried is None else int(carried["t_start_ns"].size)
        parent, _ = at.nesting(cols["t_start_ns"], cols["t_end_ns"], cols["thread"])
        closed = np.maximum(cols["t_end_ns"], cols["t_start_ns"]) <= watermark
        yield Batch(cols, n_carried, parent, closed)
        carried = _take(cols, np.flatnonzero(~closed)) if not closed.all() else None
