"""NVML sensors against a real-time replay of the recorded H200 trace (no GPU needed)."""

from __future__ import annotations

import os
import time

import numpy as np
import pynvml
import pytest
from fakesys.nvml import ReplayNvmlForTests

from fecomlite.sensors import measure_period
from fecomlite.sensors.nvml import discover_nvml


def sensors_by_quantity(nvml, pid=None):
    sensors, notes = discover_nvml(pid, nvml)
    return {s.name.split(":", 2)[2]: s for s in sensors}, notes


def test_every_quantity_of_the_gpu_with_units_and_labels():
    nvml = ReplayNvmlForTests(energy_read_s=0)
    found, notes = sensors_by_quantity(nvml)
    assert sorted(found) == ["energy", "memory_used", "power_avg", "power_instant",
                             "processes_sm", "temperature"]
    assert notes == ["GPU 0: no utilisation (Not Supported)"]  # the trace has none
    energy, instant, avg = found["energy"], found["power_instant"], found["power_avg"]
    assert (energy.kind, energy.unit, energy.domain, energy.slow) == ("counter", "J", "gpu:0", True)
    assert (instant.kind, instant.unit, instant.slow) == ("power", "W", False)
    assert avg.averaging_s == 1.0 and instant.averaging_s is None
    assert found["temperature"].domain == "temperature" and found["temperature"].device == "gpu:0"
    assert found["memory_used"].unit == "B"
    assert all(s.provenance == "measured" and s.model is None for s in found.values())


def recorded_during(nvml, trace, read):
    """(what the sensor read, the trace values current at some moment during that read)."""
    t0 = nvml.player.now()
    value = read()
    t1 = nvml.player.now()
    i0, i1 = np.searchsorted(trace.t_ns, [t0, t1], side="right") - 1
    return value, set(np.round(trace.values[max(i0, 0):i1 + 1], 6))


def test_values_are_the_trace_in_sensor_units():
    nvml = ReplayNvmlForTests(energy_read_s=0, offset_s=4.0)  # in the bursts: values move
    found, _ = sensors_by_quantity(nvml)
    pairs = {
        "energy": nvml.energy, "power_instant": nvml.power_instant,
        "power_avg": nvml.power_avg, "temperature": nvml.temp, "memory_used": nvml.mem,
    }
    for quantity, trace in pairs.items():
        value, recorded = recorded_during(nvml, trace, found[quantity].read)
        assert round(value, 6) in recorded, quantity
    energy, _ = recorded_during(nvml, nvml.energy, found["energy"].read)
    assert 3000 < energy < 10000  # the mJ counter divided by 1000 exactly once
    assert 100 < found["power_instant"].read() < 800  # W, not mW


def test_energy_counter_period_and_read_cost_are_measured():
    nvml = ReplayNvmlForTests()  # with the recorded ~3.9 ms per energy read
    found, _ = sensors_by_quantity(nvml)
    m = measure_period(found["energy"], max_s=1.0)
    assert m.source == "measured" and m.changes >= 3
    assert 0.07 < found["energy"].period_s < 0.14  # the counter updates every ~100 ms
    assert 0.0035 < found["energy"].read_cost_s < 0.02
    m = measure_period(found["power_instant"], max_s=1.0)
    assert m.source == "measured" and 0.07 < m.period_s < 0.14
    assert found["power_instant"].read_cost_s < 0.001


def test_counter_difference_over_the_busy_part_matches_the_trace():
    nvml = ReplayNvmlForTests(energy_read_s=0, offset_s=3.0)  # skip the 3 s idle lead-in
    found, _ = sensors_by_quantity(nvml)

    def read_between() -> tuple[float, float, float]:
        """A read and the trace's values just before and after it (a step may fall between)."""
        before = nvml.energy.value_at(nvml.player.now())
        value = found["energy"].read()
        return value, before, nvml.energy.value_at(nvml.player.now())

    first, *around_first = read_between()
    time.sleep(0.5)
    last, *around_last = read_between()
    assert any(first == pytest.approx(v, abs=1e-6) for v in around_first)
    assert any(last == pytest.approx(v, abs=1e-6) for v in around_last)
    assert last - first > 0.4 * 120  # at least idle power for 0.4 s


def test_process_memory_counts_only_the_measured_tree():
    me = os.getpid()
    nvml = ReplayNvmlForTests(energy_read_s=0, processes=((me, 3 << 30), (1, 7 << 30)))
    found, _ = sensors_by_quantity(nvml, pid=me)
    mem = found["process_memory"]
    assert mem.read() == float(3 << 30)
    assert (mem.domain, mem.unit, mem.device) == ("process-gpu-memory", "B", "gpu:0")
    assert "process_memory" not in sensors_by_quantity(nvml)[0]  # no pid, no such sensor


def test_no_library_gives_no_sensor_and_says_why():
    nvml = ReplayNvmlForTests(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert discover_nvml(None, nvml) == ([], ["no NVIDIA GPU: NVML: NVML Shared Library Not Found"])
    nvml = ReplayNvmlForTests(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert discover_nvml(None, nvml)[1] == ["no NVIDIA GPU: NVML: Driver Not Loaded"]


def test_a_transient_nvml_error_reads_none():
    nvml = ReplayNvmlForTests(energy_read_s=0)
    found, _ = sensors_by_quantity(nvml)

    def gpu_lost(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    nvml.nvmlDeviceGetPowerUsage = gpu_lost
    assert found["power_avg"].read() is None
    assert found["power_avg"].last_error.endswith("GPU is lost")
    assert found["power_instant"].read() is not None



def sm_reads(nvml, sensors, seconds: float) -> dict[str, list[float]]:
    """Each sensor read every 50 ms for `seconds` of the replay."""
    out: dict[str, list[float]] = {s.name: [] for s in sensors}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
        for s in sensors:
            out[s.name].append(s.read())
    return out


def test_another_process_on_the_gpu_is_seen_and_not_counted_as_the_programs():
    # the recorded 4000-product burst (3.0–3.8 s into the trace) done by pid 1, not by us
    me = os.getpid()
    nvml = ReplayNvmlForTests(energy_read_s=0, offset_s=3.1, gpu_users=(1,))
    found, notes = sensors_by_quantity(nvml, pid=me)
    every, mine = found["processes_sm"], found["process_sm"]
    assert (every.domain, every.unit, every.device) == ("gpu-processes", "%", "gpu:0")
    assert mine.domain == "process-gpu-util"
    reads = sm_reads(nvml, [every, mine], 0.5)
    assert np.mean(reads[every.name]) > 80  # the GPU computed throughout the burst
    assert max(reads[mine.name]) == 0.0  # none of it was the measured tree's


def test_the_programs_own_gpu_work_is_its_own():
    me = os.getpid()
    nvml = ReplayNvmlForTests(energy_read_s=0, offset_s=3.1, gpu_users=(me,))
    found, _ = sensors_by_quantity(nvml, pid=me)
    reads = sm_reads(nvml, [found["processes_sm"], found["process_sm"]], 0.5)
    every, mine = reads["nvml:0:processes_sm"], reads["nvml:0:process_sm"]
    assert np.mean(mine) > 80 and np.mean(mine) == pytest.approx(np.mean(every), abs=5)


def test_an_idle_gpu_reads_zero():
    nvml = ReplayNvmlForTests(energy_read_s=0, gpu_users=(1,))  # the 3 s idle lead-in
    found, _ = sensors_by_quantity(nvml)
    assert max(sm_reads(nvml, [found["processes_sm"]], 0.3)["nvml:0:processes_sm"]) == 0.0


def test_no_per_process_utilisation_says_which_check_cannot_be_done():
    nvml = ReplayNvmlForTests(energy_read_s=0, process_utilisation=False)
    found, notes = sensors_by_quantity(nvml, pid=os.getpid())
    assert "processes_sm" not in found and "process_sm" not in found
    said = [n for n in notes if "processes_sm" in n]
    assert said and "whether other processes use this GPU cannot be checked" in said[0]
