"""The estimation fallback: where its envelope comes from, its labels, and that it follows load."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fecomlite.sensors import MODELS
from fecomlite.sensors.discovery import discover
from fecomlite.sensors.estimate import (
    CPU_MODEL,
    DRAM_ACTIVE_W_PER_GIB,
    DRAM_MODEL,
    DRAM_STATIC_W_PER_GIB,
    PROCESS_MODEL,
    EstimatedCpuPower,
    EstimatedDramPower,
    EstimatedProcessCpuPower,
    PowerEnvelope,
    cpu_envelope,
    mem_total_gib,
)
from fecomlite.sensors.utilisation import N_CPUS, ProcessTreeCpuUtilisation


@pytest.fixture(autouse=True)
def no_env_config(monkeypatch):
    monkeypatch.delenv("FECOMLITE_CPU_TDP_W", raising=False)
    monkeypatch.delenv("FECOMLITE_CPU_IDLE_FRACTION", raising=False)


def test_known_cpu_envelope_is_scaled_to_the_cpus_shown():
    full = cpu_envelope({}, "Intel(R) Xeon(R) Platinum 8480+", n_cpus=224)  # two sockets
    vm = cpu_envelope({}, "Intel(R) Xeon(R) Platinum 8480+", n_cpus=8)  # an 8-vCPU slice
    assert full.max_w == pytest.approx(700) and vm.max_w == pytest.approx(25)
    assert vm.idle_w == pytest.approx(0.3 * 25)
    assert vm.source.startswith("table: ") and "350 W per 112 threads × 8 CPUs" in vm.source
    assert cpu_envelope({}, "AMD EPYC 7763 64-Core Processor", 128).max_w == pytest.approx(280)


def test_unknown_cpu_gets_the_stated_default_with_a_cap():
    small = cpu_envelope({}, "Intel(R) Xeon(R) Processor", n_cpus=2)
    assert small.max_w == 10 and small.source.startswith("default: 5 W × 2 logical CPUs")
    assert "not in the table" in small.source
    assert cpu_envelope({}, "", n_cpus=256).max_w == 250


def test_configuration_wins_over_the_table(monkeypatch):
    chosen = cpu_envelope({"cpu_tdp_w": 95, "cpu_idle_fraction": 0.2}, "EPYC 7763", 128)
    assert (chosen.max_w, chosen.idle_w) == (95, pytest.approx(19))
    assert chosen.source.startswith("configured")
    monkeypatch.setenv("FECOMLITE_CPU_TDP_W", "65")
    assert cpu_envelope({}, "EPYC 7763", 128).max_w == 65


def test_estimated_sensors_are_labelled_with_model_and_parameters():
    envelope = PowerEnvelope(max_w=100, idle_w=30, source="configured (test)")
    cpu, dram = EstimatedCpuPower(envelope), EstimatedDramPower(16.0)
    for sensor, model in ((cpu, CPU_MODEL), (dram, DRAM_MODEL)):
        assert (sensor.provenance, sensor.model, sensor.kind, sensor.unit) == (
            "estimated", model, "power", "W")
        assert sensor.description == MODELS[model]
        assert sensor.metadata()["model_params"] == sensor.model_params
    assert cpu.domain == "cpu-package" and dram.domain == "dram"
    assert cpu.model_params["max_w"] == 100 and cpu.model_params["idle_w"] == 30
    assert cpu.model_params["envelope_source"] == "configured (test)"
    assert dram.model_params["gib"] == 16.0


def test_cpu_estimate_follows_a_spinning_process():
    envelope = PowerEnvelope(max_w=100, idle_w=30, source="configured (test)")
    cpu = EstimatedCpuPower(envelope, min_window_s=0.05)
    dram = EstimatedDramPower(mem_total_gib(), min_window_s=0.05)
    assert cpu.read() is None  # no complete utilisation window yet
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.15)
        cpu.read(), dram.read()  # start a window while the spinner runs
        time.sleep(0.5)
        watts, dram_watts = cpu.read(), dram.read()
    finally:
        spinner.kill()
        spinner.wait()
    # the spinner keeps ≥ 30 % of one CPU busy even on a shared machine: u ≥ 0.3 / N
    assert 30 + 70 * 0.3 / N_CPUS <= watts <= 100
    gib = mem_total_gib()
    assert gib * (0.25 + 0.125 * 0.3 / N_CPUS) <= dram_watts <= gib * 0.375


def test_process_estimate_counts_only_the_measured_program():
    """A spinning child counts; a spinning neighbour (another process tree) does not."""
    envelope = PowerEnvelope(max_w=100, idle_w=30, source="configured (test)")
    program = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        utilisation = ProcessTreeCpuUtilisation(program.pid, min_window_s=0.05)
        own = EstimatedProcessCpuPower(envelope, utilisation)
        assert own.model == PROCESS_MODEL and own.provenance == "estimated"
        assert own.domain == "cpu-process" and PROCESS_MODEL in MODELS
        time.sleep(0.3)
        own.read()
        time.sleep(0.5)
        idle_program = own.read()
    finally:
        for p in (program, neighbour):
            p.kill()
            p.wait()
    assert idle_program is not None and idle_program < 0.05 * 70  # a sleeping program: ~0 W
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        own = EstimatedProcessCpuPower(
            envelope, ProcessTreeCpuUtilisation(spinner.pid, min_window_s=0.05)
        )
        time.sleep(0.3)
        own.read()
        time.sleep(0.5)
        busy_program = own.read()
    finally:
        spinner.kill()
        spinner.wait()
    # above idle only: at most the envelope's span, at least its share of ≥ 30 % of one CPU
    assert 70 * 0.3 / N_CPUS <= busy_program <= 70


def test_the_estimates_and_machine_utilisation_share_one_window(tmp_path):
    """One /proc/stat read per window serves util:cpu, est:cpu-package and est:dram: the three
    agree exactly on the busy share (with a reader each, their windows would differ)."""
    sensors = {s.name: s for s in discover(settings={"rapl_root": tmp_path})[0]}  # no RAPL
    util, cpu, dram = sensors["util:cpu"], sensors["est:cpu-package"], sensors["est:dram"]
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        checked = 0
        for _ in range(5):
            time.sleep(0.12)
            busy = util.read()
            time.sleep(0.03)  # a reader of its own would now see another window
            watts, dram_watts = cpu.read(), dram.read()
            if busy is None:
                continue
            checked += 1
            share = busy / 100
            env = cpu.envelope
            assert watts == pytest.approx(env.idle_w + (env.max_w - env.idle_w) * share, rel=1e-12)
            assert dram_watts == pytest.approx(
                dram.gib * (DRAM_STATIC_W_PER_GIB + DRAM_ACTIVE_W_PER_GIB * share), rel=1e-12)
        assert checked >= 4
    finally:
        spinner.kill()
        for sensor in sensors.values():
            sensor.close()
