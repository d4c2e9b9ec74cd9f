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

Other processes on a GPU: NVML's per-process accounting (`nvmlDeviceGetProcessUtilization`)
gives each process's SM utilisation. The machine sensor `processes_sm` sums it over every
process, the run's `process_sm` over the measured tree only; their difference is what other
processes used, read the way the CPUs' is (util:cpu less util:process). Where NVML offers no
per-process utilisation (some products, vGPUs, MIG) there is no such sensor and a note says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from fecomlite.sensors.base import COUNTER, GAUGE, POWER, BaseSensor
from fecomlite.sensors.proctree import ProcessTree

UPDATE_PERIOD_S = 0.1  # energy counter and power fields, measured on an H200
AVERAGING_S = 1.0  # nvmlDeviceGetPowerUsage's moving-average window on an H200
UTILISATION_PERIOD_S = 1.0  # NVML's utilisation sample window: 1/6 s to 1 s by product

PROCESS_SM_PERIOD_S = 0.2  # NVML samples process utilisation every ~1/6 s
SAMPLE_HOLD_S = 0.4  # no new process sample for this long: no process ran
OTHER_PROCESSES = "gpu-processes"  # domain: SM % used by every process on a GPU (the machine's)
PROCESS_GPU_UTIL = "process-gpu-util"  # domain: SM % used by the measured process tree
PROCESS_DOMAINS = ("process-gpu-memory", PROCESS_GPU_UTIL)  # follow a pid's tree

_MISSING = {  # what a missing quantity means for the run, in words
    "processes_sm": ": NVML gives no per-process utilisation here, so whether other processes "
                    "use this GPU cannot be checked",
}

_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by valueType


class ProcessSmUtilisation:
    """SM utilisation (%) of the processes `pids()` lists (every process: None), from NVML's
    per-process samples since the previous read: each process's mean over its samples, summed,
    at most 100.

    NVML answers NOT_FOUND when no process ran on the GPU since the time asked. Its samples
    come every ~1/6 s, so a read between two of them holds the last value, until no sample has
    come for SAMPLE_HOLD_S: then no process ran, 0 %. Timestamps are NVML's (µs of the wall
    clock); the first read looks one period back.
    """

    def __init__(self, nvml: Any, pids: Callable[[], set[int]] | None = None) -> None:
        self._nvml = nvml
        self._pids = pids
        self._since_us = time.time_ns() // 1000 - int(PROCESS_SM_PERIOD_S * 1e6)
        self._value = 0.0

    def __call__(self, handle: Any) -> float:
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._since_us)
        except nvml.NVMLError as exc:
            if exc.value not in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_SUCCESS):
                raise  # SUCCESS: pynvml's way of saying "no sample" when the count is 0
            samples = []
        if not samples:
            held = time.time_ns() // 1000 - self._since_us < SAMPLE_HOLD_S * 1e6
            self._value = self._value if held else 0.0
            return self._value
        keep = self._pids() if self._pids is not None else None
        by_pid: dict[int, list[float]] = {}
        for sample in samples:
            self._since_us = max(self._since_us, int(sample.timeStamp))
            if keep is None or int(sample.pid) in keep:
                by_pid.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        self._value = min(100.0, sum(sum(v) / len(v) for v in by_pid.values()))
        return self._value


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
            if process_only and meta["domain"] not in PROCESS_DOMAINS:
                continue
            sensor = NvmlSensor(getter, handle, index, quantity, **meta)
            try:
                if getter(handle) is None:
                    raise ValueError("no value")
            except (nvml.NVMLError, ValueError) as exc:
                notes.append(f"GPU {index}: no {quantity} ({exc})" + _MISSING.get(quantity, ""))
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
    out.append(("processes_sm", ProcessSmUtilisation(nvml),
                meta(OTHER_PROCESSES, "%", GAUGE, PROCESS_SM_PERIOD_S,
                     "nvmlDeviceGetProcessUtilization: SM % of every process on the GPU",
                     watch_period=False)))
    if pid is not None:
        tree = ProcessTree(pid)
        out.append(("process_sm", ProcessSmUtilisation(nvml, lambda: set(tree.pids())),
                    meta(PROCESS_GPU_UTIL, "%", GAUGE, PROCESS_SM_PERIOD_S,
                         "nvmlDeviceGetProcessUtilization: SM % of the measured process tree",
                         watch_period=False)))

        def process_memory(h: Any) -> float:
            pids = set(tree.pids())
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
            return float(sum(p.usedGpuMemory or 0 for p in procs if p.pid in pids))

        out.append(("process_memory", process_memory,
                    meta("process-gpu-memory", "B", GAUGE, UPDATE_PERIOD_S,
                         "nvmlDeviceGetComputeRunningProcesses, summed over the process tree",
                         watch_period=False)))
    return out
