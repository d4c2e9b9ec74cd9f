"""Keras 3 (TensorFlow backend): layer calls timed by wrapping `keras.layers.Layer.__call__`,
and the layers of compiled steps from the TensorFlow profiler (`tf_graph`).

Eager calls (a custom training loop, `fit`/`predict` of a model compiled with
`run_eagerly=True`) are timed by the wrapper itself, forward only: Keras computes gradients with a
`GradientTape`, whose eager backward ops carry no layer name and pass no layer hook. A step
compiled by `tf.function` (what `fit`, `evaluate` and `predict` do by default) runs the layers'
Python once, while tracing: the wrapper then notes each layer's name scope, and
`keras.Model.fit`/`evaluate`/`predict` are wrapped to profile the run and turn its ops into
forward and backward layer spans (not under XLA, `jit_compile=True`: the step is one executable
whose kernels carry no layer name, so it is not profiled). A layer's spans name the outermost
driving call that ran them (`... in fit`; the validation `fit` runs is `fit`'s): the same
layer under `fit`, `evaluate` and `predict` is three sites. Layers traced but never timed are
counted (`layer-graph:` facts, never an event) so the report can say what could not be seen.
Under the PyTorch backend Keras layers are `torch.nn.Module`s and the PyTorch hooks time them,
so nothing is wrapped here.
"""

from __future__ import annotations

import functools
import re
import threading
from time import monotonic_ns as _now
from typing import Any

from fecomlite.runtime.capture import nbytes_of, safely
from fecomlite.runtime.layers import facts
from fecomlite.runtime.layers.facts import Record
from fecomlite.runtime.layers.tf_graph import GraphProfiler, Scopes

PROFILED = ("fit", "evaluate", "predict")  # the calls that compile a step by default
STEP_MAKERS = ("make_train_function", "make_test_function", "make_predict_function")


class KerasTracer:
    def __init__(self, keras: Any, record: Record, sync: Any) -> None:
        self.keras = keras
        self.record = record
        self.sync = sync
        self.local = threading.local()
        self.params: dict[int, int] = {}
        self.traced: dict[str, set[int]] = {}
        self.graph_keys: dict[str, str] = {}  # model -> its `layer-graph:` facts key
        self.timed: dict[str, set[str]] = {}  # model -> layers timed from the profiler
        self.scopes = Scopes()
        self.graph = GraphProfiler(self.scopes)
        self.profiling = threading.local()
        self.driving = threading.local()  # .name: the outermost fit/evaluate/predict running

    def install(self) -> None:
        if self.keras.backend.backend() != "tensorflow":
            return
        import tensorflow as tf  # the backend imported it already

        self.eager = tf.executing_eagerly
        self.name_scope = tf.get_current_name_scope
        self.symbolic_type = self.keras.KerasTensor
        self.callback_types = (self.keras.callbacks.TensorBoard,)
        layer_type = self.keras.layers.Layer
        original = layer_type.__call__

        @functools.wraps(original)
        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            return self.call(original, layer, args, kwargs)

        layer_type.__call__ = __call__
        for name in PROFILED:
            self._wrap_driver(name)
        for name in STEP_MAKERS:
            self._wrap_step_maker(name)

    def _wrap_driver(self, name: str) -> None:
        original = getattr(self.keras.Model, name)

        @functools.wraps(original)
        def driver(model: Any, *args: Any, **kwargs: Any) -> Any:
            outer = getattr(self.driving, "name", None)
            if outer is None:
                self.driving.name = name
            profiled = safely(self._profile_begin, model, kwargs, default=False)
            try:
                return original(model, *args, **kwargs)
            finally:
                if profiled:
                    safely(self._profile_end, name)
                self.driving.name = outer

        setattr(self.keras.Model, name, driver)

    def _wrap_step_maker(self, name: str) -> None:
        """The step function a `make_*_function` sets runs each step through the profiler's
        gate, so its windows are cut between steps (`tf_graph.StepGate`)."""
        original = getattr(self.keras.Model, name, None)
        if original is None:
            return
        attribute = name.removeprefix("make_")
        gate = self.graph.gate

        @functools.wraps(original)
        def maker(model: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(model, *args, **kwargs)  # Keras sets the function (returns None)
            safely(self._gate, model, attribute, gate)
            return result

        setattr(self.keras.Model, name, maker)

    @staticmethod
    def _gate(model: Any, attribute: str, gate: Any) -> None:
        made = getattr(model, attribute, None)
        if made is None or getattr(made, "_fecomlite_gated", False):
            return

        @functools.wraps(made)
        def gated(*args: Any, **kwargs: Any) -> Any:
            return gate.step(made, *args, **kwargs)

        gated._fecomlite_gated = True  # type: ignore[attr-defined]
        setattr(model, attribute, gated)

    def _profile_begin(self, model: Any, kwargs: dict[str, Any]) -> bool:
        """Profile this call if it runs compiled steps and nothing else profiles: not inside
        another profiled call (`fit` runs `evaluate`), not with a TensorBoard callback (it may
        start the profiler itself, which allows one session at a time)."""
        if getattr(self.profiling, "on", False) or getattr(model, "run_eagerly", False):
            return False
        if getattr(model, "jit_compile", False) is True:  # one XLA executable: no op has a
            key = facts.site_key(facts.GRAPH, model.name, "", type(model).__name__)
            facts.TABLE.update(key, xla=True)  # layer name, so profiling would time nothing
            return False
        callbacks = kwargs.get("callbacks") or []
        if any(isinstance(c, self.callback_types) for c in callbacks):
            return False
        if not self.graph.begin():
            return False
        self.profiling.on = True
        return True

    def _profile_end(self, driver: str) -> None:
        self.profiling.on = False
        spans = self.graph.end()
        for site, t0, t1, continues in spans:
            self.record(facts.driven(site, driver), t0, t1, False, continues)
        for site in dict.fromkeys(span[0] for span in spans):
            forward = site.replace(facts.BACKWARD, facts.FORWARD, 1)
            facts.TABLE.update(facts.driven(site, driver), params=self.scopes.params.get(forward))
            model = facts.parse(site)["model"]  # type: ignore[index]
            self.timed.setdefault(model, set()).add(forward)
            if model in self.graph_keys:
                facts.TABLE.update(self.graph_keys[model], timed=len(self.timed[model]))

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

    def _stack(self) -> list[tuple[Any, ...]]:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def _open(
        self,
        stack: list[tuple[Any, ...]],
        layer: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[Any, ...] | None:
        if self._symbolic(args, kwargs):  # building a functional model: nothing runs
            return None
        eager = bool(self.eager())
        if stack:
            _, model, parent_path, _, _ = stack[-1]
            path = f"{parent_path}/{layer.name}" if parent_path else layer.name
        else:
            model, path = layer.name, ""
        frame = (layer, model, path, eager, None if eager else self.name_scope())
        if not eager and stack:
            seen = self.traced.setdefault(model, set())
            seen.add(id(layer))
            key = self.graph_keys[model] = facts.site_key(
                facts.GRAPH, model, "", type(stack[0][0]).__name__
            )
            facts.TABLE.update(key, traced=len(seen))
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
        layer, model, path, eager, outer_scope = frame
        if not eager:
            scope = None if raised else _own_scope(outer_scope, layer.name, result)
            if scope is not None:
                self.scopes.add(scope, model, path, type(layer).__name__, self._count(layer))
            return
        if not stack:
            return
        site = facts.site_key(facts.FORWARD, model, path, type(layer).__name__,
                              getattr(self.driving, "name", None))
        self.record(site, t0, t1, raised)
        facts.TABLE.update(
            site,
            params=self._count(layer),
            output_bytes_max=None if raised else nbytes_of((result,), {}),
            eager=True,
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


def _own_scope(outer: str, name: str, result: Any) -> str | None:
    """The name scope a traced layer call ran in: `outer` plus the component that its output
    op's name has next (Keras enters `name`, made unique as `name_N`); None when the output is
    not the layer's own op (a layer that returns its input)."""
    first = next(iter(_flat(result)), None)
    op_name = getattr(first, "name", None)
    if not isinstance(op_name, str):
        return None
    prefix = f"{outer}/" if outer else ""
    if not op_name.startswith(prefix):
        return None
    own = op_name[len(prefix) :].split("/", 1)[0]
    if own != name and not re.fullmatch(re.escape(name) + r"_\d+", own):
        return None
    return prefix + own


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _flat(item)]
    if isinstance(value, dict):
        return [v for item in value.values() for v in _flat(item)]
    return [value]
