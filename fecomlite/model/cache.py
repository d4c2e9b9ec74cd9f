"""This machine's memory hierarchy: which cache level a working set fits in.

Energy per FLOP jumps where a working set leaves a cache level (BUTTER-E), so the model needs the
sizes of the levels. CPU caches come from sysfs (`/sys/devices/system/cpu/cpuN/cache/index*`:
level, type, size), as the kernel reports them (a VM shows what the hypervisor tells it). NVML
does not report a GPU's L2 size, so GPUs are looked up in a table of vendor specifications by
name; an unknown GPU has no known L2 and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSFS_CPU = Path("/sys/devices/system/cpu")
MAIN_MEMORY = "DRAM"
GPU_MEMORY = "VRAM"  # the GPU's own memory (HBM or GDDR)
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}

# (pattern on the NVML device name, L2 size in MiB), from the vendors' specifications
GPU_L2_MIB: list[tuple[str, float]] = [
    (r"\bH200\b", 50),
    (r"\bH100\b", 50),
    (r"\bGH200\b", 50),
    (r"\bA100\b", 40),
    (r"\bA30\b", 24),
    (r"\bA10G?\b", 6),
    (r"\bL40S?\b", 96),
    (r"\bL4\b", 48),
    (r"\bV100\b", 6),
    (r"\bT4\b", 4),
    (r"RTX 4090\b", 72),
    (r"RTX 3090\b", 6),
    (r"RTX A6000\b", 6),
]


class HierarchyError(ValueError):
    """A cache description that cannot be read or makes no sense."""


@dataclass(frozen=True)
class CacheLevel:
    """One level: its name (L1d, L2, L3, DRAM) and size in bytes (None: unbounded memory)."""

    name: str
    size_bytes: int | None


@dataclass(frozen=True)
class MemoryHierarchy:
    """The levels of one device, smallest first, ending with unbounded main memory."""

    device: str  # "cpu" or "gpu:N"
    levels: tuple[CacheLevel, ...]
    source: str  # where the sizes came from, in words

    @property
    def level_names(self) -> list[str]:
        return [level.name for level in self.levels]

    def level_of(self, working_set_bytes: float) -> str:
        """The smallest level the working set fits in."""
        if working_set_bytes < 0:
            raise HierarchyError(f"a working set cannot be negative ({working_set_bytes})")
        for level in self.levels:
            if level.size_bytes is None or working_set_bytes <= level.size_bytes:
                return level.name
        return self.levels[-1].name

    def breakpoints(self) -> list[tuple[str, int]]:
        """(level, size) of every bounded level: where energy per FLOP may jump."""
        return [(lv.name, lv.size_bytes) for lv in self.levels if lv.size_bytes is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "source": self.source,
            "levels": [{"name": lv.name, "size_bytes": lv.size_bytes} for lv in self.levels],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryHierarchy:
        try:
            levels = tuple(CacheLevel(str(lv["name"]), lv["size_bytes"]) for lv in data["levels"])
            return cls(str(data["device"]), levels, str(data.get("source", "")))
        except (KeyError, TypeError) as exc:
            raise HierarchyError(f"not a memory hierarchy: {exc}") from exc


def parse_size(text: str) -> int:
    """sysfs cache sizes: "48K", "2048K", "32M", "1G" (binary units, as the kernel means them)."""
    match = _SIZE.match(text)
    if not match:
        raise HierarchyError(f"cannot read cache size {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def cpu_hierarchy(root: Path = SYSFS_CPU, cpu: int = 0) -> MemoryHierarchy:
    """Data and unified caches of one CPU from sysfs; only DRAM when sysfs shows none."""
    folder = Path(root) / f"cpu{cpu}" / "cache"
    levels: dict[int, int] = {}
    for index in sorted(folder.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text().strip())
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        levels[level] = max(size, levels.get(level, 0))
    named = [CacheLevel("L1d" if lv == 1 else f"L{lv}", size)
             for lv, size in sorted(levels.items())]
    source = f"sysfs {folder}" if named else f"no caches under {folder}: DRAM only"
    return MemoryHierarchy("cpu", (*named, CacheLevel(MAIN_MEMORY, None)), source)


def gpu_l2_bytes(name: str) -> int | None:
    """A GPU's L2 size from the table of specifications, None when the name is not in it."""
    for pattern, mib in GPU_L2_MIB:
        if re.search(pattern, name):
            return int(mib * 2**20)
    return None


def gpu_hierarchy(name: str, index: int = 0) -> MemoryHierarchy:
    """A GPU's L2 (where the table knows it) and its device memory."""
    l2 = gpu_l2_bytes(name)
    if l2 is None:
        return MemoryHierarchy(
            f"gpu:{index}", (CacheLevel(GPU_MEMORY, None),),
            f"{name}: L2 size unknown (not in fecomlite's table); device memory only",
        )
    return MemoryHierarchy(
        f"gpu:{index}", (CacheLevel("L2", l2), CacheLevel(GPU_MEMORY, None)),
        f"{name}: L2 {l2 // 2**20} MiB from vendor specifications",
    )


def hierarchy_for(device: str, machine: dict[str, Any] | None = None) -> MemoryHierarchy:
    """The hierarchy of "cpu" or "gpu:N" (a GPU's name from the run store's `machine`)."""
    if device == "cpu":
        return cpu_hierarchy()
    if device.startswith("gpu:") and device[4:].isdigit():
        index = int(device[4:])
        names = {int(g.get("index", -1)): str(g.get("name", "")) for g in
                 (machine or {}).get("gpus", [])}
        return gpu_hierarchy(names.get(index, "unknown GPU"), index)
    raise HierarchyError(f"device must be 'cpu' or 'gpu:N', not {device!r}")
