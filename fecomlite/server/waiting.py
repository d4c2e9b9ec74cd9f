"""Accepted connections that have not sent anything yet wait here, not in a worker thread.

With a bounded pool of request threads, a connection that holds a thread while sending nothing
(thousands of idle sockets from one local program) would block every other client for as long as
the request timeout. Here they wait in one thread and one epoll instead: the first byte hands a
connection to a worker, and IDLE silence closes it. Only a connection that started a request
holds a worker (and then the request timeout bounds it).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any


class WaitingRoom:
    """Holds connections until they are readable (`ready(conn, address)`) or silent for
    `idle_s` (`drop(conn)`)."""

    def __init__(
        self,
        ready: Callable[[socket.socket, Any], None],
        drop: Callable[[socket.socket], None],
        idle_s: float,
    ) -> None:
        self._ready, self._drop, self.idle_s = ready, drop, idle_s
        self._selector = selectors.DefaultSelector()
        self._incoming: deque[tuple[socket.socket, Any]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (self._wake_r, self._wake_w):
            end.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="waiting-room", daemon=True)
        self._thread.start()

    def add(self, conn: socket.socket, address: Any) -> None:
        """Called by the accept loop: never blocks."""
        self._incoming.append((conn, address))
        self._wake()

    def close(self) -> None:
        """Close every waiting connection and end the thread."""
        self._closed = True
        self._wake()
        self._thread.join(timeout=5)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe: a wake-up is pending anyway
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        waiting: dict[socket.socket, tuple[Any, float]] = {}
        while not self._closed:
            for key, _ in self._selector.select(timeout=1.0):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(1 << 16)
                    continue
                conn = key.fileobj
                self._selector.unregister(conn)
                address, _ = waiting.pop(conn)
                self._ready(conn, address)  # waits for a free worker
            while self._incoming:
                conn, address = self._incoming.popleft()
                waiting[conn] = (address, time.monotonic() + self.idle_s)
                self._selector.register(conn, selectors.EVENT_READ, address)
            now = time.monotonic()
            for conn in [c for c, (_, deadline) in waiting.items() if deadline < now]:
                self._selector.unregister(conn)
                del waiting[conn]
                self._drop(conn)
        for conn in [*waiting, *(c for c, _ in self._incoming)]:
            self._drop(conn)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
