"""Run a function right after a module is imported (or now, if it already was).

The layer hooks need the framework, but importing it ourselves would change the program (a Keras
program need not import torch, and imports cost seconds). A finder on `sys.meta_path` finds
nothing itself; for the watched names it asks the other finders and wraps the loader so the
callback runs once the module has executed."""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


def when_imported(callbacks: dict[str, Callback]) -> None:
    """Call each callback with its module once that module is imported; never raises."""
    waiting = {}
    for name, callback in callbacks.items():
        module = sys.modules.get(name)
        if module is not None:
            _safely(callback, module)
        else:
            waiting[name] = callback
    if waiting:
        sys.meta_path.insert(0, _Watcher(waiting))


def _safely(callback: Callback, module: ModuleType) -> None:
    with contextlib.suppress(Exception):  # tracing is optional, the program is not
        callback(module)


class _Watcher(importlib.abc.MetaPathFinder):
    def __init__(self, callbacks: dict[str, Callback]) -> None:
        self.callbacks = callbacks
        self.busy: set[str] = set()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.callbacks or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, lambda module: self._loaded(name, module))
        return spec

    def _loaded(self, name: str, module: ModuleType) -> None:
        """The module executed: its callback runs now, once. (Not at `find_spec`: a spec may be
        looked up without importing, as TensorFlow does with `importlib.util.find_spec("keras")`
        before it imports Keras.)"""
        callback = self.callbacks.pop(name, None)
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)
        if callback is not None:
            callback(module)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callback."""

    def __init__(self, loader: Any, callback: Callback) -> None:
        self.loader = loader
        self.callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__.loader = self.loader  # reloads and introspection see the real loader
        self.loader.exec_module(module)
        _safely(self.callback, module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code...
        return getattr(self.loader, name)
