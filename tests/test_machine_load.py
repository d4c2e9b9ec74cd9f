"""A busy machine is named: other processes' CPU use during the baseline or the repetitions
flags the machine-level above-idle figures, and the program's own share leads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from report_helpers import build_run

from fecomlite.analysis.run_analysis import BUSY_SHARE, analyse_run
from fecomlite.store import Store


def add_utilisation(store: Store, run_id: int, machine_pct: float, program_pct: float) -> None:
    """util:cpu and util:process every 100 ms over the run, the program's only inside reps."""
    run = store.run(run_id)
    reps = store.repetitions(run_id)
    t = np.arange(run["t_start_ns"] - 3 * 10**9, run["t_end_ns"], 10**8, dtype=np.int64)
    inside = np.zeros(t.size, bool)
    for r in reps:
        inside |= (t >= r["t_start_ns"]) & (t <= r["t_end_ns"])
    mine = np.where(inside, program_pct, 0.0)
    machine = store.add_sensor(run_id, name="util:cpu", domain="utilisation", unit="%",
                               kind="gauge", provenance="measured", period_s=0.1)
    proc = store.add_sensor(run_id, name="util:process", domain="utilisation", unit="%",
                            kind="gauge", provenance="measured", period_s=0.1)
    rows = [(machine, int(x), float(m + machine_pct)) for x, m in zip(t, mine, strict=True)]
    rows += [(proc, int(x), float(m)) for x, m in zip(t, mine, strict=True)]
    store.add_samples(rows)
    store.put_result(run_id, "idle_baseline", {
        **(store.result(run_id, "idle_baseline") or {}),
        "t_start_ns": int(t[0]), "t_end_ns": int(t[0] + 3 * 10**9)})


def test_other_processes_make_machine_level_figures_unreliable(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        quiet, busy = build_run(store), build_run(store)
        add_utilisation(store, quiet, machine_pct=2.0, program_pct=40.0)
        add_utilisation(store, busy, machine_pct=45.0, program_pct=40.0)
        q, b = analyse_run(store, quiet), analyse_run(store, busy)
    assert not q.load["busy"] and q.load["program_other_pct"] < 100 * BUSY_SHARE
    assert all(d["reliable"] for d in q.domains)
    assert b.load["busy"]
    assert b.load["baseline_other_pct"] == 45.0
    assert abs(b.load["program_other_pct"] - 45.0) < 1.0  # the program's own 40 % taken off
    assert "other processes used the CPUs" in b.load["text"]
    by_name = {d["domain"]: d for d in b.domains}
    assert not by_name["cpu-package"]["reliable"]  # machine-level, on the host
    assert by_name["gpu:0"]["reliable"]  # a GPU counter is not the CPUs' business
