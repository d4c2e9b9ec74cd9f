"""Sends the probe's event batches to the measurement server, or to a spool file without one.

Runs on the probe's flusher thread (and at exit), never on the user's call path. A server that
stops answering is not retried on every batch: after a failure the sender spools for a while,
then tries again, so a dead server costs the program nothing and loses nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from fecomlite import batch_codec

if TYPE_CHECKING:
    import http.client

RETRY_AFTER_FAILURE_S = 2.0
POST_TIMEOUT_S = 2.0


class Sender:
    """One per process: posts batches over a kept-alive loopback connection, else spools."""

    # header field -> what to send in it now ({} = nothing); e.g. "layers" (fecomlite.layers)
    extra_headers: ClassVar[dict[str, Callable[[], dict[str, Any]]]] = {}

    def __init__(self, config: Any) -> None:
        self.config = config
        self.hyperparams: dict[str, Any] = {}
        self.shapes: dict[str, Any] = {}  # site -> shapes of its latest sized call, not yet sent
        self._sent_shapes: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._shapes_lock = threading.Lock()  # held for a dict update only: on the user's thread
        self._conn: http.client.HTTPConnection | None = None
        self._down_until = 0.0
        url = urlsplit(config.url) if config.url else None
        self._host = url.hostname if url else None
        self._port = url.port if url else None

    def add_hyperparams(self, params: dict[str, Any]) -> None:
        """Hyperparameters seen by the probe go out with the next batch."""
        with self._lock:
            self.hyperparams.update(params)

    def add_shapes(self, site: str, shapes: dict[str, Any]) -> None:
        """A sized call's shapes (`probe_capture.call_shapes`); sent once unless they change."""
        if self._sent_shapes.get(site) != shapes:
            with self._shapes_lock:
                self.shapes[site] = shapes

    def _take_shapes(self) -> dict[str, Any]:
        with self._shapes_lock:
            shapes, self.shapes = self.shapes, {}
        self._sent_shapes.update(shapes)
        return shapes

    def send(self, drain: Callable[[], tuple[Any, ...]]) -> None:
        """Drain the probe's buffer and send it as one batch (docs/internals.md §2)."""
        with self._lock:
            names, *columns = drain()
            shapes = self._take_shapes()
            extra = {k: v for k, take in self.extra_headers.items() if (v := take())}
            if not names and not self.hyperparams and not shapes and not extra:
                return
            meta: dict[str, Any] = {"rep": self.config.rep, "pid": os.getpid(), **extra}
            if self.hyperparams:
                meta["hyperparams"] = self.hyperparams
                self.hyperparams = {}
            if shapes:
                meta["shapes"] = shapes
            if self._host and self._post(batch_codec.encode(meta, names, tuple(columns))):
                return
            if self.config.run:
                meta.update(run=self.config.run, token=self.config.token)
            self._spool(batch_codec.encode(meta, names, tuple(columns)))

    def _post(self, body: bytes) -> bool:
        if time.monotonic() < self._down_until:
            return False
        import http.client  # on the flusher thread: it costs the user's program ~20 ms at import

        try:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=POST_TIMEOUT_S
                )
            self._conn.request(
                "POST",
                f"/api/runs/{self.config.run}/events",
                body=body,
                headers={
                    "Content-Type": batch_codec.CONTENT_TYPE,
                    "X-Fecomlite-Token": self.config.token,
                },
            )
            response = self._conn.getresponse()
            response.read()
            if response.status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        self._conn = None
        self._down_until = time.monotonic() + RETRY_AFTER_FAILURE_S
        return False

    def _spool(self, batch: bytes) -> None:
        path = spool_path(self.config.spool)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as spool:
            batch_codec.write_record(spool, batch)


def spool_path(configured: str) -> Path:
    """The spool file of this process: configured, or ./.fecomlite/spool/<pid>.spool."""
    if configured:
        return Path(configured)
    return Path(".fecomlite") / "spool" / f"{os.getpid()}.spool"
