"""A store that cannot write (a full disk) at any moment: the run ends with the reason, the
server and its watchdog survive, and the store stays readable (issue #31)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from test_server_faults import _mount_tmpfs
from test_server_support import FakeSensorForTests, encode_batch, serving

from fecomlite.server.client import ServerError
from fecomlite.store import Store

EVENT = ("train.py:1:0", 10, 20, 1, 0, -1, -1)
FULL = sqlite3.OperationalError("database or disk is full")


def _refuse(*args: object, **kwargs: object) -> None:
    raise FULL


def _status(home: Path, run: int) -> dict:
    with Store(home / "store.sqlite", readonly=True) as store:  # what `report` opens
        return {**store.run(run), "store_error": store.result(run, "store_error")}


def _wait_for(home: Path, run: int, status: str) -> dict:
    deadline = time.monotonic() + 30
    while (row := _status(home, run))["status"] != status and time.monotonic() < deadline:
        time.sleep(0.2)
    return row


def test_an_end_the_store_refuses_is_written_by_the_watchdog_once_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    home = tmp_path / "home"
    with serving(home, [FakeSensorForTests("p")]) as (server, client):
        run, token = client.create_run("x.py", [], "method", {})
        assert client.post_batch(run, token, encode_batch(1, 1, [EVENT] * 5)) == 5
        with monkeypatch.context() as full:
            full.setattr(Store, "update_run", _refuse)
            reply = client.finish_run(run, "finished", 0)
            assert reply["ok"] is False and "database or disk is full" in reply["error"]
            assert _status(home, run)["status"] == "running"
            time.sleep(2.5)  # the watchdog retries meanwhile, and must not die of it
        assert _wait_for(home, run, "finished")["status"] == "finished"
        assert any(t.name == "run-watchdog" for t in __import__("threading").enumerate())
        assert client.status()["server"] == "fecomlite"


def test_a_batch_the_store_refused_makes_the_run_incomplete_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    home = tmp_path / "home"
    with serving(home, [FakeSensorForTests("p")]) as (server, client):
        run, token = client.create_run("x.py", [], "method", {})
        with monkeypatch.context() as full:
            full.setattr(Store, "add_batch", _refuse)
            with pytest.raises(ServerError, match="507"):
                client.post_batch(run, token, encode_batch(1, 1, [EVENT] * 5))
        reply = client.finish_run(run, "finished", 0)
    assert reply["status"] == "incomplete" and "disk is full" in reply["store_error"]
    row = _status(home, run)
    assert row["status"] == "incomplete"
    assert "database or disk is full" in row["store_error"]["reason"]


def test_a_repetition_end_the_store_refuses_ends_the_run_incomplete_not_the_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A full disk at a repetition's end: the request still succeeds (the runner has a run to
    end), and the run ends `incomplete` with the store's reason."""
    home = tmp_path / "home"
    with serving(home, [FakeSensorForTests("p")]) as (server, client):
        run, token = client.create_run("x.py", [], "method", {})
        client.rep_start(run, 1)
        assert client.post_batch(run, token, encode_batch(1, 1, [EVENT] * 5)) == 5
        with monkeypatch.context() as full:
            full.setattr(Store, "upsert_repetition", _refuse)
            client.rep_end(run, 1, 0)  # raised ServerError (507) before
        reply = client.finish_run(run, "finished", 0)
    assert reply["status"] == "incomplete"
    assert "repetition 1's end not stored" in reply["store_error"]
    assert "repetition 1's end not stored" in _status(home, run)["store_error"]["reason"]


def test_a_disk_that_fills_at_finish_still_ends_the_run(tmp_path: Path):
    """A real full disk: fecomlite's home on an 8 MB tmpfs, filled just before the finish. The
    server gives back the disk it kept in reserve, and the end is written."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "8m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        home = disk / "home"
        with serving(home, [FakeSensorForTests("p")]) as (server, client):
            run, token = client.create_run("x.py", [], "method", {})
            client.post_batch(run, token, encode_batch(1, 1, [EVENT] * 50))
            _fill(disk / "filler")
            reply = client.finish_run(run, "finished", 0)
            assert reply["ok"] is True, reply
            assert not Path(f"{home / 'store.sqlite'}-reserve").exists()  # spent
        row = _status(home, run)
        assert row["status"] == "finished"
        with Store(home / "store.sqlite", readonly=True) as store:
            assert store.event_count(run) == 50
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_store_on_a_full_disk_is_read_without_its_shm_file(tmp_path: Path):
    """SQLite reads a WAL store through a -shm file it makes beside it: on a full disk it
    cannot, and the store file alone (no -wal rows) is read as it is."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        path = disk / "store.sqlite"
        with Store(path) as store:
            run = store.create_run(program="x.py", status="finished")
        assert not Path(f"{path}-shm").exists()
        _fill(disk / "filler")
        with Store(path, readonly=True) as store:
            assert store.run(run)["status"] == "finished"
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(path: Path) -> None:
    """Write until the disk is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass


def test_server_stop_writes_an_end_the_store_refused(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    from fecomlite.server.service import MeasurementService

    monkeypatch.setattr(MeasurementService, "_watch_once", lambda self: None)  # stop alone
    home = tmp_path / "home"
    with serving(home, [FakeSensorForTests("p")]) as (server, client):
        run, _ = client.create_run("x.py", [], "method", {})
        with monkeypatch.context() as full:
            full.setattr(Store, "update_run", _refuse)
            assert client.finish_run(run, "failed", 3)["ok"] is False
        assert _status(home, run)["status"] == "running"
    row = _status(home, run)  # the server has stopped
    assert (row["status"], row["exit_code"]) == ("failed", 3)
