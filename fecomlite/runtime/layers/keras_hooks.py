"""Keras 3 (TensorFlow backend): every layer call timed by wrapping `keras.layers.Layer.__call__`.

Only calls that run eagerly are timed: a custom training loop, `predict`/`fit` of a model
compiled with `run_eagerly=True`. A step compiled by `tf.function` (what `fit` does by default)
runs the layers' Python once, while tracing, and then as one graph: the wrapper counts the layers
it saw traced (`layer-graph:` facts, never an event) so the report can say that `fit`'s layers
could not be seen one by one. Keras computes gradients with a `GradientTape` inside `train_step`,
which no layer hook sees: Keras layers have no backward entries. Under the PyTorch backend Keras
layers are `torch.nn.Module`s and the PyTorch hooks time them, so nothing is wrapped here.
"""

from __future__ import annotations

import functools
import threading
from time import monotonic_ns as _now
from typing import Any

from fecomlite.runtime.capture import nbytes_of, safely
from fecomlite.runtime.layers import facts
from fecomlite.runtime.layers.facts import Record


class KerasTracer:
    def __init__(self, keras: Any, record: Record, sync: Any) -> None:
        self.keras = keras
        self.record = record
        self.sync = sync
        self.local = threading.local()
        self.params: dict[int, int] = {}
        self.traced: dict[str, set[int]] = {}

    def install(self) -> None:
        if self.keras.backend.backend() != "tensorflow":
            return
        import tensorflow as tf  # the backend imported it already

        self.eager = tf.executing_eagerly
        self.symbolic_type = self.keras.KerasTensor
        layer_type = self.keras.layers.Layer
        original = layer_type.__call__

        @functools.wraps(original)
        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            return self.call(original, layer, args, kwargs)

        layer_type.__call__ = __call__

    def call(self, original: Any, layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`original(layer, *args, **kwargs)`, timed when eager and not the outermost layer."""
        stack = self._stack()
        frame = safely(self._open, stack, layer, args, kwargs)
        if frame is None:
            return original(layer, *args, **kwargs)
        t0 = _now()
        try:
            result = original(layer, *args, **kwargs)
        except BaseException:
            safely(self._close, stack, frame, t0, None, True)
            raise
        safely(self._close, stack, frame, t0, result, False)
        return result

    def _stack(self) -> list[tuple[Any, str, str, bool]]:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def _open(
        self,
        stack: list[tuple[Any, str, str, bool]],
        layer: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[Any, ...] | None:
        if self._symbolic(args, kwargs):  # building a functional model: nothing runs
            return None
        eager = bool(self.eager())
        if stack:
            _, model, parent_path, _ = stack[-1]
            path = f"{parent_path}/{layer.name}" if parent_path else layer.name
        else:
            model, path = layer.name, ""
        frame = (layer, model, path, eager)
        if not eager and stack:
            seen = self.traced.setdefault(model, set())
            seen.add(id(layer))
            facts.TABLE.update(
                facts.site_key(facts.GRAPH, model, "", type(stack[0][0]).__name__), traced=len(seen)
            )
        if self.sync is not None and eager:
            self.sync()
        stack.append(frame)
        return frame

    def _close(
        self, stack: list[Any], frame: tuple[Any, ...], t0: int, result: Any, raised: bool
    ) -> None:
        if self.sync is not None and frame[3]:
            self.sync()
        t1 = _now()
        if stack and stack[-1] is frame:
            stack.pop()
        layer, model, path, eager = frame
        if not eager or not stack:
            return
        site = facts.site_key(facts.FORWARD, model, path, type(layer).__name__)
        self.record(site, t0, t1, raised)
        facts.TABLE.update(
            site,
            params=self._count(layer),
            output_bytes_max=None if raised else nbytes_of((result,), {}),
        )

    def _symbolic(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        for value in (*args, *kwargs.values()):
            items = value if isinstance(value, (list, tuple)) else (value,)
            if any(isinstance(v, self.symbolic_type) for v in items):
                return True
        return False

    def _count(self, layer: Any) -> int | None:
        n = self.params.get(id(layer))
        if n is None and getattr(layer, "built", False):
            n = self.params[id(layer)] = int(layer.count_params())
        return n
