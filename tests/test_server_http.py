"""The server over real HTTP on 127.0.0.1, with injected sensors: auth, limits, runs, idle, gate."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import typer
from fakesys.nvml import H200, ReplayNvmlForTests
from stored_events import events_table
from test_server_support import FakeSensorForTests, encode_batch, served
from typer.testing import CliRunner

from fecomlite.sensors.nvml import discover_nvml
from fecomlite.sensors.replay import fixture_sensors
from fecomlite.server.app import ServerConfigError
from fecomlite.server.client import ServerClient, ServerError
from fecomlite.server.command import server_command
from fecomlite.server.runtime import open_server
from fecomlite.server.state import read_state
from fecomlite.store import Store

MANIFEST = {"format": 1, "sites": {"train.py:3:4": {
    "file": "train.py", "line": 3, "col": 4, "api": "keras.Model.fit", "written": "model.fit",
    "kind": "method", "function": "main", "source": "model.fit(x)"}}}


def raw_request(url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
                method: str = "POST") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_events_need_their_runs_token(tmp_path: Path):
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        run, token = client.create_run("train.py", [], "method", {}, manifest=MANIFEST)
        other, other_token = client.create_run("other.py", [], "method", {})
        body = encode_batch(1, 99, [("train.py:3:4", 10, 20, 1, 0, 64, -1)])
        url = f"{client.url}/api/runs/{run}/events"
        assert raw_request(url, body)[0] == 401
        assert raw_request(url, body, {"X-Fecomlite-Token": token + "x"})[0] == 403
        assert raw_request(url, body, {"X-Fecomlite-Token": other_token})[0] == 403
        assert raw_request(  # the admin token is not a run token
            url, body, {"Authorization": f"Bearer {client.admin_token}"})[0] == 401
        assert raw_request(f"{client.url}/api/runs/999/events", body,
                           {"X-Fecomlite-Token": token})[0] == 403
        assert client.post_batch(run, token, body) == 1
    with Store(tmp_path / "store.sqlite") as store:
        (row,) = events_table(store).db.execute(
            "SELECT e.run_id, e.pid, e.t_start_ns, e.in_bytes, e.out_bytes, s.api, s.line "
            "FROM events e JOIN sites s ON s.id = e.site_id")
        assert tuple(row) == (run, 99, 10, 64, None, "keras.Model.fit", 3)


def test_admin_endpoints_need_the_admin_token(tmp_path: Path):
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        intruder = ServerClient(client.url, "not-the-token", client.store_path)
        with pytest.raises(ServerError) as refused:
            intruder.create_run("x.py", [], "method", {})
        assert refused.value.status == 403
        status, reply = raw_request(f"{client.url}/api/shutdown", b"{}")
        assert status == 401 and "admin token" in reply["error"]
        assert intruder.status() == {"server": "fecomlite"}  # still served, but says no more
        assert client.status()["pid"] == os.getpid()
        with Store(tmp_path / "store.sqlite") as store:
            assert store.runs() == []


def test_bad_requests_get_errors_and_the_server_keeps_serving(tmp_path: Path):
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        run, token = client.create_run("x.py", [], "method", {})
        events = f"{client.url}/api/runs/{run}/events"
        admin = {"Authorization": f"Bearer {client.admin_token}"}
        assert raw_request(f"{client.url}/api/nothing", b"{}")[0] == 404
        assert raw_request(f"{client.url}/api/runs", method="GET")[0] == 405
        assert raw_request(events, b"\x05\x00\x00\x00{}", {"X-Fecomlite-Token": token})[0] == 400
        assert raw_request(f"{client.url}/api/runs", b"[1, 2]", admin)[0] == 400
        assert raw_request(f"{client.url}/api/runs/{run}/idle", b'{"seconds": -1}', admin)[0] \
            == 400
        assert raw_request(f"{client.url}/api/runs/77/watch", b'{"pid": 1}', admin)[0] == 404
        big = encode_batch(1, 1, [("a:1:0", 1, 2, 3, 0, -1, -1)] * 700_000)  # 31 MB
        assert raw_request(events, big, {"X-Fecomlite-Token": token})[0] == 413
        assert client.status()["recording"] == [run]


def test_non_loopback_addresses_are_refused(tmp_path: Path):
    for host in ("0.0.0.0", "192.168.1.10", "::", "example.org", "127.0.0.2"):
        with pytest.raises(ServerConfigError, match="127.0.0.1 only"):
            open_server(tmp_path, host=host, sensors=[])
    app = typer.Typer()
    app.command()(server_command)
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "refusing to serve" in result.output
    assert read_state(tmp_path) is None


def test_idle_baseline_from_sensors_of_known_power(tmp_path: Path):
    sensors = [
        FakeSensorForTests("fake:cpu", value=lambda t: 42.0, provenance="estimated",
                           model="cpu-util-linear"),
        FakeSensorForTests("fake:gpu-energy", domain="gpu:0", unit="J", kind="counter",
                           period_s=0.05, value=lambda t: 1000.0 + 100.0 * round(t, 2)),
        FakeSensorForTests("fake:temp", domain="temperature", unit="C", kind="gauge"),
    ]
    with served(tmp_path, sensors) as client:
        run, _ = client.create_run("x.py", [], "method", {})
        idle = client.idle(run, 0.6)
    assert set(idle["sensors"]) == {"fake:cpu", "fake:gpu-energy"}  # power and counters only
    cpu, gpu = idle["sensors"]["fake:cpu"], idle["sensors"]["fake:gpu-energy"]
    assert cpu["mean_w"] == 42.0 and cpu["std_w"] == 0.0
    assert (cpu["provenance"], cpu["model"]) == ("estimated", "cpu-util-linear")
    assert gpu["mean_w"] == pytest.approx(100.0, rel=0.05)
    with Store(tmp_path / "store.sqlite") as store:
        assert store.run(run)["idle"] == {"fake:cpu": 42.0, "fake:gpu-energy": gpu["mean_w"]}
        assert store.result(run, "idle_baseline")["sensors"]["fake:cpu"]["n"] >= 20


def test_gate_passes_on_the_idle_part_of_a_recorded_trace(tmp_path: Path):
    # 1.1 s in, the averaged power has settled; the work starts at 3 s
    with served(tmp_path, fixture_sensors(H200, offset_s=1.1)) as client:
        run, _ = client.create_run("x.py", [], "method", {})
        # the trace's idle GPU sits at 42 °C: over FECoM's 40 °C, under 45 °C
        result = client.gate(run, rep=1, window=5, max_wait_s=1.8, gpu_temp_max_c=45)
    assert result["passed"], result["reasons"]
    checked = {c["sensor"]: c for c in result["checked"]}
    assert checked["replay:gpu:0:temp"]["check"] == "temperature"
    assert checked["replay:gpu:0:temp"]["value"] == 42.0
    assert checked["replay:gpu:0:power_instant"]["limit"] == 0.01, result  # the GPU ratio
    with Store(tmp_path / "store.sqlite") as store:
        assert store.repetitions(run)[0]["gate"]["passed"] is True


def test_gate_fails_within_its_max_wait_on_the_busy_part_and_says_why(tmp_path: Path):
    with served(tmp_path, fixture_sensors(H200, offset_s=5.6)) as client:
        run, _ = client.create_run("x.py", [], "method", {})
        result = client.gate(run, window=5, max_wait_s=1.5, gpu_temp_max_c=80)
    assert not result["passed"]
    assert 1.5 <= result["waited_s"] < 2.5
    unstable = [c for c in result["checked"] if c["check"] == "power_cv" and not c["passed"]]
    assert any(c["sensor"] == "replay:gpu:0:power_instant" and c["value"] > 0.01
               for c in unstable)
    assert any("power_instant: power_cv" in r for r in result["reasons"])
    with Store(tmp_path / "store.sqlite") as store:
        assert store.result(run, "gates")[-1]["passed"] is False


def test_gate_fails_while_another_process_computes_on_the_gpu(tmp_path: Path):
    # the recorded burst (3.0–3.8 s into the trace) and the work after it, done by pid 1
    nvml = ReplayNvmlForTests(energy_read_s=0, offset_s=3.05, gpu_users=(1,))
    sensors, _ = discover_nvml(None, nvml)
    with served(tmp_path, sensors) as client:
        run, _ = client.create_run("x.py", [], "method", {})
        result = client.gate(run, window=3, max_wait_s=1.0, gpu_temp_max_c=80,
                             gpu_power_cv_max=10.0)
    quiet = next(c for c in result["checked"] if c["check"] == "gpu_quiet")
    assert quiet["sensor"] == "nvml:0:processes_sm" and quiet["value"] > 10, result
    assert not result["passed"]
    assert any("not quiet: other processes used" in r for r in result["reasons"])
    assert not any("gpu:0" in n for n in result["not_checked"])


def test_samples_and_sensor_metadata_of_a_run_with_a_watched_process(tmp_path: Path):
    watched: list[int] = []

    def process_sensors(pid: int):
        watched.append(pid)
        rss = FakeSensorForTests("proc:rss", domain="process-memory", unit="B", kind="gauge",
                                 value=lambda t: float(pid), device="process")
        return [rss], [f"following {pid}"]

    machine = [FakeSensorForTests("est:cpu-package", provenance="estimated",
                                  model="cpu-util-linear", period_s=0.1)]
    with served(tmp_path, machine, process_sensors=process_sensors, flush_s=0.1) as client:
        run, _ = client.create_run("x.py", ["--epochs", "1"], "method", {"repeat": 2})
        assert client.watch(run, 4242) == {"sensors": ["proc:rss"], "notes": ["following 4242"]}
        client.rep_start(run, 1, extra={"fraction": 0.5})
        client.rep_end(run, 1, 0)
        client.tail(run, 1, 0.2)
        client.watch(run, 4343)
        client.rep_start(run, 2)
        client.rep_end(run, 2, 3)
        client.tail(run, 2, 0.2)
        client.finish_run(run, "failed", 3)
        with pytest.raises(ServerError, match="status must be"):
            client.finish_run(run, "great", 0)
    assert watched == [4242, 4343]
    with Store(tmp_path / "store.sqlite") as store:
        meta = {s["name"]: s for s in store.sensors(run)}
        assert meta["est:cpu-package"]["provenance"] == "estimated"
        assert meta["est:cpu-package"]["model"] == "cpu-util-linear"
        assert meta["est:cpu-package"]["period_s"] == 0.1
        assert (meta["proc:rss"]["domain"], meta["proc:rss"]["unit"]) == ("process-memory", "B")
        pids = {v for (v,) in store.db.execute(
            "SELECT DISTINCT value FROM samples WHERE sensor_id=?", (meta["proc:rss"]["id"],))}
        assert pids == {4242.0, 4343.0}
        r = store.run(run)
        assert (r["status"], r["exit_code"], r["argv"]) == ("failed", 3, ["--epochs", "1"])
        last = store.db.execute("SELECT max(t_ns) FROM samples").fetchone()[0]
        assert last <= r["t_end_ns"]
        reps = store.repetitions(run)
        assert [(x["rep"], x["exit_code"], x["extra"]) for x in reps] == [
            (1, 0, {"fraction": 0.5}), (2, 3, {})]
        for x in reps:
            assert x["t_start_ns"] <= x["t_end_ns"] < x["tail_end_ns"]
            # an estimate of CPU time: the tail lasts until its readings cover none of the
            # program (a read interval, 0.05 s, plus its 0.1 s period), not the 0.2 s asked
            assert x["tail_end_ns"] - x["t_end_ns"] >= 0.15e9
        assert store.result(run, "sensors")["proc:rss"]["domain"] == "process-memory"


def test_state_file_is_private_and_open_runs_end_interrupted(tmp_path: Path):
    with served(tmp_path, [FakeSensorForTests("p")]) as client:
        state_file = tmp_path / "server.json"
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        state = json.loads(state_file.read_text())
        assert state["port"] == int(client.url.rsplit(":", 1)[1])
        assert state["store"] == str(tmp_path.resolve() / "store.sqlite")
        run, _ = client.create_run("x.py", [], "method", {})
        client.hyperparams(run, {"lr": 0.01})
    assert not state_file.exists()
    with Store(tmp_path / "store.sqlite") as store:
        assert store.run(run)["status"] == "interrupted"
        assert store.run(run)["hyperparams"] == {"lr": 0.01}


def test_the_listener_waits_without_polling_and_still_stops_at_once(tmp_path: Path):
    server = open_server(tmp_path, sensors=[], notes=[])
    loop = threading.Thread(target=server.serve_forever, daemon=True)  # no poll timeout
    loop.start()
    try:
        time.sleep(0.2)
        status, _ = raw_request(f"{server.url}/api/status", method="GET")
        assert status == 200
        started = time.monotonic()
        server.shutdown()
        loop.join(5)
        assert not loop.is_alive() and time.monotonic() - started < 3.0
    finally:
        server.server_close()
        server.service.close()
