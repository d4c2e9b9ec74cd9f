"""A tiny framework stand-in for instrumenter tests (configured as an API root: `fakeapi`).

Every call appends one entry to `LOG`, so a test can check that each call happened exactly once
and in the original order; values depend only on how many API calls came before (`CALLS`), never
on what else a test adds to `LOG`. Values are plain and printable so two runs compare by text.
"""

from __future__ import annotations

import asyncio

LOG: list[str] = []
CALLS = [0]


def _show(value: object) -> str:
    if hasattr(value, "__next__"):  # a generator: consume it, as a framework would
        return repr(list(value))  # type: ignore[call-overload]
    return repr(value)


def _record(name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> int:
    shown = [_show(a) for a in args] + [f"{k}={_show(v)}" for k, v in kwargs.items()]
    LOG.append(f"{name}({', '.join(shown)})")
    CALLS[0] += 1
    return CALLS[0]


def f(*args: object, **kwargs: object) -> Thing:
    return Thing(_record("f", args, kwargs))


def g(*args: object, **kwargs: object) -> int:
    return _record("g", args, kwargs)


def boom(*args: object) -> None:
    raise ValueError(f"boom {_record('boom', args, {})}")


async def nap(value: object, seconds: float = 0.001) -> int:
    """An awaitable API (like an async client's call): records, then yields to other tasks."""
    n = _record("nap", (value,), {})
    await asyncio.sleep(seconds)
    return n


async def aboom(*args: object) -> None:
    await asyncio.sleep(0)
    raise ValueError(f"aboom {_record('aboom', args, {})}")


def decorate(tag: str):  # a decorator factory, like tf.function(jit_compile=True)
    _record("decorate", (tag,), {})

    def wrap(fn):
        fn.tag = tag
        return fn

    return wrap


class Thing:
    def __init__(self, n: int = 0) -> None:
        self.n = n
        _record("Thing", (n,), {})

    def m(self, *args: object) -> Thing:
        _record(f"Thing[{self.n}].m", args, {})
        return Thing(self.n + 1)

    def __call__(self, *args: object) -> int:
        _record(f"Thing[{self.n}]()", args, {})
        return self.n

    def __repr__(self) -> str:
        return f"Thing[{self.n}]"


class Layer:
    """A base class users subclass (like keras.layers.Layer or torch.nn.Module)."""

    def __init__(self) -> None:
        _record("Layer.__init__", (), {})

    def __call__(self, x: object) -> object:
        _record(f"{type(self).__name__}.__call__", (x,), {})
        return self.forward(x)

    def forward(self, x: object) -> object:
        return x

    def fit(self, x: object) -> str:
        _record(f"{type(self).__name__}.fit", (x,), {})
        return f"fitted {x!r}"
