"""CPU utilisation of the machine (`/proc/stat`) and of the measured process tree
(`/proc/<pid>/stat`), both as a percentage of all the machine's CPUs.

Utilisation is a rate: each read returns the share over the time since the previous window
closed. The kernel counts in ticks of 1/CLK_TCK s (10 ms), so a window shorter than
`min_window_s` (default 0.1 s) is too coarse: until the window is long enough, a read repeats the
last value (and the first read, with no window yet, returns None).
"""

from __future__ import annotations

import os
import time

from fecomlite.sensors._files import KernelFile, monotonic
from fecomlite.sensors.base import GAUGE, BaseSensor
from fecomlite.sensors.proctree import ProcessFiles

CLK_TCK = os.sysconf("SC_CLK_TCK")
N_CPUS = os.cpu_count() or 1
MIN_WINDOW_S = 0.1


class MachineCpuShare:
    """Busy share (0..1) of all CPUs from `/proc/stat` deltas, over windows of ≥ min_window_s.

    busy = user + nice + system + irq + softirq; total adds idle, iowait and steal (time the
    hypervisor gave to another guest is not this machine's work). guest time is already in user.
    One share can serve several sensors read by the same thread (utilisation and the estimates
    built on it): one `/proc/stat` read per window for all of them, and the same window.
    """

    def __init__(self, min_window_s: float = MIN_WINDOW_S) -> None:
        self.min_window_s = min_window_s
        self._file = KernelFile("/proc/stat", size=256)
        self._last_t = time.monotonic()
        self._last = self._ticks()
        self.value: float | None = None

    def _ticks(self) -> tuple[int, int]:
        line = self._file.read_bytes().split(b"\n", 1)[0].split()
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in line[1:9])
        busy = user + nice + system + irq + softirq
        return busy, busy + idle + iowait + steal

    def update(self) -> float | None:
        now = monotonic()
        if now - self._last_t >= self.min_window_s:
            busy, total = self._ticks()
            if total > self._last[1]:
                self.value = (busy - self._last[0]) / (total - self._last[1])
                self._last, self._last_t = (busy, total), now
        return self.value

    def restart(self) -> None:
        """A new window from now, with no value until it is long enough: after the reader
        paused, the next window would span the pause (a run's first utilisation would be the
        machine's mean since the last run)."""
        self._last_t = monotonic()
        self._last = self._ticks()
        self.value = None

    def kernel_files(self) -> list[KernelFile]:
        return [self._file]

    def close(self) -> None:
        self._file.close()


class MachineCpuUtilisation(BaseSensor):
    """Machine-wide CPU utilisation, % of all CPUs."""

    def __init__(
        self, min_window_s: float = MIN_WINDOW_S, share: MachineCpuShare | None = None
    ) -> None:
        self._share = share or MachineCpuShare(min_window_s)
        super().__init__(
            name="util:cpu",
            domain="utilisation",
            unit="%",
            kind=GAUGE,
            device="machine",
            nominal_period_s=self._share.min_window_s,
            watch_period=False,
            description=f"busy share of all {N_CPUS} CPUs from /proc/stat",
        )

    def _read(self) -> float | None:
        share = self._share.update()
        return None if share is None else 100.0 * share

    def restart(self) -> None:
        self._share.restart()

    def kernel_files(self) -> list[KernelFile]:
        return self._share.kernel_files()

    def close(self) -> None:
        self._share.close()


class ProcessTreeCpuUtilisation(BaseSensor):
    """CPU time of the measured process tree per wall time, % of all CPUs (100 = all busy).

    Each member counts utime + stime + cutime + cstime: a child's time moves into its parent's
    cutime when it is reaped, so the sum stays continuous as workers come and go.
    """

    def __init__(
        self, pid: int, *, include_children: bool = True, min_window_s: float = MIN_WINDOW_S
    ) -> None:
        super().__init__(
            name="util:process",
            domain="utilisation",
            unit="%",
            kind=GAUGE,
            device="process",
            nominal_period_s=min_window_s,
            watch_period=False,
            description=f"CPU time of the process tree per wall time, % of all {N_CPUS} CPUs",
        )
        self.pid = pid
        self.min_window_s = min_window_s
        self._files = ProcessFiles(pid, "stat", include_children=include_children, size=1024)
        self._last_t = time.monotonic()
        self._last_ticks = self._ticks()
        self._value: float | None = None

    def _ticks(self) -> int:
        total = 0
        for content in self._files.contents():
            fields = content[content.rindex(b")") + 2:].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        return total

    def _read(self) -> float | None:
        now = monotonic()
        if now - self._last_t >= self.min_window_s:
            ticks = self._ticks()
            cpu_s = max(ticks - self._last_ticks, 0) / CLK_TCK
            self._value = 100.0 * cpu_s / ((now - self._last_t) * N_CPUS)
            self._last_t, self._last_ticks = now, ticks
        return self._value

    def kernel_files(self) -> list[KernelFile]:
        return self._files.kernel_files()

    def close(self) -> None:
        self._files.close()
