"""Helpers for the live view, metrics and watch tests: a real server in a thread (real HTTP,
real SQLite) that also hands back the server object, a raw GET, an SSE reader, and a child
process that grows its memory in steps and burns CPU, through the real probe when asked."""

from __future__ import annotations

import http.client
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from fecomlite.sensors import discover, discover_process
from fecomlite.server.client import ServerClient

REPO = Path(__file__).resolve().parents[1]


def real_sensors() -> tuple[list[Any], Any]:
    """This machine's own sensors (no period probe: tests need no second of waiting) and the
    factory for a process's."""
    sensors, _ = discover(None)
    return sensors, lambda pid: discover_process(pid)


def get(host: str, port: int, path: str, *, method: str = "GET", body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with http.client (no proxy, any Host header); (status, headers, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def read_events(url_host: str, port: int, seconds: float,
                token: str) -> list[tuple[float, dict[str, Any]]]:
    """The SSE messages of /live/stream received within `seconds`, with their arrival time."""
    conn = http.client.HTTPConnection(url_host, port, timeout=10)
    conn.request("GET", f"/live/stream?token={token}")
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type", "").startswith("text/event-stream")
    out = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            line = response.fp.readline()
            if line.startswith(b"data: "):
                out.append((time.monotonic(), json.loads(line[6:])))
    finally:
        conn.close()
    return out


GROWER = textwrap.dedent("""
    import sys, time
    STEP, STEPS, PAUSE = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    if len(sys.argv) > 4:
        import fecomlite.runtime.probe as __fecomlite__
        call = __fecomlite__.call
    else:
        call = lambda site, f, *a: f(*a)

    def grow(n):
        return bytearray(b"x") * n  # written, so resident

    def burn(seconds):
        end, x = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            x += 1
        return x

    time.sleep(PAUSE)
    blocks = []
    for _ in range(STEPS):
        blocks.append(call("grower.py:20:18", grow, STEP))
        call("grower.py:21:8", burn, PAUSE)
    time.sleep(PAUSE)
""")
GROWER_SITES = {
    "grower.py:20:18": {"file": "grower.py", "line": 20, "col": 18, "api": "grower.grow",
                        "written": "grow", "kind": "function", "function": "<module>"},
    "grower.py:21:8": {"file": "grower.py", "line": 21, "col": 8, "api": "grower.burn",
                       "written": "burn", "kind": "function", "function": "<module>"},
}


def grower_command(folder: Path, step_bytes: int, steps: int, pause_s: float,
                   probe: bool = False) -> list[str]:
    """A Python command that sleeps, then `steps` times grows by `step_bytes` and burns CPU for
    `pause_s`, then sleeps; with `probe`, each grow and burn is a wrapped call."""
    script = folder / "grower.py"
    script.write_text(GROWER)
    return [sys.executable, str(script), str(step_bytes), str(steps), str(pause_s),
            *(["probe"] if probe else [])]


def probe_env(client: ServerClient, run_id: int, token: str, spool: Path) -> dict[str, str]:
    """The environment `fecomlite run` gives a repetition (docs/internals.md §2)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env.update(FECOMLITE_URL=client.url, FECOMLITE_RUN=str(run_id), FECOMLITE_REP="1",
               FECOMLITE_TOKEN=token, FECOMLITE_SPOOL=str(spool),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p))
    return env
