"""What the probe's slow path captures: tensor sizes, callee names, data-size cuts, GPU sync.

Hyperparameters are read in `hyperparams`, by handlers `site_handlers` sets up.

Only sampled calls and a few special sites come here, so this may cost microseconds; the fast
path in `probe.py` never does. Everything is duck-typed (numpy, torch and TensorFlow tensors alike)
and imports no framework: a framework is used only when the user's program already imported it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from fecomlite.runtime.names import runtime_name

MAX_SIZED_ITEMS = 64  # elements of a list/tuple argument looked at for sizes


def safely(func: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    """Run probe bookkeeping; a failure there must never reach the user's program."""
    try:
        return func(*args)
    except Exception:
        return default


def tensor_nbytes(value: Any) -> int | None:
    """Bytes of one tensor or array from its shape and dtype (never by copying or pickling)."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes  # numpy
    if hasattr(value, "element_size") and hasattr(value, "nelement"):
        return int(value.element_size() * value.nelement())  # torch
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    itemsize = getattr(dtype, "size", None) or getattr(dtype, "itemsize", None)
    if shape is None or not isinstance(itemsize, int):
        return None
    dims = [d if isinstance(d, int) else getattr(d, "value", None) for d in shape]
    if any(d is None for d in dims):
        return None
    return int(math.prod(dims)) * itemsize  # TensorFlow


def nbytes_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Total bytes of the tensor/array arguments (one level into lists and tuples)."""
    total = 0
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            for item in value[:MAX_SIZED_ITEMS]:
                total += tensor_nbytes(item) or 0
        else:
            total += tensor_nbytes(value) or 0
    return total


IMPORTED = "imported_modules"  # in a shape record: modules the call imported (its first use)
MAX_SHAPED_ARGS = 8  # arguments (and result items) whose shapes are recorded
_LAYER_SHAPES = ("weight", "kernel", "embeddings", "bias")  # tensors: torch, Keras, Keras, both
_LAYER_FACTS = ("kernel_size", "stride", "strides", "padding", "data_format", "use_bias")


def shape_of(value: Any) -> dict[str, Any] | None:
    """{"shape", "dtype", "itemsize"} of one tensor or array, None for anything else."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or isinstance(value, type):
        return None
    dims = [d if isinstance(d, int) or d is None else getattr(d, "value", d) for d in shape]
    if not all(d is None or isinstance(d, int) for d in dims):
        return None
    name, itemsize = _dtype_facts(dtype)
    return {"shape": dims, "dtype": name, "itemsize": itemsize}


_dtype_cache: dict[Any, tuple[str, int | None]] = {}


def _dtype_facts(dtype: Any) -> tuple[str, int | None]:
    """(name, bytes per item) of a numpy, torch or TensorFlow dtype; cached, since a dtype's
    `name` is computed anew on each access and a program uses only a handful of dtypes."""
    facts = _dtype_cache.get(dtype)
    if facts is None:
        name = getattr(dtype, "name", None) or str(dtype).removeprefix("torch.")
        itemsize = getattr(dtype, "itemsize", None) or getattr(dtype, "size", None)
        facts = (str(name), itemsize if isinstance(itemsize, int) else None)
        _dtype_cache[dtype] = facts
    return facts


def _shapes(values: Any) -> list[dict[str, Any] | None]:
    return [shape_of(v) for v in list(values)[:MAX_SHAPED_ARGS]]


def _layer_facts(owner: Any) -> dict[str, Any]:
    """Weight shapes and the hyperparameters a FLOP count needs, of a layer or module."""
    facts: dict[str, Any] = {}
    torch_parameters = getattr(owner, "_parameters", None)
    if isinstance(torch_parameters, dict):  # a torch module: a missing attribute is costly there
        tensors, attrs = torch_parameters, getattr(owner, "__dict__", {})
    else:
        tensors = attrs = {name: getattr(owner, name, None)
                           for name in (*_LAYER_SHAPES, *_LAYER_FACTS)}
    for name in _LAYER_SHAPES:
        shape = shape_of(tensors.get(name))
        if shape is not None:
            facts[name] = shape
    if not facts:
        return facts
    for name in _LAYER_FACTS:
        value = attrs.get(name)
        if isinstance(value, (bool, int, str)):
            facts[name] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
            facts[name] = list(value)
    return facts


def call_shapes(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> dict[str, Any]:
    """What the energy model needs to price a call: argument and result shapes and, for a
    layer/module or a tensor method, the layer's weights or the tensor the method is bound to."""
    shapes: dict[str, Any] = {
        "args": _shapes(args),
        "result": _shapes(result) if isinstance(result, (tuple, list)) else [shape_of(result)],
    }
    named = {k: shape_of(v) for k, v in list(kwargs.items())[:MAX_SHAPED_ARGS]}
    if any(named.values()):
        shapes["kwargs"] = {k: v for k, v in named.items() if v is not None}
    owner = getattr(fn, "__self__", fn)
    bound = shape_of(owner)
    if bound is not None:
        shapes["self"] = bound
    else:
        weights = _layer_facts(owner)
        if weights:
            shapes["weights"] = weights
    return shapes


def record_shapes(
    sink: Any, site: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
    imported: int = 0,
) -> None:
    """Hand a sized call's shapes to the sender (`Sender.add_shapes`); never raises. imported:
    the modules `sys.modules` gained during the call (its first use), kept beside the shapes
    as `imported_modules` when there were any."""
    shapes = safely(call_shapes, fn, args, kwargs, result)
    if shapes is not None:
        if imported > 0:
            shapes[IMPORTED] = imported
        safely(sink.add_shapes, site, shapes)


def record_name(sink: Any, site: str, fn: Any) -> None:
    """Hand the public name of the callee a site ran to the sender (`Sender.add_name`)."""
    safely(sink.add_name, site, safely(runtime_name, fn))


_sync_functions: list[Callable[[], Any]] | None = None


def gpu_sync() -> None:
    """Wait for queued GPU work, so a call's interval covers its kernels (asynchronous GPUs)."""
    global _sync_functions
    if _sync_functions is None:
        _sync_functions = _find_gpu_sync()
    for sync in _sync_functions:
        sync()


def _find_gpu_sync() -> list[Callable[[], Any]]:
    found: list[Callable[[], Any]] = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        found.append(torch.cuda.synchronize)
    tf = sys.modules.get("tensorflow")
    if tf is not None and tf.config.list_logical_devices("GPU"):
        found.append(tf.test.experimental.sync_devices)
    return found


class Handler:
    """Slow-path hooks for one site: adjust the arguments before, look at the result after;
    `finished` once it needs no more calls (the site then leaves the always-slow sites)."""

    finished = False

    def before(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, kwargs

    def after(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        return None


class DataSizeHandler(Handler):
    """Cuts tensor/array arguments along their first dimension to a fraction (data-size runs)."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def before(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (
            tuple(self.cut(a) for a in args),
            {k: self.cut(v) for k, v in kwargs.items()},
        )

    def cut(self, value: Any) -> Any:
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) == 0 or tensor_nbytes(value) is None:
            return value
        n = int(shape[0])
        return value[: max(1, math.ceil(n * self.fraction))]


class KeepCallHandler(Handler):
    """Hands the last call that returned to the calibration replayer
    (`fecomlite.runtime.calibration_replay`),
    which replays it at exit; only in a calibration repetition, only for the listed sites."""

    def __init__(self, site: str, replayer: Any) -> None:
        self.site = site
        self.replayer = replayer

    def after(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        self.replayer.keep(self.site, fn, args, kwargs)


class ChainedHandler(Handler):
    def __init__(self, handlers: list[Handler]) -> None:
        self.handlers = handlers

    @property
    def finished(self) -> bool:  # type: ignore[override]
        return all(handler.finished for handler in self.handlers)

    def before(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        for handler in self.handlers:
            args, kwargs = handler.before(fn, args, kwargs)
        return args, kwargs

    def after(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        for handler in self.handlers:
            safely(handler.after, fn, args, kwargs, result)
