"""What PyTorch's compilers see of the probe: nothing but the call it wraps.

* dynamo (`torch.compile`) traces the Python bytecode of a compiled function and so meets every
  `__fecomlite__.call(site, fn, *args)`. The C entry point would be a skipped function (a graph
  break, an error under `fullgraph=True`) and the Python ones would be traced into (the sized
  path, guards on the probe's state). Each entry point is registered as a dynamo polyfill whose
  body is `fn(*args, **kwargs)`: the graph is the original's, and the compiled code never calls
  the probe. Registration waits for the program to import `torch._dynamo` (the probe never
  imports torch), by a one-shot import hook.
* The JIT tracer (`torch.jit.trace`, and `make_fx`/export tracing) runs calls eagerly and names
  each value after the Python frame that made it; the sized path's frames and size reads would
  differ between the invocations `trace` compares. While one traces, calls stay on the fast path.
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
    try:
        return torch._C._get_tracing_state() is not None or bool(torch.compiler.is_compiling())
    except Exception:  # a torch still importing, or one without these: not tracing
        return False


def register_with_dynamo(entry_points: Iterable[Callable[..., Any]]) -> None:
    """Make dynamo trace each entry point as `plain_call`, now or once it is imported."""
    entry_points = tuple(dict.fromkeys(entry_points))

    def register() -> None:
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
