"""A program that dies suddenly (os._exit, SIGKILL) after N wrapped calls: every call is stored,
its unsent events recovered from the ring file it leaves (`runtime.event_ring`; where they cannot
be recovered they are counted lost, exactly: tests/test_lost_at_exit_ring.py). A program that ends
normally loses nothing. No ring file is left behind."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from fecomlite.server.client import ServerError, ensure_server, live_client
from fecomlite.store import Store

CALLS = 50_000

LOOP = """\
import os, signal
import numpy as np

for _ in range({calls}):
    np.abs(-1)
{end}
"""

FORKED_CHILD_DIES = """\
import os
import numpy as np

for _ in range(20_000):
    np.abs(-1)
pid = os.fork()
if pid == 0:  # a forked worker that dies unflushed
    for _ in range(30_000):
        np.abs(-1)
    os._exit(0)
os.waitpid(pid, 0)
"""


def _run(home: Path, folder: Path, program: str) -> tuple[subprocess.CompletedProcess[str],
                                                        dict[str, Any], int]:
    """`fecomlite run` of the program, quickly: its result, its run's row, the events stored."""
    script = folder / "loop.py"
    script.write_text(program)
    result = run_cli(folder, "run", "--home", str(home), "--api", "numpy", "--repeat", "1",
                     "--idle", "0", "--tail", "0", "--no-gate", "--quiet", str(script))
    client = live_client(home)
    assert client is not None, result.stdout + result.stderr
    with Store(client.store_path) as store:
        run_id = store.latest_run_id()
        run, stored = store.run(run_id), store.event_count(run_id)
    assert not [p for p in home.rglob("*") if p.suffix in (".events", ".sites", ".count")]
    assert sorted(p.name for p in folder.iterdir()) == ["loop.py"]  # nothing beside the script
    return result, run, stored


ENDS = [("os._exit(3)", 3, "failed"), ("os.kill(os.getpid(), signal.SIGKILL)", 137, "failed"),
        ("", 0, "finished")]


@pytest.mark.parametrize(("end", "exit_status", "status"), ENDS)
def test_every_call_is_stored_even_after_a_sudden_death(home, tmp_path, end, exit_status, status):
    result, run, stored = _run(home, tmp_path, LOOP.format(calls=CALLS, end=textwrap.dedent(end)))
    assert result.returncode == exit_status, result.stdout + result.stderr
    assert run["status"] == status  # failed: the program's exit, not lost events
    assert (stored, run["lost_events"], run["lost_at_exit"]) == (CALLS, 0, 0)


PAST_THE_RING = """\
import os
import numpy as np
import fecomlite.runtime.probe as probe
from fecomlite.runtime import event_ring

probe.FLUSH_EVERY_S, probe.FLUSH_EVENTS = 3600, 10**9  # the flusher falls a ring behind
for _ in range(event_ring.CAPACITY + {beyond}):
    np.abs(-1)
os._exit(3)
"""


def test_events_past_a_full_ring_are_counted_lost_exactly(home, tmp_path):
    """Unsent records that found the ring full wait in memory: a death loses them, and the run
    counts them, exactly, and says so."""
    from fecomlite.runtime.event_ring import CAPACITY

    result, run, stored = _run(home, tmp_path, PAST_THE_RING.format(beyond=5_000))
    assert result.returncode == 3, result.stdout + result.stderr
    assert (stored, run["lost_events"], run["status"]) == (CAPACITY, 5_000, "incomplete")
    assert run["lost_at_exit"] == run["lost_events"] == 5_000  # the sized first calls: in the ring
    assert "5000 events recorded by a process that died" in result.stdout


def test_a_forked_child_that_dies_unflushed_keeps_its_events_too(home, tmp_path):
    result, run, stored = _run(home, tmp_path, FORKED_CHILD_DIES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert run["status"] == "finished"
    assert (stored, run["lost_events"]) == (50_000, 0)  # the child's from its own ring


def test_a_finish_naming_bad_counts_is_refused(home):
    client = ensure_server(home)
    run, _ = client.create_run("x.py", [], "method", {})
    for bad in ({"not-a-proc": 1}, {"0123456789abcdef": -1}, {"0123456789abcdef": True}):
        with pytest.raises(ServerError, match="recorded must map"):
            client.finish_run(run, "finished", 0, bad)
    reply = client.finish_run(run, "finished", 0, {"0123456789abcdef": 7})  # none stored
    assert (reply["status"], reply["lost_events"], reply["lost_at_exit"]) == ("incomplete", 7, 7)
