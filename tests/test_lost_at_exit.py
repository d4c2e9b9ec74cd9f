"""A program that dies suddenly (os._exit, SIGKILL) after N wrapped calls: every call is either
stored or counted as lost (`runtime.event_counter`), exactly, and the run says `incomplete`;
a program that ends normally loses nothing. No counter file is left behind."""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_cli

from fecomlite.server.client import live_client
from fecomlite.store import Store

CALLS = 50_000

PROGRAM = """\
import os, signal
import numpy as np

for _ in range({calls}):
    np.abs(-1)
{end}
"""


@pytest.mark.parametrize(("end", "exit_status", "status"), [
    ("os._exit(3)", 3, "incomplete"),
    ("os.kill(os.getpid(), signal.SIGKILL)", 137, "incomplete"),
    ("", 0, "finished"),
])
def test_every_call_is_stored_or_counted_lost(home, tmp_path, end, exit_status, status):
    script = tmp_path / "loop.py"
    script.write_text(PROGRAM.format(calls=CALLS, end=textwrap.dedent(end)))
    result = run_cli(tmp_path, "run", "--home", str(home), "--api", "numpy", "--repeat", "1",
                     "--idle", "0", "--tail", "0", "--no-gate", "--quiet", str(script))
    assert result.returncode == exit_status, result.stdout + result.stderr
    client = live_client(home)
    assert client is not None
    with Store(client.store_path) as store:
        run_id = store.latest_run_id()
        run, stored = store.run(run_id), store.event_count(run_id)
    assert run["status"] == status
    assert stored + run["lost_events"] == CALLS
    assert run["lost_at_exit"] == run["lost_events"]
    if status == "finished":
        assert run["lost_events"] == 0
    else:
        assert run["lost_events"] > 0  # the last ~200 ms of calls were still in the buffer
        assert f"{run['lost_events']} events recorded by a process that died" in result.stdout
    assert not list(home.rglob("*.count"))  # the counter files are removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop.py"]  # nothing beside the script
