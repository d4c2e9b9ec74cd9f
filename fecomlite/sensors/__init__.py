"""Sensors: every source of energy, power, memory, temperature and utilisation, one protocol.

The whole API the server needs:

    sensors, notes = discover(pid, settings)     # every source here; notes say what is missing
    sensors, notes = discover_process(pid, settings)  # only those that follow pid's tree
    for s in sensors:
        m = measure_period(s, max_s=1.0)          # bounded; sets s.period_s and s.read_cost_s
        value = s.read()                          # float in s.unit, or None; never raises
        s.close()                                 # at the end

Each sensor has `name` (unique), `domain`, `unit`, `kind`, `provenance`, `model`, `period_s`
(docs/internals.md §3), plus `device`, `model_params`, `slow` (a read costs milliseconds: give it
its own thread), `sample_period_s` (how often to read it: half its update period, or the chosen
period for sources fresh on every read), `averaging_s`, `read_cost_s`, `description`, and
`metadata()` (all of these as a dict for the store and the report). A sensor is read by one thread.

Kinds: "counter" (J, only ever grows: energy = difference), "power" (W), "gauge" (a level).
Domains: cpu-package, cpu-core, uncore (parts of cpu-package), psys (whole platform), dram,
gpu:N (energy and power of GPU N), temperature, process-memory (host RSS of the measured tree),
gpu-memory (device memory used), process-gpu-memory, utilisation. Provenance is "measured", or
"estimated" with `model` naming one of `MODELS` (fecomlite/sensors/estimate.py documents them).
"""

from importlib import import_module
from typing import Any

# Loaded on first use: a summary that needs one constant of `estimate` does not pay for
# discovering sensors (NVML, RAPL, psutil).
_WHERE = {
    **dict.fromkeys(("COUNTER", "ESTIMATED", "GAUGE", "MEASURED", "POWER", "BaseSensor",
                     "PeriodMeasurement", "Sensor", "measure_period"), "base"),
    **dict.fromkeys(("discover", "discover_process"), "discovery"),
    "MODELS": "estimate",
    **dict.fromkeys(("ReplaySensor", "Trace", "fixture_sensors", "load_trace"), "replay"),
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)


__all__ = [
    "COUNTER",
    "ESTIMATED",
    "GAUGE",
    "MEASURED",
    "MODELS",
    "POWER",
    "BaseSensor",
    "PeriodMeasurement",
    "ReplaySensor",
    "Sensor",
    "Trace",
    "discover",
    "discover_process",
    "fixture_sensors",
    "load_trace",
    "measure_period",
]
