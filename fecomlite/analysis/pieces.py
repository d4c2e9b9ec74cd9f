"""Calls cut in pieces: a layer's span that the runtime recorded as several events (its ops
interleaved with other layers', `runtime.layers.spans`), each after the first with the status
bit CONTINUES. Every piece is an event of its own for the attribution (they are what nests);
wherever calls are counted or averaged, a call is its first piece and the pieces after it."""

from __future__ import annotations

import numpy as np

from fecomlite.runtime.batch_codec import CONTINUES, RAISED


def call_heads(
    rep: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    site: np.ndarray,
    t0: np.ndarray,
    status: np.ndarray,
) -> np.ndarray:
    """Each event's call, as the row of its first piece (its own row for a whole call): a
    continuation joins the event before it of its site on its thread, in the repetition."""
    n = t0.size
    if not (status & CONTINUES).any():  # no call in pieces: each event is its own call
        return np.arange(n, dtype=np.int64)
    order = np.lexsort((t0, site, tid, pid, rep))
    keys = np.stack([rep[order], pid[order], tid[order], site[order]])
    new_thread = np.concatenate(([True], (np.diff(keys, axis=1) != 0).any(axis=0)))
    head = new_thread | ((status[order] & CONTINUES) == 0)
    pos = np.maximum.accumulate(np.where(head, np.arange(n), 0))
    out = np.empty(n, np.int64)
    out[order] = order[pos]
    return out


def is_call(status: np.ndarray) -> np.ndarray:
    """The events that begin a call (not continuations)."""
    return (status & CONTINUES) == 0


def call_count(status: np.ndarray) -> int:
    """How many calls the events of `status` hold (their pieces counted once)."""
    return int(is_call(status).sum())


def per_call(heads: np.ndarray, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sums of `values` over each call's pieces among the rows `idx`, in order of the calls."""
    _, which = np.unique(heads[idx], return_inverse=True)
    return np.bincount(which, weights=values[idx])


def calls_raised(heads: np.ndarray, idx: np.ndarray, status: np.ndarray) -> int:
    """Calls among the rows `idx` of which a piece raised."""
    return int(np.unique(heads[idx][(status[idx] & RAISED) != 0]).size)
