"""GET /metrics: Prometheus text that prometheus-client's own parser reads, counters that only
grow (within a run and across runs), and where it answers: loopback by default, and with
--metrics-addr a second, read-only listener that serves /metrics and nothing else."""

from __future__ import annotations

import platform
import socket
import time
from pathlib import Path

import psutil
import pytest
import typer
from prometheus_client.parser import text_string_to_metric_families
from report_helpers import FIXTURES
from test_live_support import get
from test_server_support import FakeSensorForTests, encode_batch, serving
from typer.testing import CliRunner

from fecomlite.sensors.replay import fixture_sensors
from fecomlite.server.app import parse_address
from fecomlite.server.command import server_command

FIXTURE = FIXTURES / "h200-nvml"
ENERGY = "replay:gpu:0:energy"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(host: str, port: int, token: str) -> tuple[Samples, dict[str, str]]:
    """(value per (sample name, labels), type per family) as prometheus-client parses them."""
    status, headers, body = get(host, port, "/metrics",
                                headers={"Authorization": f"Bearer {token}"})
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    types = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def counters(samples: Samples, types: dict[str, str]) -> Samples:
    return {k: v for k, v in samples.items()
            if types.get(k[0].removesuffix("_total")) == "counter" and k[0].endswith("_total")}


def find(samples: Samples, name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in samples.items()
            if n == name and all(dict(ls).get(k) == x for k, x in labels.items())]


def test_metrics_parse_and_their_counters_only_grow(tmp_path: Path):
    """A real NVML trace (H200, replayed) during a run with calls: the GPU's energy, power,
    temperature and memory, and the run's calls and per-API energy estimate."""
    sensors = fixture_sensors(FIXTURE, offset_s=2.0)  # GPU work begins a second in
    manifest = {"sites": {"t.py:1:0": {"api": "torch.matmul"}}}
    with serving(tmp_path, sensors) as (server, client):
        run, token = client.create_run("t.py", [], "method", {"repeat": 1}, manifest=manifest)
        client.idle(run, 0.5)
        client.rep_start(run, 1)
        start = time.monotonic_ns()
        time.sleep(2.5)
        batch = encode_batch(1, 1, [("t.py:1:0", start, time.monotonic_ns(), 1, 0, -1, -1)])
        client.post_batch(run, token, batch)
        first, types = scrape("127.0.0.1", server.port, server.view_token)
        time.sleep(2.3)  # the call's bins settle and the trace goes on
        second, _ = scrape("127.0.0.1", server.port, server.view_token)
        client.rep_end(run, 1, 0)
        client.finish_run(run, "finished", 0)
        other, _ = client.create_run("t.py", [], "method", {"repeat": 1})
        time.sleep(0.8)
        third, _ = scrape("127.0.0.1", server.port, server.view_token)

    host = platform.node()
    grown = counters(first, types)
    assert len(grown) >= 3
    for key, value in grown.items():
        assert second[key] >= value, key
    energy = {"sensor": ENERGY, "host": host, "domain": "gpu:0", "provenance": "measured"}
    (e1,), (e2,), (e3,) = (find(s, "fecomlite_energy_joules_total", **energy)
                           for s in (first, second, third))
    assert 0 < e1 < e2 <= e3  # across the runs too: the counter is the server's, not a run's
    assert e2 - e1 > 2.3 * 100  # the H200 drew 120-700 W
    (power,) = find(second, "fecomlite_power_watts", sensor=ENERGY, host=host)
    assert 100 < power < 800
    (temperature,) = find(second, "fecomlite_temperature_celsius", host=host)
    assert 30 < temperature < 90
    (memory,) = find(second, "fecomlite_memory_bytes", run=str(run), domain="gpu-memory")
    assert memory > 1e9
    assert find(second, "fecomlite_api_calls_total", run=str(run), api="torch.matmul") == [1.0]
    (api_energy,) = find(second, "fecomlite_api_energy_joules_total", run=str(run),
                         api="torch.matmul", domain="gpu:0", provenance="measured",
                         method="live-overlap")
    assert api_energy > 50  # seconds of matrix products, above a measured 120 W idle
    assert find(third, "fecomlite_run_info", run=str(other), status="running") == [1.0]
    assert find(third, "fecomlite_api_calls_total", run=str(run)) == []  # the new run's now


def test_per_api_series_carry_node_and_rank_and_sum_to_the_job(tmp_path: Path):
    """Two ranks of node 1 and a process without rank, posting as probes do (rank fields in the
    batch header): one series per rank, labelled with its node, summing to every call."""
    manifest = {"sites": {"t.py:1:0": {"api": "torch.matmul"}}}
    with serving(tmp_path, [FakeSensorForTests("p")]) as (server, client):
        run, token = client.create_run("t.py", [], "method", {"repeat": 1}, manifest=manifest)
        client.rep_start(run, 1)
        start = time.monotonic_ns()
        for pid, rank, calls in ((101, 0, 2), (102, 1, 3), (103, None, 1)):
            meta = {} if rank is None else {"rank": rank, "local_rank": rank, "node": 1,
                                            "device": "cpu", "job": "j7", "clock_offset_ns": 0}
            events = [("t.py:1:0", start + k, start + k + 1000, 1, 0, -1, -1)
                      for k in range(calls)]
            client.post_batch(run, token, encode_batch(1, pid, events, **meta))
        samples, types = scrape("127.0.0.1", server.port, server.view_token)
        client.rep_end(run, 1, 0)
        client.finish_run(run, "finished", 0)

    assert types["fecomlite_api_calls"] == "counter"
    calls = {(dict(ls)["node"], dict(ls)["rank"]): v for (n, ls), v in samples.items()
             if n == "fecomlite_api_calls_total" and dict(ls)["api"] == "torch.matmul"}
    assert calls == {("1", "0"): 2.0, ("1", "1"): 3.0, ("", ""): 1.0}
    seconds = find(samples, "fecomlite_api_call_seconds_total", run=str(run), rank="1", node="1")
    assert seconds == [pytest.approx(3 * 1e-6)]


def _listening_ips() -> set[str]:
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def _refused(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) != 0


def test_by_default_nothing_answers_beyond_loopback(tmp_path: Path):
    with serving(tmp_path, [FakeSensorForTests("p")]) as (server, _):
        assert _listening_ips() == {"127.0.0.1"}
        assert _refused("127.0.0.2", server.port)  # loopback range, but not the bound address
        assert get("127.0.0.1", server.port, "/metrics")[0] == 401  # run data: a token's
        assert get("127.0.0.1", server.port, f"/metrics?token={server.view_token}")[0] == 200


def test_the_metrics_option_serves_metrics_alone_on_the_other_address(tmp_path: Path):
    with serving(tmp_path, [FakeSensorForTests("p")], metrics_addr="127.0.0.2:0") as (
        server, client
    ):
        assert server.metrics is not None
        port = server.metrics.port
        assert _listening_ips() == {"127.0.0.1", "127.0.0.2"}
        assert _refused("127.0.0.2", server.port)  # the event API is not there
        status, _, body = get("127.0.0.2", port, "/metrics", headers={"Host": "node7:9464"})
        assert status == 200 and b"fecomlite_recording" in body
        admin = {"Authorization": f"Bearer {client.admin_token}", "Content-Type":
                 "application/json"}
        for method, path in [("GET", "/"), ("GET", "/api/status"), ("GET", "/live/stream"),
                             ("GET", "/static/charts.js"), ("POST", "/metrics"),
                             ("POST", "/api/runs"), ("POST", "/api/shutdown")]:
            body = b"{}" if method == "POST" else None
            assert get("127.0.0.2", port, path, method=method, body=body,
                       headers=admin)[0] == 404, path
        assert client.status()["recording"] == []  # nothing was created through it


def test_server_command_refuses_a_malformed_metrics_address(tmp_path: Path):
    app = typer.Typer()
    app.command()(server_command)
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "--metrics-addr", "9464"])
    assert result.exit_code == 2 and "HOST:PORT" in result.output
    assert not (tmp_path / "server.json").exists()


@pytest.mark.parametrize("text,expected", [("0.0.0.0:9464", ("0.0.0.0", 9464)),
                                           ("[::]:9464", ("::", 9464))])
def test_metrics_addresses_parse(text: str, expected: tuple[str, int]):
    assert parse_address(text) == expected
