"""The HTTP face of the measurement server: JSON over loopback, every request authenticated.

Admin routes want `Authorization: Bearer <admin token>` (from the 0600 state file); event posts
want the run's `X-Fecomlite-Token`. Tokens are checked before a body is read, bodies are size
limited, and any failure becomes a JSON error with a 4xx/5xx status, never a dead server.
Whatever shows run data (the live view, its stream, /metrics, /api/status beyond "I am
fecomlite") also wants the view token, as Jupyter does: the URL `fecomlite run` prints carries it
(`/?token=...`), and the page keeps it in a cookie for its stream. Those pages also want a Host
header naming loopback, so a web page cannot reach them through a DNS name rebound to 127.0.0.1;
the page's static assets hold no data and want the Host check alone.

A connection waits without a thread until it sends something (`waiting.py`; closed after
REQUEST_TIMEOUT_S of silence), then is served by a thread from a bounded pool; a request that
stalls is dropped after REQUEST_TIMEOUT_S; bodies read at once are bounded in total
(BODY_BUDGET_BYTES), so concurrent large batches cannot take the machine's memory.

The route table is data (`ROUTES`): `MetricsServer`, the listener `--metrics-addr` asks for, is
another `ThreadingHTTPServer` over the same `MeasurementService` whose table holds GET /metrics
alone; it may listen beyond loopback because it reads and never writes.
"""

from __future__ import annotations

import contextlib
import hmac
import http.cookies
import json
import math
import re
import secrets
import select
import socket
import sqlite3
import sys
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fecomlite.runtime.batch_codec import BatchError, check_value
from fecomlite.server import live, metrics
from fecomlite.server.replies import Reply, Stream
from fecomlite.server.service import MeasurementService, RunNotFound, StoreFailure
from fecomlite.server.state import ServerState
from fecomlite.server.waiting import WaitingRoom
from fecomlite.store import StoreError

MAX_BODY_BYTES = 16 * 1024 * 1024  # a probe batch every 200 ms stays far below this
DISCARD_LIMIT_BYTES = 4 * MAX_BODY_BYTES  # refused bodies up to this size are read and dropped
BODY_BUDGET_BYTES = 4 * MAX_BODY_BYTES  # bodies held at once, all requests together
MAX_WORKERS = 64  # request threads at once; more connections wait in the backlog
BACKLOG = 1024
REQUEST_TIMEOUT_S = 30.0  # a connection silent this long (mid-request or kept alive) is closed
LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
METRICS_TIMEOUT_S = 30.0  # a metrics client that sends nothing is dropped after this
MAX_ID = 2**62  # run and repetition numbers in URLs (SQLite holds 64-bit integers)
MAX_NS = 2**62  # monotonic clock stamps (as batch_codec.MAX_NS)
MAX_REP = 10**6 - 1  # as a batch header's rep (batch_codec)
EXIT_CODES = (-(2**31), 2**31 - 1)  # a process's status, or minus the signal that ended it
PROC_ID = re.compile(r"[0-9a-f]{16}")  # a probe's batch id (`Sender.proc`)
MAX_PROCESSES = 100_000  # counter files a run's finish may name


class ServerConfigError(ValueError):
    """The server was asked for something it will not do (e.g. listen beyond loopback)."""


class _Refused(Exception):
    """A request answered with an HTTP error status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def check_loopback(host: str) -> str:
    """The address to bind: 127.0.0.1 only, since the event API trusts local processes."""
    if host not in (LOOPBACK, "localhost"):
        raise ServerConfigError(
            f"refusing to serve the event API on {host!r}: fecomlite's server listens on "
            f"{LOOPBACK} only (its tokens protect local runs, not a network service)"
        )
    return LOOPBACK


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [HOST]:PORT) of the metrics listener."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ServerConfigError(f"a metrics address is HOST:PORT (e.g. 0.0.0.0:9464), not {text!r}")
    return host, int(port)


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    auth: str  # "none" | "admin" | "run" | "page" (no token, but a loopback Host header)
    handler: Callable[[MeasurementService, re.Match[str], Any], Any]
    raw: bool  # the handler takes the body as bytes, not as a JSON object


def _route(method: str, path: str, auth: str, raw: bool = False) -> Callable[[Any], Route]:
    def make(fn: Any) -> Route:
        return Route(method, re.compile(f"^{path}$"), auth, fn, raw)

    return make


def _int(body: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = body.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or not -(2**63) <= value < 2**63):
        raise ValueError(f"{key} must be a 64-bit integer")
    return value


def _bounded(body: dict[str, Any], key: str, low: int, high: int) -> int | None:
    """An optional integer in low..high (a stamp, an exit status, a repetition)."""
    value = _int(body, key)
    if value is not None and not low <= value <= high:
        raise ValueError(f"{key} must be an integer in {low}..{high}")
    return value


def _path_int(m: re.Match[str], key: str) -> int:
    """A run or repetition number from the URL: digits the store can hold."""
    digits = m[key]
    if len(digits) > 19 or int(digits) > MAX_ID:
        raise ValueError(f"{key} number out of range 0..{MAX_ID}")
    return int(digits)


def _rep(m: re.Match[str]) -> int:
    rep = _path_int(m, "rep")
    if rep > MAX_REP:
        raise ValueError(f"rep number out of range 0..{MAX_REP}")
    return rep


def _float(body: dict[str, Any], key: str) -> float:
    value = body.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(float(value)):
        raise ValueError(f"{key} must be a finite number")
    return float(value)


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false")
    return value


def _obj(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{key} must be an object")
    return value


def _json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = json.loads(raw, parse_constant=_no_constant)
        if not isinstance(body, dict):
            raise _Refused(400, "body must be a JSON object")
        check_value(body, "body")
    except (ValueError, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, BatchError) else "body is not JSON"
        raise _Refused(400, reason) from exc
    return body


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


RUN = r"/api/runs/(?P<run>\d+)"
REP = RUN + r"/reps/(?P<rep>\d+)"


@_route("GET", "/api/status", "none")
def _status(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    """Who answers, to anyone; what it measures and where, to a holder of a token only."""
    return svc.status() if body.get("viewer") else {"server": "fecomlite"}


@_route("POST", "/api/runs", "admin")
def _create_run(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    argv = body.get("argv") or []
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a list of strings")
    return svc.create_run(
        program=str(body.get("program", "")), argv=argv, level=str(body.get("level", "method")),
        settings=_obj(body, "settings"), kind=str(body.get("kind", "instrumented")),
        parent_id=_int(body, "parent_id"), manifest=_obj(body, "manifest"),
        owner_pid=_int(body, "owner_pid"),
    )


@_route("POST", RUN + "/manifest", "admin")
def _manifest(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.set_manifest(_path_int(m, "run"), _obj(body, "manifest") or {})
    return {"ok": True}


@_route("POST", RUN + "/watch", "admin")
def _watch(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.watch(_path_int(m, "run"), _int(body, "pid"))


@_route("POST", REP + "/start", "admin")
def _rep_start(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.rep_start(_path_int(m, "run"), _rep(m), _bounded(body, "t_ns", 0, MAX_NS),
                  _obj(body, "extra"))
    return {"ok": True}


@_route("POST", REP + "/end", "admin")
def _rep_end(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.rep_end(_path_int(m, "run"), _rep(m), _bounded(body, "t_ns", 0, MAX_NS),
                _bounded(body, "exit_code", *EXIT_CODES))
    return {"ok": True}


@_route("POST", REP + "/tail", "admin")
def _tail(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.tail(_path_int(m, "run"), _rep(m), _float(body, "seconds"),
                    until_baseline=_bool(body, "until_baseline"))


@_route("POST", RUN + "/idle", "admin")
def _idle(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.idle(_path_int(m, "run"), _float(body, "seconds"))


@_route("POST", RUN + "/idle-estimate", "admin")
def _idle_estimate(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.idle_estimate(_path_int(m, "run"), _float(body, "seconds"),
                             _float(body, "max_age_s"),
                             _int(body, "client_started_ns"))


@_route("POST", RUN + "/gate", "admin")
def _gate(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    thresholds = _obj(body, "thresholds") or {}
    return svc.gate(_path_int(m, "run"), _bounded(body, "rep", 0, MAX_REP), thresholds)


@_route("POST", RUN + "/hyperparams", "admin")
def _hyperparams(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.hyperparams(_path_int(m, "run"), _obj(body, "params") or {})
    return {"ok": True}


@_route("POST", RUN + "/events", "run", raw=True)
def _events(svc: MeasurementService, m: re.Match[str], body: bytes) -> Any:
    return {"stored": svc.post_events(_path_int(m, "run"), body)}


@_route("POST", RUN + "/finish", "admin")
def _finish(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.finish_run(_path_int(m, "run"), str(body.get("status", "finished")),
                          _bounded(body, "exit_code", *EXIT_CODES), _recorded(body))


def _recorded(body: dict[str, Any]) -> dict[str, int]:
    """The `recorded` field: batch id (`proc`, 16 hex digits) -> events the process recorded."""
    value = body.get("recorded") or {}
    if not isinstance(value, dict) or len(value) > MAX_PROCESSES or not all(
            isinstance(k, str) and PROC_ID.fullmatch(k) and isinstance(n, int)
            and not isinstance(n, bool) and 0 <= n < 2**63 for k, n in value.items()):
        raise ValueError("recorded must map process ids (16 hex digits) to event counts")
    return value


@_route("POST", "/api/ingest", "admin")
def _ingest(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    path = body.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError("path (a spool file or directory) is required")
    return svc.ingest(Path(path), _obj(body, "manifest"))


@_route("POST", "/api/shutdown", "admin")
def _shutdown(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return {"ok": True, "shutting_down": True}


@_route("GET", "/", "view")
def _live_page(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    page = live.page()
    return Reply(page.body, page.content_type, (*page.headers, *body.get("set_cookie", ())))


@_route("GET", r"/static/(?P<name>[A-Za-z0-9_.-]+)", "page")
def _live_asset(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    try:
        return live.asset(m["name"])
    except live.AssetNotFound as exc:
        raise _Refused(404, str(exc)) from exc


@_route("GET", "/live/stream", "view")
def _live_stream(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return live.stream(svc.monitor, svc.closing)


@_route("GET", "/metrics", "view")
def _metrics(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return metrics.exposition(svc.monitor)


ROUTES: list[Route] = [
    _status, _create_run, _manifest, _watch, _hyperparams, _rep_start, _rep_end, _tail, _idle,
    _idle_estimate, _gate, _events, _finish, _ingest, _shutdown, _live_page, _live_asset,
    _live_stream, _metrics,
]
# The metrics listener: the same handler, any Host (Prometheus names its target by address).
METRICS_ROUTES: list[Route] = [Route("GET", re.compile("^/metrics$"), "none", _metrics.handler,
                                     False)]


class _Budget:
    """Bytes of request bodies held at once: a reader waits until its body fits."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int) -> Any:
        size = min(size, self.limit)
        with self._changed:
            self._changed.wait_for(lambda: self.used + size <= self.limit)
            self.used += size
        try:
            yield
        finally:
            with self._changed:
                self.used -= size
                self._changed.notify_all()


class _Listener(ThreadingHTTPServer):
    """A bounded pool of request threads over a shared service; `routes` is what this
    listener answers."""

    daemon_threads = True
    request_queue_size = BACKLOG
    routes: list[Route]
    admin_token: str | None = None
    view_token: str | None = None
    max_body = MAX_BODY_BYTES
    discard_limit = DISCARD_LIMIT_BYTES
    explain_methods = True  # 405 for a known path with another method; False: 404

    def __init__(self, service: MeasurementService, address: tuple[str, int],
                 handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.workers = threading.BoundedSemaphore(MAX_WORKERS)
        self.bodies = _Budget(BODY_BUDGET_BYTES)
        super().__init__(address, handler)
        self.service = service
        self.waiting = WaitingRoom(self._start_worker, self.shutdown_request, REQUEST_TIMEOUT_S)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A new connection waits, without a thread, until it sends something."""
        self.waiting.add(request, client_address)

    def _start_worker(self, request: Any, client_address: Any) -> None:
        """A connection that sent something: served by a worker once one is free."""
        self.workers.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.workers.release()
            self.shutdown_request(request)

    def server_close(self) -> None:
        self.waiting.close()
        super().server_close()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.workers.release()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Wait in `select` until a request comes, with no timeout by default: a timed poll is
        a wake-up every poll_interval, which on a VM costs more CPU than the requests do.
        `shutdown` wakes the loop itself."""
        super().serve_forever(poll_interval)  # type: ignore[arg-type]  # None: no timeout

    def shutdown(self) -> None:
        """Ask the loop to stop, then connect to the listener until it has seen the request
        (an empty connection is read as nothing and closed)."""
        stopping = threading.Thread(target=super().shutdown, name="listener-stop", daemon=True)
        stopping.start()
        host, port = self.server_address[:2]
        host = {"0.0.0.0": LOOPBACK, "": LOOPBACK, "::": "::1"}.get(str(host), str(host))
        while stopping.is_alive():
            with contextlib.suppress(OSError):  # refused: the loop has ended or is ending
                socket.create_connection((host, port), timeout=1).close()
            stopping.join(0.05)


class MeasurementServer(_Listener):
    """The listener: loopback only, one thread per request, owning the service it serves.
    `metrics` is the optional read-only listener on another address (see `open_metrics`)."""

    def __init__(
        self, service: MeasurementService, port: int = 0, host: str = LOOPBACK,
        admin_token: str | None = None, max_body: int = MAX_BODY_BYTES,
    ) -> None:
        super().__init__(service, (check_loopback(host), port), _Handler)
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.view_token = secrets.token_urlsafe(24)
        self.max_body = max_body
        self.routes = ROUTES
        self.metrics: MetricsServer | None = None

    def open_metrics(self, address: str) -> MetricsServer:
        """Bind the read-only /metrics listener on `address` (HOST:PORT); `serve` runs it."""
        self.metrics = MetricsServer(self.service, parse_address(address))
        return self.metrics

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def state(self, pid: int) -> ServerState:
        return ServerState(pid, self.port, self.admin_token, str(self.service.store_path),
                           self.view_token or "")

    def shutdown_soon(self) -> None:
        """Stop serving from a request thread (`shutdown` blocks until the loop exits)."""
        threading.Thread(target=self.shutdown, daemon=True).start()


class MetricsServer(_Listener):
    """GET /metrics and nothing else (404), on any address: it holds no token, reads no body and
    changes nothing, so it may face the network; the event and admin API never listens here."""

    max_body = 0
    discard_limit = 0
    explain_methods = False

    def __init__(self, service: MeasurementService, address: tuple[str, int]) -> None:
        super().__init__(service, address, _MetricsHandler)
        self.routes = METRICS_ROUTES

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"


class _Handler(BaseHTTPRequestHandler):
    server: _Listener
    protocol_version = "HTTP/1.1"
    server_version = "fecomlite"
    timeout = REQUEST_TIMEOUT_S
    # A reply's headers and body go out in two writes: with Nagle's algorithm on, the body
    # waited for the ACK the client delays (~40 ms), so a probe's kept-alive connection could
    # post ~25 batches a second however fast the server stored them.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: one line per request would flood the foreground console every 200 ms."""

    def _handle(self, method: str) -> None:
        self._body_read = False
        try:
            code, reply = 200, self._dispatch(method)
        except _Refused as exc:
            code, reply = exc.code, {"error": exc.message}
        except RunNotFound as exc:
            code, reply = 404, {"error": str(exc)}
        except StoreFailure as exc:  # the store could not take it (a full disk): not the caller
            code, reply = 507, {"error": str(exc)}
        except sqlite3.OperationalError as exc:  # a full disk, an I/O error: not the caller
            code = 503 if "locked" in str(exc) else 507
            reply = {"error": f"the store could not record it: {exc}"}
        except (ValueError, TypeError, StoreError, OSError) as exc:
            code, reply = 400, {"error": str(exc)}
        except RuntimeError as exc:  # shutting down
            code, reply = 503, {"error": str(exc)}
        except Exception as exc:  # the last line of defence: report, keep serving
            print(f"fecomlite server: {method} {self.path}: {exc!r}", file=sys.stderr)
            code, reply = 500, {"error": f"internal error: {exc!r}"}
        if code != 200:
            self._discard_body()
            self.close_connection = True
        if isinstance(reply, Stream):
            self._stream(reply)
        elif isinstance(reply, Reply):
            self._send_bytes(code, reply.body, reply.content_type, reply.headers)
        else:
            self._send(code, reply)
            if reply.get("shutting_down") and isinstance(self.server, MeasurementServer):
                self.server.shutdown_soon()

    def _dispatch(self, method: str) -> Any:
        path = self.path.split("?", 1)[0]
        matches = [(r, m) for r in self.server.routes if (m := r.pattern.match(path))]
        found = [(r, m) for r, m in matches if r.method == method]
        if not found and matches and self.server.explain_methods:
            raise _Refused(405, f"{path} wants {matches[0][0].method}")
        if not found:
            raise _Refused(404, f"no such endpoint: {method} {path}")
        route, match = found[0]
        clock = getattr(self.server, "clock", None)
        if route.handler is _status and clock is not None:
            clock.not_work()  # asked by any home's `server status`: not this home's work
        self._authorise(route, match)
        if method != "POST":
            return route.handler(self.server.service, match, self._view_extras(route))
        length = self._content_length()
        with self.server.bodies.hold(length):
            raw = self._read_body(length)
            body = raw if route.raw else _json_object(raw)
            return route.handler(self.server.service, match, body)

    def _viewer(self) -> str | None:
        """The token this request shows for reading run data (the admin token counts), from
        the Authorization header, the `token` query parameter or this server's cookie."""
        given = [self.headers.get("Authorization", "").removeprefix("Bearer ").strip()]
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        given += query.get("token", [])
        cookies = http.cookies.SimpleCookie()
        with contextlib.suppress(http.cookies.CookieError):
            cookies.load(self.headers.get("Cookie", ""))
        if (morsel := cookies.get(self._cookie_name())) is not None:
            given.append(morsel.value)
        for token in (self.server.view_token, self.server.admin_token):
            if token and any(hmac.compare_digest(g.encode(), token.encode()) for g in given):
                return token
        return None

    def _cookie_name(self) -> str:
        return f"fecomlite-{self.server.port}"  # cookies ignore ports: one per server

    def _view_extras(self, route: Route) -> dict[str, Any]:
        """What a GET handler may know: whether a token was shown, and the cookie to set."""
        token = self._viewer()
        if token is None:
            return {}
        cookie = (f"{self._cookie_name()}={token}; Path=/; HttpOnly; SameSite=Strict",)
        return {"viewer": True, "set_cookie": (("Set-Cookie", cookie[0]),)}

    def _authorise(self, route: Route, match: re.Match[str]) -> None:
        if route.auth == "admin":
            header = self.headers.get("Authorization", "")
            if not header:
                raise _Refused(401, "admin token required (Authorization: Bearer ...)")
            given = header.removeprefix("Bearer ").strip()
            token = self.server.admin_token
            if not token or not hmac.compare_digest(given.encode(), token.encode()):
                raise _Refused(403, "wrong admin token")
        elif route.auth in ("page", "view"):
            host = self.headers.get("Host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name not in LOOPBACK_NAMES:
                raise _Refused(403, f"this page is served to loopback names only, not {host!r}")
            if route.auth == "view" and self._viewer() is None:
                raise _Refused(401, "this page shows run data: open the URL `fecomlite run` "
                                    "printed (it carries ?token=...)")
        elif route.auth == "run":
            token = self.headers.get("X-Fecomlite-Token", "")
            if not token:
                raise _Refused(401, "run token required (X-Fecomlite-Token)")
            if not self.server.service.check_token(int(match["run"]), token):
                raise _Refused(403, "wrong token for this run")

    def _content_length(self) -> int:
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            raise _Refused(411, "Content-Length required")
        if int(length) > self.server.max_body:
            raise _Refused(413, f"body over {self.server.max_body} bytes")
        return int(length)

    def _read_body(self, length: int) -> bytes:
        self._body_read = True
        body = self.rfile.read(length)
        if len(body) < length:
            raise _Refused(400, "the body ended before its Content-Length")
        return body

    def _discard_body(self) -> None:
        """Read a refused request's body (up to a bound), so that its sender gets the answer
        instead of a broken pipe."""
        length = self.headers.get("Content-Length", "")
        if self._body_read or not length.isdigit():
            return
        left = int(length)
        if left > self.server.discard_limit:
            return
        while left > 0 and (chunk := self.rfile.read(min(left, 1 << 16))):
            left -= len(chunk)

    def _send(self, code: int, reply: dict[str, Any]) -> None:
        self._send_bytes(code, json.dumps(reply).encode(), "application/json")

    def _send_bytes(
        self, code: int, data: bytes, content_type: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        try:
            self.send_response(code, HTTPStatus(code).phrase)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away; nothing to tell it
            self.close_connection = True

    def _stream(self, stream: Stream) -> None:
        """Hold the connection for a stream (Server-Sent Events) until it ends or the client
        leaves; no length is sent, so the connection closes after it."""
        self.close_connection = True

        def write(chunk: bytes) -> None:
            self.wfile.write(chunk)
            self.wfile.flush()

        def connected() -> bool:
            """False once the viewer closed its end: nothing to read means still there, a
            readable end that reads nothing means the end of its stream. (`select` first: the
            socket has a timeout, under which even MSG_DONTWAIT waits.)"""
            try:
                if not select.select([self.connection], [], [], 0)[0]:
                    return True
                return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
            except BlockingIOError:
                return True
            except (OSError, ValueError):
                return False

        try:
            self.send_response(200, "OK")
            self.send_header("Content-Type", stream.content_type)
            self.send_header("Connection", "close")
            for name, value in stream.headers:
                self.send_header(name, value)
            self.end_headers()
            stream.pump(write, connected)
        except OSError:  # the viewer left
            pass
        except Exception as exc:  # report, end this stream; the viewer reconnects by itself
            print(f"fecomlite server: stream {self.path}: {exc!r}", file=sys.stderr)


class _MetricsHandler(_Handler):
    """The metrics listener's handler: a client that sends nothing is dropped."""

    timeout = METRICS_TIMEOUT_S
