"""The project's modules and its tests rewritten as they are imported (`fecomlite.instrument.
importhook`, the hook `fecomlite run` uses), so the framework calls inside a test are named as a
run names them; the probe's events go to the plugin's sink, never to a server or a spool file.

Two import rewriters meet here, and both must apply: pytest rewrites the asserts of test modules
and conftest files, fecomlite wraps framework calls. For a module pytest would rewrite, the
instrumented text has its asserts rewritten by pytest's own `rewrite_asserts`; a module that
fecomlite leaves alone is left to the other finders (pytest's included), not loaded here.
"""

from __future__ import annotations

import ast
import importlib
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from fecomlite.instrument.importhook import ImportHook, Rewriter
from fecomlite.instrument.project import InstrumentError
from fecomlite.pytest_plugin.recorder import PROBE, EventSink


def _pytest_rewrites(fullname: str, filename: str) -> Any:
    """pytest's assertion hook, when it would rewrite this module's asserts; else None."""
    from _pytest.assertion import assertstate_key
    from _pytest.assertion.rewrite import AssertionRewritingHook

    for finder in sys.meta_path:
        if isinstance(finder, AssertionRewritingHook):
            try:
                state = finder.config.stash[assertstate_key]
                return finder if finder._should_rewrite(fullname, filename, state) else None
            except (AttributeError, KeyError):
                return None
    return None


class TestImportHook(ImportHook):
    """The import hook, for a pytest session: test modules keep pytest's assert rewriting."""

    def __init__(self, rewriter: Rewriter) -> None:
        super().__init__(rewriter)
        self._importing = threading.local()  # the module find_spec is looking for

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        outer = getattr(self._importing, "name", None)  # rewriting may import other modules
        self._importing.name = fullname
        try:
            return super().find_spec(fullname, path, target)
        finally:
            self._importing.name = outer

    def code_for(self, filename: str) -> Any:
        name = getattr(self._importing, "name", None)
        code = super().code_for(filename)
        pytest_hook = _pytest_rewrites(name, filename) if code is not None and name else None
        if pytest_hook is None:
            return code
        from _pytest.assertion.rewrite import rewrite_asserts

        text = self.rewriter.entry(filename, Path(filename).read_bytes())["text"]
        tree = ast.parse(text, filename)
        rewrite_asserts(tree, text.encode(), filename, pytest_hook.config)
        return compile(tree, filename, "exec", dont_inherit=True)


def start(config: pytest.Config, cache_dir: Path | None) -> tuple[TestImportHook, EventSink]:
    """Rewrite the modules under the rootdir from now on; the probe's events go to the sink."""
    import fecomlite.runtime.probe  # noqa: F401 - loaded now, so its sender is replaced first

    sink = EventSink()
    probe = sys.modules[PROBE]
    probe.flush()
    sink.replaced, probe._sender = probe._sender, sink
    try:
        hook = TestImportHook(Rewriter(config.rootpath, None, cache_dir))
    except InstrumentError as exc:
        raise pytest.UsageError(str(exc)) from None
    sys.meta_path.insert(0, hook)  # as `importhook.install` does, with this subclass
    importlib.invalidate_caches()
    return hook, sink


def stop(hook: TestImportHook, sink: EventSink) -> None:
    """No more rewriting; the probe gets its own sender back."""
    from fecomlite.pytest_plugin.recorder import restore_probe

    hook.uninstall()
    restore_probe(sink)
