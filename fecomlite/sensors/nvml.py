"""NVIDIA GPUs through NVML (pynvml): energy, power, temperature, memory and utilisation.

Facts measured on an H200 (docs/design.md): the energy counter (mJ) changes every ~100 ms and
one read costs ~4 ms, so its sensor is `slow` and belongs on its own sampler thread; the instant
power field and (in the recorded trace) the temperature refresh every ~100 ms;
`nvmlDeviceGetPowerUsage` is a ~1 s moving average, labelled with `averaging_s` so attribution
never treats it as instantaneous.

The NVML module is injectable (`nvml=`): tests pass a replay of a recorded trace instead of
pynvml. Any NVMLError at discovery (no library, no driver, no GPU) gives no sensors and a note.
Per-process GPU memory matches NVML's pids against the process tree; inside a container with
its own pid namespace NVML reports host pids, and that sensor then reads 0.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from fecomlite.sensors.base import COUNTER, GAUGE, POWER, BaseSensor
from fecomlite.sensors.proctree import ProcessTree

UPDATE_PERIOD_S = 0.1  # energy counter and power fields, measured on an H200
AVERAGING_S = 1.0  # nvmlDeviceGetPowerUsage's moving-average window on an H200
UTILISATION_PERIOD_S = 1.0  # NVML's utilisation sample window: 1/6 s to 1 s by product

_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by valueType


class NvmlSensor(BaseSensor):
    """One NVML quantity of one GPU: `getter(handle)` already converted to `unit`."""

    def __init__(
        self, getter: Callable[[Any], float | None], handle: Any, index: int, quantity: str,
        **meta: Any,
    ) -> None:
        super().__init__(name=f"nvml:{index}:{quantity}", device=f"gpu:{index}", **meta)
        self._get = getter
        self._handle = handle

    def _read(self) -> float | None:
        return self._get(self._handle)


def discover_nvml(
    pid: int | None = None, nvml: ModuleType | Any = None, *, process_only: bool = False
) -> tuple[list[NvmlSensor], list[str]]:
    """Every supported NVML quantity of every GPU (with `process_only`, only the GPU memory of
    `pid`'s tree), and notes on what is missing."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return [], ["no NVIDIA GPU: pynvml (nvidia-ml-py) is not installed"]
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        return [], [f"no NVIDIA GPU: NVML: {exc}"]
    if count == 0:
        return [], ["no NVIDIA GPU: NVML found no device"]
    sensors: list[NvmlSensor] = []
    notes: list[str] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            notes.append(f"GPU {index} skipped: NVML: {exc}")
            continue
        for quantity, getter, meta in _quantities(nvml, pid, index):
            if process_only and meta["domain"] != "process-gpu-memory":
                continue
            sensor = NvmlSensor(getter, handle, index, quantity, **meta)
            try:
                if getter(handle) is None:
                    raise ValueError("no value")
            except (nvml.NVMLError, ValueError) as exc:
                notes.append(f"GPU {index}: no {quantity} ({exc})")
                continue
            sensors.append(sensor)
    return sensors, notes


def _quantities(
    nvml: Any, pid: int | None, index: int
) -> list[tuple[str, Callable[[Any], float | None], dict[str, Any]]]:
    """(quantity, getter, sensor metadata) for each quantity NVML may give for GPU `index`."""
    instant_field = nvml.NVML_FI_DEV_POWER_INSTANT
    gpu = f"gpu:{index}"

    def energy(h: Any) -> float:
        return nvml.nvmlDeviceGetTotalEnergyConsumption(h) * 1e-3  # mJ -> J

    def power_instant(h: Any) -> float | None:
        value = nvml.nvmlDeviceGetFieldValues(h, [instant_field])[0]
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            return None
        return getattr(value.value, _VALUE_FIELDS[value.valueType]) * 1e-3  # mW -> W

    def power_avg(h: Any) -> float:
        return nvml.nvmlDeviceGetPowerUsage(h) * 1e-3  # mW -> W

    def temperature(h: Any) -> float:
        return float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))

    def memory_used(h: Any) -> float:
        return float(nvml.nvmlDeviceGetMemoryInfo(h).used)

    def utilisation(h: Any) -> float:
        return float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)

    def meta(domain: str, unit: str, kind: str, period: float, text: str, **extra: Any) -> dict:
        return {"domain": domain, "unit": unit, "kind": kind, "nominal_period_s": period,
                "description": text, **extra}

    out = [
        ("energy", energy, meta(gpu, "J", COUNTER, UPDATE_PERIOD_S,
                                "nvmlDeviceGetTotalEnergyConsumption (mJ counter, ~4 ms a read)",
                                slow=True)),
        ("power_instant", power_instant, meta(gpu, "W", POWER, UPDATE_PERIOD_S,
                                              "NVML_FI_DEV_POWER_INSTANT field")),
        ("power_avg", power_avg, meta(gpu, "W", POWER, UPDATE_PERIOD_S,
                                      "nvmlDeviceGetPowerUsage: a ~1 s moving average",
                                      averaging_s=AVERAGING_S)),
        ("temperature", temperature, meta("temperature", "C", GAUGE, UPDATE_PERIOD_S,
                                          "nvmlDeviceGetTemperature (GPU die)",
                                          watch_period=False)),
        ("memory_used", memory_used, meta("gpu-memory", "B", GAUGE, UPDATE_PERIOD_S,
                                          "nvmlDeviceGetMemoryInfo.used (whole device)",
                                          watch_period=False)),
        ("utilisation", utilisation, meta("utilisation", "%", GAUGE, UTILISATION_PERIOD_S,
                                          "nvmlDeviceGetUtilizationRates.gpu",
                                          watch_period=False)),
    ]
    if pid is not None:
        tree = ProcessTree(pid)

        def process_memory(h: Any) -> float:
            pids = set(tree.pids())
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
            return float(sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids))

        out.append(("process_memory", process_memory,
                    meta("process-gpu-memory", "B", GAUGE, UPDATE_PERIOD_S,
                         "nvmlDeviceGetComputeRunningProcesses, summed over the process tree",
                         watch_period=False)))
    return out
