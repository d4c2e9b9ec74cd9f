"""Helpers for the server tests: a test-only sensor, batch encoding, an in-thread server.

The server under test is the real one (real HTTP on 127.0.0.1, real SQLite); only the sensors
are injected, so the tests do not depend on what this machine can measure.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fecomlite.runtime import batch_codec
from fecomlite.server.client import ServerClient
from fecomlite.server.runtime import open_server, serve
from fecomlite.server.state import read_state


class FakeSensorForTests:
    """A sensor whose reading is `value(seconds since its first read)`; it records which threads
    read and closed it."""

    def __init__(
        self, name: str, *, domain: str = "cpu-package", unit: str = "W", kind: str = "power",
        value: Callable[[float], float | None] = lambda t: 42.0, period_s: float = 0.02,
        slow: bool = False, provenance: str = "measured", model: str | None = None,
        device: str = "cpu",
    ) -> None:
        self.name, self.domain, self.unit, self.kind = name, domain, unit, kind
        self.provenance, self.model, self.period_s = provenance, model, period_s
        self.slow, self.device = slow, device
        self.value = value
        self.reads = 0
        self.read_threads: set[int] = set()
        self.closed_in: int | None = None
        self._t0: float | None = None

    def read(self) -> float | None:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        self.reads += 1
        self.read_threads.add(threading.get_ident())
        return self.value(now - self._t0)

    def close(self) -> None:
        self.closed_in = threading.get_ident()


_batch_numbers = itertools.count()


def encode_batch(rep: int, pid: int, events: list[tuple[Any, ...]], **meta: Any) -> bytes:
    """A probe batch (docs/internals.md §2) from (site, t0, t1, tid, status, in, out) tuples;
    each call's batch has its own id (proc, seq) unless `meta` gives one."""
    meta = {"proc": "testsender", "seq": next(_batch_numbers), **meta}
    names = sorted({e[0] for e in events})
    dtypes = ("<i4", "<i8", "<i8", "<u8", "u1", "<i8", "<i8")
    rows = [(names.index(e[0]), *e[1:]) for e in events]
    columns = tuple(
        np.array([r[i] for r in rows], dtype=dtype).tobytes() for i, dtype in enumerate(dtypes)
    )
    return batch_codec.encode({"rep": rep, "pid": pid, **meta}, names, columns)


@contextmanager
def serving(
    home: Path, sensors: list[Any], *, process_sensors: Any = None, **service_options: Any
) -> Iterator[tuple[Any, ServerClient]]:
    """A real server in a thread of this process, over `home`; yields (server, client) and
    shuts it down on exit."""
    server = open_server(
        home, sensors=sensors, process_sensors=process_sensors, notes=[], **service_options
    )
    thread = threading.Thread(target=serve, args=(server, home), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while (state := read_state(home)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state is not None, "the server did not publish its state file"
    client = ServerClient.from_state(state)
    try:
        yield server, client
    finally:
        if thread.is_alive():
            client.shutdown()
        thread.join(timeout=10)


@contextmanager
def served(
    home: Path, sensors: list[Any], *, process_sensors: Any = None, **service_options: Any
) -> Iterator[ServerClient]:
    """`serving` when only the client is needed."""
    with serving(home, sensors, process_sensors=process_sensors, **service_options) as (_, c):
        yield c
