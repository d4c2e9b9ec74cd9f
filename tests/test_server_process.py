"""The server as its own process (`ensure_server`), killed with SIGKILL; spool ingest."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from stored_events import events_table
from test_server_support import FakeSensorForTests, encode_batch, served

from fecomlite.runtime import batch_codec
from fecomlite.server.client import ServerError, ensure_server
from fecomlite.store import Store


def wait_until_dead(pid: int, timeout: float = 60.0) -> None:
    """Until the process is gone or a zombie (it is our child: nobody else reaps it). The bound
    is generous: a clean stop joins the sampler's threads and writes its ends, which took over
    10 s once under the full suite on a loaded 2-vCPU machine; a server that hangs still fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still alive")


def test_sigkill_mid_run_leaves_a_store_holding_everything_committed(tmp_path: Path):
    with ThreadPoolExecutor(2) as pool:  # two callers at once still start one server
        client, other = pool.map(ensure_server, [tmp_path, tmp_path])
    try:
        assert other.pid == client.pid
        assert ensure_server(tmp_path).pid == client.pid  # a live server is reused
        run, token = client.create_run("train.py", [], "method", {}, manifest={"sites": {
            "train.py:1:0": {"file": "train.py", "line": 1, "api": "torch.matmul"}}})
        for i in range(3):
            batch = encode_batch(1, 7, [("train.py:1:0", 100 * i, 100 * i + 50, 1, 0, -1, -1)])
            assert client.post_batch(run, token, batch) == 1
        client.rep_start(run, 1)
        time.sleep(1.2)  # the sampler writes every 0.5 s
        os.kill(client.pid, signal.SIGKILL)
        wait_until_dead(client.pid)
    except BaseException:
        os.kill(client.pid, signal.SIGKILL)
        raise
    with Store(tmp_path / "store.sqlite", create=False) as store:
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert store.run(run)["status"] == "running"  # killed: nobody closed it
        events = events_table(store).db.execute(
            "SELECT e.t_start_ns, s.api FROM events e JOIN sites s ON s.id=e.site_id "
            "ORDER BY e.t_start_ns").fetchall()
        assert [tuple(e) for e in events] == [(0, "torch.matmul"), (100, "torch.matmul"),
                                              (200, "torch.matmul")]
        assert store.repetitions(run)[0]["t_start_ns"] > 0
        utilisation = store.sensor_id(run, "util:cpu")  # /proc/stat: on every Linux machine
        n = store.db.execute(
            "SELECT count(*) FROM samples WHERE sensor_id=?", (utilisation,)).fetchone()[0]
        assert n >= 5  # read every 100 ms, committed every 0.5 s
    # the state file names a dead server: the next call starts a new one ...
    fresh = ensure_server(tmp_path)
    try:
        assert fresh.pid != client.pid
        second, _ = fresh.create_run("train.py", [], "method", {})
    finally:
        os.kill(fresh.pid, signal.SIGTERM)  # ... which SIGTERM stops cleanly
    wait_until_dead(fresh.pid)
    assert not (tmp_path / "server.json").exists()
    with pytest.raises(ServerError, match="unreachable"):
        fresh.status()
    with Store(tmp_path / "store.sqlite", create=False) as store:
        # the killed server's run was ended by the next server (nobody else could finish it),
        # at its last sample, its data kept
        assert [r["status"] for r in store.runs()] == ["interrupted", "interrupted"]
        assert store.run(second)["t_end_ns"] is not None
        last_sample = store.db.execute(
            "SELECT max(t_ns) FROM samples s JOIN sensors n ON n.id=s.sensor_id "
            "WHERE n.run_id=?", (run,)).fetchone()[0]
        assert store.run(run)["t_end_ns"] == last_sample
        assert events_table(store).db.execute("SELECT count(*) FROM events WHERE run_id=?",
                                (run,)).fetchone()[0] == 3


def write_spool(path: Path, *batches: bytes, torn: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for batch in batches:
            batch_codec.write_record(f, batch)
        f.write(torn)


def test_spooled_batches_are_ingested_into_their_run_or_a_new_one(tmp_path: Path):
    project = tmp_path / "project-instrumented"
    manifest = {"format": 1, "source_root": "/src/project", "sites": {
        "train.py:9:4": {"file": "train.py", "line": 9, "col": 4, "api": "tf.matmul"}}}
    (project / ".fecomlite").mkdir(parents=True)
    (project / ".fecomlite" / "manifest.json").write_text(json.dumps(manifest))
    with served(tmp_path / "home", [FakeSensorForTests("p")]) as client:
        run, token = client.create_run("train.py", [], "method", {}, manifest=manifest)
        event = ("train.py:9:4", 5, 9, 1, 0, 128, 256)
        # a process started by the run (run id as the probe has it: a string) ...
        write_spool(project / ".fecomlite" / "spool" / "11.spool",
                    encode_batch(2, 11, [event] * 3, run=str(run)))
        # ... and one started by hand, without a server: two batches, a corrupt record, and a
        # last record cut short by a crash
        corrupt = b"\x02\x00\x00\x00{}"
        torn = (1000).to_bytes(8, "little") + b"\x00" * 10
        write_spool(project / ".fecomlite" / "spool" / "12.spool",
                    encode_batch(0, 12, [event]), encode_batch(0, 12, [event, event]),
                    corrupt, torn=torn)
        report = client.ingest_report(project / ".fecomlite" / "spool")
        again = client.ingest_report(project / ".fecomlite" / "spool")
    assert (report["events"], report["files"], report["bad_records"]) == (6, 2, 1)
    assert report["bad_reasons"] == ["12.spool record 3: batch header lacks n or sites",
                                     "12.spool record 4: torn: claims 1,000 bytes, the file "
                                     "holds 10 more"]
    assert (report["torn_records"], report["whole"]) == (1, False)  # 12.spool must be kept
    # every batch is stored once: the same spools again add nothing, and no new run
    assert (again["events"], again["duplicate_batches"], again["runs"]) == (0, 3, [])
    new_run = max(report["runs"])
    assert report["runs"] == [run, new_run] and new_run != run
    with Store(tmp_path / "home" / "store.sqlite") as store:
        ingested = store.run(new_run)
        assert (ingested["status"], ingested["kind"]) == ("ingested", "instrumented")
        assert ingested["program"] == "/src/project"  # from the manifest beside the spool
        per_run = dict(events_table(store).db.execute(
            "SELECT run_id, count(*) FROM events GROUP BY run_id").fetchall())
        assert per_run == {run: 3, new_run: 3}
        assert [r["id"] for r in store.runs()] == [run, new_run]
        apis = {a for (a,) in store.db.execute("SELECT DISTINCT api FROM sites")}
        assert apis == {"tf.matmul"}
        assert [r["rep"] for r in store.repetitions(run)] == [2]
        (row,) = events_table(store).db.execute(
            "SELECT pid, in_bytes, out_bytes FROM events WHERE run_id=?", (new_run,)
        ).fetchall()[:1]
        assert tuple(row) == (12, 128, 256)
