"""Estimated CPU and DRAM power, for machines without RAPL. Every figure is labelled `estimated`.

Models (also in `MODELS`, which the report prints next to every estimated figure):

cpu-util-linear
    P_cpu = P_idle + (P_max − P_idle) × u
    u is the busy share of all CPUs from /proc/stat over the sampling window. P_max, the power
    envelope of the CPUs this machine shows, comes from, in order: the setting `cpu_tdp_w` or the
    environment variable FECOMLITE_CPU_TDP_W; a table of known CPUs matched against the
    /proc/cpuinfo model name (TDP per package ÷ threads per package × CPUs shown, so a VM with a
    slice of a big CPU gets that slice); else 5 W per logical CPU, at most 250 W.
    P_idle = idle_fraction × P_max, idle_fraction 0.3 by default (setting `cpu_idle_fraction`).
    Known to be crude: real power is not linear in utilisation, turbo and AVX draw more, and a
    VM's utilisation does not show its neighbours. It ranks calls; it does not measure them.

dram-gib-util-linear
    P_dram = GiB × (static_w_per_gib + active_w_per_gib × u)
    GiB is MemTotal from /proc/meminfo; static 0.25 W/GiB and active 0.125 W/GiB, so 0.375 W/GiB
    at full load (the 3 W per 8 GB DIMM figure CodeCarbon also uses). CPU utilisation stands in
    for memory traffic, which /proc does not show: the above-idle DRAM share is a guess.

process-cpu-share
    P_process = (P_max − P_idle) × CPU time of the measured process tree ÷ (wall time × CPUs)
    The measured program's own share of the cpu-util-linear envelope above idle (domain
    cpu-process): on a shared machine it does not count the neighbours that machine-wide
    utilisation counts. Above idle by construction (its idle is 0 W); it overlaps cpu-package
    and is never added to it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from fecomlite.sensors._files import KernelFile
from fecomlite.sensors.base import ESTIMATED, POWER, BaseSensor
from fecomlite.sensors.utilisation import (
    MIN_WINDOW_S,
    N_CPUS,
    MachineCpuShare,
    ProcessTreeCpuUtilisation,
)

CPU_MODEL = "cpu-util-linear"
DRAM_MODEL = "dram-gib-util-linear"
PROCESS_MODEL = "process-cpu-share"
ABOVE_IDLE_MODELS = frozenset({PROCESS_MODEL})  # their readings are above idle already: idle 0 W
MODELS: dict[str, str] = {
    CPU_MODEL: "P_cpu = P_idle + (P_max − P_idle) × CPU utilisation (/proc/stat); P_max from "
    "config, a table of known CPUs, or 5 W per logical CPU (max 250 W); P_idle = 0.3 × P_max",
    DRAM_MODEL: "P_dram = MemTotal GiB × (0.25 + 0.125 × CPU utilisation) W/GiB "
    "(0.375 W/GiB at full load)",
    PROCESS_MODEL: "P_process = (P_max − P_idle) × the measured process tree's CPU time ÷ "
    "(wall time × CPUs): the program's own share above idle, blind to other processes",
}

DEFAULT_W_PER_CPU = 5.0
DEFAULT_MAX_W = 250.0
DEFAULT_IDLE_FRACTION = 0.3
DRAM_STATIC_W_PER_GIB = 0.25
DRAM_ACTIVE_W_PER_GIB = 0.125

# (pattern on the /proc/cpuinfo model name, TDP per package in W, threads per package)
KNOWN_CPUS: list[tuple[str, float, int]] = [
    (r"Xeon\(R\) Platinum 8570\b", 350, 112),
    (r"Xeon\(R\) Platinum 8480\+", 350, 112),
    (r"Xeon\(R\) Platinum 8468\b", 350, 96),
    (r"Xeon\(R\) Platinum 8380\b", 270, 80),
    (r"Xeon\(R\) Gold 6348\b", 235, 56),
    (r"Xeon\(R\) Gold 6230\b", 125, 40),
    (r"Xeon\(R\) CPU E5-2686 v4\b", 145, 36),
    (r"EPYC 9654\b", 360, 192),
    (r"EPYC 9554\b", 360, 128),
    (r"EPYC 7763\b", 280, 128),
    (r"Core\(TM\) i9-13900K\b", 125, 32),
    (r"Core\(TM\) i7-12700K\b", 125, 20),
    (r"Ryzen 9 5950X\b", 105, 32),
]


@dataclass(frozen=True)
class PowerEnvelope:
    max_w: float
    idle_w: float
    source: str  # how max_w was obtained, in words, for the report

    def params(self, utilisation: str) -> dict[str, Any]:
        """The model parameters a sensor built on this envelope stores (and the report shows)."""
        return {"max_w": self.max_w, "idle_w": self.idle_w, "envelope_source": self.source,
                "cpus": N_CPUS, "utilisation": utilisation}


def cpu_model_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The first `model name` in /proc/cpuinfo, or "" when there is none (e.g. some ARM)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_envelope(
    settings: dict[str, Any] | None = None, model_name: str | None = None, n_cpus: int = N_CPUS
) -> PowerEnvelope:
    """The CPU power envelope: from settings/env, the known-CPU table, or the stated default."""
    settings = settings or {}
    model_name = cpu_model_name() if model_name is None else model_name
    idle_fraction = float(
        settings.get("cpu_idle_fraction")
        or os.environ.get("FECOMLITE_CPU_IDLE_FRACTION")
        or DEFAULT_IDLE_FRACTION
    )
    configured = settings.get("cpu_tdp_w") or os.environ.get("FECOMLITE_CPU_TDP_W")
    if configured:
        max_w = float(configured)
        source = "configured (cpu_tdp_w / FECOMLITE_CPU_TDP_W)"
    else:
        match = next(
            ((p, tdp, thr) for p, tdp, thr in KNOWN_CPUS if re.search(p, model_name)), None
        )
        if match:
            _, tdp, threads = match
            max_w = tdp / threads * n_cpus
            source = f"table: {model_name}, {tdp:g} W per {threads} threads × {n_cpus} CPUs"
        else:
            max_w = min(DEFAULT_W_PER_CPU * n_cpus, DEFAULT_MAX_W)
            source = (
                f"default: {DEFAULT_W_PER_CPU:g} W × {n_cpus} logical CPUs "
                f"(max {DEFAULT_MAX_W:g} W); CPU {model_name or 'unknown'!r} not in the table"
            )
    return PowerEnvelope(max_w=max_w, idle_w=idle_fraction * max_w, source=source)


def mem_total_gib(meminfo: str = "/proc/meminfo") -> float:
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 2**30
    raise ValueError(f"no MemTotal in {meminfo}")


class EstimatedCpuPower(BaseSensor):
    """CPU package power from machine utilisation and a power envelope (model cpu-util-linear)."""

    def __init__(
        self, envelope: PowerEnvelope, min_window_s: float = MIN_WINDOW_S,
        share: MachineCpuShare | None = None,
    ) -> None:
        self._share = share or MachineCpuShare(min_window_s)
        super().__init__(
            name="est:cpu-package",
            domain="cpu-package",
            unit="W",
            kind=POWER,
            device="cpu",
            nominal_period_s=self._share.min_window_s,
            provenance=ESTIMATED,
            model=CPU_MODEL,
            model_params=envelope.params("/proc/stat busy share of all CPUs"),
            watch_period=False,
            description=MODELS[CPU_MODEL],
        )
        self.envelope = envelope

    def _read(self) -> float | None:
        u = self._share.update()
        if u is None:
            return None
        return self.envelope.idle_w + (self.envelope.max_w - self.envelope.idle_w) * u

    def restart(self) -> None:
        self._share.restart()

    def kernel_files(self) -> list[KernelFile]:
        return self._share.kernel_files()

    def close(self) -> None:
        self._share.close()


class EstimatedProcessCpuPower(BaseSensor):
    """The measured program's own CPU power above idle (model process-cpu-share), from the CPU
    time of its process tree: unlike machine utilisation, blind to other processes."""

    def __init__(self, envelope: PowerEnvelope, utilisation: ProcessTreeCpuUtilisation) -> None:
        super().__init__(
            name="est:cpu-process",
            domain="cpu-process",
            unit="W",
            kind=POWER,
            device="process",
            nominal_period_s=utilisation.min_window_s,
            provenance=ESTIMATED,
            model=PROCESS_MODEL,
            model_params=envelope.params("/proc/<pid>/stat CPU time of the process tree"),
            watch_period=False,
            description=MODELS[PROCESS_MODEL],
        )
        self.envelope = envelope
        self._utilisation = utilisation  # shared with util:process, read on the same thread

    def _read(self) -> float | None:
        percent = self._utilisation.read()
        if percent is None:
            return None
        return (self.envelope.max_w - self.envelope.idle_w) * percent / 100.0

    def kernel_files(self) -> list[KernelFile]:
        return self._utilisation.kernel_files()


class EstimatedDramPower(BaseSensor):
    """DRAM power from installed memory and machine utilisation (model dram-gib-util-linear)."""

    def __init__(
        self, gib: float, min_window_s: float = MIN_WINDOW_S, share: MachineCpuShare | None = None
    ) -> None:
        self._share = share or MachineCpuShare(min_window_s)
        super().__init__(
            name="est:dram",
            domain="dram",
            unit="W",
            kind=POWER,
            device="memory",
            nominal_period_s=self._share.min_window_s,
            provenance=ESTIMATED,
            model=DRAM_MODEL,
            model_params={
                "gib": round(gib, 3),
                "static_w_per_gib": DRAM_STATIC_W_PER_GIB,
                "active_w_per_gib": DRAM_ACTIVE_W_PER_GIB,
                "utilisation": "/proc/stat busy share of all CPUs",
            },
            watch_period=False,
            description=MODELS[DRAM_MODEL],
        )
        self.gib = gib

    def _read(self) -> float | None:
        u = self._share.update()
        if u is None:
            return None
        return self.gib * (DRAM_STATIC_W_PER_GIB + DRAM_ACTIVE_W_PER_GIB * u)

    def restart(self) -> None:
        self._share.restart()

    def kernel_files(self) -> list[KernelFile]:
        return self._share.kernel_files()

    def close(self) -> None:
        self._share.close()
