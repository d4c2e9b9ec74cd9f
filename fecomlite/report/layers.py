"""The layer tree of a `--trace-layers` run: API → layer → its children, forward and backward.

Layer events are attributed like calls (`fecomlite.runtime.layers`); here each layer API row gets
`kind: "layer"`, its phase, model, path, class, parameter count and memory facts (result
"layers"), and `parent_api`: the API whose calls most often enclose its calls (the call that
drove it). The HTML tree shows inclusive and self energy over the additive domains, so a
parent's self energy is what its children's inclusive energy leaves of its own.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from fecomlite.analysis import units
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.runtime.layers import facts

FACT_FIELDS = (
    "phase",
    "model",
    "path",
    "class",
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
    """Add kind/parent_api and the layer facts to `a.apis` rows in place; notes for the report."""
    parents = parent_apis(a)
    for row in a.apis:
        parts = facts.parse(row["api"])
        if parts is None:
            continue
        known = {**parts, **(layer_facts.get(row["api"]) or {})}
        row.update({k: known.get(k) for k in FACT_FIELDS}, kind="layer")
        row["parent_api"] = parents.get(row["api"])
    return _notes(a, layer_facts)


def parent_apis(a: RunAnalysis) -> dict[str, str]:
    """Each API's most frequent enclosing API (APIs whose calls are all top-level: none)."""
    api, parent = a.calls["api"], a.calls["parent"]
    nested = parent >= 0
    pairs = Counter(zip(api[nested].tolist(), api[parent[nested]].tolist(), strict=True))
    best: dict[int, tuple[int, int]] = {}
    for (child, up), n in pairs.items():
        if child != up and n > best.get(child, (0, -1))[0]:
            best[child] = (n, up)
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


def tree(a: RunAnalysis) -> list[dict[str, Any]]:
    """Nodes for the template: the layers and the calls above them (the call that drove a layer
    and the calls enclosing that one), each with its children, most costly first."""
    parents = parent_apis(a)
    shown: set[str] = set()
    for row in a.apis:
        name = row["api"]
        while row.get("kind") == "layer" and name is not None and name not in shown:
            shown.add(name)
            name = parents.get(name)
    if not shown:
        return []
    by_parent: dict[str | None, list[dict[str, Any]]] = {}
    for row in a.apis:
        if row["api"] in shown:
            up = parents.get(row["api"])
            by_parent.setdefault(up if up in shown else None, []).append(row)
    return [_node(r, by_parent, set()) for r in _by_energy(by_parent.get(None, []))]


def _node(
    row: dict[str, Any], by_parent: dict[Any, list[dict[str, Any]]], seen: set[str]
) -> dict[str, Any]:
    seen = seen | {row["api"]}
    inclusive, own = _energy(row)
    is_layer = row.get("kind") == "layer"
    label = row["api"]
    if is_layer:
        label = f"{row.get('path')} ({row.get('class')})"
    children = [c for c in by_parent.get(row["api"], []) if c["api"] not in seen]
    return {
        "label": label,
        "phase": row.get("phase") if is_layer else "call",
        "calls": row["calls"],
        "time": units.scaled(row["total_time_s"], "s"),
        "inclusive": units.scaled(inclusive, "J"),
        "self": units.scaled(own, "J"),
        "params": f"{row['params']:,}" if is_layer and row.get("params") is not None else "",
        "saved": units.scaled(row.get("saved_bytes_max"), "B") if is_layer else "",
        "output": units.scaled(row.get("output_bytes_max"), "B") if is_layer else "",
        "compiled": bool(row.get("compiled")),
        "children": [_node(c, by_parent, seen) for c in _by_energy(children)],
    }


def _energy(row: dict[str, Any]) -> tuple[float, float]:
    """(inclusive, self) energy above idle over the additive domains."""
    cross = row.get("all_domains") or {}
    domains = cross.get("domains") or []
    own = float(np.nansum([row["energy"][d]["self_J"] for d in domains])) if domains else np.nan
    return float(cross.get("above_idle_J", np.nan)), own


def _by_energy(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: -np.nan_to_num(_energy(r)[0], nan=-1.0))
