"""`fecomlite watch PID | -- COMMAND [ARGS...]`: measure any process, uninstrumented.

The simple memory and energy monitor to use before going per API: one process tree's memory and
the machine's power over time, in the same run store and live view as `fecomlite run` (a run of
kind `watch`, level `process`, one repetition, no call events), so `fecomlite report` renders it.
A command is started here after the optional idle baseline; a PID is followed from now until it
exits (its exit status is not ours to read). Ctrl-C ends the watch and keeps what was measured.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fecomlite.analysis.units import scaled
from fecomlite.terminal import plain

if TYPE_CHECKING:  # imported where used: `fecomlite watch --help` answers at once
    import numpy as np

    from fecomlite.runner.output import Output
    from fecomlite.server.client import ServerClient
    from fecomlite.store import Store

console = Console()
STOP_WAIT_S = 10.0  # after Ctrl-C, how long a started command may take to exit


class WatchError(RuntimeError):
    """The target cannot be watched (no such process, a command that does not start)."""


@dataclass(frozen=True)
class Target:
    """A running process (`pid`) or a command to start (`command`)."""

    pid: int | None = None
    command: tuple[str, ...] = ()

    @classmethod
    def parse(cls, args: list[str]) -> Target:
        """A lone integer is a PID; anything else is a command."""
        if len(args) == 1 and args[0].isdigit():
            return cls(pid=int(args[0]))
        if not args:
            raise WatchError("give a PID, or -- COMMAND [ARGS...]")
        return cls(command=tuple(args))

    def describe(self) -> tuple[str, list[str]]:
        """(program, argv) for the run: the command line, or what the process was started with
        (a process whose command line cannot be read is named by its pid)."""
        if self.command:
            return shlex.join(self.command), list(self.command)
        import psutil

        try:
            argv = psutil.Process(self.pid).cmdline()
        except psutil.NoSuchProcess as exc:
            raise WatchError(f"no process {self.pid} to watch") from exc
        except psutil.AccessDenied:
            argv = []
        return (shlex.join(argv) if argv else f"pid {self.pid}"), argv


@dataclass
class WatchOutcome:
    run_id: int
    status: str  # finished | failed | interrupted
    exit_code: int | None
    pid: int | None
    counted: dict[int, str] = field(default_factory=dict)  # pid -> command: the tree seen


MEMORY_LABELS = {  # what each memory sensor of a watch run is, in the summary (short: a row)
    "proc:rss": "tree RSS",  # summed over the processes counted
    "proc:peak_rss": "root VmHWM",  # the root process's own high-water mark
}


class TreeCensus:
    """The processes of the watched tree, listed as often as the RSS sensor re-lists them: what
    the tree's RSS summed, said after the summary (`bash -c`, `time`, `uv run` or `torchrun` as
    the root is then visibly not all that was measured)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from fecomlite.sensors.proctree import DEFAULT_REFRESH_S, descendants

        while True:
            for pid in [self.pid, *descendants(self.pid)]:
                command = _command_of(pid)  # again each time: a forked child execs later
                if command:
                    self.seen[pid] = command
            if self._stop.wait(DEFAULT_REFRESH_S):
                return

    def stop(self) -> dict[int, str]:
        self._stop.set()
        self._thread.join(timeout=5)
        return dict(self.seen)


def _command_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return None
    return shlex.join(os.fsdecode(w) for w in words)


def watch(
    client: ServerClient, target: Target, *, idle_s: float = 0.0, tail_s: float = 0.0,
    on_start: Callable[[int, int, list[str]], object] = lambda run_id, pid, notes: None,
    pipe_output: bool = False,
) -> WatchOutcome:
    """Create a `watch` run, measure the target until it exits (or Ctrl-C), finish the run.
    `on_start(run_id, pid, notes)` is called once the process is followed; the notes say what
    of it cannot be measured (e.g. another user's process). With `pipe_output` a started
    command's output is copied to sys.stdout/sys.stderr as it comes (what a live display
    redirects), rather than written to the terminal behind its back."""
    from fecomlite.runner.experiment import PUMP_DRAIN_S
    from fecomlite.runner.output import Output, stream_fd

    if target.pid is not None and idle_s > 0:
        raise WatchError("an idle baseline needs a quiet machine: use --idle with a COMMAND, "
                         "which starts after it, not with a PID that already runs")
    program, argv = target.describe()
    settings = {"repeat": 1, "idle_s": idle_s, "tail_s": tail_s,
                "target": "pid" if target.pid is not None else "command"}
    run_id, _ = client.create_run(program=program, argv=argv, level="process",
                                  settings=settings, kind="watch")
    outcome = WatchOutcome(run_id, "finished", None, target.pid)
    proc: subprocess.Popen[bytes] | None = None
    census: TreeCensus | None = None
    output: Output | None = None
    started = False
    try:
        if idle_s > 0:
            client.idle(run_id, idle_s)
        client.rep_start(run_id, 1)
        started = True
        if target.command:
            if pipe_output:
                output = Output((stream_fd(sys.stdout, 1), stream_fd(sys.stderr, 2)), None)
            ends = output.child if output is not None else [None, None]
            try:
                proc = subprocess.Popen(list(target.command), stdout=ends[0], stderr=ends[1])
            except OSError as exc:
                if output is not None:
                    output.close_unstarted()
                    output = None
                outcome.status, outcome.exit_code = "failed", 127
                raise WatchError(f"cannot start {shlex.join(target.command)}: {exc}") from exc
            outcome.pid = proc.pid
            if output is not None:
                output.start()
        assert outcome.pid is not None
        census = TreeCensus(outcome.pid)
        followed = client.watch(run_id, outcome.pid)
        on_start(run_id, outcome.pid, list(followed.get("notes", [])))
        outcome.exit_code = proc.wait() if proc else _wait_for_exit(outcome.pid)
        if outcome.exit_code:
            outcome.status = "failed"
    except KeyboardInterrupt:
        outcome.status = "interrupted"
        if proc is not None:
            outcome.exit_code = _stop(proc)
    finally:
        if output is not None:  # the last of its output, before the summary
            output.join(PUMP_DRAIN_S)
        if census is not None:
            outcome.counted = census.stop()
        if started:
            client.rep_end(run_id, 1, outcome.exit_code)
            if tail_s > 0 and outcome.status != "interrupted":
                client.tail(run_id, 1, tail_s)
        client.watch(run_id, None)
        client.finish_run(run_id, outcome.status, outcome.exit_code)
    return outcome


def _wait_for_exit(pid: int) -> None:
    """Until a process that is not our child has exited (psutil polls its pid)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait()


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """The command got the terminal's SIGINT too; give it time to finish, then insist."""
    try:
        proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# -- summary ----------------------------------------------------------------------------------


def watch_summary(store: Store, run_id: int) -> dict[str, Any]:
    """Duration, memory (the first reading and the peak of the tree's RSS, the root's VmHWM, GPU
    memory) and energy per domain with its provenance, over the watched repetition. (A process
    that has exited reads 0, so its last reading says nothing.)"""
    from fecomlite.analysis import attribution as at
    from fecomlite.analysis.run_analysis import choose_energy_sensors

    rep = store.repetitions(run_id)[0]
    t0, t1 = rep["t_start_ns"], rep["t_end_ns"] or store.run(run_id)["t_end_ns"]
    sensors = store.sensors(run_id)
    out: dict[str, Any] = {"run_id": run_id, "seconds": (t1 - t0) / 1e9, "memory": {},
                           "energy": []}
    for s in sensors:
        if s["unit"] == "B" and s["kind"] == "gauge":
            t, v = _samples(store, s["id"], t0, t1)
            if v.size:
                out["memory"][s["name"]] = {"start_B": float(v[0]), "peak_B": float(v.max()),
                                            "domain": s["domain"], "provenance": s["provenance"]}
    idle = store.run(run_id)["idle"]
    chosen, _ = choose_energy_sensors(sensors, store.result(run_id, "sensors") or {})
    for domain, s in sorted(chosen.items()):
        t, v = _samples(store, s["id"], None, None)
        try:
            iv = at.sensor_intervals(s["kind"], t, v, period_s=s.get("period_s"))
        except ValueError:
            continue
        if iv.count == 0:
            continue
        idle_w = idle.get(s["name"])
        total, above = at.window_energy(iv, idle_w or 0.0, t0, t1)
        out["energy"].append({
            "domain": domain, "sensor": s["name"], "provenance": s["provenance"],
            "model": s["model"], "total_J": total,
            "above_idle_J": above if idle_w is not None else None, "idle_W": idle_w,
        })
    return out


def _samples(
    store: Store, sensor_id: int, t0: int | None, t1: int | None
) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    rows = store.samples(sensor_id, t0 or 0, t1)
    return (np.fromiter((r[0] for r in rows), np.int64, len(rows)),
            np.fromiter((r[1] for r in rows), float, len(rows)))


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"run {summary['run_id']}: watched for "
                        f"{scaled(summary['seconds'], 's')}", title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_column("source")
    for name, m in summary["memory"].items():
        growth = m["peak_B"] - m["start_B"]
        table.add_row(f"{MEMORY_LABELS.get(name, name)}: first → peak",
                      f"{scaled(m['start_B'], 'B')} → "
                      f"{scaled(m['peak_B'], 'B')} ({scaled(growth, 'B', signed=True)})",
                      m["provenance"])
    for e in summary["energy"]:
        source = e["provenance"] + (f" ({e['model']})" if e["model"] else "") + f", {e['sensor']}"
        value = scaled(e["total_J"], "J")
        if e["above_idle_J"] is not None:
            value += f" ({scaled(e['above_idle_J'], 'J')} above idle)"
        table.add_row(f"{e['domain']} energy", value, source)
    if not summary["energy"]:
        table.caption = "no energy sensor gave readings"
    elif all(e["above_idle_J"] is None for e in summary["energy"]):
        table.caption = "totals include idle power: --idle SECONDS measures a baseline first"
    return table


# -- the command ------------------------------------------------------------------------------


def watch_command(
    target: Annotated[
        list[str],
        typer.Argument(help="A PID to follow, or -- COMMAND [ARGS...] to start and follow.",
                       metavar="PID | -- COMMAND [ARGS...]", show_default=False),
    ],
    idle: Annotated[
        float, typer.Option(min=0, help="Seconds of idle baseline before COMMAND starts.")
    ] = 0.0,
    tail: Annotated[
        float, typer.Option(min=0, help="Seconds sampled after the process ends.")
    ] = 0.0,
    home: Annotated[
        Path | None, typer.Option(help="fecomlite's folder: store, server state (./.fecomlite).")
    ] = None,
    live: Annotated[
        bool | None,
        typer.Option("--live/--no-live", help="Live figures in the terminal (power per domain, "
                     "memory, the call in progress); on by default on a terminal.",
                     show_default=False),
    ] = None,
) -> None:
    """Measure any process, uninstrumented: memory and power over time, live and in the store."""
    from fecomlite.server.client import ServerError, ensure_server
    from fecomlite.server.watch_live import LiveFigures
    from fecomlite.store import Store, default_home

    display = LiveFigures(console) if (console.is_terminal if live is None else live) else None
    try:
        parsed = Target.parse(target)
        client = ensure_server((home or default_home()).resolve())
        console.print(f"measurement server: [bold]{client.view_url}[/] (live view)")

        def started(run_id: int, pid: int, notes: list[str]) -> None:
            console.print(f"watching pid {pid} as run [bold]{run_id}[/]; Ctrl-C stops watching")
            for note in notes:
                console.print(f"[yellow]note:[/] {plain(note)}")
            if display is not None:
                display.follow(run_id, pid)

        started_at = time.monotonic()
        if display is not None:
            display.start(client)
        try:
            outcome = watch(client, parsed, idle_s=idle, tail_s=tail, on_start=started,
                            pipe_output=display is not None)
        finally:
            if display is not None:
                display.stop()
    except (WatchError, ServerError) as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(2) from exc
    with Store(client.store_path) as store:
        console.print(summary_table(watch_summary(store, outcome.run_id)))
    from fecomlite.analysis.exit_status import exit_description, shell_status

    if outcome.counted:
        listed = ", ".join(f"{pid} {command}" for pid, command in outcome.counted.items())
        console.print(f"the tree's RSS counted {len(outcome.counted)} process(es): {listed}",
                      markup=False, highlight=False)

    ended = {"finished": "exited", "failed": exit_description(outcome.exit_code or 0),
             "interrupted": "watch interrupted"}[outcome.status]
    console.print(f"{ended} after {scaled(time.monotonic() - started_at, 's')}; run "
                  f"[bold]{outcome.run_id}[/] stored in [bold]{plain(client.store_path)}[/]; "
                  f"`fecomlite report {outcome.run_id}` renders it.")
    if outcome.status == "failed" and outcome.exit_code:
        raise typer.Exit(shell_status(outcome.exit_code))
