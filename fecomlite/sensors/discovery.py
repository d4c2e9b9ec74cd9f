"""Find every source this machine has, and say in words what it lacks."""

from __future__ import annotations

from typing import Any

from fecomlite.sensors import contention, estimate, nvml, procmem, rapl, temperature, utilisation
from fecomlite.sensors.base import BaseSensor


def discover(
    pid: int | None = None, settings: dict[str, Any] | None = None
) -> tuple[list[BaseSensor], list[str]]:
    """(sensors, notes): RAPL, NVML, CPU temperatures, CPU utilisation, and for `pid` its tree's
    memory and CPU use; estimated CPU package and DRAM power where RAPL does not measure them.

    settings (all optional): rapl_root, hwmon_root, thermal_root (sysfs roots, for tests);
    nvml (an NVML module, for tests); cpu_tdp_w, cpu_idle_fraction (the estimation envelope);
    include_children (default True); rss_period_s (default 0.005 s, i.e. 200 Hz).
    Nothing here raises for a missing or unreadable source: it becomes a note.
    """
    settings = settings or {}
    sensors: list[BaseSensor] = []
    notes: list[str] = []

    found, said = rapl.discover_rapl(settings.get("rapl_root", rapl.DEFAULT_ROOT))
    sensors += found
    notes += said
    found, said = nvml.discover_nvml(pid, settings.get("nvml"))
    sensors += found
    notes += said
    found, said = temperature.discover_temperatures(
        settings.get("hwmon_root", temperature.HWMON_ROOT),
        settings.get("thermal_root", temperature.THERMAL_ROOT),
    )
    sensors += found
    notes += said

    measured = {s.domain for s in sensors if s.provenance == "measured"}
    envelope = None
    try:  # everything below reads /proc (Linux)
        share = utilisation.MachineCpuShare()  # one /proc/stat read per window for all three
        if "cpu-package" not in measured:
            envelope = estimate.cpu_envelope(settings)
            sensors.append(estimate.EstimatedCpuPower(envelope, share=share))
            notes.append(
                f"CPU package power estimated (model {estimate.CPU_MODEL}: idle "
                f"{envelope.idle_w:.1f} W, max {envelope.max_w:.1f} W, {envelope.source})"
            )
        if "dram" not in measured:
            gib = estimate.mem_total_gib()
            sensors.append(estimate.EstimatedDramPower(gib, share=share))
            notes.append(f"DRAM power estimated (model {estimate.DRAM_MODEL}, {gib:.1f} GiB)")
        sensors.append(utilisation.MachineCpuUtilisation(share=share))
        stat = contention.MachineStat()  # steal time and runnable tasks: the load, measured
        sensors += [contention.StealTime(stat), contention.RunnableTasks(stat)]
    except (OSError, ValueError) as exc:
        notes.append(f"no CPU utilisation, hence no CPU/DRAM estimate: {exc}")
    if pid is not None:
        found, said = discover_process(pid, settings, with_gpu=False, cpu_envelope=envelope)
        sensors += found
        notes += said
    return sensors, notes


def discover_process(
    pid: int,
    settings: dict[str, Any] | None = None,
    *,
    with_gpu: bool = True,
    cpu_envelope: estimate.PowerEnvelope | None = None,
) -> tuple[list[BaseSensor], list[str]]:
    """Only the sensors that follow `pid`'s process tree: RSS, peak RSS, CPU use, (with_gpu)
    GPU memory per GPU, and, where CPU power is estimated (`cpu_envelope`), the program's own
    share of it (model process-cpu-share). For a server that discovered the machine once and
    watches one run's process at a time. Same settings as `discover`."""
    settings = settings or {}
    sensors: list[BaseSensor] = []
    notes: list[str] = []
    children = bool(settings.get("include_children", True))
    try:
        sensors.append(procmem.ProcessRss(
            pid, include_children=children,
            period_s=float(settings.get("rss_period_s", procmem.RSS_PERIOD_S)),
        ))
        sensors.append(procmem.ProcessPeakRss(pid))
        process_cpu = utilisation.ProcessTreeCpuUtilisation(pid, include_children=children)
        sensors.append(process_cpu)
        if cpu_envelope is not None:
            sensors.append(estimate.EstimatedProcessCpuPower(cpu_envelope, process_cpu))
        sensors.append(contention.ProcessRunQueueWait(pid, include_children=children))
    except OSError as exc:
        notes.append(f"process {pid} not readable: {exc}; no process memory or CPU use")
    if with_gpu:
        found, said = nvml.discover_nvml(pid, settings.get("nvml"), process_only=True)
        sensors += found
        notes += [n for n in said if not n.startswith("no NVIDIA GPU")]  # said at discover()
    return sensors, notes
