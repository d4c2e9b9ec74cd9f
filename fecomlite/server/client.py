"""The Python client of the measurement server, and `ensure_server`, which starts one if needed.

Stdlib only (urllib), and never through an HTTP proxy: the server is on loopback, and a proxy
from the environment would see the tokens.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fecomlite.runtime import batch_codec
from fecomlite.server.idle import IDLE_EXIT_S
from fecomlite.server.state import ServerState, pid_alive, read_state
from fecomlite.store import StoreError, default_home, private_home

START_TIMEOUT_S = 60.0  # sensor discovery measures update periods for about a second
SLACK_S = 30.0  # on top of a blocking request's own duration
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


class ServerError(RuntimeError):
    """The server refused a request, failed, or could not be reached or started."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerClient:
    """Talks to one server with its admin token (from the state file)."""

    def __init__(
        self, url: str, admin_token: str, store_path: Path, *, pid: int | None = None,
        timeout: float = SLACK_S, view_token: str = "",
    ) -> None:
        self.url = url.rstrip("/")
        self.admin_token = admin_token
        self.store_path = Path(store_path)
        self.pid = pid
        self.timeout = timeout
        self.started = False  # True when `ensure_server` has just started this server
        self.view_token = view_token
        self.store_id = ""  # the store's identity, as the last create_run said

    @classmethod
    def from_state(cls, state: ServerState) -> ServerClient:
        return cls(state.url, state.admin_token, Path(state.store), pid=state.pid,
                   view_token=state.view_token)

    @property
    def view_url(self) -> str:
        """The live view's address, with the token that opens it (like Jupyter's)."""
        return f"{self.url}/?token={self.view_token}" if self.view_token else f"{self.url}/"

    def _call(
        self, method: str, path: str, body: dict[str, Any] | bytes | None = None, *,
        headers: dict[str, str] | None = None, timeout: float | None = None, admin: bool = True,
    ) -> dict[str, Any]:
        data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        if admin:
            headers["Authorization"] = f"Bearer {self.admin_token}"
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers=headers)
        try:
            with _OPENER.open(request, timeout=timeout or self.timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except ValueError:
                message = exc.reason
            raise ServerError(f"{method} {path}: {exc.code} {message}", exc.code) from None
        except (OSError, ValueError) as exc:
            raise ServerError(f"{method} {path}: server at {self.url} unreachable: {exc}") from exc

    # -- the API -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The server's pid, store, sensors (a caller without a token learns only that it is
        a fecomlite server)."""
        return self._call("GET", "/api/status", timeout=5)

    def create_run(
        self, program: str, argv: list[str], level: str, settings: dict[str, Any],
        kind: str = "instrumented", parent_id: int | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> tuple[int, str]:
        """Start a run (samples are stored from now on); returns (run_id, event token). The run
        belongs to this process: it is marked interrupted if this process dies first."""
        reply = self._call("POST", "/api/runs", {
            "program": program, "argv": argv, "level": level, "settings": settings,
            "kind": kind, "parent_id": parent_id, "manifest": manifest, "owner_pid": os.getpid(),
        })
        self.store_id = str(reply.get("store_id", ""))
        return int(reply["run_id"]), str(reply["token"])

    def set_manifest(self, run_id: int, manifest: dict[str, Any]) -> None:
        self._call("POST", f"/api/runs/{run_id}/manifest", {"manifest": manifest})

    def watch(self, run_id: int, pid: int | None) -> dict[str, Any]:
        """Follow this process tree's memory and CPU use (None: stop following)."""
        return self._call("POST", f"/api/runs/{run_id}/watch", {"pid": pid})

    def idle(self, run_id: int, seconds: float) -> dict[str, Any]:
        """Measure the idle baseline for `seconds` (blocks that long)."""
        return self._call("POST", f"/api/runs/{run_id}/idle", {"seconds": seconds},
                          timeout=seconds + SLACK_S)

    def idle_estimate(
        self, run_id: int, seconds: float, max_age_s: float, client_started_ns: int | None = None
    ) -> dict[str, Any]:
        """The server's rolling idle estimate as the run's baseline, or {"refused": why};
        readings after `client_started_ns` (this process's start-up) are not judged."""
        return self._call("POST", f"/api/runs/{run_id}/idle-estimate",
                          {"seconds": seconds, "max_age_s": max_age_s,
                           "client_started_ns": client_started_ns})

    def gate(self, run_id: int, rep: int | None = None, **thresholds: float) -> dict[str, Any]:
        """Wait until the machine is stable (at most `max_wait_s`, default 120 s)."""
        wait = float(thresholds.get("max_wait_s", 120.0))
        return self._call("POST", f"/api/runs/{run_id}/gate",
                          {"rep": rep, "thresholds": thresholds}, timeout=wait + SLACK_S)

    def rep_start(self, run_id: int, rep: int, extra: dict[str, Any] | None = None) -> None:
        self._call("POST", f"/api/runs/{run_id}/reps/{rep}/start",
                   {"t_ns": time.monotonic_ns(), "extra": extra})

    def rep_end(self, run_id: int, rep: int, exit_code: int | None) -> None:
        self._call("POST", f"/api/runs/{run_id}/reps/{rep}/end",
                   {"t_ns": time.monotonic_ns(), "exit_code": exit_code})

    def tail(
        self, run_id: int, rep: int, seconds: float, until_baseline: bool = False
    ) -> dict[str, Any]:
        """Keep sampling `seconds` after the repetition ended (blocks that long), or with
        `until_baseline` until power is back at the run's idle baseline, if sooner:
        {tail_end_ns, back_since_ns (None: not seen back)}."""
        return self._call("POST", f"/api/runs/{run_id}/reps/{rep}/tail",
                          {"seconds": seconds, "until_baseline": until_baseline},
                          timeout=seconds + SLACK_S)

    def post_batch(self, run_id: int, token: str, body: bytes) -> int:
        """What the probe does: post one encoded batch (`fecomlite.runtime.batch_codec`) with the
        run's
        token; returns how many events were stored."""
        reply = self._call("POST", f"/api/runs/{run_id}/events", body, admin=False,
                           headers={"X-Fecomlite-Token": token,
                                    "Content-Type": batch_codec.CONTENT_TYPE})
        return int(reply["stored"])

    def hyperparams(self, run_id: int, params: dict[str, Any]) -> None:
        """Merge hyperparameters into the run (e.g. ones given on the command line)."""
        self._call("POST", f"/api/runs/{run_id}/hyperparams", {"params": params})

    def finish_run(self, run_id: int, status: str, exit_code: int | None,
                   recorded: dict[str, int] | None = None) -> dict[str, Any]:
        """Close the run: {status (`incomplete` when events were lost), lost_events, and
        lost_at_exit: of them, those of processes that died before sending them}. `recorded`:
        proc -> events each process recorded (`runtime.event_ring`)."""
        return self._call("POST", f"/api/runs/{run_id}/finish",
                          {"status": status, "exit_code": exit_code, "recorded": recorded or {}})

    def ingest_report(self, path: Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
        """Ingest a spool file or directory: {events, runs, files, bad_lines}."""
        return self._call("POST", "/api/ingest",
                          {"path": str(Path(path).resolve()), "manifest": manifest},
                          timeout=600)

    def ingest(self, path: Path, manifest: dict[str, Any] | None = None) -> int:
        """Ingest a spool file or directory; returns how many events were stored."""
        return int(self.ingest_report(path, manifest)["events"])

    def shutdown(self, wait_s: float = 10.0) -> None:
        """Stop the server and wait (up to `wait_s`) until it has cleaned up and gone."""
        self._call("POST", "/api/shutdown", {})
        home = self.store_path.parent
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            state = read_state(home)
            if state is None or state.pid != self.pid:  # removed: the last thing a server does
                return
            time.sleep(0.05)


def ensure_server(home: Path | None = None, timeout_s: float = START_TIMEOUT_S) -> ServerClient:
    """A client of the server serving `home`, starting one in the background if none answers
    (`client.started`); that one exits by itself after `IDLE_EXIT_S` unused."""
    home = (home or default_home()).resolve()
    try:
        private_home(home)
        lock = _private_file(home / "server.lock")
    except StoreError as exc:
        raise ServerError(str(exc)) from None
    except OSError as exc:  # e.g. a read-only or full home
        raise ServerError(f"fecomlite cannot write to its folder {home}: "
                          f"{exc.strerror or exc}") from None
    with _locked(lock):
        client = live_client(home)
        if client is not None:
            return client
        return _start(home, timeout_s)


def live_client(home: Path) -> ServerClient | None:
    """A client of the server the state file in `home` names, if that server answers as itself
    (a dead one's pid may be a zombie or reused)."""
    state = read_state(home)
    if state is None or not pid_alive(state.pid):
        return None
    client = ServerClient.from_state(state)
    try:
        answered = client.status()
    except ServerError:
        return None
    return client if answered.get("pid") == state.pid else None


def _start(home: Path, timeout_s: float) -> ServerClient:
    log_path = _private_file(home / "server.log")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fecomlite.server", "--home", str(home),
             "--idle-exit", str(IDLE_EXIT_S)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"the server exited with status {proc.returncode}:\n"
                              f"{_tail(log_path)}")
        state = read_state(home)
        if state is not None and state.pid == proc.pid:
            client = ServerClient.from_state(state)
            try:
                client.status()
                client.started = True
                return client
            except ServerError:
                pass
        time.sleep(0.05)
    proc.terminate()
    raise ServerError(f"the server did not answer within {timeout_s:g} s:\n{_tail(log_path)}")


def _private_file(path: Path) -> Path:
    """Create `path` readable by its owner only (it may hold paths and arguments)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return path


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`, so that two callers never start two servers."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
