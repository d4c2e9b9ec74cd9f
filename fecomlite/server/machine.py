"""What machine a run was measured on: kept with every run, collected once by the server."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import psutil


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, GPUs, OS: enough to tell two runs' machines apart."""
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_logical": psutil.cpu_count(logical=True),
        "cpu_physical": psutil.cpu_count(logical=False),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": psutil.virtual_memory().total,
        "gpus": _gpus(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs through NVML; an empty list where there is no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no device: a machine without NVIDIA GPUs
        return []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({
                "index": i,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                "driver": driver,
            })
        return gpus
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
