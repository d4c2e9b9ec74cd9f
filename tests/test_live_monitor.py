"""The monitor behind the live view and /metrics, alone: binning, energy that only grows, and
the running per-API estimate on a known power profile over a real server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_server_support import FakeSensorForTests, encode_batch, serving

from fecomlite.server import live
from fecomlite.server.monitor import BIN_NS, SETTLE_S, Track


def _counter_track() -> Track:
    return Track("rapl:package-0", "cpu-package", "J", "counter", "measured", None)


def _seq() -> int:
    return 0


def test_a_counter_bins_into_power_and_its_energy_never_shrinks():
    track = _counter_track()
    t0 = 7 * BIN_NS  # on the grid
    energy_seen = []
    for i in range(301):  # 3 s read every 10 ms; 50 W; reset to 0 at 1.5 s (a wrap not unwrapped)
        t = t0 + i * 10_000_000
        value = 50.0 * (i / 100) if i < 150 else 50.0 * ((i - 150) / 100)
        track.add(t, value, _seq)
        energy_seen.append(track.energy_J)
    assert all(b >= a for a, b in zip(energy_seen, energy_seen[1:], strict=False))
    assert track.energy_J == pytest.approx(50.0 * 2.99, rel=0.01)  # the reset's step adds 0
    powers = [b.value for b in track.bins]
    assert len(powers) == 6  # the read at 3 s opened a seventh bin, still open
    assert powers[3] == pytest.approx(49.0)  # the reset's read added nothing: 24.5 J in 0.5 s
    assert [p for i, p in enumerate(powers) if i != 3] == pytest.approx([50.0] * 5)
    assert [b.start_ns for b in track.bins] == [t0 + k * BIN_NS for k in range(6)]


def test_a_repeated_read_stored_for_two_runs_counts_once():
    track = _counter_track()
    for _ in range(2):  # the writer stores each read once per recording run
        for i in range(101):
            track.add(i * 10_000_000, 20.0 * i / 100, _seq)
        assert track.energy_J == pytest.approx(20.0)


def test_gauges_keep_the_peak_for_memory_and_the_mean_otherwise():
    rss = Track("proc:rss", "process-memory", "B", "gauge", "measured", None)
    temp = Track("hwmon:cpu", "temperature", "C", "gauge", "measured", None)
    for i, v in enumerate([1e6, 9e6, 2e6, 3e6]):
        rss.add(i * 100_000_000, v, _seq)
        temp.add(i * 100_000_000, 40.0 + i, _seq)
    rss.add(BIN_NS, 5e6, _seq)  # closes the first bin
    temp.add(BIN_NS, 50.0, _seq)
    assert rss.bins[0].value == 9e6 and rss.now(BIN_NS) == 5e6
    assert temp.bins[0].value == pytest.approx(41.5)


def test_per_api_energy_goes_to_the_innermost_calls_above_the_idle_baseline(tmp_path: Path):
    """10 W idle, 110 W during [1 s, 2 s): API a runs the first half, b the second, inside an
    outer call c. The estimate gives a and b 50 J each above idle, c next to nothing (the busy
    second lies on the bin grid, so no bin mixes c's own time with a's or b's power)."""
    ns = (time.monotonic_ns() // BIN_NS + 1) * BIN_NS
    origin = ns / 1e9
    busy = (ns + 1_000_000_000, ns + 2_000_000_000)
    sensor = FakeSensorForTests(
        "fake:power",
        value=lambda _: 110.0 if busy[0] <= time.monotonic_ns() < busy[1] else 10.0)
    manifest = {"sites": {k: {"api": k} for k in ("a", "b", "c")}}
    with serving(tmp_path, [sensor]) as (server, client):
        run, token = client.create_run("p.py", [], "method", {"repeat": 1}, manifest=manifest)
        client.idle(run, 0.6)
        events = [("a", ns + 1_000_000_000, ns + 1_500_000_000, 1, 0, -1, -1),
                  ("b", ns + 1_500_000_000, ns + 2_000_000_000, 1, 0, -1, -1),
                  ("c", ns + 900_000_000, ns + 2_050_000_000, 1, 0, -1, -1)]
        time.sleep(max(0.0, origin + 2.1 - time.monotonic()))
        assert client.post_batch(run, token, encode_batch(1, 42, events)) == 3
        time.sleep(max(0.0, origin + 2.6 + SETTLE_S - time.monotonic()))
        snap = server.service.monitor.refresh()
        shown = live.message(server.service.monitor, snap,
                             {"seq": 0, "run": None, "started": False, "overview": {}})
    apis = {a.api: a for a in snap.apis}
    assert {k: apis[k].calls for k in "abc"} == {"a": 1, "b": 1, "c": 1}
    assert apis["c"].seconds == pytest.approx(1.15)
    # self time: c's own 0.15 s, not the 1 s of a and b nested in it (#30); the self times add
    # up to the time in calls, where the inclusive ones count the nested second twice
    assert {k: apis[k].self_s for k in "abc"} == pytest.approx(
        {"a": 0.5, "b": 0.5, "c": 0.15}, abs=1e-6)
    rows = {r["api"]: r for r in shown["calls"]["top"]}
    assert {k: rows[k]["self_s"] for k in "abc"} == pytest.approx(
        {"a": 0.5, "b": 0.5, "c": 0.15}, abs=1e-6)
    assert rows["c"]["seconds"] == pytest.approx(1.15)
    shares = [rows[k]["share"].get("cpu-package", 0.0) for k in "abc"]
    assert sum(shares) <= 1.0 + 1e-9 and rows["c"]["share"].get("cpu-package", 0.0) < 0.02
    energy = {k: apis[k].energy_J.get("cpu-package", 0.0) for k in "abc"}
    assert energy["a"] == pytest.approx(50.0, rel=0.1)
    assert energy["b"] == pytest.approx(50.0, rel=0.1)
    assert energy["c"] < 1.0
    assert snap.calls["outside_J"]["cpu-package"] < 1.0
    assert snap.calls["last"]["api"] == "c"  # the batch's last event
    assert snap.energy_domains == {"cpu-package": "fake:power"}


def test_the_server_side_imports_no_scipy():
    """The monitor shares the report's sensor choice; importing it must stay fast (no scipy)."""
    import subprocess
    import sys

    code = "import sys, fecomlite.server.app; print('scipy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr

