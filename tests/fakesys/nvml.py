"""ReplayNvmlForTests: answers the pynvml calls fecomlite makes from a recorded H200 trace.

It stands in for the `pynvml` module (injected through `discover_nvml(nvml=...)`), plays the
trace in real time, so a sensor sees the real ~100 ms update period and values, and sleeps the
recorded ~4 ms cost of an energy read. Errors, constants and result structures are pynvml's own
(NVMLError subclasses, c_nvmlFieldValue_t, c_nvmlMemory_t), so the code under test decodes
exactly what the real library returns. The trace has no utilisation and no process list: the
utilisation call answers NOT_SUPPORTED, and the process list is given by the test.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pynvml

from fecomlite.sensors.replay import TracePlayer, load_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # recorded H200 traces, in the repo
H200 = FIXTURES / "h200-nvml"
_GIB = 2**30


class ReplayNvmlForTests:
    NVMLError = pynvml.NVMLError
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_FI_DEV_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(
        self, directory: Path = H200, *, offset_s: float = 0.0, energy_read_s: float = 0.0039,
        processes: tuple[tuple[int, int], ...] = (), init_error: int | None = None,
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
