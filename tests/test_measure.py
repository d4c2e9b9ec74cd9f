"""`fecomlite.measure()`: figures handed back to the user's code, with and without a server,
nested and from threads. Real sensors (CPU and DRAM estimated here, measured where RAPL is)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from conftest import run_cli
from stored_events import events_table
from test_run_e2e import FAST, write

import fecomlite
from fecomlite.analysis.run_analysis import ADDITIVE_DOMAINS
from fecomlite.api.sampler import monitor
from fecomlite.store import Store

MB = 1 << 20


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def power_bounds(domain: str) -> tuple[float, float]:
    """(lowest, highest) W the chosen sensor can report: an estimate's model envelope, or
    anything non-negative for a measured source."""
    sensor = next(s.sensor for s in monitor()._series.values() if s.sensor.domain == domain)
    params = sensor.model_params
    if sensor.model == "cpu-util-linear":
        return params["idle_w"], params["max_w"]
    if sensor.model == "dram-gib-util-linear":
        gib = params["gib"]
        return gib * params["static_w_per_gib"], gib * (
            params["static_w_per_gib"] + params["active_w_per_gib"]
        )
    return 0.0, float("inf")


def test_a_block_gets_duration_energy_per_domain_and_memory():
    t0 = time.monotonic()
    with fecomlite.measure("block") as m:
        held = bytearray(64 * MB)  # touched: zero-filled pages are resident
        held[::4096] = b"x" * (len(held) // 4096)
        busy(0.5)
    elapsed = time.monotonic() - t0
    assert isinstance(m.duration_s, float) and 0.5 <= m.duration_s <= elapsed
    energy = m.energy_J
    assert {"cpu-package", "dram"} <= set(energy)
    for domain in ("cpu-package", "dram"):
        low, high = power_bounds(domain)
        # energy over the window is power × time within the sensor's range (idle included)
        assert 0.9 * low * m.duration_s <= energy[domain] <= 1.1 * high * m.duration_s, domain
        assert m.provenance[domain] == monitor()._series[m.domains[domain].sensor].sensor.provenance
        assert m.resolution_s[domain] > 0
    assert m.total_J == pytest.approx(
        sum(j for d, j in energy.items() if d in ADDITIVE_DOMAINS or d.startswith("gpu:"))
    )
    assert m.memory_added_B >= 48 * MB
    assert m.memory_peak_B >= m.memory_added_B
    assert m.co2e_g is None  # no intensity given
    del held


def test_memory_freed_inside_shows_a_peak_above_what_is_left():
    with fecomlite.measure() as m:
        temp = bytearray(96 * MB)
        temp[::4096] = b"y" * (len(temp) // 4096)
        time.sleep(0.05)  # a few 200 Hz RSS reads while it is held
        del temp
    assert m.memory_added_B < 32 * MB
    start_rss = m._resolved()["memory"]["host"][0]
    assert m.memory_peak_B >= start_rss + 80 * MB


def test_nested_blocks_each_have_their_own_window():
    with fecomlite.measure("outer") as outer:
        busy(0.2)
        with fecomlite.measure("inner") as inner:
            busy(0.3)
        busy(0.2)
    assert outer.duration_s >= inner.duration_s + 0.4
    assert inner.start_ns > outer.start_ns and inner.end_ns < outer.end_ns
    for domain, joules in inner.energy_J.items():
        assert 0 < joules < outer.energy_J[domain], domain


def test_one_measure_object_on_several_threads_gives_each_its_own_measurement():
    reused = fecomlite.measure("reused")
    results: dict[str, object] = {}

    def work(name: str, seconds: float) -> None:
        with reused as m:
            time.sleep(seconds)
        results[name] = m

    threads = [threading.Thread(target=work, args=(n, s)) for n, s in (("a", 0.4), ("b", 0.1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0.4 <= results["a"].duration_s < 0.4 + 0.3
    assert 0.1 <= results["b"].duration_s < 0.1 + 0.3
    assert results["a"].energy_J["cpu-package"] > results["b"].energy_J["cpu-package"]


def test_decorator_measures_every_call_and_keeps_behaviour():
    @fecomlite.measure("step", carbon_intensity=400.0)
    def step(x, *, scale=1):
        """Doubles."""
        if x < 0:
            raise ValueError(x)
        busy(0.05)
        return 2 * x * scale

    assert step.__doc__ == "Doubles." and step.last is None
    assert step(3, scale=2) == 12
    first = step.last
    assert first.duration_s >= 0.05
    with pytest.raises(ValueError):
        step(-1)
    assert step.last is not first and step.last.duration_s < first.duration_s
    # grams = J / 3.6e6 × PUE (1) × 400 g/kWh, over the non-overlapping domains
    assert first.co2e_g == pytest.approx(first.total_J / 3.6e6 * 400.0)
    assert "estimated at 400 gCO2e/kWh" in first.as_dict()["carbon_intensity"]


def test_a_region_code_and_pue_give_the_tables_intensity():
    with fecomlite.measure(region="FRA", pue=1.5) as m:
        busy(0.1)
    intensity = m.carbon_intensity
    assert intensity.g_per_kwh == pytest.approx(56.0, abs=0.1)
    assert m.co2e_g == pytest.approx(m.total_J / 3.6e6 * 1.5 * intensity.g_per_kwh)
    assert "FRA France 2023" in intensity.label() and "PUE 1.5" in intensity.label()


def test_inside_a_run_the_block_is_a_region_and_the_figures_come_back(home, tmp_path):
    script = write(
        tmp_path,
        "prog.py",
        """
        import json, time
        import fecomlite

        with fecomlite.measure("train") as m:
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                pass
        print("MEASURED", json.dumps(m.as_dict()))
    """,
    )
    result = run_cli(
        tmp_path,
        "run",
        "--home",
        str(home),
        "--repeat",
        "1",
        "--carbon-intensity",
        "300",
        *FAST,
        str(script),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("MEASURED"))
    figures = json.loads(line.split(" ", 1)[1])
    assert figures["duration_s"] >= 0.3 and figures["energy_J"]["cpu-package"] > 0
    assert figures["co2e_g"] == pytest.approx(figures["total_J"] / 3.6e6 * 300)
    with Store(home / "store.sqlite", create=False) as store:
        run_id = max(r["id"] for r in store.runs())
        spans = events_table(store).db.execute(
            "SELECT e.t_start_ns, e.t_end_ns FROM events e JOIN sites s ON s.id = e.site_id "
            "WHERE e.run_id=? AND s.api='region:train'",
            (run_id,),
        ).fetchall()
    assert len(spans) == 1
    assert (spans[0][1] - spans[0][0]) / 1e9 == pytest.approx(figures["duration_s"], abs=0.01)


def test_a_gpu_gives_measured_energy_and_process_gpu_memory():
    """The H200 trace replayed as NVML (a test fake named so): the GPU's counter, per window."""
    from fakesys.nvml import ReplayNvmlForTests

    from fecomlite.api.measure import Measurement
    from fecomlite.api.sampler import Monitor

    nvml = ReplayNvmlForTests(energy_read_s=0, processes=((os.getpid(), 3 << 30),))
    mon = Monitor({"nvml": nvml})
    try:
        m = Measurement("gpu")
        token, m.start_ns = mon.open()
        trace_start = nvml.player.now()
        time.sleep(1.0)
        m.end_ns = time.monotonic_ns()
        trace_end = nvml.player.now()
        m._pending = mon.close(token, m.start_ns, m.end_ns)
        expected_J = nvml.energy.value_at(trace_end) - nvml.energy.value_at(trace_start)
        assert m.provenance["gpu:0"] == "measured"
        assert m.energy_J["gpu:0"] == pytest.approx(expected_J, rel=0.1)
        assert m.total_J >= m.energy_J["gpu:0"]
        assert m.gpu_memory_peak_B == float(3 << 30) and m.gpu_memory_added_B == 0.0
    finally:
        mon.stop()


def test_a_forked_child_measures_with_its_own_sensors():
    with fecomlite.measure():  # the parent's monitor is running
        pass
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a measurement must not wait for the parent's thread
        start = time.monotonic()
        with fecomlite.measure() as m:
            busy(0.2)
        ok = m.energy_J.get("cpu-package", 0) > 0 and time.monotonic() - start < 4
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
