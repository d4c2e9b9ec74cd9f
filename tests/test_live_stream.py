"""The live view over real HTTP: the page and its assets, the Server-Sent Events stream (rate,
content, stage and gate as a run goes), and that nothing is read while nobody watches."""

from __future__ import annotations

import http.client
import threading
import time
from pathlib import Path

import pytest
from test_live_support import get, read_events
from test_server_support import FakeSensorForTests, serving

REPORT_STATIC = Path(__file__).resolve().parents[1] / "fecomlite" / "report" / "static"


def _sensors() -> list[FakeSensorForTests]:
    return [
        FakeSensorForTests("fake:energy", kind="counter", unit="J", value=lambda t: 40.0 * t),
        FakeSensorForTests("fake:rss", domain="process-memory", unit="B", kind="gauge",
                           value=lambda t: 1e6 * (1 + int(t * 4)), device="process"),
    ]


def test_page_and_assets_come_from_the_server_under_a_strict_policy(tmp_path: Path):
    with serving(tmp_path, _sensors()) as (server, _):
        assert get("127.0.0.1", server.port, "/")[0] == 401  # the page shows run data
        status, headers, body = get("127.0.0.1", server.port, f"/?token={server.view_token}")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        # the page keeps the token in a cookie of its own for its stream (not readable by JS)
        cookie = headers["Set-Cookie"]
        assert cookie.startswith(f"fecomlite-{server.port}={server.view_token};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        stream = get("127.0.0.1", server.port, "/live/stream?token=wrong")
        assert stream[0] == 401
        policy = headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert b'src="static/charts.js"' in body and b'href="static/report.css"' in body
        assert b"http" not in body.split(b"<main>")[1]  # no link to anywhere else
        for name in ("charts.js", "report.css"):  # the report's own files, not copies
            status, _, served = get("127.0.0.1", server.port, f"/static/{name}")
            assert status == 200 and served == (REPORT_STATIC / name).read_bytes()
        assert get("127.0.0.1", server.port, "/static/live.js")[0] == 200
        assert get("127.0.0.1", server.port, "/static/store.sqlite")[0] == 404
        assert get("127.0.0.1", server.port, "/static/../server.json")[0] == 404


@pytest.mark.parametrize("path", ["/", "/live/stream", "/metrics", "/static/live.js"])
def test_pages_answer_loopback_names_only(tmp_path: Path, path: str):
    """A page of another site whose name was rebound to 127.0.0.1 sends its own Host."""
    with serving(tmp_path, _sensors()) as (server, _):
        if not path.startswith("/static"):
            path += f"?token={server.view_token}"
        refused = get("127.0.0.1", server.port, path, headers={"Host": "evil.example"})
        assert refused[0] == 403
        if not path.startswith("/live/stream"):  # an SSH tunnel's local port is another port
            assert get("127.0.0.1", server.port, path, headers={"Host": "localhost:8022"})[0] == 200


def test_the_stream_pushes_more_than_twice_a_second_and_each_point_once(tmp_path: Path):
    with serving(tmp_path, _sensors()) as (server, client):
        run, _ = client.create_run("train.py", ["--epochs", "2"], "method", {"repeat": 2})
        client.rep_start(run, 1)
        messages = read_events("127.0.0.1", server.port, 2.6, server.view_token)
    times = [t for t, _ in messages]
    assert len(messages) >= 5
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 0.5
    first, *rest = [m for _, m in messages]
    assert first["reset"] and not any(m["reset"] for m in rest)
    assert first["run"]["program"] == "train.py" and first["run"]["argv"] == ["--epochs", "2"]
    assert first["stage"]["stage"] == "run" and first["stage"]["rep"] == 1
    assert rest[-1]["progress"] == {"done": 0, "total": 2, "started": 1}
    (power,) = rest[-1]["power"]
    assert power["label"] == "CPU package (measured)"
    assert power["now"] == pytest.approx(40, rel=0.05)
    rss = [t for m in [first, *rest] for t, _ in m["points"].get("fake:rss", [])]
    assert len(rss) >= 3 and rss == sorted(set(rss))  # every step once, in order
    values = [m["memory"][0]["now"] for m in rest if m["memory"]]  # once a sample was stored
    assert len(values) >= 3 and values[-1] > values[0]  # the fake RSS grows every 0.25 s


def test_the_stream_says_what_the_run_waits_for_and_how_the_gate_went(tmp_path: Path):
    with serving(tmp_path, _sensors()) as (server, client):
        run, _ = client.create_run("train.py", [], "method", {"repeat": 1})
        idle = threading.Thread(target=client.idle, args=(run, 1.2))
        idle.start()
        during = read_events("127.0.0.1", server.port, 0.6, server.view_token)
        idle.join()
        verdict = client.gate(run, max_wait_s=0.3, window=2, poll_s=0.1)
        after = read_events("127.0.0.1", server.port, 0.5, server.view_token)
    assert during[-1][1]["stage"]["stage"] == "idle"
    assert during[-1][1]["stage"]["seconds"] == 1.2
    assert during[0][1]["gate"] is None
    gate = after[-1][1]["gate"]
    assert gate["passed"] == verdict["passed"] and gate["reasons"] == verdict["reasons"]
    assert after[-1][1]["power"][0]["idle"] == pytest.approx(40, rel=0.1)
    assert after[-1][1]["stage"]["stage"] == "between"


def test_nothing_is_read_while_nobody_watches(tmp_path: Path):
    with serving(tmp_path, _sensors()) as (server, client):
        monitor = server.service.monitor
        client.create_run("train.py", [], "method", {})
        time.sleep(0.6)
        assert monitor.refreshes == 0
        threads = threading.active_count()
        read_events("127.0.0.1", server.port, 1.0, server.view_token)
        watched = monitor.refreshes
        assert watched >= 2
        time.sleep(1.0)  # the stream's thread sees the viewer left before its next push
        assert monitor.refreshes <= watched + 1  # one may have begun as the viewer left
        assert threading.active_count() <= threads


def test_a_connected_viewer_does_not_hold_the_server_up(tmp_path: Path):
    with serving(tmp_path, _sensors()) as (server, client):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/live/stream", headers={"Cookie": f"fecomlite-{server.port}="
                                                               f"{server.view_token}"})
        response = conn.getresponse()
        assert response.fp.readline() == b"retry: 2000\n"
        t0 = time.monotonic()
        client.shutdown()
        rest = response.read()  # until the server closes the stream
        assert time.monotonic() - t0 < 2.0
        assert rest.count(b"event: update") <= 3
        conn.close()
