"""`fecomlite watch`'s live figures in the terminal: the live view's stream, drawn with rich.

The server already works out what the live view shows (power per energy domain with its sensor's
provenance, the process's RSS and GPU memory, the call in progress or the last one to end) and
pushes it as Server-Sent Events. The terminal reads that same stream, so it shows the page's
figures by the same model, with no second reading of the store. A share domain (the process's
part of the CPU package) is shown as a share of its whole, never added to anything.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fecomlite.analysis.run_analysis import domain_role
from fecomlite.analysis.units import scaled
from fecomlite.report.palette import domain_name
from fecomlite.server.client import ServerClient
from fecomlite.terminal import plain

REFRESH_PER_S = 4
CONNECT_TIMEOUT_S = 10.0
MAX_RUNNING_SHOWN = 3  # calls in progress on screen (nested calls, threads)


class StreamFeed:
    """The latest message of the server's live stream, read by a thread of its own until
    `close()` (which shuts the connection, so the reading thread ends at once)."""

    def __init__(self, client: ServerClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._latest: dict[str, Any] | None = None
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._read, name="fecomlite-watch-feed", daemon=True)

    def start(self) -> StreamFeed:
        self._thread.start()
        return self

    @property
    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._latest

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=CONNECT_TIMEOUT_S)

    def _read(self) -> None:
        url = urlsplit(self._client.url)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=CONNECT_TIMEOUT_S)
        try:
            conn.request("GET", f"/live/stream?token={self._client.view_token}")
            self._sock = conn.sock  # the response keeps it after the connection lets it go
            response = conn.getresponse()
            if response.status != 200:
                self.error = f"the live stream answered {response.status}"
                return
            data: list[str] = []
            while not self._closed.is_set():
                line = response.readline()
                if not line:
                    return
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if text.startswith("data:"):
                    data.append(text[5:].lstrip())
                elif not text and data:
                    message = json.loads("\n".join(data))
                    data.clear()
                    with self._lock:
                        self._latest = message
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if not self._closed.is_set():
                self.error = f"the live stream stopped: {exc}"
        finally:
            with contextlib.suppress(OSError):
                conn.close()


def live_figures(
    message: dict[str, Any] | None, run_id: int, pid: int, error: str | None = None
) -> Group:
    """What the terminal shows now: the run's elapsed time, each energy domain's power (with its
    provenance and idle level), memory, and the calls in progress (or the last one)."""
    title = f"run {run_id}: watching pid {pid}"
    run = (message or {}).get("run") or {}
    if run.get("id") != run_id:  # not yet (or no longer) the run the server follows
        waiting = error or "waiting for the server's first figures…"
        return Group(Text(title, style="bold"), Text(waiting, style="dim"))
    if run.get("elapsed_s") is not None:
        title += f" for {scaled(run['elapsed_s'], 's')}"
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("figure")
    table.add_column("now", justify="right")
    table.add_column("source")
    for p in message.get("power", []):
        value = scaled(p.get("now"), "W")
        role = domain_role(p["domain"])
        if role["role"] == "share":
            value += f" (share of {domain_name(role['of'])})"
        elif p.get("idle") is not None:
            value += f" (idle {scaled(p['idle'], 'W')})"
        source = p["provenance"] + (f", {p['model']}" if p.get("model") else "")
        table.add_row(f"{domain_name(p['domain'])} power", value, plain(source))
    for m in message.get("memory", []):
        table.add_row(
            plain(m["label"].split(" (")[0]),
            scaled(m.get("now"), "B"),
            plain(m["label"].partition(" (")[2].rstrip(")")),
        )
    calls = message.get("calls") or {}
    for label, value in _call_rows(calls):
        table.add_row(label, value, "probe")
    if not message.get("power"):
        table.caption = "no energy sensor has given a reading yet"
    parts: list[Any] = [table]
    if calls.get("total"):  # the notes say what the per-API estimate cannot do
        parts += [Text(f"note: {plain(n)}", style="yellow") for n in message.get("notes", [])]
    if error:
        parts.append(Text(error, style="red"))
    return Group(*parts)


def _call_rows(calls: dict[str, Any]) -> list[tuple[str, str]]:
    """The calls in progress as the stream carries them (`in_progress`: the live view's, each
    with its API, what was written and how long it has run), else the last call to end; nothing
    for a process without the probe."""
    rows = []
    running = calls.get("in_progress") or []
    for c in running[:MAX_RUNNING_SHOWN]:
        written = f" ({plain(c['written'])})" if c.get("written") else ""
        rows.append(("call in progress",
                     f"{plain(c.get('api'))}{written} for {scaled(c.get('elapsed_s'), 's')}"))
    if len(running) > MAX_RUNNING_SHOWN:
        rows.append(("", f"and {len(running) - MAX_RUNNING_SHOWN} more"))
    if not running and calls.get("last"):
        last = calls["last"]
        rows.append(
            (
                "last call",
                f"{plain(last['api'])} took {scaled(last['took_s'], 's')}, "
                f"{scaled(last['ago_s'], 's')} ago",
            )
        )
    if calls.get("total"):
        rows.append(("calls so far", f"{calls['total']:,}"))
    return rows


class LiveFigures:
    """The live display of one watch, from `start` (before the command starts: its output, piped
    through sys.stdout/sys.stderr, then shows above the figures) until `stop` (idempotent, leaves
    the last figures on screen). `follow(run_id, pid)` says what to show once it is known."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._target: tuple[int, int] | None = None
        self._feed: StreamFeed | None = None
        self._live: Live | None = None

    def start(self, client: ServerClient) -> None:
        self._feed = StreamFeed(client).start()
        self._live = Live(
            get_renderable=self._render,
            console=self._console,
            refresh_per_second=REFRESH_PER_S,
            transient=False,
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._live.start()

    def follow(self, run_id: int, pid: int) -> None:
        self._target = (run_id, pid)

    def _render(self) -> Group | Text:
        feed = self._feed
        if self._target is None or feed is None:
            return Text("starting…", style="dim")
        return live_figures(feed.latest, *self._target, feed.error)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._feed is not None:
            self._feed.close()
            self._feed = None
