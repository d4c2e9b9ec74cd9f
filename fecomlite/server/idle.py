"""Idle exit: a server `fecomlite run` started in the background stops by itself once nothing
has used it for a while, so forgotten servers do not pile up (README, "The measurement server").

Busy means a request in flight (a live view's stream included) or a run still recording; the
idle time counts from the end of the last of these. A status request (`fecomlite server status`
asks every server of the user, from any home) is not work: it never keeps a server alive.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

IDLE_EXIT_S = 600.0  # what an automatically started server waits, idle, before it exits


class ActivityClock:
    """Requests in flight, and when the last one that did this home's work ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last = time.monotonic()
        self._mine = threading.local()  # whether the request on this thread is work

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
        self._mine.work = True
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._mine.work:
                    self._last = time.monotonic()

    def not_work(self) -> None:
        """The request on this thread only asks who answers (`fecomlite server status`, which
        asks every server of the user, whatever its home): it does not keep the server."""
        self._mine.work = False

    def touch(self) -> None:
        """Count now as used (a run is still recording)."""
        with self._lock:
            self._last = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last request ended; 0 while one is in flight."""
        with self._lock:
            return 0.0 if self._in_flight else time.monotonic() - self._last


class Tracked(Protocol):
    """A server that knows when it was last used (`fecomlite.server.runtime.TrackedServer`)."""

    clock: ActivityClock

    def busy(self) -> bool: ...

    def shutdown(self) -> None: ...


def exit_when_idle(
    server: Tracked, idle_exit_s: float, say: Callable[[str], None] | None = None
) -> threading.Thread:
    """A thread that shuts `server` down once it has been idle for `idle_exit_s` seconds."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))

    def watch() -> None:
        check = min(max(idle_exit_s / 20, 0.05), 5.0)
        while True:
            time.sleep(check)
            if server.busy():
                server.clock.touch()
            elif server.clock.idle_for() >= idle_exit_s:
                say(f"fecomlite server: idle for {idle_exit_s:g} s, exiting")
                server.shutdown()
                return

    thread = threading.Thread(target=watch, name="idle-exit", daemon=True)
    thread.start()
    return thread
