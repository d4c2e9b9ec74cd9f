"""/proc readers against real child processes whose memory and CPU use we control."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fecomlite.sensors.procmem import ProcessPeakRss, ProcessRss
from fecomlite.sensors.utilisation import (
    N_CPUS,
    MachineCpuUtilisation,
    ProcessTreeCpuUtilisation,
)

MB = 10**6
# "alloc": allocate 200 MiB on the first line of stdin, free it on the second, exit on the third.
# "spin": burn CPU until killed. "parent:<role>": stay idle while a child plays <role>.
CHILD = r"""
import subprocess, sys
role = sys.argv[1]
if role.startswith("parent:"):
    sys.exit(subprocess.call([sys.executable, __file__, role[7:]]))
print("ready", flush=True)
if role == "spin":
    while True:
        pass
sys.stdin.readline()
block = b"x" * (200 << 20)  # bytes(n) would be lazily zero-mapped; this writes every page
print("allocated", flush=True)
sys.stdin.readline()
del block
print("freed", flush=True)
sys.stdin.readline()
"""


def start(script: Path, role: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(script), role], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    return proc


def say(proc: subprocess.Popen[str], expect: str) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == expect + "\n"


@pytest.fixture
def procs(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    started: list[subprocess.Popen[str]] = []
    yield lambda role: started.append(start(script, role)) or started[-1]
    for p in started:  # the grandchildren first: an orphaned spinner would spin on
        if p.poll() is None:
            for kid in psutil.Process(p.pid).children(recursive=True):
                kid.kill()
        p.kill()
        p.wait()


def test_tree_rss_sees_a_grandchild_allocate_200_mib(procs):
    parent = procs("parent:alloc")  # the allocating process is the parent's child
    tree = ProcessRss(parent.pid)
    alone = ProcessRss(parent.pid, include_children=False)
    before_tree, before_alone = tree.read(), alone.read()
    assert len(tree._files.pids()) == 2 and before_tree > before_alone > 0
    say(parent, "allocated")
    assert tree.read() - before_tree >= 190 * MB
    assert abs(alone.read() - before_alone) < 10 * MB
    assert tree.unit == "B" and tree.domain == "process-memory" and tree.kind == "gauge"


def test_peak_keeps_the_high_water_mark_after_memory_is_freed(procs):
    child = procs("alloc")
    rss, peak = ProcessRss(child.pid), ProcessPeakRss(child.pid)
    base = rss.read()
    say(child, "allocated")
    high = rss.read()
    say(child, "freed")
    assert high - base >= 190 * MB
    assert rss.read() < high - 150 * MB  # the memory went back to the system
    assert peak.read() >= high - MB  # VmHWM still holds the peak


def test_readers_return_none_once_the_process_is_gone(procs):
    child = procs("alloc")
    rss, peak = ProcessRss(child.pid), ProcessPeakRss(child.pid)
    assert rss.read() > 0 and peak.read() > 0
    child.kill()
    child.wait()
    assert rss.read() is None and peak.read() is None
    assert rss.error_count == 0  # an exited process is not an error


def test_missing_process_fails_at_construction():
    with pytest.raises(OSError):
        ProcessRss(2**22 + 12345)  # above pid_max's default ceiling: never a live pid


def test_cpu_utilisation_of_a_spinning_grandchild(procs):
    parent = procs("parent:spin")
    tree = ProcessTreeCpuUtilisation(parent.pid, min_window_s=0.05)
    alone = ProcessTreeCpuUtilisation(parent.pid, include_children=False, min_window_s=0.05)
    machine = MachineCpuUtilisation(min_window_s=0.05)
    time.sleep(0.1)
    for s in (tree, alone, machine):
        s.read()  # close the first window: measure only while the child spins
    time.sleep(0.5)
    t, a, m = tree.read(), alone.read(), machine.read()
    one_core = 100 / N_CPUS
    assert t >= 0.3 * one_core  # the spinner had at least 30 % of a core, on a shared machine
    assert a < 0.1 * one_core  # the idle parent alone burns nothing
    assert m >= t - 0.15 * one_core  # the machine includes the tree (different tick phases)
    assert t <= 100 and m <= 100


def test_utilisation_holds_its_value_within_a_window():
    machine = MachineCpuUtilisation(min_window_s=0.2)
    assert machine.read() is None  # no complete window yet
    time.sleep(0.25)
    first = machine.read()
    assert first is not None and 0 <= first <= 100
    assert machine.read() == first  # the window is not yet over: the same value



def test_a_restarted_utilisation_has_no_value_until_its_new_window_is_long_enough():
    machine = MachineCpuUtilisation(min_window_s=0.2)
    time.sleep(0.25)
    assert machine.read() is not None
    time.sleep(0.25)  # a pause of the reader: its next window would span it
    machine.restart()
    assert machine.read() is None  # not the pause's value, nor the last one again
    time.sleep(0.25)
    assert machine.read() is not None
