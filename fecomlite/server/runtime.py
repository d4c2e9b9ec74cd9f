"""The server process from start to stop: find the sensors, bind, publish the state file (and
the user's registry link), serve until stopped or idle too long, and leave a clean store behind
(open runs marked `interrupted`, the state file and the link removed)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fecomlite.server.app import MeasurementServer, check_loopback
from fecomlite.server.client import live_client
from fecomlite.server.idle import ActivityClock, exit_when_idle
from fecomlite.server.machine import machine_info
from fecomlite.server.registry import register, unregister
from fecomlite.server.sampler import Sensor
from fecomlite.server.service import MeasurementService, ProcessSensors
from fecomlite.server.state import remove_state, write_state
from fecomlite.store import default_home

PERIOD_PROBE_S = 1.0  # how long `measure_period` may watch each sensor at start (in parallel)
SAMPLER_ENV = "FECOMLITE_SAMPLER"  # "python": no C tick thread (to compare, or if it misbehaves)


class ServerRunning(RuntimeError):
    """Another live server already owns this home."""


class TrackedServer(MeasurementServer):
    """A measurement server that knows when it was last used, for its idle exit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = ActivityClock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.clock.request():
            super().process_request_thread(request, client_address)  # type: ignore[misc]

    def busy(self) -> bool:
        """A run is recording (its program may post nothing for a long while)."""
        return bool(self.service.sampler.recording())


def machine_sensors(
    settings: dict[str, Any] | None = None,
) -> tuple[list[Sensor], list[str], ProcessSensors]:
    """The machine's sensors with measured update periods, notes on what is missing, and a
    factory for the sensors that follow a process (memory, CPU and GPU use of its tree)."""
    from fecomlite.sensors import discover, measure_period

    sensors, notes = discover(None, settings)
    with ThreadPoolExecutor(max_workers=max(1, len(sensors))) as pool:
        list(pool.map(lambda s: measure_period(s, max_s=PERIOD_PROBE_S), sensors))
    machine_names = {s.name for s in sensors}

    def process_sensors(pid: int) -> tuple[list[Sensor], list[str]]:
        """The new process's sensors, at once (a period probe would miss its start-up)."""
        found, said = discover(pid, settings)
        mine = [s for s in found if s.name not in machine_names]
        for s in found:
            if s.name in machine_names:
                s.close()
        return mine, [n for n in said if n not in notes]

    return sensors, notes, process_sensors


def idle_watch_sensors() -> list[Sensor]:
    """Other instances of the machine's sensors, for the rolling idle estimate's own thread."""
    from fecomlite.sensors import discover

    return discover(None)[0]


def open_server(
    home: Path,
    port: int = 0,
    host: str = "127.0.0.1",
    sensors: list[Sensor] | None = None,
    process_sensors: ProcessSensors | None = None,
    notes: list[str] | None = None,
    metrics_addr: str | None = None,
    **service_options: Any,
) -> MeasurementServer:
    """A bound, not yet serving server over `<home>/store.sqlite`; sensors are discovered when
    none are given. Refuses a non-loopback host and a home another live server owns.
    `metrics_addr` (HOST:PORT) binds a second, read-only listener serving GET /metrics only."""
    host = check_loopback(host)
    home = home.resolve()
    other = live_client(home)
    if other is not None and other.pid != os.getpid():
        raise ServerRunning(f"a fecomlite server (pid {other.pid}) already serves {home} "
                            f"at {other.url}")
    service_options.setdefault("use_ticker", os.environ.get(SAMPLER_ENV, "c") != "python")
    if sensors is None:
        sensors, found_notes, process_sensors = machine_sensors()
        notes = [*found_notes, *(notes or [])]
        service_options.setdefault("watch_sensors", idle_watch_sensors())
    service = MeasurementService(
        home / "store.sqlite", sensors, notes=notes, machine=machine_info(),
        process_sensors=process_sensors, **service_options,
    )
    server = None
    try:
        server = TrackedServer(service, port, host)
        if metrics_addr:
            server.open_metrics(metrics_addr)
        return server
    except BaseException:
        if server is not None:
            server.server_close()
        service.close()
        raise


# The main thread's loop wakes this often. A signal sent to the process is taken by any of its
# threads (the sampler's, the writer's, the C tick thread), while Python runs its handler only in
# the main thread, and only once that thread runs again: a loop waiting with no timeout left a
# SIGTERM unhandled until the next request came (the server hung in 2 of 6 stops here).
SIGNAL_POLL_S = 0.5

def serve(
    server: MeasurementServer,
    home: Path,
    ready: Callable[[str], None] | None = None,
    idle_exit_s: float = 0.0,
) -> None:
    """Publish the state file and serve until shutdown, SIGTERM, Ctrl-C or (`idle_exit_s` > 0)
    that many seconds unused; then clean up."""
    home = home.resolve()
    pid = os.getpid()
    metrics = server.metrics
    if metrics is not None:
        threading.Thread(target=metrics.serve_forever, name="metrics-listener",
                         daemon=True).start()
    write_state(home, server.state(pid))
    with contextlib.suppress(OSError):  # unlisted by `server status`, but serving all the same
        register(pid, home)
    if ready:
        ready(server.url)
    if idle_exit_s > 0 and isinstance(server, TrackedServer):
        exit_when_idle(server, idle_exit_s)
    try:
        server.serve_forever(SIGNAL_POLL_S)
    finally:
        unregister(pid)
        if metrics is not None:
            metrics.shutdown()
            metrics.server_close()
        server.server_close()
        server.service.close()
        remove_state(home, pid)


def run_foreground(
    home: Path | None,
    port: int,
    host: str,
    metrics_addr: str | None = None,
    idle_exit_s: float = 0.0,
) -> None:
    """`fecomlite server`: serve in this process; SIGTERM stops it as cleanly as Ctrl-C;
    `idle_exit_s` > 0 stops it after that long unused."""
    home = (home or default_home()).resolve()
    server = open_server(home, port, host, metrics_addr=metrics_addr)

    def stop(signum: int, frame: object) -> None:
        """The first SIGTERM stops serving; later ones are ignored, so that a second signal
        cannot cut the clean-up short (runs left open, the state file left behind)."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    with contextlib.suppress(KeyboardInterrupt):
        serve(server, home, ready=lambda url: _announce(server, url, home, idle_exit_s),
              idle_exit_s=idle_exit_s)


def _announce(server: MeasurementServer, url: str, home: Path, idle_exit_s: float) -> None:
    status = server.service.status()
    print(f"fecomlite server {url} (pid {os.getpid()}), store {status['store']}", flush=True)
    for s in status["sensors"]:
        print(f"  sensor {s['name']}: {s['domain']} {s['kind']} {s['unit']} {s['provenance']}"
              f"{' (' + s['model'] + ')' if s['model'] else ''}, every "
              f"{s['sample_interval_s'] * 1000:g} ms", flush=True)
    for note in status["notes"]:
        print(f"  note: {note}", flush=True)
    print(f"  live view {url}/?token={server.view_token}", flush=True)
    if server.metrics is not None:
        print(f"  metrics (read-only) {server.metrics.url}", flush=True)
    if idle_exit_s > 0:
        print(f"  exits by itself after {idle_exit_s:g} s unused", flush=True)
    print(f"  state file {home / 'server.json'}; stop with Ctrl-C or `fecomlite server stop`",
          file=sys.stderr, flush=True)
