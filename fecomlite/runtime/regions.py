"""`fecomlite.region(name)`: mark a span of the user's own code, measured like a wrapped call.

Usable as `with fecomlite.region("epoch"):` and as `@fecomlite.region("load")`. Outside a run
(no `FECOMLITE_RUN` in the environment) it does nothing and imports nothing beyond this module.

Inside a run, entering and leaving are the C `Region` type's (`_fastprobe.c`): one clock read
each and an append to the probe's buffer, with no import and no Python frame, so a region costs
a few times a probe instead of ~1.3 µs (benchmarks/region_overhead.py). Without the C extension
the same stack lives in Python.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from threading import get_ident
from time import monotonic_ns
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_ACTIVE = bool(os.environ.get("FECOMLITE_RUN"))


class _InactiveSpan:
    """Outside a run: entering and leaving do nothing."""

    __slots__ = ("site",)

    def __init__(self, site: str) -> None:
        self.site = site

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *_: object) -> None:
        return None


class _PythonSpan:
    """The C `Region`'s behaviour without the extension: a stack of (thread, start)."""

    __slots__ = ("_starts", "site")

    def __init__(self, site: str) -> None:
        self.site = site
        self._starts: list[tuple[int, int]] = []

    def __enter__(self) -> Any:
        self._starts.append((get_ident(), monotonic_ns()))
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        t1, tid = monotonic_ns(), get_ident()
        for i in range(len(self._starts) - 1, -1, -1):
            if self._starts[i][0] == tid:
                _probe().record(self.site, self._starts.pop(i)[1], t1, exc_type is not None)
                return


def _probe() -> Any:
    """The probe module: its buffer is where spans go, and its sender takes them to the server."""
    from fecomlite.runtime import probe

    return probe


def _span_type() -> type:
    if not _ACTIVE:
        return _InactiveSpan
    try:
        from fecomlite.runtime._fastprobe import Region
    except ImportError:
        return _PythonSpan
    return Region  # type: ignore[no-any-return]


class region(_span_type()):  # type: ignore[misc]  # noqa: N801 - used like contextlib's helpers
    """A named span of user code; nests with the wrapped calls inside it, and with itself.

    One object may be entered again inside itself and from several threads at once: each exit
    ends the latest span its own thread started.
    """

    __slots__ = ()

    def __init__(self, name: str) -> None:
        super().__init__(f"region:{name}")
        if _ACTIVE:
            _probe()  # started once: the probe's sender drains the buffer the span lands in

    def __call__(self, func: F) -> F:
        if not _ACTIVE:
            return func

        @functools.wraps(func)
        def measured(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return measured  # type: ignore[return-value]
