"""ReplayNvmlForTests: answers the pynvml calls fecomlite makes from a recorded H200 trace.

It stands in for the `pynvml` module (injected through `discover_nvml(nvml=...)`), plays the
trace in real time, so a sensor sees the real ~100 ms update period and values, and sleeps the
recorded ~4 ms cost of an energy read. Errors, constants and result structures are pynvml's own
(NVMLError subclasses, c_nvmlFieldValue_t, c_nvmlMemory_t), so the code under test decodes
exactly what the real library returns. The trace has no utilisation and no process list: the
utilisation call answers NOT_SUPPORTED, and the process list is given by the test.

Per-process utilisation comes from the trace's own record of when the GPU computed
(gpu_calls.csv: the GPU was busy exactly inside each call): `gpu_users` names the pids that
did that work, so a test can put the recorded work on the measured process or on another one.
Samples are NVML's: one per user per ~1/6 s window the GPU was busy in, `smUtil` the busy share
of the window, timestamps in µs of the wall clock; NOT_FOUND when none is newer than asked.
`process_utilisation=False` answers NOT_SUPPORTED, as some products do.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pynvml

from fecomlite.sensors.replay import TracePlayer, load_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # recorded H200 traces, in the repo
H200 = FIXTURES / "h200-nvml"
_GIB = 2**30
SAMPLE_NS = 166_666_667  # NVML's process-utilisation sample window on recent products


class ReplayNvmlForTests:
    NVMLError = pynvml.NVMLError
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_FI_DEV_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND

    def __init__(
        self, directory: Path = H200, *, offset_s: float = 0.0, energy_read_s: float = 0.0039,
        processes: tuple[tuple[int, int], ...] = (), init_error: int | None = None,
        gpu_users: tuple[int, ...] = (), process_utilisation: bool = True,
    ) -> None:
        energy = directory / "gpu_samples_energy.csv"
        power = directory / "gpu_samples_power.csv"
        self.energy = load_trace(energy, "energy_mJ")
        self.power_avg = load_trace(power, "power_avg_mW")
        self.power_instant = load_trace(power, "power_instant_mW")
        self.temp = load_trace(power, "temp_C")
        self.mem = load_trace(power, "mem_used_B")
        t0 = min(int(self.energy.t_ns[0]), int(self.power_avg.t_ns[0]))
        self.player = TracePlayer(t0, offset_s)
        self.energy_read_s = energy_read_s
        self.processes = processes
        self.init_error = init_error
        self.gpu_users = gpu_users
        self.process_utilisation = process_utilisation
        self.busy = busy_windows(directory / "gpu_calls.csv")
        self.wall_minus_mono_ns = time.time_ns() - time.monotonic_ns()

    def _at(self, trace) -> float:
        t = min(max(self.player.now(), int(trace.t_ns[0])), int(trace.t_ns[-1]))
        return trace.value_at(t)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return "replay-gpu-0"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        time.sleep(self.energy_read_s)
        return round(self._at(self.energy) * 1e3)  # back to mJ, as NVML gives it

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return round(self._at(self.power_avg) * 1e3)  # mW

    def nvmlDeviceGetFieldValues(self, handle: str, field_ids: list[int]):
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field in zip(values, field_ids, strict=True):
            value.fieldId = field
            if field == pynvml.NVML_FI_DEV_POWER_INSTANT:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = round(self._at(self.power_instant) * 1e3)  # mW
                value.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        return round(self._at(self.temp))

    def nvmlDeviceGetMemoryInfo(self, handle: str):
        used = round(self._at(self.mem))
        total = 141 * _GIB
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: str):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.processes]

    def nvmlDeviceGetProcessUtilization(self, handle: str, since_us: int) -> list:
        if not self.process_utilisation:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now = self.player.now()  # trace clock; the player maps it to the monotonic clock
        mono_of_trace = self.player.start_ns - self.player.t0_ns
        ends = np.arange(int(self.busy[0, 0]) + SAMPLE_NS, now + 1, SAMPLE_NS, dtype=np.int64)
        wall_us = (ends + mono_of_trace + self.wall_minus_mono_ns) // 1000
        ends = ends[wall_us > since_us]
        samples = []
        for end in ends:
            share = overlap(self.busy, int(end) - SAMPLE_NS, int(end)) / SAMPLE_NS
            stamp = (int(end) + mono_of_trace + self.wall_minus_mono_ns) // 1000
            for pid in self.gpu_users if share > 0 else ():
                samples.append(pynvml.c_nvmlProcessUtilizationSample_t(
                    pid=pid, timeStamp=stamp, smUtil=round(100 * share), memUtil=0, encUtil=0,
                    decUtil=0))
        if not samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return samples


def busy_windows(path: Path) -> np.ndarray:
    """[start, end] ns (trace clock) of every recorded call, sorted: when the GPU computed."""
    with open(path, newline="") as f:
        rows = [(int(r["t_start_ns"]), int(r["t_end_ns"])) for r in csv.DictReader(f)]
    return np.array(sorted(rows), dtype=np.int64).reshape(-1, 2)


def overlap(windows: np.ndarray, a: int, b: int) -> int:
    """ns of [a, b] inside the windows (the calls of one trace do not overlap)."""
    return int(np.clip(np.minimum(windows[:, 1], b) - np.maximum(windows[:, 0], a), 0, None).sum())
