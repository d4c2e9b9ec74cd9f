"""Calibration replays (issue 8): the costliest call sites replayed alone, back to back, so that
the intensity fit gets sensor intervals holding a single API.

Three parts, in three layers (this module holds the first two, which run inside the measured
program; `fecomlite.runner.calibration` chooses and runs; `fecomlite.analysis.calibration` fits):

* the allow-list (`DENY`, `ALLOW`, `ARGUMENT_RULES`; `verdict`, `runtime_refusal`): which calls
  may be replayed at all. Only calls known to be free of side effects: tensor math, linear
  algebra, activations, reductions, elementwise and functional ops of numpy, PyTorch, TensorFlow
  and Keras, and layer/module calls in inference mode. Never training, optimizer steps,
  gradients, I/O, random numbers, in-place ops or data pipelines; anything not listed is skipped;
* the replayer (`Replayer`), inside the measured program in one extra repetition: the probe's
  slow path hands it the last call that returned of each listed site (function and arguments,
  by reference, nothing serialised); at exit it replays each for `FECOMLITE_CALIBRATE_S`
  seconds, with idle gaps between sites, printing nothing;
* the orchestration (`choose_sites`, `run_calibration`): after the measured repetitions, rank the
  sites by above-idle energy, run the program once more with the replayer on, and store what was
  replayed and what was skipped, and why, as the run's "calibration" result.

A replay is recorded as a call of site `calibrate:<site key>` whose API is `calibrate:<api>`, and
so is every wrapped call made inside a replay (a module whose own code is instrumented): the
tables report replays on their own rows, never in the program's totals, and `fit_groups` ties
each to its API for the intensity fit.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

PREFIX = "calibrate:"
KIND = "calibration"  # the manifest kind of a replay site
DEFAULT_TOP = 5
DEFAULT_SECONDS = 1.5  # per site: many ~100 ms sensor intervals (DESIGN.md)
DEFAULT_GAP_S = 0.5  # idle between sites, so that no interval mixes two replays

# The environment of the calibration repetition (docs/internals.md §2 lists the probe's).
ENV_SITES = "FECOMLITE_CALIBRATE"  # JSON list of site keys, in replay order
ENV_SECONDS = "FECOMLITE_CALIBRATE_S"
ENV_GAP_S = "FECOMLITE_CALIBRATE_GAP_S"
ENV_REPORT = "FECOMLITE_CALIBRATE_REPORT"  # where the replayer writes what it did (JSON)


# -- the allow-list ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Canonical API names (`fnmatch` patterns, case-sensitive) of some manifest kinds (any kind
    when empty), and why such a call is, or is not, replayed."""

    patterns: tuple[str, ...]
    kinds: tuple[str, ...]
    reason: str

    def matches(self, api: str, kind: str) -> bool:
        if self.kinds and kind not in self.kinds:
            return False
        return not self.patterns or any(fnmatchcase(api, p) for p in self.patterns)


# Checked first: the first rule that matches says why a call is never replayed.
DENY: tuple[Rule, ...] = (
    Rule((), ("compiled",), "compiled user code: its side effects are unknown"),
    Rule((), ("constructor",), "builds an object: not a computation"),
    Rule((), ("region", KIND, "program"), "not a framework call"),
    Rule(("*.fit", "*.fit_generator", "*.train_on_batch", "*.train_step"), (),
         "training: updates weights and optimizer state"),
    Rule(("*.backward", "torch.autograd.*", "*.gradient"), (),
         "computes gradients: accumulates into .grad"),
    Rule(("*.step", "*.zero_grad", "*.apply_gradients", "*.minimize", "torch.optim.*",
          "keras.optimizers.*", "tensorflow.optimizers.*"), (),
         "optimizer: mutates the parameters or its own state"),
    Rule(("*random*", "*.rand", "*.rand_like", "*.randn", "*.randn_like", "*.randint",
          "*.randint_like", "*.randperm", "*.bernoulli", "*.multinomial", "*.poisson",
          "*.normal", "*.uniform", "*seed*", "*.shuffle", "*.permutation", "*.gumbel_softmax",
          "tensorflow.nn.dropout", "tensorflow.nn.experimental.*"), (),
         "random numbers: advances a generator's state"),
    Rule(("*[!_]_", "*.assign", "*.assign_add", "*.assign_sub", "*.scatter_update",
          "*.scatter_nd_update", "*.train", "*.eval", "*.requires_grad_", "*.register_*"), (),
         "mutates its arguments, a variable or a module in place"),
    Rule(("*.save", "*.save_*", "*.savez", "*.savez_*", "*.savetxt", "*.load", "*.load_*",
          "*.loadtxt", "*.fromfile", "*.tofile", "*.print", "tensorflow.print", "*.write",
          "*.write_*", "*.read", "*.read_*", "*.summary", "tensorflow.summary.*",
          "tensorflow.io.*", "torch.hub.*", "*.open", "*.to_csv", "*.export", "*.export_*"), (),
         "input/output"),
    Rule(("tensorflow.data.*", "torch.utils.data.*", "*DataLoader*", "*.__iter__",
          "*.__next__"), (),
         "data pipeline or iterator: consumes or produces state"),
    Rule(("keras.metrics.*", "keras.callbacks.*"), (),
         "metric or callback: accumulates state from call to call"),
    Rule(("*.predict", "*.evaluate"), (),
         "runs callbacks and a data pipeline: its layer calls are what replays measure"),
)

_NUMPY_MATH = (
    "matmul", "dot", "vdot", "inner", "outer", "tensordot", "einsum", "kron", "add", "subtract",
    "multiply", "divide", "true_divide", "power", "exp", "expm1", "log", "log1p", "log2",
    "log10", "sqrt", "square", "abs", "absolute", "negative", "sin", "cos", "tan", "tanh",
    "sinh", "cosh", "arctan", "maximum", "minimum", "clip", "where", "sum", "mean", "std",
    "var", "max", "min", "amax", "amin", "prod", "cumsum", "cumprod", "argmax", "argmin",
    "sort", "argsort", "median", "percentile", "quantile", "average", "transpose",
    "concatenate", "stack", "convolve", "correlate", "trace", "diff",
)
_TORCH_MATH = (
    "matmul", "mm", "bmm", "mv", "addmm", "baddbmm", "einsum", "tensordot", "dot", "outer",
    "cdist", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "add", "sub",
    "mul", "div", "pow", "exp", "log", "log1p", "sqrt", "rsqrt", "square", "abs", "neg", "sin",
    "cos", "tanh", "sigmoid", "relu", "softmax", "log_softmax", "clamp", "clip", "where",
    "maximum", "minimum", "sum", "mean", "std", "var", "max", "min", "amax", "amin", "prod",
    "norm", "argmax", "argmin", "cumsum", "logsumexp", "sort", "topk", "cat", "stack",
    "flatten", "reshape", "transpose", "permute", "layer_norm", "softmax",
)
_TF_MATH = (
    "matmul", "einsum", "tensordot", "add", "add_n", "subtract", "multiply", "divide", "pow",
    "exp", "sqrt", "square", "abs", "negative", "tanh", "sigmoid", "maximum", "minimum",
    "clip_by_value", "where", "concat", "stack", "reshape", "transpose", "argmax", "argmin",
    "sort", "argsort", "cumsum", "norm", "tile", "cast",
)
# Methods called on tensors/arrays that framework calls returned (`torch.sin().sum`, the static
# `torch.sin/sum`, or as the probe named it, `torch.Tensor.sum`): checked at replay time to be
# bound to a tensor or array.
_TENSOR_TYPES = ("torch.Tensor", "tensorflow.Tensor", "numpy.ndarray")
_TENSOR_METHODS = (
    "matmul", "mm", "bmm", "dot", "sum", "mean", "std", "var", "max", "min", "amax", "amin",
    "prod", "norm", "argmax", "argmin", "cumsum", "logsumexp", "softmax", "log_softmax", "relu",
    "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "pow", "t", "transpose", "permute",
    "reshape", "view", "flatten", "unsqueeze", "squeeze", "contiguous", "clone",
)

# Then these: the first that matches allows the replay (subject to `runtime_refusal`).
ALLOW: tuple[Rule, ...] = (
    Rule(tuple(f"numpy.{n}" for n in _NUMPY_MATH) + ("numpy.linalg.*", "numpy.fft.*"),
         ("function",), "numpy math"),
    Rule(tuple(f"torch.{n}" for n in _TORCH_MATH)
         + ("torch.linalg.*", "torch.fft.*", "torch.special.*"), ("function",),
         "PyTorch tensor math"),
    Rule(("torch.nn.functional.*",), ("function",), "PyTorch functional op"),
    Rule(tuple(f"tensorflow.{n}" for n in _TF_MATH)
         + ("tensorflow.reduce_*", "tensorflow.linalg.*", "tensorflow.math.*", "tensorflow.nn.*",
            "tensorflow.signal.*"), ("function",), "TensorFlow tensor math"),
    Rule(("keras.ops.*", "keras.activations.*"), ("function",), "Keras op"),
    Rule(("keras.*.__call__",), ("method",), "Keras layer call, replayed with training=False"),
    Rule(("torch.nn.*.__call__",), ("method",),
         "PyTorch module call, replayed in eval mode under no_grad only"),
    Rule(tuple(f"*().{n}" for n in _TENSOR_METHODS)
         + tuple(f"{t}.{n}" for t in _TENSOR_TYPES for n in _TENSOR_METHODS), ("method",),
         "tensor method"),
)
NOT_LISTED = ("not on the allow-list (only side-effect-free math, and layer calls in inference "
              "mode, are replayed)")

# Arguments that make an allowed API mutate or draw random numbers: (API pattern, argument name,
# reason), refused when the argument is set (not None/False), by keyword or by position.
ARGUMENT_RULES: tuple[tuple[str, str, str], ...] = (
    ("*", "out", "writes its result into an `out` argument"),
    ("*", "inplace", "works in place (`inplace=True`)"),
    ("*", "training", "training mode: random (dropout) or updates running statistics"),
    ("torch.nn.functional.instance_norm", "running_mean", "updates running statistics"),
)


def verdict(api: str, kind: str) -> tuple[bool, str]:
    """(replayable, why) for a site, from its canonical API name and manifest kind alone."""
    api = api.replace("/", "().")  # the static `torch.sin/sum` (names.RESULT): `torch.sin().sum`
    for rule in DENY:
        if rule.matches(api, kind):
            return False, rule.reason
    for rule in ALLOW:
        if rule.matches(api, kind):
            return True, rule.reason
    return False, NOT_LISTED


def inference_arguments(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a replay: a Keras layer whose call takes `training` gets False."""
    takes_training = getattr(fn, "_call_has_training_arg", None)  # Keras 3
    if takes_training is None:
        takes_training = getattr(fn, "_expects_training_arg", False)  # tf_keras
    if takes_training is True:
        return args, {**kwargs, "training": False}
    return args, kwargs


def runtime_refusal(api: str, kind: str, fn: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> str | None:
    """Why this very call must not be replayed (None: replay it), from the objects at hand."""
    allowed, reason = verdict(api, kind)
    if not allowed:
        return reason
    modules = getattr(fn, "modules", None)
    is_module = isinstance(getattr(fn, "training", None), bool) and callable(modules)  # torch
    if is_module and any(m.training for m in modules()):
        return "the module, or one inside it, is in training mode"
    if getattr(fn, "stateful", False) is True:
        return "a stateful layer: it carries state from call to call"
    if kind == "method" and not api.endswith(".__call__"):
        owner = getattr(fn, "__self__", None)
        if not (hasattr(owner, "shape") and hasattr(owner, "dtype")):
            return "not a method of a tensor or array"
    nin = getattr(fn, "nin", None)  # a numpy ufunc takes its outputs by position too
    if isinstance(nin, int) and len(args) > nin:
        return ARGUMENT_RULES[0][2]
    bound = _bound_arguments(fn, args, kwargs)
    for pattern, name, reason in ARGUMENT_RULES:
        if _is_set(bound.get(name)) and fnmatchcase(api, pattern):
            return reason
    return None


def _bound_arguments(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument by name, defaults included, where the signature is known; else the
    keywords (builtins such as torch.matmul take `out` by keyword only)."""
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return dict(kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    for param in bound.signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(param.name, {}))
    return named


def _is_set(value: Any) -> bool:
    """Given and not off: `True`, 1, an array as `out` (never asked for its truth value)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return bool(value)
    return True


# -- the replayer, inside the measured program ------------------------------------------------


@dataclass
class _Kept:
    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    refusal: str | None  # what the call's own moment says against replaying it


def _refusal_at_call(fn: Any) -> str | None:
    """A module called in training mode is not replayed, even when it is in eval mode by the
    time of the replay: an inference replay would not measure what those calls did."""
    if getattr(fn, "training", None) is True and callable(getattr(fn, "modules", None)):
        return "its last call ran in training mode (replays are inference only)"
    return None


class Replayer:
    """Keeps the last call that returned of each listed site and replays them at exit.

    The exit hook is registered at the first kept call, after the probe registered its final
    flush at import: atexit runs the last registered first, so the replays' events are flushed.
    Nothing here raises into the program, and nothing it prints is seen.
    """

    def __init__(
        self, sites: dict[str, dict[str, Any]], *, seconds: float = DEFAULT_SECONDS,
        gap_s: float = DEFAULT_GAP_S, report_path: str = "",
        record: Callable[[str, int, int, bool], None],
        sync: Callable[[], None] | None = None,
    ) -> None:
        self.sites = sites  # site key -> its manifest entry, in replay order
        self.seconds = seconds
        self.gap_s = gap_s
        self.report_path = report_path
        self.record = record
        self.sync = sync
        self.kept: dict[str, _Kept] = {}
        self.report: dict[str, dict[str, Any]] = {}
        self._owner = os.getpid()  # a forked worker keeps nothing and replays nothing
        self._lock = threading.Lock()
        self._registered = False
        self._ran = False

    @classmethod
    def from_environment(
        cls, calibrate: str, manifest_sites: dict[str, Any],
        record: Callable[[str, int, int, bool], None],
    ) -> Replayer:
        """From `FECOMLITE_CALIBRATE` (given) and the other calibration variables."""
        env = os.environ
        keys = [str(k) for k in json.loads(calibrate)]
        sync = None
        if env.get("FECOMLITE_SYNC") == "1":
            from fecomlite.runtime.capture import gpu_sync

            sync = gpu_sync
        return cls(
            {k: dict(manifest_sites.get(k) or {}) for k in keys},
            seconds=float(env.get(ENV_SECONDS) or DEFAULT_SECONDS),
            gap_s=float(env.get(ENV_GAP_S) or DEFAULT_GAP_S),
            report_path=env.get(ENV_REPORT, ""),
            record=record,
            sync=sync,
        )

    def keep(self, site: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Called by the probe after each call of a listed site returned."""
        if os.getpid() != self._owner:
            return
        self.kept[site] = _Kept(fn, args, dict(kwargs), _refusal_at_call(fn))
        if not self._registered:
            with self._lock:
                if not self._registered:
                    self._registered = True
                    atexit.register(self.run_at_exit)

    def run_at_exit(self) -> None:
        """The exit hook: replay, then write the report; never raises."""
        with contextlib.suppress(BaseException):
            self.run()
        with contextlib.suppress(BaseException):
            if self.report_path:
                Path(self.report_path).write_text(json.dumps(self.report, indent=1))

    def run(self) -> dict[str, dict[str, Any]]:
        """Replay every kept site in order; `report` says, per site, what happened."""
        if os.getpid() != self._owner or self._ran:
            return self.report
        self._ran = True
        with _quiet(), _no_grad(), _nested_calls_as_replays():
            for key, site in self.sites.items():
                api, kind = str(site.get("api", "")), str(site.get("kind", ""))
                entry = self.report[key] = {"api": api, "calls": 0, "seconds": 0.0}
                kept = self.kept.pop(key, None)
                if kept is None:
                    entry["skipped"] = "no call of it returned in the calibration repetition"
                    continue
                try:
                    args, kwargs = inference_arguments(kept.fn, kept.args, kept.kwargs)
                    refusal = kept.refusal or runtime_refusal(api, kind, kept.fn, args, kwargs)
                except Exception as exc:  # an object that does not answer as expected
                    refusal = f"could not be checked ({type(exc).__name__})"
                if refusal is not None:
                    entry["skipped"] = refusal
                    continue
                time.sleep(self.gap_s)
                self._replay(PREFIX + key, kept.fn, args, kwargs, entry)
        return self.report

    def _replay(self, event_site: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                entry: dict[str, Any]) -> None:
        """Call `fn` back to back for `seconds`; the first exception stops it (and is noted)."""
        span_ns = int(self.seconds * 1e9)
        first = last = 0
        while True:
            self._sync()
            t0 = time.monotonic_ns()
            try:
                fn(*args, **kwargs)
            except Exception as exc:
                self._sync()
                self.record(event_site, t0, time.monotonic_ns(), True)
                entry["stopped"] = f"raised {type(exc).__name__} after {entry['calls']} replays"
                break
            self._sync()
            last = time.monotonic_ns()
            self.record(event_site, t0, last, False)
            first = first or t0
            entry["calls"] += 1
            entry["seconds"] = (last - first) / 1e9
            if last - first >= span_ns:
                break
        if entry["calls"] == 0:
            entry["skipped"] = entry.pop("stopped")

    def _sync(self) -> None:
        if self.sync is not None:
            with contextlib.suppress(Exception):
                self.sync()


@contextlib.contextmanager
def _nested_calls_as_replays() -> Iterator[None]:
    """Wrapped calls made inside a replay (a module whose own code is instrumented) are
    recorded as replays too, `calibrate:<their site>`, never as more calls of the program.
    Instrumented code looks `__fecomlite__.call` up at every call, so swapping it is enough."""
    probe = sys.modules.get("fecomlite.runtime.probe")
    if probe is None:
        yield
        return
    call = probe.call

    def replay_call(site: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return call(PREFIX + site, fn, *args, **kwargs)

    probe.call = replay_call
    try:
        yield
    finally:
        probe.call = call


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Replays print nothing: Python's streams and file descriptors 1 and 2 go to /dev/null."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved: list[tuple[int, int]] = []
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                saved.append((fd, os.dup(fd)))
                os.dup2(devnull, fd)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), \
                contextlib.redirect_stderr(sink):
            yield
    finally:
        _flush_c_streams()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def _flush_c_streams() -> None:
    """What a C library printed into stdio's buffers goes to /dev/null too, not out later."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


def _no_grad() -> contextlib.AbstractContextManager[Any]:
    torch = sys.modules.get("torch")
    return torch.no_grad() if torch is not None else contextlib.nullcontext()
