"""Replay of recorded traces: units from column names, step-hold values, real-time playback."""

from __future__ import annotations

import pytest
from fakesys.nvml import H200

from fecomlite.sensors.replay import ReplaySensor, TracePlayer, fixture_sensors, load_trace


class ManualClock:
    """A clock the test moves by hand (the replayed values are the recorded ones)."""

    def __init__(self, t_ns: int = 10**12) -> None:
        self.t_ns = t_ns

    def __call__(self) -> int:
        return self.t_ns


def test_units_and_kinds_come_from_the_column_suffix():
    energy = load_trace(H200 / "gpu_samples_energy.csv", "energy_mJ")
    power = load_trace(H200 / "gpu_samples_power.csv", "power_instant_mW")
    temp = load_trace(H200 / "gpu_samples_power.csv", "temp_C")
    assert (energy.unit, energy.kind, power.unit, power.kind) == ("J", "counter", "W", "power")
    assert (temp.unit, temp.kind) == ("C", "gauge")
    assert energy.values[0] == pytest.approx(3978.794)  # 3978794 mJ in the file
    assert power.values[0] == pytest.approx(166.024)
    # the facts in the fixture's README: 5,532 J over 15.6 s
    assert energy.values[-1] - energy.values[0] == pytest.approx(5532, abs=1)
    assert energy.duration_ns / 1e9 == pytest.approx(15.6, abs=0.1)


def test_bad_columns_are_refused(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("t_ns,energy_furlongs\n1,2\n")
    with pytest.raises(ValueError, match="unknown unit suffix"):
        load_trace(f, "energy_furlongs")
    with pytest.raises(ValueError, match="needs columns t_ns and power_W"):
        load_trace(f, "power_W")


def test_value_at_holds_the_last_sample_and_sorts_input(tmp_path):
    f = tmp_path / "meter.csv"
    f.write_text("t_ns,power_W\n300,7.5\n100,5\n200,6\n")
    trace = load_trace(f, "power_W")
    assert list(trace.t_ns) == [100, 200, 300]
    assert [trace.value_at(t) for t in (99, 100, 199, 200, 299, 300, 301)] == [
        None, 5.0, 5.0, 6.0, 6.0, 7.5, None]


def test_sensor_plays_the_trace_against_the_clock(tmp_path):
    f = tmp_path / "meter.csv"
    f.write_text("t_ns,energy_uJ\n5000,1000000\n5100,1500000\n5200,4000000\n")
    clock = ManualClock()
    sensor = ReplaySensor(load_trace(f, "energy_uJ"), name="meter", domain="cpu-package",
                          player=TracePlayer(5000, clock=clock))
    readings = []
    for step in (0, 99, 1, 100, 1):
        clock.t_ns += step
        readings.append(sensor.read())
    assert readings == [1.0, 1.0, 1.5, 4.0, None]  # J; None once the trace is over
    assert (sensor.kind, sensor.unit, sensor.provenance) == ("counter", "J", "measured")


def test_fixture_sensors_share_one_player_and_land_in_their_domains():
    clock = ManualClock()
    sensors = {s.name: s for s in fixture_sensors(H200, offset_s=3.0, clock=clock)}
    assert sorted(sensors) == [
        "replay:gpu:0:energy", "replay:gpu:0:mem_used", "replay:gpu:0:power_avg",
        "replay:gpu:0:power_instant", "replay:gpu:0:temp",
    ]
    assert sensors["replay:gpu:0:energy"].domain == "gpu:0"
    assert sensors["replay:gpu:0:temp"].domain == "temperature"
    assert sensors["replay:gpu:0:mem_used"].domain == "gpu-memory"
    start = sensors["replay:gpu:0:energy"].read()
    clock.t_ns += 2 * 10**9  # two seconds into the bursts
    end = sensors["replay:gpu:0:energy"].read()
    energy = load_trace(H200 / "gpu_samples_energy.csv", "energy_mJ")
    power = load_trace(H200 / "gpu_samples_power.csv", "power_avg_mW")
    t0 = int(min(energy.t_ns[0], power.t_ns[0])) + 3 * 10**9
    assert end - start == pytest.approx(
        energy.value_at(t0 + 2 * 10**9) - energy.value_at(t0))
    assert end - start > 2 * 200  # well above idle: the GPU was busy then
