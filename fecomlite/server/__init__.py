"""The local measurement server: samples sensors, receives probe events, gates repetitions and
stores everything in the run store. Clients use `ensure_server(home)` and `ServerClient`."""

from fecomlite.server.client import ServerClient, ServerError, ensure_server

__all__ = ["ServerClient", "ServerError", "ensure_server"]
