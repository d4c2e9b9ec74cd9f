"""RAPL against a fake powercap tree: zones, domains, unit conversion, wraparound, denial."""

from __future__ import annotations

import threading
import time

import pytest
from fakesys import file_permissions_enforced, make_rapl_zone, write_value

from fecomlite.sensors import measure_period
from fecomlite.sensors.rapl import PERMISSION_FIX, discover_rapl


@pytest.fixture
def two_packages(tmp_path):
    root = tmp_path / "powercap"
    make_rapl_zone(root, "0", "package-0", 1_000_000)
    make_rapl_zone(root, "0:0", "core", 400_000)
    make_rapl_zone(root, "0:1", "dram", 200_000)
    make_rapl_zone(root, "1", "package-1", 3_000_000)
    (root / "intel-rapl").mkdir()  # the control type directory the kernel also puts there
    return root


def test_every_zone_becomes_a_labelled_counter_in_joules(two_packages):
    sensors, notes = discover_rapl(two_packages)
    by_name = {s.name: s for s in sensors}
    assert list(by_name) == [
        "rapl:package-0", "rapl:package-0:core", "rapl:package-0:dram", "rapl:package-1"
    ]
    assert [s.domain for s in sensors] == ["cpu-package", "cpu-core", "dram", "cpu-package"]
    assert all(s.kind == "counter" and s.unit == "J" and s.provenance == "measured"
               for s in sensors)
    assert by_name["rapl:package-0"].read() == pytest.approx(1.0)
    write_value(two_packages / "intel-rapl:0" / "energy_uj", 3_500_000)
    assert by_name["rapl:package-0"].read() == pytest.approx(3.5)
    assert by_name["rapl:package-1"].read() == pytest.approx(3.0)
    assert notes == []


def test_counter_is_unwrapped_at_max_energy_range(tmp_path):
    zone = make_rapl_zone(tmp_path, "0", "package-0", 900, max_uj=1000)
    (sensor,), _ = discover_rapl(tmp_path)
    readings = [sensor.read()]
    for raw in (990, 40, 500, 20, 20):  # wraps twice: +10, +50, +460, +520, +0 µJ
        write_value(zone / "energy_uj", raw)
        readings.append(sensor.read())
    assert [round(r * 1e6) for r in readings] == [900, 990, 1040, 1500, 2020, 2020]


def test_permission_denied_names_the_fix(two_packages):
    for zone in ("intel-rapl:0", "intel-rapl:0:1"):
        (two_packages / zone / "energy_uj").chmod(0)
    with file_permissions_enforced():
        sensors, notes = discover_rapl(two_packages)
    assert [s.name for s in sensors] == ["rapl:package-0:core", "rapl:package-1"]
    (note,) = notes
    assert "permission denied" in note
    assert "intel-rapl:0," in note and "intel-rapl:0:1" in note
    assert PERMISSION_FIX in note and "chmod o+r" in PERMISSION_FIX


def test_absent_powercap_is_a_note_not_an_error(tmp_path):
    assert discover_rapl(tmp_path / "nope") == ([], [f"no RAPL: {tmp_path / 'nope'} absent"])
    (tmp_path / "empty").mkdir()
    sensors, notes = discover_rapl(tmp_path / "empty")
    assert sensors == [] and "no intel-rapl zones" in notes[0]


def test_vanished_zone_reads_none_and_keeps_the_error(two_packages):
    sensors, _ = discover_rapl(two_packages)
    (two_packages / "intel-rapl:1" / "energy_uj").write_text("garbage\n")
    assert sensors[-1].read() is None
    assert sensors[-1].error_count == 1 and "ValueError" in sensors[-1].last_error


def test_period_is_measured_from_a_counter_that_ticks(tmp_path):
    zone = make_rapl_zone(tmp_path, "0", "package-0", 0)
    stop = threading.Event()

    def tick() -> None:  # the "hardware": +1 mJ every 10 ms
        uj = 0
        while not stop.wait(0.010):
            uj += 1000
            write_value(zone / "energy_uj", uj)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        (sensor,), _ = discover_rapl(tmp_path)
        m = measure_period(sensor, max_s=1.0)
    finally:
        stop.set()
        ticker.join()
    assert m.source == "measured" and sensor.period_source == "measured"
    assert 0.005 < sensor.period_s < 0.03
    assert m.elapsed_s < 0.5 and sensor.read_cost_s < 0.001
    assert sensor.sample_period_s == pytest.approx(sensor.period_s / 2)


def test_period_measurement_gives_up_on_a_frozen_counter(tmp_path):
    make_rapl_zone(tmp_path, "0", "package-0", 5)
    (sensor,), _ = discover_rapl(tmp_path)
    t0 = time.perf_counter()
    m = measure_period(sensor, max_s=0.2)
    assert time.perf_counter() - t0 < 0.4
    assert m.source == "nominal" and m.changes == 0 and sensor.period_s == 0.001
