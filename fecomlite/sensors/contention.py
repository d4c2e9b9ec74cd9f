"""How much the measured program had to wait for a CPU: contention, measured rather than assumed.

On a loaded machine the program's threads wait in the run queue, and threads that spin while
their peers wait (OpenMP/MKL barriers, PyTorch's intra-op pool) burn CPU time doing nothing:
the program's own CPU share (cpu-process), made from CPU time, grows with the load. Three
sources say how much load there was, each read every 0.1 s:

- `sched:wait`: the run-queue wait of every thread of the process tree
  (`/proc/<pid>/task/<tid>/schedstat`, second field, ns), per wall time, in % of all CPUs —
  beside `util:process` (the tree's CPU time on the same scale) it is the wait per CPU second;
- `util:steal`: the time the hypervisor gave the CPUs to other guests (`/proc/stat` steal), % of
  all CPUs;
- `load:runnable`: tasks runnable on the machine now (`/proc/stat` procs_running) per CPU.

The analysis (`analysis/contention.py`) turns them into what load did to each domain.
"""

from __future__ import annotations

import os

from fecomlite.sensors._files import KernelFile, monotonic
from fecomlite.sensors.base import GAUGE, BaseSensor
from fecomlite.sensors.proctree import ProcessTree

N_CPUS = os.cpu_count() or 1
PERIOD_S = 0.1
DOMAIN = "contention"  # not "utilisation": the gate's quiet checks and the live view skip them


class ProcessRunQueueWait(BaseSensor):
    """Run-queue wait of the process tree's threads per wall time, % of all CPUs."""

    def __init__(self, pid: int, *, include_children: bool = True) -> None:
        super().__init__(
            name="sched:wait", domain=DOMAIN, unit="%", kind=GAUGE, device="process",
            nominal_period_s=PERIOD_S, watch_period=False,
            description="run-queue wait of the process tree's threads per wall time "
                        f"(/proc/<pid>/task/*/schedstat), % of all {N_CPUS} CPUs",
        )
        os.stat(f"/proc/{pid}/task/{pid}/schedstat")  # raises: no such process, or no schedstat
        self.tree = ProcessTree(pid, include_children=include_children)
        self._waited: dict[tuple[int, int], int] = {}
        self._last_t = monotonic()
        self._total = self._wait_ns()  # raises when the root cannot be read
        self._value: float | None = None

    def _wait_ns(self) -> int:
        """Σ over live threads of the wait each added since first seen (a thread that exits
        takes its count with it: only increases are summed)."""
        added = 0
        for pid in self.tree.pids():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                        waited = int(f.read().split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                key = (pid, int(tid))
                added += max(waited - self._waited.get(key, waited), 0)
                self._waited[key] = waited
        return getattr(self, "_total", 0) + added

    def restart(self) -> None:
        """A new window from now: no value spans a pause of the sampler."""
        self._total, self._last_t, self._value = self._wait_ns(), monotonic(), None

    def _read(self) -> float | None:
        now = monotonic()
        if now - self._last_t >= PERIOD_S:
            total = self._wait_ns()
            self._value = 100.0 * (total - self._total) / 1e9 / ((now - self._last_t) * N_CPUS)
            self._total, self._last_t = total, now
        return self._value


class MachineStat:
    """One `/proc/stat` read per window for steal time and the runnable tasks."""

    def __init__(self) -> None:
        self._file = KernelFile("/proc/stat", size=16384)
        self._last_t = monotonic()
        self._last = self._parse()
        self.steal_pct: float | None = None
        self.runnable: float | None = None

    def _parse(self) -> tuple[int, int, int]:
        data = self._file.read_bytes()
        fields = [int(x) for x in data.split(b"\n", 1)[0].split()[1:9]]
        start = data.index(b"procs_running ") + len(b"procs_running ")
        return fields[7], sum(fields), int(data[start:data.index(b"\n", start)])

    def update(self) -> None:
        now = monotonic()
        if now - self._last_t < PERIOD_S:
            return
        steal, total, running = self._parse()
        if total > self._last[1]:
            self.steal_pct = 100.0 * (steal - self._last[0]) / (total - self._last[1])
        self.runnable = running / N_CPUS
        self._last, self._last_t = (steal, total, running), now

    def restart(self) -> None:
        """A new window from now (no steal value spans a pause of the sampler)."""
        self._last_t, self._last = monotonic(), self._parse()
        self.steal_pct = None

    def close(self) -> None:
        self._file.close()


class _MachineStatSensor(BaseSensor):
    def __init__(self, stat: MachineStat, **meta: str) -> None:
        super().__init__(kind=GAUGE, device="machine", nominal_period_s=PERIOD_S,
                         watch_period=False, **meta)
        self._stat = stat


class StealTime(_MachineStatSensor):
    """CPU time the hypervisor gave to other guests, % of all CPUs."""

    def __init__(self, stat: MachineStat) -> None:
        super().__init__(stat, name="util:steal", domain=DOMAIN, unit="%",
                         description="steal time of all CPUs (/proc/stat)")

    def restart(self) -> None:
        self._stat.restart()

    def _read(self) -> float | None:
        self._stat.update()
        return self._stat.steal_pct


class RunnableTasks(_MachineStatSensor):
    """Tasks runnable on the machine now, per CPU (1 = every CPU has one)."""

    def __init__(self, stat: MachineStat) -> None:
        super().__init__(stat, name="load:runnable", domain=DOMAIN, unit="per CPU",
                         description=f"runnable tasks per CPU (/proc/stat procs_running, "
                                     f"{N_CPUS} CPUs)")

    def _read(self) -> float | None:
        self._stat.update()
        return self._stat.runnable
