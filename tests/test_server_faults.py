"""Faults around a real server process and real probe processes: a server paused longer than the
probe waits (SIGSTOP), a full disk under the spool (/dev/full: ENOSPC), a client killed with
SIGKILL, SIGTERM twice, and another OS user on the machine (setpriv)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import run_cli
from stored_events import events_table

from fecomlite.runtime.sender import POST_TIMEOUT_S
from fecomlite.server.client import ServerClient, ensure_server, live_client
from fecomlite.store import Store

REPO = Path(__file__).resolve().parents[1]
SITE = "loop.py:3:4"
# calls a site in a loop for the given seconds, then prints how many calls it made
LOOP = textwrap.dedent(f"""
    import sys, time
    import fecomlite.runtime.probe as __fecomlite__
    def f():
        return 1
    calls, end = 0, time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        __fecomlite__.call({SITE!r}, f)
        calls += 1
        if calls % 20 == 0:
            time.sleep(0.002)
    print(calls)
""")


def _env(client: ServerClient, run: int, token: str, spool: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env.update(FECOMLITE_URL=client.url, FECOMLITE_RUN=str(run), FECOMLITE_TOKEN=token,
               FECOMLITE_SPOOL=str(spool), FECOMLITE_REP="1", FECOMLITE_STORE=client.store_id,
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p))
    return env


def _paused_run(home: Path, spool: Path, pause_s: float) -> tuple[ServerClient, int, int]:
    """A probe process calling for 5 s while its server is stopped for `pause_s` mid-run;
    returns (client, run, calls made)."""
    client = ensure_server(home)
    run, token = client.create_run("loop.py", [], "method", {})
    script = home.parent / "loop.py"
    script.write_text(LOOP)
    proc = subprocess.Popen([sys.executable, str(script), "5"], env=_env(client, run, token, spool),
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        os.kill(client.pid, signal.SIGSTOP)
        time.sleep(pause_s)
    finally:
        os.kill(client.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return client, run, int(out)


def _stored(client: ServerClient, run: int) -> int:
    with Store(client.store_path) as store:
        return store.event_count(run)


def test_a_server_paused_past_the_probe_timeout_stores_every_call_once(tmp_path: Path):
    """The probe gives up on a batch the paused server stores later, and spools it too: after
    the spool is ingested, each call is stored once (not twice)."""
    home, spool = tmp_path / "home", tmp_path / "rep-1.spool"
    client, run, calls = _paused_run(home, spool, POST_TIMEOUT_S + 1.0)
    try:
        assert spool.stat().st_size > 0  # the pause did make the probe spool
        report = client.ingest_report(spool)
        assert report["duplicate_batches"] >= 1  # the batch the paused server stored anyway
        assert _stored(client, run) == calls
        again = client.ingest_report(spool)  # ingested twice: nothing more
        assert (again["events"], _stored(client, run)) == (0, calls)
        assert client.finish_run(run, "finished", 0) == {
            "ok": True, "status": "finished", "lost_events": 0}
    finally:
        client.shutdown()


def test_events_lost_to_a_full_disk_are_counted_and_the_run_is_incomplete(tmp_path: Path):
    """No server for 3 s and a spool on a full disk (/dev/full: every write is ENOSPC): the
    events are lost, but not silently: stored + lost is every call, and the run says so."""
    home = tmp_path / "home"
    client, run, calls = _paused_run(home, Path("/dev/full"), POST_TIMEOUT_S + 1.0)
    try:
        finished = client.finish_run(run, "finished", 0)
        stored = _stored(client, run)
        assert finished["status"] == "incomplete"
        assert finished["lost_events"] > 0 and stored + finished["lost_events"] == calls
        with Store(client.store_path) as store:
            assert store.run(run)["status"] == "incomplete"
            assert store.run(run)["lost_events"] == finished["lost_events"]
    finally:
        client.shutdown()


CLIENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fecomlite.server.client import ensure_server
    client = ensure_server(Path(sys.argv[1]))
    run, _ = client.create_run("x.py", [], "method", {})
    print(run, flush=True)
    time.sleep(600)
""")


def _wait_for(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_a_run_whose_client_was_killed_ends_interrupted(tmp_path: Path):
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, str(home)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        run = int(proc.stdout.readline())
        client = ensure_server(home)
        assert client.status()["recording"] == [run]
        proc.kill()
        proc.wait()

        def ended() -> bool:
            with Store(client.store_path) as store:
                return store.run(run)["status"] == "interrupted"

        assert _wait_for(ended)  # the server no longer records it forever
        assert client.status()["recording"] == []
    finally:
        proc.kill()
        ensure_server(home).shutdown()


def test_sigterm_twice_still_cleans_up(tmp_path: Path):
    client = ensure_server(tmp_path)
    run, _ = client.create_run("x.py", [], "method", {})
    os.kill(client.pid, signal.SIGTERM)
    time.sleep(0.05)  # the first is being handled: closing the sampler, the store
    os.kill(client.pid, signal.SIGTERM)
    assert _wait_for(lambda: not (tmp_path / "server.json").exists())
    with Store(tmp_path / "store.sqlite") as store:
        assert store.run(run)["status"] == "interrupted"


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup",
                           "--clear-groups", *argv], capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs setpriv and root to act as a second user (nobody)")
def test_another_user_reads_nothing_and_cannot_post(tmp_path: Path):
    """A home in a folder others may enter (a project folder, 0755): the home is 0700, and its
    store, state, log and spools 0600; the server tells others nothing without a token."""
    project = tmp_path / "project"
    project.mkdir()
    for folder in (tmp_path, project):
        folder.chmod(0o755)
    home = project / ".fecomlite"
    spool = home / "logs" / "rep-1.spool"
    client, run, _ = _paused_run(home, spool, POST_TIMEOUT_S + 1.0)
    try:
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for name in ("store.sqlite", "server.json", "server.log", "logs/rep-1.spool"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
        assert b"token" not in spool.read_bytes()
        for name in ("store.sqlite", "server.json", "logs/rep-1.spool"):
            denied = _as_nobody("cat", str(home / name))
            assert denied.returncode != 0 and "Permission denied" in denied.stderr
        status = _as_nobody(sys.executable, "-c", "import urllib.request; print(urllib.request."
                            f"urlopen('{client.url}/api/status').read().decode())")
        assert status.stdout.strip() == '{"server": "fecomlite"}'  # no pid, port, store
        stream = _as_nobody(sys.executable, "-c", "import urllib.request, urllib.error\n"
                            f"try: urllib.request.urlopen('{client.url}/live/stream')\n"
                            "except urllib.error.HTTPError as e: print(e.code)")
        assert stream.stdout.strip() == "401"
    finally:
        client.shutdown()


CALLS = textwrap.dedent("""
    import numpy as np
    a = np.ones(4)
    for i in range(1_000_000):
        np.add(a, i)
""")


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def test_a_run_on_a_full_disk_says_how_many_events_it_lost(tmp_path: Path):
    """The issue's case: fecomlite's home on a 4 MB tmpfs (events are stored compressed, a few
    bytes a call: 1,000,000 calls overfill what the server's 2 MB reserve leaves). The store
    fills up, then the spool cannot be written: the run ends incomplete, and stored + lost is
    every call made."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "4m"):
        pytest.skip("cannot mount a tmpfs here (needs root); the ENOSPC test covers the probe")
    try:
        (tmp_path / "calls.py").write_text(CALLS)
        result = run_cli(tmp_path, "run", "--home", str(disk / "home"), "--api", "numpy",
                         "--repeat", "1", "--idle", "0", "--tail", "0", "--no-gate", "calls.py")
        client = live_client(disk / "home")
        if client is not None:
            client.shutdown()
        assert result.returncode == 1, result.stdout + result.stderr
        with Store(disk / "home" / "store.sqlite", create=False) as store:
            run = store.run(1)
            stored = events_table(store).db.execute("SELECT count(*) FROM events").fetchone()[0]
        assert run["status"] == "incomplete" and run["lost_events"] > 0
        assert stored + run["lost_events"] == 1_000_001  # np.ones once, np.add 1,000,000 times
        assert f"incomplete: {run['lost_events']} events could be neither sent nor spooled" in \
            " ".join(result.stdout.split())
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
