"""fecomlite: what each framework API call of a deep-learning project costs in energy and memory.

The public API (`measure`, `Measurement`, `region`, `%load_ext fecomlite`) is loaded on first
use, so that importing a part of the package (the probe, inside the measured program) loads
nothing else.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Measurement", "load_ipython_extension", "measure", "region"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("measure", "Measurement"):
        from fecomlite.api import measure as module
    elif name == "region":
        from fecomlite.runtime import regions as module
    else:
        raise AttributeError(f"module 'fecomlite' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext fecomlite`: the `%%fecomlite` cell magic (fecomlite/api/notebook_magic.py)."""
    from fecomlite.api.notebook_magic import load_ipython_extension as load

    load(ipython)
