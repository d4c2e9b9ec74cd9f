"""Host memory of the measured process, read from outside it (no probe ever touches memory).

RSS comes from `/proc/<pid>/statm` (resident pages × page size), summed over the process tree,
and is cheap enough to sample at 200 Hz or more (one `pread` per member, about a microsecond).
The peak comes from `VmHWM` in `/proc/<pid>/status`: the kernel's exact high-water mark of the
root process, which catches peaks shorter than any sampling period. The tree's peak is the
maximum of the sampled tree RSS (children's VmHWM cannot be summed: their peaks need not
coincide).
"""

from __future__ import annotations

import os

from fecomlite.sensors._files import KernelFile
from fecomlite.sensors.base import GAUGE, BaseSensor
from fecomlite.sensors.proctree import ProcessFiles

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
RSS_PERIOD_S = 0.005  # 200 Hz
PEAK_PERIOD_S = 0.1


class ProcessRss(BaseSensor):
    """Resident memory of a process (and, by default, its descendants), in bytes."""

    def __init__(
        self, pid: int, *, include_children: bool = True, period_s: float = RSS_PERIOD_S
    ) -> None:
        super().__init__(
            name="proc:rss",
            domain="process-memory",
            unit="B",
            kind=GAUGE,
            device="process",
            nominal_period_s=period_s,
            watch_period=False,
            description="resident set size from /proc/<pid>/statm"
            + (", summed over the process tree" if include_children else ""),
        )
        self.pid = pid
        self._files = ProcessFiles(pid, "statm", include_children=include_children, size=128)

    def _read(self) -> float | None:
        pages = [int(c.split(None, 2)[1]) for c in self._files.contents()]
        return float(sum(pages) * PAGE_SIZE) if pages else None

    def kernel_files(self) -> list[KernelFile]:
        return self._files.kernel_files()

    def close(self) -> None:
        self._files.close()


class ProcessPeakRss(BaseSensor):
    """The kernel's high-water mark of resident memory (VmHWM) of the root process, in bytes."""

    def __init__(self, pid: int, *, period_s: float = PEAK_PERIOD_S) -> None:
        super().__init__(
            name="proc:peak_rss",
            domain="process-memory",
            unit="B",
            kind=GAUGE,
            device="process",
            nominal_period_s=period_s,
            watch_period=False,
            description="VmHWM of the root process from /proc/<pid>/status",
        )
        self.pid = pid
        self._files = ProcessFiles(pid, "status", include_children=False)

    def _read(self) -> float | None:
        for content in self._files.contents():
            start = content.find(b"VmHWM:")
            if start >= 0:
                return float(int(content[start + 6:content.index(b"kB", start)]) * 1024)
        return None

    def kernel_files(self) -> list[KernelFile]:
        return self._files.kernel_files()

    def close(self) -> None:
        self._files.close()
