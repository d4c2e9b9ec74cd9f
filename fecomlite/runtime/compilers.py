"""What PyTorch's compilers see of the probe: nothing but the call it wraps.

* dynamo (`torch.compile`) traces the Python bytecode of a compiled function and so meets every
  `__fecomlite__.call(site, fn, *args)`. The C entry point would be a skipped function (a graph
  break, an error under `fullgraph=True`) and the Python ones would be traced into (the sized
  path, guards on the probe's state). Each entry point is registered as a dynamo polyfill whose
  body is `fn(*args, **kwargs)`: the graph is the original's, and the compiled code never calls
  the probe. Registration waits for the program to import `torch._dynamo` (the probe never
  imports torch), by a one-shot import hook.
  dynamo also never traces into the probe's own code: after a graph break, the rest of a
  compiled function runs eagerly with dynamo still looking at each new frame, and the probe's
  helpers (`before`/`after` of the sized path, the run-time decision) would be compiled as frames
  of their own, with breaks and warnings of their own. Their code objects are marked skipped,
  with every frame they call (`set_code_exec_strategy`); the pure-Python entry points, skipped
  alone (the user's callee they call is compiled as without the probe).
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


def register_with_dynamo(
    entry_points: Iterable[Callable[..., Any]], helpers: Iterable[Callable[..., Any]] = ()
) -> None:
    """Make dynamo trace each entry point as `plain_call`, and never compile a frame of the
    entry points or of the helpers (nor any frame a helper calls), now or once it is imported."""
    entry_points = tuple(dict.fromkeys(entry_points))
    helpers = tuple(helpers)

    def register() -> None:
        with suppress(Exception):
            _skip_frames(entry_points, recursive=False)
            _skip_frames(helpers, recursive=True)
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


def _skip_frames(functions: Iterable[Callable[..., Any]], *, recursive: bool) -> None:
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    nested = FrameAction.SKIP if recursive else FrameAction.DEFAULT
    for fn in functions:
        code = getattr(fn, "__code__", None)  # the C entry points have none: no frame at all
        if code is not None:
            set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, nested))


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
