"""Replies other than JSON, for the routes that serve a page, a stream or Prometheus text.

A route handler returns a dict (sent as JSON), a `Reply` (bytes with their content type) or a
`Stream` (the handler thread keeps the connection and writes until the stream returns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Reply:
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Stream:
    """`pump(write, connected)` writes chunks until it is done or `connected()` turns False
    (`write` raises OSError once the client has gone). The response has no length, so the
    connection closes after it."""

    pump: Callable[[Callable[[bytes], None], Callable[[], bool]], None]
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()
