"""Every field of what the server is sent is checked: out-of-range batches are a 400 with the
reason (never a stored value that breaks a report later), a batch is stored once whatever its
path, spools of another store are refused, and slow or large requests cannot hold the server."""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from cli_runner import invoke
from stored_events import events_table
from test_server_http import raw_request
from test_server_support import FakeSensorForTests, encode_batch, served

from fecomlite.runtime import batch_codec
from fecomlite.server import app as server_app
from fecomlite.store import Store

EVENT = ("train.py:1:0", 10, 20, 1, 0, -1, -1)


def _with_header(header: dict, events: int = 0) -> bytes:
    """A batch whose header is exactly `header` (columns for `events` zero events)."""
    raw = json.dumps(header).encode()
    return struct.pack("<I", len(raw)) + raw + b"\0" * (45 * events)


BAD_BATCHES = {
    "pid 10**400": _with_header({"n": 0, "sites": [], "proc": "p", "seq": 1, "pid": 10**400}),
    "rep 1e308": _with_header({"n": 0, "sites": [], "proc": "p", "seq": 1, "rep": 1e308}),
    "NaN hyperparameter": b"".join([struct.pack("<I", 66), b'{"n": 0, "sites": [], "proc": "p", '
                                    b'"seq": 1, "hyperparams": {"a": NaN}}']),
    "deep hyperparameters": _with_header({"n": 0, "sites": [], "proc": "p", "seq": 1,
                                          "hyperparams": {"a": [[[[[[[[[[1]]]]]]]]]]}}),
    "no id": encode_batch(1, 1, [EVENT], proc=None, seq=None),
    "unbounded unknown field": _with_header({"n": 0, "sites": [], "proc": "p", "seq": 1,
                                             "x": "y" * 5000}),
    "ends before it starts": encode_batch(1, 1, [("a:1:0", 20, 10, 1, 0, -1, -1)]),
    "status 7": encode_batch(1, 1, [("a:1:0", 10, 20, 1, 7, -1, -1)]),
    "stamp beyond 2**62": encode_batch(1, 1, [("a:1:0", 10, 2**63 - 1, 1, 0, -1, -1)]),
}


@pytest.mark.parametrize("name", BAD_BATCHES)
def test_an_out_of_range_batch_is_a_400_with_the_reason_and_stores_nothing(
        tmp_path: Path, name: str):
    body = BAD_BATCHES[name]
    if name == "no id":
        header = json.loads(body[4:4 + struct.unpack_from("<I", body)[0]])
        header = {k: v for k, v in header.items() if v is not None}
        body = _with_header(header, 1)[:-45] + body[-45:]
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        run, token = client.create_run("x.py", [], "method", {})
        status, reply = raw_request(f"{client.url}/api/runs/{run}/events", body,
                                    {"X-Fecomlite-Token": token})
        assert status == 400, reply
        assert reply["error"]  # the reason, in words
        assert client.status()["recording"] == [run]  # and the server serves on
    with Store(tmp_path / "store.sqlite") as store:
        assert events_table(store).db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
        assert store.run(run)["hyperparams"] == {}


def test_admin_numbers_out_of_range_are_refused(tmp_path: Path):
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        run, _ = client.create_run("x.py", [], "method", {})
        admin = {"Authorization": f"Bearer {client.admin_token}"}
        for path, body in [(f"/api/runs/{run}/reps/1/end", b'{"t_ns": 1' + b"0" * 400 + b"}"),
                           (f"/api/runs/{run}/idle", b'{"seconds": NaN}'),
                           (f"/api/runs/{run}/idle", b'{"seconds": "1"}'),
                           (f"/api/runs/{run}/watch", b'{"pid": 99999999999}'),
                           (f"/api/runs/{run}/reps/1/start", b'{"t_ns": -1}'),
                           (f"/api/runs/{run}/reps/1/end", b'{"exit_code": -9223372036854775808}'),
                           (f"/api/runs/{run}/gate", b'{"rep": -1}'),
                           (f"/api/runs/{run}/reps/{10**30}/start", b"{}"),
                           (f"/api/runs/{10**30}/finish", b"{}"),
                           (f"/api/runs/{run}/reps/{10**6}/end", b"{}")]:
            status, reply = raw_request(client.url + path, body, admin)
            assert status == 400 and reply["error"], (path, reply)
        with Store(client.store_path, readonly=True) as store:
            assert store.repetitions(run) == []  # nothing stored for any of them


def test_the_same_batch_posted_twice_is_stored_once(tmp_path: Path):
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        run, token = client.create_run("x.py", [], "method", {})
        batch = encode_batch(1, 1, [EVENT] * 3, proc="retry", seq=0)
        assert client.post_batch(run, token, batch) == 3
        assert client.post_batch(run, token, batch) == 0  # a retry after a lost reply
    with Store(tmp_path / "store.sqlite") as store:
        assert events_table(store).db.execute("SELECT count(*) FROM events").fetchone()[0] == 3


def _spool(path: Path, *batches: bytes) -> Path:
    with open(path, "wb") as f:
        for batch in batches:
            batch_codec.write_record(f, batch)
    return path


def test_ingest_refuses_a_spool_of_another_store_and_stores_nothing(tmp_path: Path):
    with served(tmp_path / "a", [FakeSensorForTests("p")]) as a:
        run, _ = a.create_run("x.py", [], "method", {})
        foreign = _spool(tmp_path / "rep-1.spool", encode_batch(
            1, 1, [EVENT], run=str(run), store=a.store_id))
    with served(tmp_path / "b", [FakeSensorForTests("p")]) as b:
        b.create_run("y.py", [], "method", {})  # run 1 of b: the spool's run id exists here
        result = invoke(["ingest", str(foreign), "--home", str(tmp_path / "b")],
                        env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "was written for another fecomlite store" in result.output
    assert foreign.exists()  # kept, for the home it belongs to
    with Store(tmp_path / "b" / "store.sqlite") as store:
        assert events_table(store).db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
        assert len(store.runs()) == 1


def test_ingest_resumes_past_a_bad_record_and_commits_no_part_of_it(tmp_path: Path):
    with served(tmp_path / "home", [FakeSensorForTests("p")]) as client:
        run, _ = client.create_run("x.py", [], "method", {})
        spool = _spool(tmp_path / "rep-1.spool",
                       encode_batch(1, 1, [EVENT], run=str(run)),
                       encode_batch(1, 1, [("a:1:0", 30, 20, 1, 0, -1, -1)] * 2, run=str(run)),
                       encode_batch(1, 1, [EVENT] * 4, run=str(run)))
        report = client.ingest_report(spool)
    assert (report["events"], report["bad_records"]) == (5, 1)
    assert report["bad_reasons"] == ["rep-1.spool record 2: an event ends before it starts"]


def _reply(sock: socket.socket) -> bytes:
    """A whole HTTP reply: its head and body may come in separate segments."""
    data = b""
    while chunk := sock.recv(1000):
        data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", head)
        if length and len(body) >= int(length.group(1)):
            break
    return data


def test_a_silent_connection_is_dropped_and_many_do_not_hold_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A client that sends half a request and stops (or never sends) holds a worker only until
    the request timeout; the bounded pool leaves the rest of them waiting in the backlog."""
    monkeypatch.setattr(server_app._Handler, "timeout", 1.0)
    monkeypatch.setattr(server_app, "MAX_WORKERS", 4)
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        run, token = client.create_run("x.py", [], "method", {})
        host, port = "127.0.0.1", int(client.url.rsplit(":", 1)[1])
        stalled = socket.create_connection((host, port))
        stalled.sendall(f"POST /api/runs/{run}/events HTTP/1.1\r\nContent-Length: 100\r\n"
                        f"X-Fecomlite-Token: {token}\r\n\r\n0123456789".encode())
        idle = [socket.create_connection((host, port)) for _ in range(20)]
        stalled.settimeout(10)
        t0 = time.monotonic()
        reply = _reply(stalled)
        assert b" 400 " in reply and b"timed out" in reply
        assert time.monotonic() - t0 < 8  # dropped after the timeout, not held forever
        assert client.status()["recording"] == [run]  # served once the idle ones time out
        for s in [stalled, *idle]:
            s.close()


def test_bodies_held_at_once_stay_within_the_budget():
    """Large bodies read at once are bounded in total: a reader whose body does not fit waits
    for another to be done (the 16 MB bodies of ten clients never sit in memory together)."""
    budget = server_app._Budget(3 * 16)
    entered, release = [], threading.Event()

    def reader(size: int) -> None:
        with budget.hold(size):
            entered.append(size)
            release.wait(10)

    threads = [threading.Thread(target=reader, args=(16,)) for _ in range(5)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(entered) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert budget.used == 48 and len(entered) == 3  # the other two wait their turn
    release.set()
    for t in threads:
        t.join(10)
    assert len(entered) == 5 and budget.used == 0
    with budget.hold(10**9):  # a body over the whole budget still goes through, alone
        assert budget.used == budget.limit


def test_idle_connections_wait_without_threads_and_the_server_still_answers(tmp_path: Path):
    """Hundreds of connections that send nothing take no thread each (the issue saw 3,000
    idle sockets make 3,006 threads) and do not keep a real client waiting."""
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        before = threading.active_count()
        port = int(client.url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
        try:
            assert client.status()["recording"] == []  # served at once
            assert threading.active_count() <= before + 2  # the status request's worker
        finally:
            for s in idle:
                s.close()
