"""The server's lifecycle as a user meets it: `fecomlite server status` and `stop`, one server
per home, the user's registry of servers, and the idle exit of an automatically started one."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

from fecomlite.server.client import ensure_server, live_client
from fecomlite.server.registry import registered_homes, registry_dir


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry of this test's own (servers started here inherit the variable)."""
    folder = tmp_path / "runtime"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def start_server(home: Path, *options: str) -> subprocess.Popen[bytes]:
    """`python -m fecomlite.server` as `ensure_server` starts it, once it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fecomlite.server", "--home", str(home), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        client = live_client(home)
        if client is not None and client.pid == proc.pid:
            return proc
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the server did not answer")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """run_cli, keeping this test's XDG_RUNTIME_DIR (run_cli drops only FECOMLITE_ names)."""
    return run_cli(cwd, *args, timeout=120)


def test_status_lists_every_server_of_the_user_and_stop_all_stops_them(
    tmp_path: Path, registry: Path
):
    first, second = tmp_path / "first", tmp_path / "second"
    proc = start_server(first)
    started = ensure_server(second)
    try:
        assert started.started  # a new one: `fecomlite run` says so
        assert not ensure_server(second).started  # the live one is reused, not started again
        assert set(registered_homes()) == {first.resolve(), second.resolve()}

        status = cli(tmp_path, "server", "status", "--home", str(first))
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert any(f"pid {proc.pid}" in line and "this home" in line for line in lines)
        assert any(f"pid {started.pid}" in line and "other home" in line for line in lines)

        refused = subprocess.run(
            [sys.executable, "-m", "fecomlite.server", "--home", str(first)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2
        assert f"already serves {first.resolve()}" in refused.stderr

        # the home given to `server` itself is the subcommand's
        grouped = cli(tmp_path, "server", "--home", str(second), "status")
        assert any(f"pid {started.pid}" in line and "this home" in line
                   for line in grouped.stdout.splitlines()), grouped.stdout
        one = cli(tmp_path, "server", "--home", str(second), "stop")
        assert one.returncode == 0 and f"stopped the server of {second.resolve()}" in one.stdout
        assert live_client(second) is None and live_client(first) is not None

        stop = cli(tmp_path, "server", "stop", "--all")
        assert stop.returncode == 0, stop.stderr
        assert proc.wait(timeout=30) == 0
        assert live_client(first) is None and live_client(second) is None
        assert not any(registry_dir().iterdir())  # each server removed its own link
    finally:
        for client in (live_client(first), live_client(second)):
            if client is not None:
                client.shutdown()
        proc.kill()

    after = cli(tmp_path, "server", "status", "--home", str(first))
    assert after.returncode == 1
    assert f"no server serves {first.resolve()}" in after.stdout
    again = cli(tmp_path, "server", "stop", "--home", str(first))
    assert again.returncode == 1 and "no server was running" in again.stdout


def test_an_idle_server_exits_by_itself_but_not_while_a_run_records(tmp_path: Path, registry: Path):
    proc = start_server(tmp_path, "--idle-exit", "1")
    try:
        client = live_client(tmp_path)
        assert client is not None
        run_id, _ = client.create_run("train.py", [], "project", {})
        time.sleep(3)  # three idle-exit periods with a run recording and no request
        assert proc.poll() is None
        client.finish_run(run_id, "finished", 0)
        assert proc.wait(timeout=30) == 0
        assert b"idle for 1 s, exiting" in (proc.stderr.read() if proc.stderr else b"")
        assert live_client(tmp_path) is None
        assert not (tmp_path / "server.json").exists()
        assert not (registry / "fecomlite" / "servers" / str(proc.pid)).exists()
    finally:
        proc.kill()


def test_status_asked_from_any_home_does_not_keep_an_idle_server(
    tmp_path: Path, registry: Path
):
    """`fecomlite server status` asks every server of the user, whatever its home: that is not
    the server's own home's work, and its idle timer goes on (it once lived 28 min, not 10)."""
    proc = start_server(tmp_path / "home", "--idle-exit", "2")
    try:
        client = live_client(tmp_path / "home")
        assert client is not None
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:  # what status does, from another home, every 0.3 s: never 2 s without one
                client.status()
            except Exception:  # noqa: BLE001 - the server shut down between two asks
                break
            time.sleep(0.3)
        assert proc.wait(timeout=30) == 0
        assert b"idle for 2 s, exiting" in (proc.stderr.read() if proc.stderr else b"")
    finally:
        proc.kill()


def test_the_registry_drops_links_of_servers_that_are_gone(tmp_path: Path, registry: Path):
    folder = registry_dir()
    folder.mkdir(parents=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (folder / dead.stdout.strip()).symlink_to(tmp_path)
    assert registered_homes() == []
    assert not any(folder.iterdir())
