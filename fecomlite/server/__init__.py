"""The local measurement server: samples sensors, receives probe events, gates repetitions and
stores everything in the run store. Clients use `ensure_server(home)` and `ServerClient`.

The client is loaded on first use, so `fecomlite server ... --help` does not load the store."""

from __future__ import annotations

from typing import Any

__all__ = ["ServerClient", "ServerError", "ensure_server"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fecomlite.server import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
