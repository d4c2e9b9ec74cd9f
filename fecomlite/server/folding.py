"""Bounded storage (`fecomlite run --keep WINDOW[/BUCKET]`): the server folds the calls past the
detail window into per-site time buckets as the run goes, so that a day of training keeps a
store that grows with its hours, not with its calls.

The detail window: the first WINDOW of each repetition (start-up, first use, compilation) and its
latest WINDOW (the steady state as it is now; once the run ends, its last WINDOW) are kept call
by call. Calls between are folded, a stored batch (chunk) at a time once the whole chunk lies
between, into rows of (repetition, process, thread, site, bucket of BUCKET seconds by start)
with counts, sums and sums of squares of duration, self time and top-level time
(`fecomlite/store/call_buckets.py`). A chunk that spans a bucket or longer (one holding an
epoch's or a `fit`'s call) is never folded: it stays in detail, and the analysis finds the
folded calls inside such a call.
docs/storage.md says what the report can and cannot show of folded calls.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.analysis.attribution import nesting
from fecomlite.runtime.batch_codec import CONTINUES, RAISED
from fecomlite.store import Store, StoreError
from fecomlite.store.call_buckets import BUSY

DEFAULT_BUCKET_S = 60.0
MIN_BUCKET_S = 1.0
CHUNKS_A_ROUND = 256  # chunks folded in one transaction (~0.2 s of a process each)
NEVER = 2**62  # `top_first_ns` of a row without top-level calls (min() keeps the others')
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|min|h)?\s*$")


class KeepError(ValueError):
    """A `--keep` value fecomlite cannot read."""


@dataclass(frozen=True)
class Keep:
    """What `--keep` asked for: the detail window at each end of a repetition, the bucket
    width of the calls folded between."""

    window_s: float
    bucket_s: float = DEFAULT_BUCKET_S

    def text(self) -> str:
        return f"{_seconds(self.window_s)}/{_seconds(self.bucket_s)}"


def parse_keep(value: str | float) -> Keep:
    """`10m`, `90s`, `2h/30s` (WINDOW[/BUCKET], units s, m, h; seconds without one)."""
    text = str(value)
    window, _, bucket = text.partition("/")
    keep = Keep(_duration(window, text), _duration(bucket, text) if bucket else DEFAULT_BUCKET_S)
    if keep.bucket_s < MIN_BUCKET_S:
        raise KeepError(f"keep {text!r}: a bucket must be at least {MIN_BUCKET_S:g} s")
    if keep.window_s < keep.bucket_s:
        raise KeepError(f"keep {text!r}: the detail window must be at least one bucket "
                        f"({_seconds(keep.bucket_s)})")
    return keep


def _duration(part: str, whole: str) -> float:
    found = _DURATION.match(part)
    if not found:
        raise KeepError(f"keep {whole!r} is not WINDOW[/BUCKET] such as 10m or 2h/30s "
                        "(units s, m, h)")
    return float(found[1]) * _UNITS[found[2] or ""]


def _seconds(s: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if s >= size and s % size == 0:
            return f"{s / size:g}{unit}"
    return f"{s:g}s"


def keep_of(settings: dict[str, Any]) -> Keep | None:
    """The run's `keep` setting (stored with it), None for every call kept."""
    value = settings.get("keep")
    return parse_keep(value) if value not in (None, "") else None


@dataclass
class Folder:
    """One run's folding: what it has seen of each repetition's calls (earliest start, latest
    end), and how far it has folded. Folding runs on a thread of its own (`worker`), with its
    own store connection: a probe's post never waits for it (folding costs a few µs a call,
    storing one ~0.3 µs), and one fold at a time (`lock`)."""

    keep: Keep
    open_store: Callable[[], Store]
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    looked: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: threading.Thread | None = None

    @property
    def window_ns(self) -> int:
        return int(self.keep.window_s * 1e9)

    @property
    def width_ns(self) -> int:
        return int(self.keep.bucket_s * 1e9)

    def after_batch(self, run_id: int, rep: int, t_start: np.ndarray,
                    t_end: np.ndarray) -> None:
        """Note a stored batch's calls; once the repetition's latest end has moved a bucket
        since the last look, fold what left the window (on the worker, unless it is busy)."""
        if not t_start.size:
            return
        self.first[rep] = min(self.first.get(rep, NEVER), int(t_start.min()))
        self.last[rep] = max(self.last.get(rep, 0), int(np.maximum(t_end, t_start).max()))
        if self.last[rep] - self.looked.get(rep, 0) < self.width_ns:
            return
        if self.worker is not None and self.worker.is_alive():
            return
        self.looked[rep] = self.last[rep]
        self.worker = threading.Thread(target=self._catch_up, args=(run_id, rep), daemon=True,
                                       name=f"fecomlite-fold-{run_id}")
        self.worker.start()

    def _catch_up(self, run_id: int, rep: int) -> None:
        """Fold every chunk that has left the window; a store that refuses (busy, full) is
        tried again after a later batch: what is not folded stays in detail."""
        with self.lock, contextlib.suppress(sqlite3.Error, StoreError), \
                self.open_store() as store:
            while self._round(store, run_id, rep):
                pass

    def finish(self, run_id: int) -> None:
        """At the run's end: fold what lies between the head and the last WINDOW of every
        repetition (spooled batches ingested after the program included)."""
        if self.worker is not None:
            self.worker.join()
        with self.lock, self.open_store() as store:
            for rep, (first, last) in store.detail_span(run_id).items():
                self.first[rep] = min(self.first.get(rep, NEVER), first)
                self.last[rep] = max(self.last.get(rep, 0), last)
                while self._round(store, run_id, rep):
                    pass

    def _round(self, store: Store, run_id: int, rep: int) -> bool:
        """Fold up to CHUNKS_A_ROUND chunks of the repetition; whether it folded any."""
        after = self.first[rep] + self.window_ns
        before = self.last[rep] - self.window_ns
        if before <= after:
            return False
        chunks = store.foldable_chunks(run_id, rep, after, before, self.width_ns,
                                       CHUNKS_A_ROUND)
        if not chunks:
            return False
        rows = summarise([c for _, c in chunks], self.width_ns)
        return store.fold(run_id, [i for i, _ in chunks], rows)


def summarise(chunks: list[dict[str, np.ndarray]], width_ns: int) -> list[tuple[Any, ...]]:
    """The bucket rows (`call_buckets.KEY` + `FIGURES`) of some chunks' calls. Nesting is found
    among the folded calls of each thread: a call's self time leaves out its folded children's,
    and a call with no folded parent is top-level here (its parent, if any, is a long call kept
    in detail, or was folded in another round)."""
    cols = {c: np.concatenate([ch[c] for ch in chunks]) for c in chunks[0]}
    t0 = cols["t_start_ns"]
    t1 = np.maximum(cols["t_end_ns"], t0)
    dur = t1 - t0
    pid, tid = _codes(cols["pid"]), _codes(cols["tid"])
    thread = pid[1] * tid[0].size + tid[1]
    parent, _ = nesting(t0, t1, thread)
    inner = parent >= 0
    child_ns = np.bincount(parent[inner], dur[inner], minlength=dur.size)
    top = ~inner
    bucket = t0 // width_ns
    groups, row = _groups([_codes(cols["rep"]), pid, tid, _codes(cols["site_id"]),
                           _codes(bucket - bucket.min())])
    n = row.max() + 1
    status = cols["status"]

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(row, values, n)

    first = np.full(n, NEVER, np.int64)
    last = np.zeros(n, np.int64)
    np.minimum.at(first, row[top], t0[top])
    np.maximum.at(last, row[top], t1[top])
    key = [groups[0], groups[1], groups[2], groups[3], (groups[4] + bucket.min()) * width_ns,
           np.full(n, width_ns)]
    exact = [total((status & CONTINUES) == 0), np.bincount(row, minlength=n),
             total((status & RAISED) != 0), total(dur.astype(float))]
    more = [total((dur - child_ns).astype(float)), total(np.where(top, dur, 0).astype(float)),
            first, last]
    columns = ([np.asarray(k, np.int64).tolist() for k in key]
               + [np.rint(f).astype(np.int64).tolist() for f in exact]
               + [total((dur / 1e9) ** 2).tolist()]
               + [np.rint(f).astype(np.int64).tolist() for f in more])
    return list(zip(*columns, strict=True)) + _busy_rows(cols["rep"], t0, t1, width_ns)


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values, each value's index into them)."""
    distinct, index = np.unique(values, return_inverse=True)
    return distinct, index.reshape(-1)


def _groups(keys: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct combinations of several coded columns (each their values for the groups)
    and each row's group: one number per combination, counted without a sort when they fit."""
    combined = np.zeros(keys[0][1].size, np.int64)
    for distinct, index in keys:
        combined = combined * distinct.size + index
    size = int(np.prod([d.size for d, _ in keys]))
    if size <= 1 << 22:
        present = np.flatnonzero(np.bincount(combined, minlength=size))
        lookup = np.zeros(size, np.int64)
        lookup[present] = np.arange(present.size)
        row = lookup[combined]
    else:
        present, row = np.unique(combined, return_inverse=True)
        row = row.reshape(-1)
    values = []
    for distinct, _ in reversed(keys):
        values.append(distinct[present % distinct.size])
        present = present // distinct.size
    return values[::-1], row


def _busy_rows(rep: np.ndarray, t0: np.ndarray, t1: np.ndarray, width_ns: int
               ) -> list[tuple[Any, ...]]:
    """Per repetition and bucket, the time some folded call of any thread ran (their union, cut
    at the buckets' edges): the program's time between calls is what is left of the window.
    Stored as `call_buckets.BUSY` rows, their union in `top_ns`."""
    out = []
    for r in np.unique(rep).tolist():
        mine = rep == r
        a, b = t0[mine], t1[mine]
        order = np.argsort(a, kind="stable")
        a, b = a[order], np.maximum.accumulate(b[order])
        new = np.concatenate(([True], a[1:] > b[:-1]))
        seg = np.flatnonzero(new)
        starts, ends = a[seg], np.concatenate((b[seg[1:] - 1], b[-1:]))
        edges = np.arange(starts[0] // width_ns * width_ns, ends[-1] + width_ns, width_ns)
        before = np.concatenate(([0], np.cumsum(ends - starts)))  # busy before each segment
        i = np.searchsorted(starts, edges, "right") - 1  # the segment each edge is in or after
        j = np.maximum(i, 0)
        busy = np.diff(np.where(i >= 0, before[j] + np.minimum(edges, ends[j]) - starts[j], 0))
        out += [(r, *BUSY, int(t), width_ns, 0, 0, 0, 0, 0.0, 0, int(ns), NEVER, 0)
                for t, ns in zip(edges[:-1], busy, strict=True) if ns > 0]
    return out
