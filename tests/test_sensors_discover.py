"""discover(): every source of this machine, and of fake trees, with estimates only where needed."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
from fakesys import make_hwmon, make_rapl_zone
from fakesys.nvml import ReplayNvmlForTests

from fecomlite.sensors import Sensor, discover, discover_process

NO_GPU = ReplayNvmlForTests(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_this_machine():
    sensors, notes = discover(os.getpid())
    names = [s.name for s in sensors]
    assert len(set(names)) == len(names)
    assert all(isinstance(s, Sensor) for s in sensors)
    assert {"util:cpu", "proc:rss", "proc:peak_rss", "util:process"} <= set(names)
    assert next(s for s in sensors if s.name == "proc:rss").read() > 10**6
    domains = {s.domain for s in sensors if s.provenance == "measured"}
    if not Path("/sys/class/powercap").exists():  # as on the machines this is built on
        assert "no RAPL: /sys/class/powercap absent" in notes
        cpu = next(s for s in sensors if s.domain == "cpu-package")
        assert (cpu.name, cpu.provenance, cpu.model) == (
            "est:cpu-package", "estimated", "cpu-util-linear")
        said = "CPU package power estimated (model cpu-util-linear"
        assert any(n.startswith(said) for n in notes)
        own = next(s for s in sensors if s.domain == "cpu-process")  # the program's own share
        assert (own.name, own.provenance, own.model) == (
            "est:cpu-process", "estimated", "process-cpu-share")
    if not any(d.startswith("gpu:") for d in domains):
        assert any(n.startswith("no NVIDIA GPU") for n in notes)


def test_measured_rapl_replaces_the_estimate_domain_by_domain(tmp_path):
    rapl = tmp_path / "powercap"
    make_rapl_zone(rapl, "0", "package-0", 10)
    settings = {"rapl_root": rapl, "nvml": NO_GPU, "hwmon_root": tmp_path / "none",
                "thermal_root": tmp_path / "none"}
    sensors, notes = discover(None, settings)
    by_domain = {s.domain: s for s in sensors}
    assert by_domain["cpu-package"].name == "rapl:package-0"
    assert by_domain["dram"].provenance == "estimated"  # no dram zone: estimated, and said so
    assert any(n.startswith("DRAM power estimated") for n in notes)
    assert not any(n.startswith("CPU package power estimated") for n in notes)
    assert not any(s.device == "process" for s in sensors)  # no pid, no process sensors

    sensors, _ = discover(os.getpid(), settings)
    assert "cpu-process" not in {s.domain for s in sensors}  # CPU measured: no program share
    make_rapl_zone(rapl, "0:0", "dram", 10)
    sensors, _ = discover(None, settings)
    assert all(s.provenance == "measured" for s in sensors)


def test_gpu_and_temperature_sources_join_in(tmp_path):
    make_hwmon(tmp_path / "hwmon", 0, "coretemp", {"Package id 0": 45000})
    nvml = ReplayNvmlForTests(energy_read_s=0, processes=((os.getpid(), 1 << 30),))
    settings = {"rapl_root": tmp_path / "none", "nvml": nvml, "hwmon_root": tmp_path / "hwmon",
                "thermal_root": tmp_path / "none", "rss_period_s": 0.002}
    sensors, notes = discover(os.getpid(), settings)
    by_name = {s.name: s for s in sensors}
    assert by_name["nvml:0:energy"].slow and by_name["nvml:0:process_memory"].read() == 2**30
    assert by_name["temp:cpu:coretemp:hwmon0:Package id 0"].read() == 45.0
    assert by_name["proc:rss"].period_s == 0.002
    assert not any(n.startswith("no CPU temperature") for n in notes)


def test_an_unreadable_pid_is_a_note():
    sensors, notes = discover(2**22 + 12345, {"nvml": NO_GPU})
    assert not any(s.device == "process" for s in sensors)
    assert any(n.startswith(f"process {2**22 + 12345} not readable") for n in notes)


def test_discover_process_gives_only_what_follows_the_tree():
    nvml = ReplayNvmlForTests(energy_read_s=0, processes=((os.getpid(), 5 << 20),))
    sensors, notes = discover_process(os.getpid(), {"nvml": nvml})
    assert [s.name for s in sensors] == [
        "proc:rss", "proc:peak_rss", "util:process", "sched:wait", "nvml:0:process_sm",
        "nvml:0:process_memory"]
    assert sensors[-1].read() == 5 << 20 and notes == []
    sensors, notes = discover_process(os.getpid(), {"nvml": NO_GPU})
    assert len(sensors) == 4 and notes == []  # "no GPU" was said once, by discover()
