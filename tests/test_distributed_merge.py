"""Two nodes simulated as two homes (two servers on loopback): `fecomlite merge` gives one report.

Each "node" is a `fecomlite run` with the environment torchrun gives a rank (RANK, LOCAL_RANK,
GROUP_RANK, TORCHELASTIC_RUN_ID), both at once. Node 1's store is then moved onto a clock that
started an hour earlier — what a machine booted an hour before the other records — so the merge
must use the recorded clock offsets to put both nodes' calls back on one time axis.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap

import pytest
from run_helpers import TIMEOUT_S, running
from stored_events import events_table

from fecomlite.server.client import live_client
from fecomlite.store import Store
from fecomlite.store.merge import PID_STRIDE

PROGRAM = """
    import numpy as np

    a = np.ones((32, 32))
    for _ in range(20):
        a = np.tanh(np.matmul(a, a))
    print("done")
"""
SKEW_NS = 3600 * 10**9
JOB = "job-merge-test"


def _node(stack, home, script, node):
    """Node NODE's `fecomlite run`, with the environment torchrun gives its rank."""
    env = dict(RANK=str(node), LOCAL_RANK="0", GROUP_RANK=str(node), WORLD_SIZE="2")
    env["TORCHELASTIC_RUN_ID"] = JOB
    return stack.enter_context(running(script.parent, home, script, "--api", "numpy", env=env))


def _skew(path):
    """Node 1 as a machine whose CLOCK_MONOTONIC started SKEW_NS earlier."""
    with Store(path, create=False) as store, store.transaction():
        db = store.db
        db.execute(  # a chunk's times are offsets from its first start
            "UPDATE event_chunks SET t_first_ns=t_first_ns+?, t_last_ns=t_last_ns+?",
            (SKEW_NS, SKEW_NS),
        )
        db.execute("UPDATE samples SET t_ns=t_ns+?", (SKEW_NS,))
        for table in ("runs", "repetitions"):
            db.execute(
                f"UPDATE {table} SET t_start_ns=t_start_ns+?, t_end_ns=t_end_ns+?",
                (SKEW_NS, SKEW_NS),
            )
        db.execute("UPDATE repetitions SET tail_end_ns=tail_end_ns+?", (SKEW_NS,))
        db.execute("UPDATE processes SET clock_offset_ns=clock_offset_ns-?", (SKEW_NS,))


def _events(path):
    with Store(path, create=False) as store:
        rows = events_table(store).db.execute("SELECT pid, t_start_ns, t_end_ns FROM events")
        return sorted(tuple(r) for r in rows)


def test_two_nodes_merge_into_one_report_with_both_ranks_on_one_clock(tmp_path_factory, tmp_path):
    homes = [tmp_path_factory.mktemp(f"node{n}") for n in (0, 1)]
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    try:
        with contextlib.ExitStack() as stack:  # both at once; neither left running on failure
            procs = [_node(stack, home, script, n) for n, home in enumerate(homes)]
            for proc in procs:
                output = "".join(proc.communicate(timeout=TIMEOUT_S))
                assert proc.returncode == 0, output
    finally:
        for home in homes:  # each node's server
            client = live_client(home)
            if client is not None:
                client.shutdown()
    stores = [home / "store.sqlite" for home in homes]
    truth = {0: _events(stores[0]), 1: _events(stores[1])}
    _skew(stores[1])

    out = tmp_path / "merged"
    result = subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", "merge", *map(str, stores), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    merged = _events(out / "store.sqlite")
    by_node = {n: [e for e in merged if e[0] // PID_STRIDE == n] for n in (0, 1)}
    for n in (0, 1):
        assert len(by_node[n]) == len(truth[n]) > 0
        assert [e[0] % PID_STRIDE for e in by_node[n]] == [e[0] for e in truth[n]]
        for (_, t0, t1), (_, r0, r1) in zip(by_node[n], truth[n], strict=True):
            # an hour undone to within 50 ms: each node reads its clock offset once, at its
            # first batch, on a machine that may pause it (the probe takes the tightest of 3)
            assert abs(t0 - r0) < 50_000_000 and abs(t1 - r1) < 50_000_000

    data = json.loads((out / "report.json").read_text())
    assert [(r["rank"], r["node"]) for r in data["ranks"]] == [(0, 0), (1, 1)]
    assert data["run"]["settings"]["job"] == JOB
    assert data["run"]["settings"]["clock_shift_ns"]["node1"] == pytest.approx(-SKEW_NS, abs=5e7)
    matmul = next(a for a in data["apis"] if a["api"] == "numpy.matmul")
    assert matmul["calls_by_rank"] == {"0": 20, "1": 20}
    domains = {d["domain"] for d in data["domains"]}
    assert {"cpu-package@node0", "cpu-package@node1"} <= domains
