"""Two `fecomlite run` at once, in one folder, on one server: each run follows its own program
(memory, CPU), keeps its own log folder, and says only what its own program did."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fecomlite.store import Store

BIG = textwrap.dedent("""
    import time
    block = bytearray(400 * 1024 * 1024)  # touched: resident
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(3)
    print("big done")
""")
SMALL = textwrap.dedent("""
    import time
    time.sleep(3.5)
    print("small done")
""")


def test_two_runs_at_once_each_measure_their_own_program(home, tmp_path):
    (tmp_path / "big.py").write_text(BIG)
    (tmp_path / "small.py").write_text(SMALL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env["COLUMNS"] = "200"
    common = ["run", "--home", str(home), "--level", "project", "--repeat", "1", "--idle", "0",
              "--tail", "0.3", "--no-gate"]
    procs = [subprocess.Popen([sys.executable, "-m", "fecomlite.cli", *common, name],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for name in ("big.py", "small.py")]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    with Store(home / "store.sqlite", create=False) as store:
        runs = {Path(r["program"]).name: r for r in store.runs() if r["kind"] == "instrumented"}
        peak = {}
        for name in ("big.py", "small.py"):
            run = runs[name]
            assert run["status"] == "finished"
            rss = store.sensor_id(run["id"], "proc:rss")
            peak[name] = store.db.execute(
                "SELECT max(value) FROM samples WHERE sensor_id=?", (rss,)).fetchone()[0]
    assert peak["big.py"] > 350e6  # its own 400 MB
    assert peak["small.py"] < 100e6  # an interpreter asleep, never the other's 400 MB
    logs = sorted((home / "logs").iterdir())
    assert len(logs) == 2  # one folder each, even when started in the same second
    assert {(d / "rep-1.log").read_text().strip() for d in logs} == {"big done", "small done"}
