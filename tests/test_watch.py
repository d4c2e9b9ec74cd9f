"""`fecomlite watch`: a real child process that grows by 150 MB is measured uninstrumented (the
growth is in the store), a PID is followed until it exits, and the report renders the run."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import typer
from stored_events import events_table
from test_live_support import grower_command, real_sensors
from test_server_support import serving
from typer.testing import CliRunner

from fecomlite.report.build import build_report
from fecomlite.report.render import write_report
from fecomlite.server.client import live_client
from fecomlite.server.watch import Target, WatchError, watch, watch_command, watch_summary
from fecomlite.store import Store

MB = 1_000_000


def _rss(store: Store, run_id: int) -> list[float]:
    rep = store.repetitions(run_id)[0]
    return [r[0] for r in store.db.execute(
        "SELECT value FROM samples WHERE sensor_id=? AND t_ns BETWEEN ? AND ? ORDER BY t_ns",
        (store.sensor_id(run_id, "proc:rss"), rep["t_start_ns"], rep["t_end_ns"]))]


def test_watch_a_command_records_its_growth_and_the_report_renders_it(tmp_path: Path):
    app = typer.Typer()
    app.command()(watch_command)
    command = grower_command(tmp_path, 50 * 2**20, 3, 0.4)  # +157 MB in three steps
    home = tmp_path / "home"
    try:
        result = CliRunner().invoke(app, ["--home", str(home), "--", *command])
    finally:
        server = live_client(home.resolve())
        if server is not None:
            server.shutdown()
    assert result.exit_code == 0, result.output
    assert "(live view)" in result.output and "watching pid" in result.output
    with Store(home / "store.sqlite", create=False) as store:
        (run,) = store.runs()
        assert (run["kind"], run["level"], run["status"], run["exit_code"]) == (
            "watch", "process", "finished", 0)
        assert run["argv"] == command
        assert events_table(store).db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
        rss = _rss(store, run["id"])
        assert len(rss) > 100  # 200 Hz over about two seconds
        assert max(rss) - rss[0] >= 140 * MB
        summary = watch_summary(store, run["id"])
        assert summary["memory"]["proc:rss"]["peak_B"] - summary["memory"]["proc:rss"][
            "start_B"] >= 140 * MB
        assert summary["energy"] and all(e["provenance"] in ("measured", "estimated")
                                         for e in summary["energy"])
        report = build_report(store, run["id"])
        written = write_report(report, tmp_path / "report", ["html"])
    assert "+" in result.output and "MB" in result.output  # the growth, in the summary table
    html = written[0].read_text()
    assert "watch" in html and "process RSS" in html


def _until_running(pid: int, command: list[str]) -> None:
    """Until the child has exec'd its command: in the window between fork and exec (and during
    exec) /proc/PID/cmdline reads the parent's, or nothing."""
    deadline = time.monotonic() + 10
    while psutil.Process(pid).cmdline() != command:
        assert time.monotonic() < deadline, "the child never started its command"
        time.sleep(0.005)


def test_watch_a_pid_until_it_exits(tmp_path: Path):
    command = grower_command(tmp_path, 10 * 2**20, 2, 0.3)
    sensors, process_sensors = real_sensors()
    with serving(tmp_path / "home", sensors, process_sensors=process_sensors) as (_, client):
        child = subprocess.Popen(command)
        try:
            _until_running(child.pid, command)
            with pytest.raises(WatchError, match="idle baseline"):
                watch(client, Target(pid=child.pid), idle_s=1.0)
            followed: list[int] = []
            outcome = watch(client, Target(pid=child.pid),
                            on_start=lambda run, pid, notes: followed.append(pid))
        finally:
            child.kill()
            child.wait()
    assert followed == [child.pid]
    assert (outcome.status, outcome.exit_code) == ("finished", None)
    with Store(tmp_path / "home" / "store.sqlite", create=False) as store:
        run = store.run(outcome.run_id)
        assert run["argv"] == command and run["status"] == "finished"
        (rep,) = store.repetitions(outcome.run_id)
        assert rep["t_end_ns"] > rep["t_start_ns"]
        assert max(_rss(store, outcome.run_id)) > 15 * MB


def test_a_command_that_cannot_start_leaves_a_failed_run(tmp_path: Path):
    sensors, process_sensors = real_sensors()
    with serving(tmp_path, sensors, process_sensors=process_sensors) as (_, client), \
            pytest.raises(WatchError, match="cannot start"):
        watch(client, Target.parse([str(tmp_path / "no-such-program")]))
    with Store(tmp_path / "store.sqlite", create=False) as store:
        (run,) = store.runs()
        assert (run["status"], run["exit_code"]) == ("failed", 127)


def test_a_lone_number_is_a_pid_and_anything_else_a_command():
    assert Target.parse(["1234"]) == Target(pid=1234)
    assert Target.parse(["python", "train.py"]) == Target(command=("python", "train.py"))
    assert Target.parse(["./1234"]).command == ("./1234",)
    with pytest.raises(WatchError):
        Target.parse([])
    with pytest.raises(WatchError, match="no process"):
        Target(pid=2**22 + 12345).describe()


def test_ctrl_c_ends_the_watch_and_keeps_the_run(tmp_path: Path):
    """The watcher's KeyboardInterrupt (Ctrl-C) stops the command and closes the run."""
    sensors, process_sensors = real_sensors()
    command = grower_command(tmp_path, 2**20, 50, 0.2)  # ten seconds unless stopped
    with serving(tmp_path, sensors, process_sensors=process_sensors) as (_, client):
        started = threading.Event()

        def interrupt(run: int, pid: int, notes: list[str]) -> None:
            started.set()
            raise KeyboardInterrupt

        outcome = watch(client, Target.parse(command), on_start=interrupt)
    assert started.is_set() and outcome.status == "interrupted"
    assert outcome.exit_code is not None  # the command was stopped and reaped
    with Store(tmp_path / "store.sqlite", create=False) as store:
        run = store.run(outcome.run_id)
        assert run["status"] == "interrupted" and run["t_end_ns"] is not None
