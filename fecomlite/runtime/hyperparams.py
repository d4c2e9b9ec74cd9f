"""The hyperparameters the program trained with, read by the probe where training uses them.

What a program builds is not what it trains with: a test DataLoader, a learning-rate scheduler
or an optimizer kept for a later loop would each pass for the training's. So each value is read
where training uses it, and where it was read goes with it (the "sources" hyperparameter):

* Keras `compile` and `fit` (rank 2): the optimizer and learning rate compile was given (one
  named by a string is read off the model after compile), the loss, fit's batch size (a
  `tf.data` pipeline's or DataLoader's own when fit is given one), epochs and the samples it
  trains on (less the `validation_split` it holds out);
* the training loop (rank 1): the optimizer whose `step()`/`apply_gradients()`/`minimize()` runs,
  with the learning rate it was configured with (a scheduler changes the running rate: OneCycleLR
  starts at max_lr / 25) and the schedule driving it (`lr_schedule`, its peak `max_lr`), found
  in the step's frame (a scheduler's `step()` is not an optimizer's), and the
  batch size of the DataLoader (or batched `tf.data.Dataset`) the `for` loop around that call or
  `loss.backward()` iterates
  (the instrumenter writes the names that loop iterates into the site's manifest entry, "loop";
  they are read in the caller's frame, never evaluated).

A higher rank wins over a lower one; two different values at one rank (two optimizers stepped)
leave the key out: unsure, nothing rather than a guess. Floats are kept as people write them
(`as_written`: 3e-3, not 0.0029999…).

Epochs of a hand-written loop (PyTorch, or Keras with `GradientTape`) are the passes of a
`for epoch in range(EPOCHS)` loop (`range(1, args.epochs + 1)` alike) around the data loop of a
training step (the manifest's "epochs" names `EPOCHS`), read at the step's first call: either in
the step's own function, or — the shape of the official MNIST example, `for epoch in ...:
train(model, device, train_loader, optimizer, epoch)` — in the function the manifest names as
"epochs_in", which must be the caller of the step's function at that first call; anything else
gives no epochs. A call of a compiled unit whose body trains (`@tf.function def train_step`,
manifest "trains") is read like a step; the optimizer its body steps (manifest "optimizer", one
plain name) is read by that name where the unit is called, and counts only if it is a torch or
Keras optimizer.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from fecomlite.runtime.capture import Handler, safely

TRAINING_STEPS = frozenset({"backward", "step", "apply_gradients", "minimize"})
_OPTIMIZER_STEPS = TRAINING_STEPS - {"backward"}
COMPILE_RANK, LOOP_RANK = 2, 1
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # fecomlite/


class Hyperparams:
    """The run's hyperparameters as this process read them, each from its best source; what
    changes goes to the sender (`Sender.add_hyperparams`), a key found unsure as None."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.known: dict[str, tuple[int, Any]] = {}
        self.sources: dict[str, str] = {}
        self._lock = threading.Lock()

    def offer(self, facts: dict[str, Any], source: dict[str, str] | str, rank: int) -> None:
        """Values read at one place; `source` says where, for all of them or key by key."""
        changed: dict[str, Any] = {}
        with self._lock:
            for key, value in _jsonable(facts).items():
                known = self.known.get(key)
                if known is None or rank > known[0]:
                    self.known[key] = (rank, value)
                    self.sources[key] = source if isinstance(source, str) else source[key]
                    changed[key] = value
                elif rank == known[0] and known[1] is not None and value != known[1]:
                    self.known[key] = (rank, None)  # two answers: neither is reported
                    self.sources.pop(key, None)
                    changed[key] = None
            if changed:
                self.sink.add_hyperparams({**changed, "sources": dict(self.sources)})


class CallReader(Handler):
    """Reads hyperparameters off the arguments and result of a call (Keras compile/fit)."""

    def __init__(
        self, extract: Callable[..., dict[str, Any]], hyperparams: Hyperparams, where: str
    ) -> None:
        self.extract = extract
        self.hyperparams = hyperparams
        self.where = where

    def after(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        self.hyperparams.offer(self.extract(fn, args, kwargs, result), self.where, COMPILE_RANK)


class TrainingStepReader(Handler):
    """At the first call of `optimizer.step()`-like or `loss.backward()` sites: the optimizer
    stepped and the batch size of the DataLoader the enclosing loop iterates."""

    def __init__(self, site: dict[str, Any], hyperparams: Hyperparams, where: str) -> None:
        self.written = str(site.get("written", ""))
        self.loop = [n for n in site.get("loop", []) if isinstance(n, str)]
        self.epochs = str(site.get("epochs", ""))
        self.epochs_in = str(site.get("epochs_in", ""))
        self.optimizer = str(site.get("optimizer", ""))  # a compiled unit's, by name
        self.hyperparams = hyperparams
        self.where = where

    def after(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        if self.finished:
            return
        self.finished = True  # read at the first call that returns: the site may then go fast
        frame = _user_frame()
        facts: dict[str, Any] = {}
        receiver, _, method = self.written.rpartition(".")
        if method in _OPTIMIZER_STEPS:
            owner = getattr(fn, "__self__", None)
            if owner is None or isinstance(owner, types.ModuleType):
                owner = _read(frame, receiver)  # a wrapper a scheduler set on the instance
            if not _is_optimizer(owner):
                return  # a scheduler's step, or something else: not the training's optimizer
            facts.update(_optimizer_facts(owner, frame))
        elif self.optimizer and _is_optimizer(_read(frame, self.optimizer)):
            facts.update(_optimizer_facts(_read(frame, self.optimizer), frame))
        sources: dict[str, str] = dict.fromkeys(facts, self.where)
        loader = _loop_batch_size(frame, self.loop)
        if loader is not None:
            facts["batch_size"], name = loader
            sources["batch_size"] = f"{name}, iterated around {self.where}"
        epochs = _read(_caller(frame, self.epochs_in) if self.epochs_in else frame, self.epochs)
        if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 and self.loop:
            facts["epochs"] = epochs
            if self.epochs_in and frame is not None:
                around = f"the call of {frame.f_code.co_name} in {self.epochs_in}"
            else:
                around = f"the loop over {self.loop[0]}"
            sources["epochs"] = f"range({self.epochs}) around {around}"
        self.hyperparams.offer(facts, sources, LOOP_RANK)


def hyperparameter_handler(
    key: str, site: dict[str, Any], hyperparams: Hyperparams
) -> Handler | None:
    """The reader for a manifest site that carries hyperparameters, if any."""
    where = f"{site.get('written') or site.get('api', '')} ({key})"
    extract = _call_extractor(str(site.get("api", "")), str(site.get("kind", "")))
    if extract is not None:
        return CallReader(extract, hyperparams, where)
    if site.get("trains") or str(site.get("written", "")).rpartition(".")[2] in TRAINING_STEPS:
        return TrainingStepReader(site, hyperparams, where)
    return None


def _call_extractor(api: str, kind: str) -> Callable[..., dict[str, Any]] | None:
    """A Keras method's reader; for a call decided at run time (kind `call`: `model.fit` on a
    model built elsewhere) by what was written, since its handler runs only once the probe has
    found a framework callee there."""
    root = api.split(".", 1)[0]
    last = api.rsplit(".", 1)[-1]
    keras_method = root in ("keras", "tensorflow", "tf_keras") and kind == "method"
    if not keras_method and kind != "call":
        return None
    return {"compile": _keras_compile, "fit": _keras_fit, "count_params": _count_params}.get(last)


def _user_frame() -> types.FrameType | None:
    """The innermost frame of the user's program (the one that made the probed call)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return frame


def _caller(frame: types.FrameType | None, function: str) -> types.FrameType | None:
    """The frame that called `frame`'s function, if it runs `function` (a qualname as the
    instrumenter writes it: `main`, `Trainer.fit`, `<module>`); else None (unsure)."""
    caller = frame.f_back if frame is not None else None
    while caller is not None and caller.f_code.co_filename.startswith(_PACKAGE_DIR):
        caller = caller.f_back
    if caller is None or caller.f_code.co_qualname.replace(".<locals>", "") != function:
        return None
    return caller


def _read(frame: types.FrameType | None, dotted: str) -> Any:
    """The value of a plain or dotted name in a frame, through namespaces only (no property or
    `__getattr__` of the user's runs)."""
    if frame is None or not dotted:
        return None
    first, *rest = dotted.split(".")
    if not first.isidentifier():
        return None
    value = frame.f_locals.get(first, frame.f_globals.get(first))
    for part in rest:
        value = safely(lambda v, p: vars(v).get(p), value, part)
    return value


def _loop_batch_size(frame: types.FrameType | None, names: list[str]) -> tuple[int, str] | None:
    """(batch size, name) of the one DataLoader or batched tf.data.Dataset the loop iterates;
    None when none or unsure."""
    found = {}
    for name in names:
        size = _batch_size(_read(frame, name))
        if size is not None:
            found[name] = size
    if len(set(found.values())) != 1:
        return None
    name, size = next(iter(found.items()))
    return size, name


# tf.data steps after `batch()` that keep the size of each batch (TF's own, private, classes)
_SAME_BATCHES = frozenset(
    {
        "_PrefetchDataset",
        "_ShuffleDataset",
        "_RepeatDataset",
        "CacheDataset",
        "_TakeDataset",
        "_SkipDataset",
        "_OptionsDataset",
    }
)


def _batch_size(data: Any) -> int | None:
    """A torch DataLoader's batch size, or the size a tf.data pipeline's `batch()` gives, found
    through the steps after it that keep batches whole; else None (a `map` may change them)."""
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and isinstance(data, torch_data.DataLoader):
        return data.batch_size if isinstance(data.batch_size, int) else None
    tf_data = getattr(sys.modules.get("tensorflow"), "data", None)
    if not isinstance(getattr(tf_data, "Dataset", None), type) or not isinstance(
        data, tf_data.Dataset
    ):
        return None
    while type(data).__name__ in _SAME_BATCHES:
        data = safely(lambda d: vars(d).get("_input_dataset"), data)
    if type(data).__name__ not in ("_BatchDataset", "_ParallelBatchDataset"):
        return None
    size = safely(lambda d: int(vars(d)["_batch_size"]), data)
    return size if isinstance(size, int) and size > 0 else None


def _optimizer_facts(optimizer: Any, frame: types.FrameType | None = None) -> dict[str, Any]:
    facts = {"optimizer": type(optimizer).__name__, "learning_rate": _learning_rate(optimizer)}
    groups = getattr(optimizer, "param_groups", None)
    if groups:  # torch: the parameters being optimised
        facts["parameters"] = sum(p.numel() for g in groups for p in g["params"])
        facts.update(_torch_schedule(optimizer, frame))
    return facts


def _torch_schedule(optimizer: Any, frame: types.FrameType | None) -> dict[str, Any]:
    """The learning-rate schedule driving a torch optimizer: the one LRScheduler of the step's
    frame (its locals, then its module's globals) that holds this optimizer, by its class, with
    its peak rate where it has one (OneCycleLR's and CyclicLR's `max_lr`, kept in the param
    group); {} when none or several (unsure)."""
    schedulers = getattr(sys.modules.get("torch.optim"), "lr_scheduler", None)
    base = getattr(schedulers, "LRScheduler", None)
    if frame is None or not isinstance(base, type):
        return {}
    found = {id(v): v for scope in (frame.f_locals, frame.f_globals) for v in scope.values()
             if isinstance(v, base) and getattr(v, "optimizer", None) is optimizer}
    if len(found) != 1:
        return {}
    schedule = next(iter(found.values()))
    out: dict[str, Any] = {"lr_schedule": type(schedule).__name__}
    peak = optimizer.param_groups[0].get("max_lr")
    if isinstance(peak, (int, float)):
        out["max_lr"] = float(peak)
    return out


def _is_optimizer(owner: Any) -> bool:
    """A torch or Keras optimizer (a scheduler is neither), by the frameworks' own classes."""
    optim = sys.modules.get("torch.optim")
    if optim is not None and isinstance(owner, optim.Optimizer):
        return True
    keras = sys.modules.get("keras")
    base = getattr(getattr(keras, "optimizers", None), "Optimizer", None)
    return isinstance(base, type) and isinstance(owner, base)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else None


def _learning_rate(optimizer: Any) -> float | None:
    """The rate the optimizer was configured with: a scheduler changes the param groups' rate
    from its first step on (OneCycleLR starts at max_lr / 25), not what the user set."""
    defaults = getattr(optimizer, "defaults", None)
    if isinstance(defaults, dict) and "lr" in defaults:  # torch: what the constructor was given
        return safely(float, defaults["lr"])
    groups = getattr(optimizer, "param_groups", None)
    if groups:
        return float(groups[0]["lr"])
    value = getattr(optimizer, "learning_rate", None)
    if value is None:  # often a float32: 7 significant digits are all it holds
        return None
    return safely(lambda v: float(f"{float(v):.7g}"), value)


def _keras_model_facts(fn: Any) -> dict[str, Any]:
    model = getattr(fn, "__self__", None)
    if model is None or not hasattr(model, "count_params"):
        return {}
    return {
        "parameters": safely(model.count_params),
        "layers": safely(len, getattr(model, "layers", None)),
    }


def _keras_compile(fn: Any, args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    optimizer = _arg(args, kwargs, 0, "optimizer")
    if isinstance(optimizer, str):  # compile made the optimizer the string names
        optimizer = getattr(getattr(fn, "__self__", None), "optimizer", None)
    loss = _arg(args, kwargs, 1, "loss")
    return {
        "optimizer": None if optimizer is None else type(optimizer).__name__,
        "learning_rate": None if optimizer is None else _learning_rate(optimizer),
        "loss": loss if isinstance(loss, str) else getattr(loss, "__name__", type(loss).__name__),
    }


def _keras_fit(fn: Any, args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    x = _arg(args, kwargs, 0, "x")
    batch_size = _arg(args, kwargs, 2, "batch_size")
    if batch_size is None and hasattr(x, "shape"):
        batch_size = 32  # Keras' default for array inputs
    elif batch_size is None:  # a tf.data pipeline or a DataLoader batches itself
        batch_size = _batch_size(x)
    return {
        "epochs": _arg(args, kwargs, 3, "epochs") or 1,
        "batch_size": batch_size,
        "training_samples": _trained_on(x, kwargs) if hasattr(x, "shape") else None,
        **_keras_model_facts(fn),
    }


def _trained_on(x: Any, kwargs: dict[str, Any]) -> int | None:
    """The samples fit trains on: all of x, less the validation_split Keras holds out (its own
    rule, floor(n × (1 − split)); validation_data given instead takes nothing from x)."""
    n = safely(lambda: int(x.shape[0]))
    split = kwargs.get("validation_split") or 0.0
    if n is None or kwargs.get("validation_data") is not None or not 0 < split < 1:
        return n
    return math.floor(n * (1.0 - float(split)))


def _count_params(fn: Any, args: tuple, kwargs: dict, result: Any) -> dict[str, Any]:
    return {"parameters": result if isinstance(result, int) else None}


def as_written(value: float) -> float:
    """A rate as people write it (3e-3, not 0.0029999…): 6 significant digits, enough for any
    value set by hand, too few for float32 or arithmetic noise."""
    return float(f"{value:.6g}") if math.isfinite(value) else value


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, float):
            out[key] = as_written(value)
        elif isinstance(value, (bool, int, str)):
            out[key] = value
        else:
            out[key] = safely(int, value) if hasattr(value, "__index__") else str(value)
    return out
