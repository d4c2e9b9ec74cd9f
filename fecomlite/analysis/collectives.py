"""Collective communication in the report: `kind: "collective"` and the call that launched it.

Two sources: the program's own `torch.distributed` collectives (wrapped calls like any other,
`parent_api` from nesting on their thread), and DDP's bucketed all-reduce (`comm_hooks`),
recorded on the thread that completed it. For those, `parent_api` is the call that launched
them: the innermost call of another thread of the same process (not a layer, not a collective)
that was running when the bucket's span began (`torch.Tensor.backward`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from fecomlite.analysis.run_analysis import RunAnalysis

KIND = "collective"
TORCH_COLLECTIVES = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
        "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
        "gather", "gather_object", "irecv", "isend", "monitored_barrier", "recv", "reduce",
        "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
    }
)  # fmt: skip
NOT_LAUNCHERS = ("layer", KIND)


def is_collective(api: str, kind: str | None) -> bool:
    if kind == KIND:
        return True
    module, _, name = api.rpartition(".")
    return module == "torch.distributed" and name in TORCH_COLLECTIVES


def annotate(a: RunAnalysis) -> None:
    """`kind: "collective"` and `parent_api` on the collectives' API rows (in place)."""
    kinds = {s["api"]: s.get("kind") for s in a.sites}
    collective = np.array([is_collective(n, kinds.get(n)) for n in a.api_names], bool)
    if not collective.any():
        return
    skip = collective | np.array([kinds.get(n) == "layer" for n in a.api_names], bool)
    calls = a.calls
    launcher = _launchers(calls, collective[calls["api"]], skip)
    for row in a.apis:
        k = a.api_names.index(row["api"])
        if not collective[k]:
            continue
        found = launcher[calls["api"] == k]
        counts = Counter(found[found >= 0].tolist())
        row["kind"] = KIND
        row["parent_api"] = a.api_names[counts.most_common(1)[0][0]] if counts else None


def _launchers(calls: dict[str, Any], wanted: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """For each wanted call, the API index of the call that launched it (−1: none found): up
    from its parent on its own thread, else from the last call of its process (not a
    collective) begun before it, the first call running at its start whose API is no layer or
    collective."""
    out = np.full(wanted.size, -1, np.int64)
    pid, t0, parent = calls["pid"], calls["t_start_ns"], calls["parent"]
    others = ~wanted
    for p in np.unique(pid[wanted]).tolist():
        cand = np.flatnonzero(others & (pid == p))
        cand = cand[np.argsort(t0[cand], kind="stable")]
        for i in np.flatnonzero(wanted & (pid == p)).tolist():
            j = int(parent[i])
            if j < 0:
                pos = int(np.searchsorted(t0[cand], t0[i], side="right")) - 1
                j = int(cand[pos]) if pos >= 0 else -1
            out[i] = _up(calls, j, int(t0[i]), skip)
    return out


def _up(calls: dict[str, Any], j: int, t: int, skip: np.ndarray) -> int:
    """From call j up its parents: the API of the first one running at t that launches calls."""
    while j >= 0:
        if calls["t_start_ns"][j] <= t <= calls["t_end_ns"][j] and not skip[calls["api"][j]]:
            return int(calls["api"][j])
        j = int(calls["parent"][j])
    return -1
