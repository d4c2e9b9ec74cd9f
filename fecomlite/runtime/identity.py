"""Which rank of a distributed job this process is, for the header of every probe batch.

torchrun (`torch.distributed.run`) gives each rank RANK, LOCAL_RANK, GROUP_RANK (the node) and
TORCHELASTIC_RUN_ID in its environment. A DataLoader worker inherits them, so its calls count for
its rank. The device is the GPU the rank computes on: torchrun's convention, `cuda:LOCAL_RANK`
(through CUDA_VISIBLE_DEVICES to the physical index NVML uses), once the process has initialised
CUDA, else "cpu"; the server's NVML process lists, where recorded, take precedence
(`fecomlite.analysis.devices`). Standard library only: the probe imports this module.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any


def rank_fields(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """{"rank", "local_rank", "node", "device", "job", "clock_offset_ns"} of a process started
    by a torch launcher, else {}. The clock offset (wall clock − CLOCK_MONOTONIC) lets `merge`
    put the nodes' monotonic times on one axis."""
    rank = _int(environ.get("RANK"))
    if rank is None:
        return {}
    local_rank = _int(environ.get("LOCAL_RANK"))
    return {
        "rank": rank,
        "local_rank": rank if local_rank is None else local_rank,
        "node": _int(environ.get("GROUP_RANK")) or 0,
        "device": cuda_device(local_rank or 0, environ) if _cuda_initialised() else "cpu",
        "job": environ.get("TORCHELASTIC_RUN_ID", ""),
        "clock_offset_ns": clock_offset_ns(),
    }


def clock_offset_ns(tries: int = 3) -> int:
    """Wall clock − CLOCK_MONOTONIC from the tightest of `tries` bracketed reads: a read paused
    between its two clocks (a busy machine) would be off by the pause."""
    return min((_bracketed_read() for _ in range(tries)), key=lambda read: read[0])[1]


def _bracketed_read() -> tuple[int, int]:
    """(gap between the monotonic reads around the wall clock's, the offset they give)."""
    m0 = time.monotonic_ns()
    wall = time.time_ns()
    m1 = time.monotonic_ns()
    return m1 - m0, wall - (m0 + m1) // 2


def cuda_device(local_rank: int, environ: Mapping[str, str] = os.environ) -> str:
    """`gpu:N`, N the physical index NVML gives the GPU of `cuda:LOCAL_RANK` (or its UUID)."""
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if len(visible) == 1:  # one GPU per task (Slurm --gpus-per-task): it is cuda:0
        return f"gpu:{visible[0]}"
    if local_rank < len(visible):
        return f"gpu:{visible[local_rank]}"
    return f"gpu:{local_rank}"


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")  # never imported here: only asked where the program did
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
