"""Layer site keys and the facts sent with them (batch header "layers", result "layers").

A layer's site key names its model, its path in that model and its class, so two models'
`0 (Linear)` never merge: `layer:Net/encoder.layers.0.self_attn (MultiheadAttention)`; its
backward is `layer-backward:` with the same rest. A Keras layer run by `fit`, `evaluate` or
`predict` names that driving call too (`layer:sequential/dense (Dense) in evaluate`), so the same
layer's calls under three drivers are three rows, each under its own call (a validation run by
`fit` stays `in fit`). Facts per site: phase (forward | backward |
graph), model, path, class, params (parameter count, the layer's own and its children's),
saved_bytes_max (PyTorch: bytes of tensors the layer's forward kept for backward, weights not
counted — the activation memory the layer adds), output_bytes_max, compiled (a compiled unit,
timed whole), traced (Keras layers seen while a compiled step was traced), timed (of those,
the layers the TensorFlow profiler's op events timed), eager (a Keras layer called eagerly:
forward only), xla (a Keras model compiled with XLA: not profiled), clock ("cuda": PyTorch
spans timed on the GPU by CUDA events; absent: the CPU's).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

Record = Callable[..., None]  # `probe.record(site, t0, t1, raised, continues, tid)`

FORWARD = "layer:"
BACKWARD = "layer-backward:"
GRAPH = "layer-graph:"
PREFIXES = (FORWARD, BACKWARD, GRAPH)


DRIVEN = re.compile(r"(?P<key>.*\)) in (?P<driver>\w+)")  # `... (Dense) in fit`


def site_key(prefix: str, model: str, path: str, cls: str, driver: str | None = None) -> str:
    key = f"{prefix}{model}/{path} ({cls})"
    return f"{key} in {driver}" if driver else key


def driven(key: str, driver: str | None) -> str:
    """`key` (a layer site key without a driver) as run by `driver` (None: unchanged)."""
    return f"{key} in {driver}" if driver else key


def parse(key: str) -> dict[str, str] | None:
    """{phase, model, path, class} of a layer site key, and its driver where it names one;
    None for any other key."""
    for prefix, phase in ((FORWARD, "forward"), (BACKWARD, "backward"), (GRAPH, "graph")):
        if key.startswith(prefix):
            m = DRIVEN.fullmatch(key)
            rest = (m["key"] if m else key)[len(prefix) :]
            model, _, tail = rest.partition("/")
            path, _, cls = tail.rpartition(" (")
            parts = {"phase": phase, "model": model, "path": path, "class": cls.rstrip(")")}
            return {**parts, "driver": m["driver"]} if m else parts
    return None


class FactsTable:
    """Per-site facts; the sender takes the ones that changed since its last batch."""

    MAX_KEYS = ("saved_bytes_max", "output_bytes_max", "traced", "timed")

    def __init__(self) -> None:
        self._facts: dict[str, dict[str, Any]] = {}
        self._changed: set[str] = set()
        self._lock = threading.Lock()

    def update(self, site: str, **values: Any) -> None:
        """Set fixed facts, raise the `*_max` ones; cheap when nothing changes."""
        with self._lock:
            known = self._facts.get(site)
            if known is None:
                given = {k: v for k, v in values.items() if v is not None}
                self._facts[site] = {**parse(site), **given}  # type: ignore[arg-type]
                self._changed.add(site)
                return
            for name, value in values.items():
                old = known.get(name)
                if value is None or old == value:
                    continue
                if name in self.MAX_KEYS and old is not None and value <= old:
                    continue
                known[name] = value
                self._changed.add(site)

    def take_changed(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            out = {site: dict(self._facts[site]) for site in self._changed}
            self._changed.clear()
        return out


TABLE = FactsTable()


def merge(stored: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """The store's result "layers" with a batch's facts added (maxima stay maxima)."""
    for site, new in batch.items():
        if parse(str(site)) is None or not isinstance(new, dict):
            continue
        old = stored.setdefault(site, {})
        for name, value in new.items():
            if name in FactsTable.MAX_KEYS and isinstance(old.get(name), (int, float)):
                value = max(old[name], value) if isinstance(value, (int, float)) else old[name]
            old[name] = value
    return stored


def site_row(key: str) -> dict[str, Any] | None:
    """The store's site row for a layer key the manifest cannot know."""
    parts = parse(key)
    if parts is None:
        return None
    written = f"{parts['path']} ({parts['class']})"
    if parts["phase"] == "backward":
        written += " backward"
    if "driver" in parts:
        written += f" in {parts['driver']}"
    return {"api": key, "written": written, "kind": "layer"}
