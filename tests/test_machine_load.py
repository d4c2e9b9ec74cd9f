"""A busy machine is named: other processes' CPU use during the baseline or the repetitions
flags the machine-level above-idle figures, and the program's own share leads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fakesys.nvml import H200, busy_windows, overlap
from report_helpers import build_run

from fecomlite.analysis.run_analysis import BUSY_SHARE, analyse_run, machine_load
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
    assert "The CPUs were busy: other processes used them" in b.load["text"]
    by_name = {d["domain"]: d for d in b.domains}
    assert not by_name["cpu-package"]["reliable"]  # machine-level, on the host
    assert by_name["gpu:0"]["reliable"]  # a GPU counter is not the CPUs' business


def add_gpu_processes(store: Store, run_id: int, *, other: bool, own: bool) -> None:
    """nvml:0:processes_sm (every process) and nvml:0:process_sm (the tree) every 0.2 s, as NVML
    would give them for the recorded H200 work (gpu_calls.csv) done by another process that
    repeats it throughout (`other`, the idle baseline included) and/or by the program, whose
    repetitions replay that trace (`own`)."""
    run = store.run(run_id)
    length = (run["t_end_ns"] - run["t_start_ns"]) // len(store.repetitions(run_id))
    recorded = busy_windows(H200 / "gpu_calls.csv")
    recorded = recorded - recorded[0, 0]
    base = store.result(run_id, "idle_baseline")
    t = np.arange(base["t_start_ns"], run["t_end_ns"], 200_000_000, dtype=np.int64)
    program = np.concatenate([busy_windows(H200 / "gpu_calls.csv") + r * length
                              for r in range(len(store.repetitions(run_id)))])
    foreign = np.concatenate([recorded + base["t_start_ns"] + k * (recorded[-1, 1] + 10**9)
                              for k in range(int((t[-1] - t[0]) / recorded[-1, 1]) + 1)])

    def share(windows: np.ndarray) -> np.ndarray:
        return np.array([100 * overlap(windows, int(x) - 200_000_000, int(x)) / 2e8 for x in t])

    mine = share(program) if own else np.zeros(t.size)
    every = np.minimum(100.0, mine + (share(foreign) if other else 0.0))
    ids = [store.add_sensor(run_id, name=f"nvml:0:{q}", domain=d, unit="%", kind="gauge",
                            provenance="measured", period_s=0.2)
           for q, d in (("processes_sm", "gpu-processes"), ("process_sm", "process-gpu-util"))]
    store.add_samples([(ids[0], int(x), float(v)) for x, v in zip(t, every, strict=True)]
                      + [(ids[1], int(x), float(v)) for x, v in zip(t, mine, strict=True)])


def test_another_process_on_the_gpu_makes_that_gpus_figures_unreliable(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        alone, shared = build_run(store), build_run(store)
        for run_id, other in ((alone, False), (shared, True)):
            add_utilisation(store, run_id, machine_pct=2.0, program_pct=40.0)
            add_gpu_processes(store, run_id, other=other, own=True)
        a, b = analyse_run(store, alone), analyse_run(store, shared)
    # the program's own GPU work is not another process's
    assert not a.load["busy"] and all(d["reliable"] for d in a.domains)
    assert a.load["gpus"][0]["program_other_pct"] < 100 * BUSY_SHARE
    assert "gpu:0 was quiet" in a.load["text"]
    assert "The CPUs were quiet" in a.load["text"]
    gpu = b.load["gpus"][0]
    assert gpu["gpu"] == "gpu:0" and gpu["busy"]
    assert gpu["baseline_other_pct"] > 100 * BUSY_SHARE
    assert gpu["program_other_pct"] > 100 * BUSY_SHARE
    assert b.load["busy"] and not b.load["cpu_busy"]
    assert "Other processes used gpu:0 (during the idle baseline" in b.load["text"]
    by_name = {d["domain"]: d for d in b.domains}
    assert not by_name["gpu:0"]["reliable"]
    assert "other processes used gpu:0" in by_name["gpu:0"]["unreliable"][0]
    assert by_name["cpu-package"]["reliable"]  # the CPUs were quiet
    assert b.load["text"].startswith("The CPUs were quiet")  # not "the machine": its GPU was not


def test_a_gpu_without_per_process_data_and_a_machine_without_gpu_are_named(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        run_id = build_run(store)
        add_utilisation(store, run_id, machine_pct=2.0, program_pct=40.0)
        with_gpu = analyse_run(store, run_id)
        sensors = [s for s in store.sensors(run_id) if not s["domain"].startswith("gpu")]
        without = machine_load(store, sensors, store.result(run_id, "idle_baseline"),
                               store.repetitions(run_id))
    assert any(n.startswith("gpu:0: NVML gave no per-process utilisation")
               for n in with_gpu.load["not_checked"])
    assert "GPUs: none on this machine" in without["checked"] and "No GPU." in without["text"]
    assert not any("GPU" in n or "gpu" in n for n in without["not_checked"])
