"""The ring a process leaves when it dies (`runtime.event_ring`), read back without a server:
every record written before the death is recovered with its site, thread, status and a
CLOCK_MONOTONIC span inside the call's; what cannot be recovered is counted (recorded), never
stored wrong: the pure-Python probe's events (it keeps no ring), records whose site key was torn
off the site table."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fecomlite.runtime import batch_codec, event_ring

CALLS = 20_000

DIES = """\
import os, signal, sys, threading, time
{python_only}
import fecomlite.runtime.probe as probe

def fail():
    raise KeyError("x")

before = time.monotonic_ns()
for i in range({calls}):
    probe.call("loop.py:1:0", abs, -i)
    if i % 1000 == 0:
        try:
            probe.call("loop.py:2:0", fail)
        except KeyError:
            pass
worker = threading.Thread(target=lambda: [probe.call("loop.py:3:0", abs, 1) for _ in range(10)])
worker.start()
worker.join()
print(before, time.monotonic_ns(), worker.ident, flush=True)
{end}
"""


def die(folder: Path, end: str, python_only: bool = False) -> tuple[int, int, int]:
    """Runs the program as a run's process would (FECOMLITE_RUN, its spool in `folder`) until
    `end` kills it: (ns before the first call, ns after the last, the worker thread's id)."""
    program = DIES.format(calls=CALLS, end=end, python_only=(
        "sys.modules['fecomlite.runtime._fastprobe'] = None" if python_only else ""))
    env = {**os.environ, "FECOMLITE_RUN": "7", "FECOMLITE_SPOOL": str(folder / "rep-1.spool")}
    env.pop("FECOMLITE_URL", None)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stderr
    before, after, worker = map(int, result.stdout.split())
    return before, after, worker


def recovered(folder: Path) -> list[tuple[dict, dict]]:
    batches = []
    for spool in folder.glob("*.recovered.spool"):
        with spool.open("rb") as stream:
            batches += [batch_codec.decode(body, require_id=True)
                        for body in batch_codec.read_records(stream)]
    return batches


EXPECTED = CALLS + CALLS // 1000 + 10  # abs calls, raising calls, the worker's calls


@pytest.mark.parametrize("end", ["os._exit(3)", "os.kill(os.getpid(), signal.SIGKILL)",
                                 "os.kill(os.getpid(), signal.SIGSEGV)"])
def test_a_dead_processs_events_are_recovered_whole(tmp_path, end):
    before, after, worker = die(tmp_path, end)
    assert event_ring.recover_unsent(tmp_path) == EXPECTED
    batches = recovered(tmp_path)
    events = [(header["sites"][s], int(t0), int(t1), int(tid), int(st))
              for header, cols in batches
              for s, t0, t1, tid, st in zip(cols["site"], cols["t_start_ns"], cols["t_end_ns"],
                                            cols["tid"], cols["status"], strict=True)]
    assert len(events) == EXPECTED
    assert all(header["run"] == "7" for header, _ in batches)
    assert all(before <= t0 <= t1 <= after for _, t0, t1, _, _ in events)
    assert sum(1 for site, *_ in events if site == "loop.py:1:0") == CALLS
    raised = [st for site, *_, st in events if site == "loop.py:2:0"]
    assert raised == [batch_codec.RAISED] * (CALLS // 1000)
    assert {tid for site, _, _, tid, _ in events if site == "loop.py:3:0"} == {worker}
    assert event_ring.recorded_counts(tmp_path) == {batches[0][0]["proc"]: EXPECTED}
    assert not list(tmp_path.glob("*.events")) and not list(tmp_path.glob("*.sites"))


def test_a_site_torn_off_the_table_costs_its_events_only(tmp_path):
    """The site table's last entry cut short (a death inside its write): that site's records
    cannot be named, so they are not stored, but they are still counted as recorded."""
    die(tmp_path, "os._exit(3)")
    (sites,) = tmp_path.glob("*.sites")
    sites.write_bytes(sites.read_bytes()[:-2])  # loop.py:3:0, the last site seen, torn
    assert event_ring.recover_unsent(tmp_path) == EXPECTED - 10
    assert list(event_ring.recorded_counts(tmp_path).values()) == [EXPECTED]


def test_the_pure_python_probe_counts_what_it_cannot_keep(tmp_path):
    die(tmp_path, "os._exit(3)", python_only=True)
    assert event_ring.recover_unsent(tmp_path) == 0
    assert list(event_ring.recorded_counts(tmp_path).values()) == [EXPECTED]


def test_a_batch_in_flight_at_the_death_is_recovered_under_its_own_id(tmp_path):
    """Died while posting batch 4 (records 0-99): those records go out as batch 4 (the store
    keeps an id once: stored already, they are not stored twice), the rest as batch 5."""
    die(tmp_path, "os._exit(3)")
    (ring,) = tmp_path.glob("*.events")
    with ring.open("r+b") as f:  # sent, seq, batch_end (event_ring's header layout)
        f.seek(32)
        f.write(struct.pack("=QqQ", 0, 4, 100))
    assert event_ring.recover_unsent(tmp_path) == EXPECTED
    assert [(h["seq"], h["n"]) for h, _ in recovered(tmp_path)] == [(4, 100), (5, EXPECTED - 100)]
