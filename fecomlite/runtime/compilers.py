"""What PyTorch's compilers see of the probe: nothing but the call it wraps.

* dynamo (`torch.compile`) traces the Python bytecode of a compiled function and so meets every
  `__fecomlite__.call(site, fn, *args)`. The C entry point would be a skipped function (a graph
  break, an error under `fullgraph=True`) and the Python ones would be traced into (the sized
  path, guards on the probe's state). Each entry point is registered as a dynamo polyfill whose
  body is `fn(*args, **kwargs)`: the graph is the original's, and the compiled code never calls
  the probe. Registration waits for the program to import `torch._dynamo` (the probe never
  imports torch), by a one-shot import hook.
  dynamo also never traces into fecomlite's own code: the package's folder is one of dynamo's
  skipped directories (`trace_rules.add`), so the sized path's helpers, which run eagerly next to
  a compiled function after a graph break, are neither compiled nor a reason for a break.
* The JIT tracer (`torch.jit.trace`, and `make_fx`/export tracing) and FX's symbolic tracer run
  calls with values that record what is done to them (proxies, fake tensors): a size read would
  become part of the graph. While one traces, or when a call's arguments are such values
  (`traced_values`), calls stay on the fast path and nothing is read from them.
* TorchScript compiles source text: `source.py` serves the user's original text.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from contextlib import suppress
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

DYNAMO = "torch._dynamo"


def plain_call(site: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """A probe entry point as dynamo traces it: the wrapped call alone."""
    return fn(*args, **kwargs)


def tracing() -> bool:
    """Whether a PyTorch tracer records the calls made now (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    fx = sys.modules.get("torch.fx._symbolic_trace")
    try:
        return (
            torch._C._get_tracing_state() is not None
            or bool(torch.compiler.is_compiling())
            or (fx is not None and bool(getattr(fx, "_is_fx_tracing_flag", False)))
        )
    except Exception:  # a torch still importing, or one without these: not tracing
        return False


def _tracer_types() -> tuple[type, ...]:
    """The classes of values that record what is done to them, among those already imported."""
    found = []
    for module, name in _TRACER_CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


_TRACER_CLASSES = (("torch.fx.proxy", "Proxy"), ("torch._subclasses.fake_tensor", "FakeTensor"),
                   ("jax.core", "Tracer"))


def traced_values(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the callee, its receiver or an argument (one level into lists and tuples) is a
    tracer's value: reading its size would record the read."""
    kinds = _tracer_types()
    if not kinds:
        return False
    values = [fn, getattr(fn, "__self__", None), *args, *kwargs.values()]
    for value in values:
        if isinstance(value, kinds):
            return True
        if isinstance(value, (list, tuple)) and any(isinstance(v, kinds) for v in value[:64]):
            return True
    return False


def register_with_dynamo(entry_points: Iterable[Callable[..., Any]]) -> None:
    """Make dynamo trace each entry point as `plain_call`, now or once it is imported."""
    entry_points = tuple(dict.fromkeys(entry_points))

    def register() -> None:
        with suppress(Exception):  # the probe's own frames: never traced, never a break
            from torch._dynamo import trace_rules

            trace_rules.add(__name__.split(".", 1)[0])
        try:
            from torch.compiler import substitute_in_graph
        except Exception:  # an older torch: dynamo then breaks the graph, as before
            return
        for fn in entry_points:
            with suppress(TypeError, ValueError):  # already registered: imported twice
                substitute_in_graph(fn)(plain_call)

    if DYNAMO in sys.modules:
        register()
    else:
        sys.meta_path.insert(0, _AfterImport(DYNAMO, register))


class _AfterImport(MetaPathFinder):
    """Runs `callback` once, right after module `name` has executed; then leaves the path."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                _then(spec.loader, self.callback)
                return spec
        return None


def _then(loader: Any, callback: Callable[[], None]) -> None:
    """After the loader executes the module, the callback (which never fails the import)."""
    exec_module = getattr(loader, "exec_module", None)
    if exec_module is None:
        return

    def exec_then_call(module: ModuleType) -> None:
        exec_module(module)
        with suppress(Exception):
            callback()

    loader.exec_module = exec_then_call  # this spec's own loader instance only
