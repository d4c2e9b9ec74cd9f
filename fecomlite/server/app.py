"""The HTTP face of the measurement server: JSON over loopback, every request authenticated.

Admin routes want `Authorization: Bearer <admin token>` (from the 0600 state file); event posts
want the run's `X-Fecomlite-Token`. Tokens are checked before a body is read, bodies are size
limited, and any failure becomes a JSON error with a 4xx/5xx status, never a dead server.
The route table is data (`ROUTES`), so another listener (a read-only `/metrics`, issue 7) can be
another `ThreadingHTTPServer` with its own table over the same `MeasurementService`.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fecomlite.server.service import MeasurementService, RunNotFound
from fecomlite.server.state import ServerState
from fecomlite.store import StoreError

MAX_BODY_BYTES = 16 * 1024 * 1024  # a probe batch every 200 ms stays far below this
DISCARD_LIMIT_BYTES = 4 * MAX_BODY_BYTES  # refused bodies up to this size are read and dropped
LOOPBACK = "127.0.0.1"


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


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    auth: str  # "none" | "admin" | "run"
    handler: Callable[[MeasurementService, re.Match[str], Any], Any]
    raw: bool  # the handler takes the body as bytes, not as a JSON object


def _route(method: str, path: str, auth: str, raw: bool = False) -> Callable[[Any], Route]:
    def make(fn: Any) -> Route:
        return Route(method, re.compile(f"^{path}$"), auth, fn, raw)

    return make


def _int(body: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = body.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{key} must be an integer")
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
        body = json.loads(raw)
    except ValueError as exc:
        raise _Refused(400, "body is not JSON") from exc
    if not isinstance(body, dict):
        raise _Refused(400, "body must be a JSON object")
    return body


RUN = r"/api/runs/(?P<run>\d+)"
REP = RUN + r"/reps/(?P<rep>\d+)"


@_route("GET", "/api/status", "none")
def _status(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.status()


@_route("POST", "/api/runs", "admin")
def _create_run(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    argv = body.get("argv") or []
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a list of strings")
    return svc.create_run(
        program=str(body.get("program", "")), argv=argv, level=str(body.get("level", "method")),
        settings=_obj(body, "settings"), kind=str(body.get("kind", "instrumented")),
        parent_id=_int(body, "parent_id"), manifest=_obj(body, "manifest"),
    )


@_route("POST", RUN + "/manifest", "admin")
def _manifest(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.set_manifest(int(m["run"]), _obj(body, "manifest") or {})
    return {"ok": True}


@_route("POST", RUN + "/watch", "admin")
def _watch(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.watch(int(m["run"]), _int(body, "pid"))


@_route("POST", REP + "/start", "admin")
def _rep_start(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.rep_start(int(m["run"]), int(m["rep"]), _int(body, "t_ns"), _obj(body, "extra"))
    return {"ok": True}


@_route("POST", REP + "/end", "admin")
def _rep_end(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.rep_end(int(m["run"]), int(m["rep"]), _int(body, "t_ns"), _int(body, "exit_code"))
    return {"ok": True}


@_route("POST", REP + "/tail", "admin")
def _tail(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.tail(int(m["run"]), int(m["rep"]), float(body.get("seconds", 0)))


@_route("POST", RUN + "/idle", "admin")
def _idle(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return svc.idle(int(m["run"]), float(body.get("seconds", 0)))


@_route("POST", RUN + "/gate", "admin")
def _gate(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    thresholds = _obj(body, "thresholds") or {}
    return svc.gate(int(m["run"]), _int(body, "rep"), thresholds)


@_route("POST", RUN + "/hyperparams", "admin")
def _hyperparams(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.hyperparams(int(m["run"]), _obj(body, "params") or {})
    return {"ok": True}


@_route("POST", RUN + "/events", "run", raw=True)
def _events(svc: MeasurementService, m: re.Match[str], body: bytes) -> Any:
    return {"stored": svc.post_events(int(m["run"]), body)}


@_route("POST", RUN + "/finish", "admin")
def _finish(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    svc.finish_run(int(m["run"]), str(body.get("status", "finished")), _int(body, "exit_code"))
    return {"ok": True}


@_route("POST", "/api/ingest", "admin")
def _ingest(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    path = body.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError("path (a spool file or directory) is required")
    return svc.ingest(Path(path), _obj(body, "manifest"))


@_route("POST", "/api/shutdown", "admin")
def _shutdown(svc: MeasurementService, m: re.Match[str], body: dict[str, Any]) -> Any:
    return {"ok": True, "shutting_down": True}


ROUTES: list[Route] = [
    _status, _create_run, _manifest, _watch, _hyperparams, _rep_start, _rep_end, _tail, _idle,
    _gate, _events, _finish, _ingest, _shutdown,
]


class MeasurementServer(ThreadingHTTPServer):
    """The listener: loopback only, one thread per request, owning the service it serves."""

    daemon_threads = True

    def __init__(
        self, service: MeasurementService, port: int = 0, host: str = LOOPBACK,
        admin_token: str | None = None, max_body: int = MAX_BODY_BYTES,
    ) -> None:
        super().__init__((check_loopback(host), port), _Handler)
        self.service = service
        self.admin_token = admin_token or secrets.token_urlsafe(32)
        self.max_body = max_body
        self.routes = ROUTES

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def state(self, pid: int) -> ServerState:
        return ServerState(pid, self.port, self.admin_token, str(self.service.store_path))

    def shutdown_soon(self) -> None:
        """Stop serving from a request thread (`shutdown` blocks until the loop exits)."""
        threading.Thread(target=self.shutdown, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    server: MeasurementServer
    protocol_version = "HTTP/1.1"
    server_version = "fecomlite"

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
        self._send(code, reply)
        if reply.get("shutting_down"):
            self.server.shutdown_soon()

    def _dispatch(self, method: str) -> dict[str, Any]:
        path = self.path.split("?", 1)[0]
        matches = [(r, m) for r in self.server.routes if (m := r.pattern.match(path))]
        if not matches:
            raise _Refused(404, f"no such endpoint: {path}")
        found = [(r, m) for r, m in matches if r.method == method]
        if not found:
            raise _Refused(405, f"{path} wants {matches[0][0].method}")
        route, match = found[0]
        self._authorise(route, match)
        body: Any = {}
        if method == "POST":
            raw = self._read_body()
            body = raw if route.raw else _json_object(raw)
        return route.handler(self.server.service, match, body)

    def _authorise(self, route: Route, match: re.Match[str]) -> None:
        if route.auth == "admin":
            header = self.headers.get("Authorization", "")
            if not header:
                raise _Refused(401, "admin token required (Authorization: Bearer ...)")
            given = header.removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), self.server.admin_token.encode()):
                raise _Refused(403, "wrong admin token")
        elif route.auth == "run":
            token = self.headers.get("X-Fecomlite-Token", "")
            if not token:
                raise _Refused(401, "run token required (X-Fecomlite-Token)")
            if not self.server.service.check_token(int(match["run"]), token):
                raise _Refused(403, "wrong token for this run")

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            raise _Refused(411, "Content-Length required")
        if int(length) > self.server.max_body:
            raise _Refused(413, f"body over {self.server.max_body} bytes")
        self._body_read = True
        return self.rfile.read(int(length))

    def _discard_body(self) -> None:
        """Read a refused request's body (up to a bound), so that its sender gets the answer
        instead of a broken pipe."""
        length = self.headers.get("Content-Length", "")
        if self._body_read or not length.isdigit():
            return
        left = int(length)
        if left > DISCARD_LIMIT_BYTES:
            return
        while left > 0 and (chunk := self.rfile.read(min(left, 1 << 16))):
            left -= len(chunk)

    def _send(self, code: int, reply: dict[str, Any]) -> None:
        data = json.dumps(reply).encode()
        try:
            self.send_response(code, HTTPStatus(code).phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away; nothing to tell it
            self.close_connection = True
