"""`fecomlite.region(name)`: mark a span of the user's own code, measured like a wrapped call.

Usable as `with fecomlite.region("epoch"):` and as `@fecomlite.region("load")`. Outside a run
(no `FECOMLITE_RUN` in the environment) it does nothing and imports nothing beyond this module.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from time import monotonic_ns
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_ACTIVE = bool(os.environ.get("FECOMLITE_RUN"))


class region:  # noqa: N801 - used like a function, as contextlib's helpers are
    """A named span of user code; nests with the wrapped calls inside it."""

    def __init__(self, name: str) -> None:
        self.site = f"region:{name}"
        self._starts: list[int] = []

    def __enter__(self) -> region:
        if _ACTIVE:
            self._starts.append(monotonic_ns())
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if _ACTIVE and self._starts:
            from fecomlite import probe

            probe.record(self.site, self._starts.pop(), monotonic_ns(), raised=exc_type is not None)

    def __call__(self, func: F) -> F:
        if not _ACTIVE:
            return func

        @functools.wraps(func)
        def measured(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return measured  # type: ignore[return-value]
