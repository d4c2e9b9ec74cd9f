"""Each GPU's energy to the calls of the processes computing on it.

Without this, the energy of `gpu:1` would be shared among every call that overlaps it in time,
rank 0's calls on `gpu:0` included. Which processes use which GPU is the device each rank's
probe names (`fecomlite.runtime.identity`: torchrun's `cuda:LOCAL_RANK` convention). CPU
package and DRAM stay shared by all calls by overlap: concurrent ranks split each interval of
the host's energy, as threads do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at


def device_owners(processes: list[dict[str, Any]]) -> dict[str, set[int]]:
    """{"gpu:N": pids computing on it, "@nodeK": pids of node K}; no GPU key when no process
    names a GPU. A merged store's domains carry their node (`gpu:0@node1`, `dram@node1`)."""
    owners: dict[str, set[int]] = {}
    for p in processes:
        if p["device"].startswith("gpu:"):
            owners.setdefault(p["device"], set()).add(p["pid"])
        owners.setdefault(f"@node{p['node']}", set()).add(p["pid"])
    return owners


def device_masks(owners: dict[str, set[int]], pid: np.ndarray) -> dict[str, np.ndarray]:
    """The same groups as boolean masks over the calls' `pid`."""
    return {key: np.isin(pid, list(pids)) for key, pids in owners.items()}


def domain_calls(masks: dict[str, np.ndarray], domain: str) -> np.ndarray | None:
    """The calls that may draw on `domain`: its GPU's processes, a merged node's processes for
    its host domains; None (all calls) otherwise."""
    if domain in masks:
        return masks[domain]
    node = domain.partition("@")[2]
    return masks.get(f"@{node}") if node else None


def attribute_calls(
    intervals: at.SensorIntervals,
    mask: np.ndarray | None,
    t_start_ns: np.ndarray,
    t_end_ns: np.ndarray,
    *,
    thread: np.ndarray,
    group: np.ndarray,
    nest: tuple[np.ndarray, np.ndarray],
    **options: Any,
) -> at.Attribution:
    """`attribution.attribute` over the calls in `mask` only (all when None); the other calls
    get no energy of this sensor and are marked not covered."""
    if mask is None:
        return at.attribute(
            intervals, t_start_ns, t_end_ns, thread=thread, group=group, nest=nest, **options
        )
    idx = np.flatnonzero(mask)
    t0, t1, th = t_start_ns[idx], t_end_ns[idx], thread[idx]
    sub = at.attribute(
        intervals, t0, t1, thread=th, group=group[idx], nest=at.nesting(t0, t1, th), **options
    )
    return _scatter(sub, idx, nest)


def _scatter(
    sub: at.Attribution, idx: np.ndarray, nest: tuple[np.ndarray, np.ndarray]
) -> at.Attribution:
    """Per-call arrays of `sub` (over calls `idx`) back onto all calls; run figures unchanged."""
    parent, depth = nest
    full: dict[str, np.ndarray] = {"parent": parent, "depth": depth}
    for f in dataclasses.fields(sub):
        value = getattr(sub, f.name)
        if f.name in full or not isinstance(value, np.ndarray) or value.shape != idx.shape:
            continue
        out = np.zeros(parent.size, dtype=value.dtype)
        out[idx] = value
        full[f.name] = out
    return dataclasses.replace(sub, **full)
