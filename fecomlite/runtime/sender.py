"""Sends the probe's event batches to the measurement server, or to a spool file without one.

Runs on the probe's flusher thread (and at exit), never on the user's call path. A server that
stops answering is not retried on every batch: after a failure the sender spools for a while,
then tries again, so a dead server costs the program nothing and loses nothing.

Every batch carries its id: this process's random `proc` and a sequence number. The store keeps
an id once, so a batch posted, timed out, spooled, and stored by a server that was only slow is
still stored once; a kept-alive connection the server closed is retried once for the same reason.
Each batch sent while the calls in progress differ from the last batch's carries them (`open`),
so the live view shows a long call while it runs, not only once it ended.
A spool record names its run and its store (never the run's token) and is written whole or not
at all (0600). Each batch also says how many events this process has produced so far
(`total`), so the store knows exactly how many never arrived (neither posted nor spooled, e.g. on
a full disk, or spooled and never ingested): the run then ends "incomplete", saying how many.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from fecomlite.runtime import batch_codec
from fecomlite.runtime.identity import rank_fields

if TYPE_CHECKING:
    import http.client

RETRY_AFTER_FAILURE_S = 2.0
POST_TIMEOUT_S = 2.0
STORE_ENV = "FECOMLITE_STORE"  # the run's store identity, which spool records name


class Sender:
    """One per process: posts batches over a kept-alive loopback connection, else spools."""

    # header field -> what to send in it now ({} = nothing); e.g. "layers"
    # (fecomlite.runtime.layers)
    extra_headers: ClassVar[dict[str, Callable[[], dict[str, Any]]]] = {}

    def __init__(self, config: Any,
                 open_calls: Callable[[], list[tuple[int, int, list[tuple[str, int]]]]]
                 | None = None) -> None:
        """`open_calls()`: the probe's calls in progress (`probe.open_calls`)."""
        self.config = config
        self._open_calls = open_calls
        self._open_sent: list[dict[str, Any]] = []
        self.hyperparams: dict[str, Any] = {}
        self.shapes: dict[str, Any] = {}  # site -> shapes of its latest sized call, not yet sent
        self._sent_shapes: dict[str, Any] = {}
        self.names: dict[str, dict[str, str]] = {}  # site -> its callee's public name, unsent
        self._named: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._shapes_lock = threading.Lock()  # held for a dict update only: on the user's thread
        self._conn: http.client.HTTPConnection | None = None
        self._down_until = 0.0
        self.proc = os.urandom(8).hex()  # a new Sender (and id) in each forked child too
        self.store = os.environ.get(STORE_ENV, "")
        self._seq = 0
        self._total = 0  # events put in batches so far
        self.lost = 0  # events neither posted nor spooled, so far
        self._lost_told = 0  # `lost` when a batch last reached the server
        self.on_sending: Callable[[int], None] = _nothing  # the probe's ring (`event_ring`)
        self.on_sent: Callable[[], None] = _nothing
        url = urlsplit(config.url) if config.url else None
        self._host = url.hostname if url else None
        self._port = url.port if url else None

    def add_hyperparams(self, params: dict[str, Any]) -> None:
        """Hyperparameters seen by the probe go out with the next batch."""
        with self._lock:
            self.hyperparams.update(params)

    def add_shapes(self, site: str, shapes: dict[str, Any]) -> None:
        """A sized call's shapes (`capture.call_shapes`); sent once unless they change."""
        if self._sent_shapes.get(site) != shapes:
            with self._shapes_lock:
                self.shapes[site] = shapes

    def add_name(self, site: str, named: dict[str, str] | None) -> None:
        """The public name of the callee a site ran (`runtime.names.runtime_name`), sent once; a
        site seen running different callees, or one without a name, is sent as {}: the store
        then keeps its static name."""
        decided = named or {}
        with self._shapes_lock:
            known = self._named.get(site)
            if known == decided or known == {}:
                return
            if known is not None:
                decided = {}
            self._named[site] = decided
            self.names[site] = decided

    def _take_shapes(self) -> dict[str, Any]:
        with self._shapes_lock:
            shapes, self.shapes = self.shapes, {}
        self._sent_shapes.update(shapes)
        return shapes

    def _take_names(self) -> dict[str, dict[str, str]]:
        with self._shapes_lock:
            names, self.names = self.names, {}
        return names

    def send(self, drain: Callable[[], tuple[Any, ...]], final: bool = False) -> None:
        """Drain the probe's buffer and send it as one batch (docs/internals.md §2); `final`:
        the process's last, posted whatever the server last answered. The probe's ring
        (`event_ring`) learns the batch's id before it goes (`on_sending`) and that it is gone
        (`on_sent`: posted, spooled or counted lost)."""
        with self._lock:
            names, *columns = drain()
            try:
                self._send_drained(names, columns, final)
            finally:
                self.on_sent()

    def _send_drained(self, names: list[str], columns: list[bytes], final: bool) -> None:
        shapes = self._take_shapes()
        callees = self._take_names()
        extra = {k: v for k, take in self.extra_headers.items() if (v := take())}
        open_now = self._in_progress()
        if open_now != self._open_sent:
            extra["open"] = open_now
        if (not names and not self.hyperparams and not shapes and not callees and not extra
                and self.lost == self._lost_told):
            return  # (after losses, even an empty batch goes: its `total` tells them)
        n = len(columns[0]) // 4
        self._total += n
        meta: dict[str, Any] = {
            "rep": self.config.rep,
            "pid": os.getpid(),
            **rank_fields(),
            "proc": self.proc,
            "seq": self._seq,
            **extra,
        }
        self.on_sending(self._seq)
        self._seq += 1
        meta["total"] = self._total
        if self.hyperparams:
            meta["hyperparams"] = self.hyperparams
            self.hyperparams = {}
        if shapes:
            meta["shapes"] = shapes
        if callees:
            meta["names"] = callees
        if self._host and self._post(batch_codec.encode(meta, names, tuple(columns)), final):
            self._lost_told = self.lost
            self._open_sent = open_now
            return
        meta.pop("open", None)  # a spool is read after the run: nothing is in progress then
        if self.config.run:
            meta["run"] = self.config.run
        if self.store:
            meta["store"] = self.store
        failure = self._spool(batch_codec.encode(meta, names, tuple(columns)))
        if failure is None:
            self._lost_told = self.lost  # the spooled record's `total` tells it
            return
        if not self.lost:
            _tell(
                f"fecomlite probe: {failure}; events from now on may be lost "
                "(counted, and the run is marked incomplete)"
            )
        self.lost += n

    def _in_progress(self) -> list[dict[str, Any]]:
        """The calls in progress as the header's `open` field: per thread, its depth and the
        outermost calls (site key, start ns)."""
        if self._open_calls is None:
            return []
        return [{"tid": tid, "depth": depth, "calls": [[site, t0] for site, t0 in calls]}
                for tid, depth, calls in self._open_calls()[:batch_codec.MAX_OPEN_THREADS]]

    def prepare(self) -> None:
        """Load the HTTP client before there is anything to send: on the flusher thread, at
        start-up, not during the program's first long call, where each of the import's file
        reads waits for the busy thread's GIL switch interval (~1 s for the first batch)."""
        if self._host:
            import http.client  # noqa: F401

    def _post(self, body: bytes, force: bool = False) -> bool:
        if not force and time.monotonic() < self._down_until and self.lost == self._lost_told:
            return False  # (after a loss, every batch tries: it may be the last one to tell)
        import http.client  # loaded by `prepare`, on the flusher thread

        for fresh in (self._conn is None, True):  # a kept-alive connection may have been closed
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
                break
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
                self._conn = None
                if fresh:
                    break
            except (OSError, http.client.HTTPException):
                break
        self._conn = None
        self._down_until = time.monotonic() + RETRY_AFTER_FAILURE_S
        return False

    def _spool(self, batch: bytes) -> str | None:
        """Append one record whole (a failed write is cut back off); why it failed, or None."""
        path = spool_path(self.config.spool)
        try:
            for folder in reversed([p for p in [path.parent, *path.parents] if not p.exists()]):
                folder.mkdir(mode=0o700, exist_ok=True)  # each level private, not just the last
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            return f"cannot spool to {path}: {exc}"
        size = 0
        try:
            size = os.fstat(fd).st_size
            with os.fdopen(fd, "ab", closefd=False) as spool:
                batch_codec.write_record(spool, batch)
            return None
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            return f"cannot spool to {path}: {exc}"
        finally:
            os.close(fd)


def _nothing(*_: Any) -> None:
    """No ring to tell (the pure-Python probe, outside a run)."""


def _tell(message: str) -> None:
    """One line in the program's log: why events may be missing."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr)


def spool_path(configured: str) -> Path:
    """The spool file of this process: configured ($FECOMLITE_SPOOL), else in fecomlite's home
    ($FECOMLITE_HOME, else ./.fecomlite): <home>/spool/<pid>.spool."""
    if configured:
        return Path(configured)
    return Path(os.environ.get("FECOMLITE_HOME", ".fecomlite")) / "spool" / f"{os.getpid()}.spool"
