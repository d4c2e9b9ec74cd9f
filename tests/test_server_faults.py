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

import numpy as np
import pytest
from conftest import run_cli
from stored_events import events_table
from test_server_support import encode_batch

from fecomlite.runner.experiment import _ingest_spools
from fecomlite.runtime import batch_codec
from fecomlite.runtime.sender import POST_TIMEOUT_S
from fecomlite.server.client import ServerClient, ensure_server, live_client
from fecomlite.server.service import RESERVE_BYTES
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


# Room on the full-disk test's tmpfs past the server's reserve: the store, its -shm file, the
# rewrite cache, the logs and a small part of the events of CALLS. Those take 1.6 MB (1.6 B a
# call, stored with the run's samples after a checkpoint; measured on a 64 MB tmpfs at load 6.8),
# so 2 MB of room (a 4 MB tmpfs) let every call fit: `finished`, lost 0, 3 runs of 3. With
# 512 KB, 57-73 k of the 1 M calls were stored (3 runs, load 6).
FULL_DISK_ROOM = 512 * 1024


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def test_a_run_on_a_full_disk_says_how_many_events_it_lost(tmp_path: Path):
    """The issue's case: fecomlite's home on a tmpfs with room for its server's reserve and
    FULL_DISK_ROOM more, far less than these calls' events take. The store fills up, then the
    spool cannot be written: the run ends incomplete, and stored + lost is every call made; the
    summary still shows (read-only: the store cannot keep it), no traceback."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, f"{(RESERVE_BYTES + FULL_DISK_ROOM) // 1024}k"):
        pytest.skip("cannot mount a tmpfs here (needs root); the ENOSPC test covers the probe")
    try:
        (tmp_path / "calls.py").write_text(CALLS)
        result = run_cli(tmp_path, "run", "--home", str(disk / "home"), "--api", "numpy",
                         "--repeat", "1", "--idle", "0", "--tail", "0", "--no-gate", "calls.py")
        client = live_client(disk / "home")
        if client is not None:
            client.shutdown()
        assert "Traceback" not in result.stdout + result.stderr  # exit 1 too
        assert result.returncode == 1, result.stdout + result.stderr
        with Store(disk / "home" / "store.sqlite", create=False) as store:
            run = store.run(1)
            stored = events_table(store).db.execute("SELECT count(*) FROM events").fetchone()[0]
        assert run["status"] == "incomplete" and run["lost_events"] > 0
        assert stored + run["lost_events"] == 1_000_001  # np.ones once, np.add 1,000,000 times
        said = " ".join(result.stdout.split())
        # the spool could not be written, or (its batches whole) the full store refused it
        assert (f"incomplete: {run['lost_events']} events could be neither sent nor spooled"
                in said or f"incomplete: {run['lost_events']} events could not be stored (a "
                "full disk?); the spool files the store refused are kept" in said)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk: Path) -> Path:
    """A file taking every free block of `disk`."""
    ballast = disk / "ballast"
    try:
        with open(ballast, "wb", buffering=0) as out:
            while True:
                out.write(b"\0" * 4096)
    except OSError:  # ENOSPC: full
        pass
    return ballast


def test_a_spool_the_full_store_refuses_is_kept_and_ingested_once_there_is_room(tmp_path: Path):
    """The runner's end of a run on a full disk: the store refuses a spool (507); the spool
    stays (the run still ends), and is stored whole once the disk has room."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "4m"):  # the server's reserve, and room for the store
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        client = ensure_server(disk / "home")
        try:
            run, _ = client.create_run("x.py", [], "method", {})
            spools = tmp_path / "logs"
            spools.mkdir()
            rng = np.random.default_rng(7)  # times that do not compress: 20,000 events, ~0.5 MB
            events = [("x.py:1:0", int(t), int(t) + 5, 1, 0, -1, -1)
                      for t in rng.integers(0, 2**60, 20_000)]
            with open(spools / "rep-1.spool", "wb") as f:
                batch_codec.write_record(f, encode_batch(1, 1, events, run=str(run)))
            ballast = _fill(disk)
            assert _ingest_spools(client, spools) == [spools / "rep-1.spool"]
            ballast.unlink(missing_ok=True)
            assert _ingest_spools(client, spools) == [] and not list(spools.iterdir())
            assert _stored(client, run) == 20_000
        finally:
            client.shutdown()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
