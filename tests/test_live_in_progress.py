"""The call in progress: the probe knows which wrapped calls are running (C and Python paths),
its batches carry them while they change, the server keeps the latest word of each process and
the monitor names them and says how long they have run, while a real probed child runs a long
call."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_live_support import GROWER_SITES, grower_command, probe_env
from test_server_support import FakeSensorForTests, encode_batch, serving

import fecomlite.runtime.probe as probe
from fecomlite.runtime import batch_codec

CALLS = [probe.call, probe._python_call]
IDS = ["native", "python"]


def _mine() -> list[tuple[str, ...]]:
    """This thread's calls in progress, outermost first, by site."""
    me = threading.get_ident()
    return [tuple(site for site, _ in calls) for tid, _, calls in probe.open_calls() if tid == me]


@pytest.mark.parametrize("call", CALLS, ids=IDS)
def test_the_probe_knows_the_calls_in_progress_on_each_thread(call):
    seen = {}

    def inner():
        seen["inner"] = _mine()
        return 1

    for _ in range(4):  # the sized path first, then the fast one
        assert call("o:1:0", call, "o:2:0", inner) == 1
        assert seen.pop("inner") == [("o:1:0", "o:2:0")]
        assert _mine() == []
    with pytest.raises(ZeroDivisionError):
        call("o:3:0", lambda: 1 / 0)
    assert _mine() == []  # a call that raised is over

    started, release = threading.Event(), threading.Event()

    def waiting():
        started.set()
        release.wait(5)

    other = threading.Thread(target=call, args=("o:4:0", waiting))
    other.start()
    started.wait(5)
    running = {tid: [s for s, _ in calls] for tid, _, calls in probe.open_calls()}
    release.set()
    other.join()
    assert running.get(other.ident) == ["o:4:0"]
    assert other.ident not in {tid for tid, _, _ in probe.open_calls()}
    probe.drain_columns()


def test_a_forked_child_runs_none_of_its_parents_calls():
    read, write = os.pipe()

    def fork_inside():
        pid = os.fork()
        if pid == 0:  # the child: the probe's after-fork hook cleared the table
            os.write(write, repr(probe.open_calls()).encode())
            os._exit(0)
        os.waitpid(pid, 0)

    probe.call("f:1:0", fork_inside)
    os.close(write)
    assert os.read(read, 1000) == b"[]"
    probe.drain_columns()


def test_a_batch_header_with_a_malformed_open_field_is_refused():
    good = {"n": 0, "sites": [], "open": [{"tid": 5, "depth": 2, "calls": [["a:1:0", 10]]}]}
    batch_codec.check_header(good)
    for bad in ([{"tid": 5, "depth": 1}],  # no calls
                [{"tid": 5, "depth": 1, "calls": [["a:1:0", -1]]}],  # a start before 0
                [{"tid": 5, "depth": 1, "calls": [[1, 2]]}],  # a site that is no text
                [{"tid": 5, "depth": 1, "calls": [["a", 1]] * 9}],  # deeper than the probe keeps
                [{"tid": 5, "depth": 1, "calls": []}] * 17,  # more threads than a batch carries
                {"tid": 5}):
        with pytest.raises(batch_codec.BatchError, match="open"):
            batch_codec.check_header({**good, "open": bad})


def test_the_server_keeps_each_process_latest_word_and_names_the_calls(tmp_path: Path):
    sites = {"m.py:3:4": {"api": "keras.Model.fit", "written": "model.fit", "file": "m.py",
                          "line": 3}}
    with serving(tmp_path, [FakeSensorForTests("fake:power")]) as (server, client):
        svc = server.service
        run, token = client.create_run("m.py", [], "method", {"repeat": 1},
                                       manifest={"sites": sites})
        client.rep_start(run, 1)
        t0 = time.monotonic_ns() - 3_000_000_000  # began 3 s ago
        word = [{"tid": 9, "depth": 1, "calls": [["m.py:3:4", t0]]}]
        client.post_batch(run, token, encode_batch(1, 42, [], proc="p1", seq=5, open=word))
        client.post_batch(run, token, encode_batch(1, 42, [], proc="p1", seq=4, open=[]))
        svc.monitor.refresh()
        time.sleep(0.3)  # past the monitor's rate limit
        (shown,) = svc.monitor.refresh().calls["in_progress"]
        assert shown["api"] == "keras.Model.fit" and shown["written"] == "model.fit"
        assert (shown["file"], shown["line"], shown["pid"], shown["level"]) == ("m.py", 3, 42, 0)
        assert 3.0 <= shown["elapsed_s"] < 10
        client.post_batch(run, token, encode_batch(1, 42, [], proc="p1", seq=6, open=[]))
        time.sleep(0.3)
        assert svc.monitor.refresh().calls["in_progress"] == []
        client.post_batch(run, token, encode_batch(1, 42, [], proc="p1", seq=7, open=word))
        client.rep_end(run, 1, 0)  # the repetition's processes are gone
        time.sleep(0.3)
        assert svc.monitor.refresh().calls["in_progress"] == []


def test_a_long_call_of_a_real_probed_child_shows_while_it_runs(tmp_path: Path):
    """The grower child burns 2.5 s in one wrapped call: the monitor shows it, by its API, with
    an elapsed time that grows, and no longer once it ended."""
    with serving(tmp_path / "home", [FakeSensorForTests("fake:power")]) as (server, client):
        svc = server.service
        run, token = client.create_run("grower.py", [], "method", {"repeat": 1},
                                       manifest={"sites": GROWER_SITES})
        client.rep_start(run, 1)
        command = grower_command(tmp_path, 1000, 1, 2.5, probe=True)
        proc = subprocess.Popen(command, env=probe_env(client, run, token, tmp_path / "s.spool"))
        seen: list[tuple[str, float]] = []
        while proc.poll() is None:
            for c in svc.monitor.refresh().calls["in_progress"]:
                seen.append((c["api"], c["elapsed_s"]))
            time.sleep(0.25)
        assert proc.returncode == 0
        burning = [elapsed for api, elapsed in seen if api == "grower.burn"]
        # first seen once a batch says it is open (the sender sends about once a second), then
        # at every refresh until it ends
        assert len(burning) >= 3 and burning[-1] - burning[0] >= 0.5
        assert all(b >= a for a, b in zip(burning, burning[1:], strict=False))
        time.sleep(0.3)
        assert svc.monitor.refresh().calls["in_progress"] == []  # its last batch said so
        client.rep_end(run, 1, 0)
