"""The layer tree of a `--trace-layers` run: API → layer → its children, forward and backward.

Layer events are attributed like calls (`fecomlite.runtime.layers`); here each layer API row gets
`kind: "layer"`, its phase, model, path, class, driver (Keras: `fit`, `evaluate`, `predict`),
parameter count and memory facts (result "layers"), and `parent_api`: the API whose calls most
often enclose its calls (the call that drove it). The HTML tree is the calling-context tree of
the calls that ran layers, with inclusive and self energy in the domains the report's bars add
(`domains.stacked_domains`: the additive ones, or the program's own share where machine-level
figures are unreliable), so a parent's self energy is what its children's inclusive energy
leaves of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fecomlite.analysis import units
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.report.domains import described, stacked_domains
from fecomlite.runtime.layers import facts
from fecomlite.store.reads import dense_ranks, row_codes

FACT_FIELDS = (
    "phase",
    "model",
    "path",
    "class",
    "driver",
    "params",
    "saved_bytes_max",
    "output_bytes_max",
    "compiled",
    "clock",
)
GRAPH_NOTE = (
    "{model} ({cls}) ran as a compiled graph (tf.function: what keras.Model.fit, evaluate and "
    "predict compile by default) that the TensorFlow profiler could not time here (another "
    "profiler session ran, a TensorBoard callback, or XLA fused its ops): its {n} layers were "
    "seen only while the graph was traced and their energy stays in the driving call. Compile "
    "the model with run_eagerly=True to see them (eager steps are slower, so their energy is "
    "not the graph's)."
)
XLA_NOTE = (
    "{model} ({cls}) was compiled with XLA (jit_compile=True, what Keras picks by default on a "
    "GPU): each step runs as one XLA executable whose kernels carry no layer name, so its {n} "
    "layers are not timed and their energy stays in the driving call (keras.Model.fit, "
    "evaluate, predict), as one unit. Compile with jit_compile=False to see them (the step "
    "then runs without XLA's fusions, so its energy is not the XLA step's)."
)
PROFILED_NOTE = (
    "{model} ({cls}) ran as a compiled graph: {timed} of its {n} layers were timed from the "
    "TensorFlow profiler's op events grouped by layer name scope, forward and backward "
    "(gradient ops). Ops the graph optimiser fused across layers count for the layer of the "
    "op they were fused into; the loss, the optimizer and variable reads stay in the driving "
    "call."
)
COMPILED_NOTE = (
    "{site}: a torch.compile'd module, timed as one unit (its layers run inside "
    "the compiled code, where no hook can see them)."
)
KERAS_BACKWARD_NOTE = (
    "Keras layers run eagerly have forward entries only: their gradients are computed by a "
    "GradientTape, whose eager backward ops carry no layer name and pass no layer hook."
)


def annotate(a: RunAnalysis, layer_facts: dict[str, Any]) -> list[str]:
    """Add kind/parent_api and the layer facts to `a.apis` rows in place; notes for the report.
    The calls' enclosing APIs are looked up only where a row is a layer's (`--trace-layers`)."""
    layers = [(row, parts) for row in a.apis if (parts := facts.parse(row["api"])) is not None]
    parents = parent_apis(a) if layers else {}
    for row, parts in layers:
        known = {**parts, **(layer_facts.get(row["api"]) or {})}
        row.update({k: known.get(k) for k in FACT_FIELDS}, kind="layer")
        row["parent_api"] = parents.get(row["api"])
    return _notes(a, layer_facts)


def parent_apis(a: RunAnalysis) -> dict[str, str]:
    """Each API's most frequent enclosing API (APIs whose calls are all top-level: none)."""
    calls = a.call_columns()
    api, parent = calls["api"], calls["parent"]
    nested = parent >= 0
    n = len(a.api_names)
    pairs, first, counts = np.unique(api[nested] * n + api[parent[nested]], return_index=True,
                                     return_counts=True)
    best: dict[int, tuple[int, int]] = {}
    for k in np.argsort(first, kind="stable"):  # as first seen: a tie goes to the earlier
        child, up = divmod(int(pairs[k]), n)
        if child != up and counts[k] > best.get(child, (0, -1))[0]:
            best[child] = (int(counts[k]), up)
    return {a.api_names[c]: a.api_names[up] for c, (_, up) in best.items()}


def _notes(a: RunAnalysis, layer_facts: dict[str, Any]) -> list[str]:
    notes = []
    for site, fact in sorted(layer_facts.items()):
        if fact.get("phase") == "graph":
            if fact.get("timed"):
                note = PROFILED_NOTE
            else:
                note = XLA_NOTE if fact.get("xla") else GRAPH_NOTE
            notes.append(
                note.format(
                    model=fact.get("model"),
                    cls=fact.get("class"),
                    n=fact.get("traced"),
                    timed=fact.get("timed"),
                )
            )
        elif fact.get("compiled") and fact.get("phase") == "forward":
            notes.append(COMPILED_NOTE.format(site=site))
    if any(f.get("eager") for f in layer_facts.values()):
        notes.append(KERAS_BACKWARD_NOTE)
    return notes


def tree_domains(a: RunAnalysis) -> str:
    """What the tree's energy columns sum, in words."""
    return described(stacked_domains(a))


def tree(a: RunAnalysis) -> list[dict[str, Any]]:
    """Nodes for the template: the calling-context tree of the top-level calls that ran layers.
    A node is one chain of APIs from a top-level call down (the same layer under `fit` and
    under `evaluate`, or a module called inside another call of its own API, are two nodes),
    summed over the calls that ran along it, so inclusive = self + the children's inclusive on
    every row; most costly first."""
    keys = [d["domain"] for d in stacked_domains(a)]
    calls = a.call_columns()
    n = calls["api"].size
    is_layer = np.array([facts.parse(name) is not None for name in a.api_names], bool)
    if n == 0 or not is_layer.any():  # no layer ran: no node to show (and no tree to build)
        return []
    node = _context_nodes(calls["api"], calls["parent"], calls["depth"])
    energy = np.zeros(n)
    own = np.zeros(n)
    for k in keys:
        if k in calls["energy_J"]:
            energy += np.nan_to_num(calls["energy_J"][k])
            own += np.nan_to_num(calls["self_energy_J"][k])
    count = node.max() + 1
    sums = {"inclusive_J": np.bincount(node, energy, count),
            "self_J": np.bincount(node, own, count),
            "time_s": np.bincount(node, calls["duration_s"], count),
            "calls": np.bincount(node[calls["call"] == np.arange(n)], minlength=count)}
    api_of = np.zeros(count, np.int64)
    api_of[node] = calls["api"]
    up_of = np.full(count, -1)
    nested = calls["parent"] >= 0
    up_of[node[nested]] = node[calls["parent"][nested]]
    keep = np.zeros(count, bool)  # a node with a layer at or below it
    for i in np.flatnonzero(is_layer[api_of]):
        while i >= 0 and not keep[i]:
            keep[i] = True
            i = up_of[i]
    children: dict[int, list[int]] = {}
    for i in range(count):
        if up_of[i] >= 0 and keep[up_of[i]]:
            children.setdefault(int(up_of[i]), []).append(i)
    rows = {r["api"]: r for r in a.apis}
    roots = [i for i in range(count) if up_of[i] < 0 and keep[i]]

    def build(i: int) -> dict[str, Any]:
        kids = sorted(children.get(i, []), key=lambda c: -sums["inclusive_J"][c])
        return _node(rows.get(a.api_names[api_of[i]], {"api": a.api_names[api_of[i]]}),
                     {k: float(v[i]) for k, v in sums.items()}, [build(c) for c in kids])

    return [build(i) for i in sorted(roots, key=lambda r: -sums["inclusive_J"][r])]


def _context_nodes(api: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Each call's node: calls share one when their chains of APIs from the top-level call
    down are the same (numbered depth by depth, in the order of (parent's node, API))."""
    node = np.full(api.size, -1, np.int64)
    next_id = 0
    for d in range(int(depth.max()) + 1 if depth.size else 0):
        rows = np.flatnonzero(depth == d)
        up = np.where(parent[rows] >= 0, node[np.maximum(parent[rows], 0)], -1)
        distinct, inverse = dense_ranks(row_codes(up, api[rows]))
        node[rows] = next_id + inverse
        next_id += distinct
    return node


def _node(row: dict[str, Any], sums: dict[str, float],
          children: list[dict[str, Any]]) -> dict[str, Any]:
    is_layer = row.get("kind") == "layer"
    label = f"{row.get('path')} ({row.get('class')})" if is_layer else row["api"]
    return {
        "label": label,
        "phase": row.get("phase") if is_layer else "call",
        "calls": int(sums["calls"]),
        "time": units.scaled(sums["time_s"], "s"),
        "inclusive": units.scaled(sums["inclusive_J"], "J"),
        "self": units.scaled(sums["self_J"], "J"),
        "params": f"{row['params']:,}" if is_layer and row.get("params") is not None else "",
        "saved": units.scaled(row.get("saved_bytes_max"), "B") if is_layer else "",
        "output": units.scaled(row.get("output_bytes_max"), "B") if is_layer else "",
        "compiled": bool(row.get("compiled")),
        "inclusive_J": sums["inclusive_J"], "self_J": sums["self_J"],
        "children": children,
    }
