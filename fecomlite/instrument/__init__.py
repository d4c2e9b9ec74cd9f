"""Static instrumentation: a copy of the user's project with every framework call wrapped.

The names below are loaded on first use (PEP 562): importing a submodule such as
`fecomlite.instrument.command` for its help must not import libcst.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Failure",
    "InstrumentError",
    "InstrumentResult",
    "configured_roots",
    "default_out",
    "instrument_path",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fecomlite.instrument import project

        return getattr(project, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
