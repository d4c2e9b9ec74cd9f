"""Per-device attribution: two processes on two GPUs, each GPU's energy to its own process.

The two GPUs are the recorded H200 traces the fake NVML replays (tests/fixtures/h200-nvml as
gpu:0, tests/fixtures/h200-nvml-mixed as gpu:1), their samples and calls laid on one time axis
as if two ranks had run them side by side, each rank on its own GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from report_helpers import MIXED, NVML, read_csv
from stored_events import plain_calls

from fecomlite.analysis import attribution as at
from fecomlite.analysis.ranks import add_rank_figures
from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.store import Store

GPUS = {0: (NVML, 100), 1: (MIXED, 200)}  # gpu index: (trace, pid of the rank using it)


def _trace(directory, shift_ns):
    calls = read_csv(directory / "gpu_calls.csv")
    energy = read_csv(directory / "gpu_samples_energy.csv")
    t_e = energy["t_ns"] + shift_ns
    joules = energy["energy_mJ"] / 1000.0
    t0, t1 = calls["t_start_ns"] + shift_ns, calls["t_end_ns"] + shift_ns
    idle = at.estimate_idle_W(at.sensor_intervals("counter", t_e, joules, period_s=0.1), t0, t1)
    return calls["api"], t0, t1, t_e, joules, idle


def _store(path, gpus):
    """A finished run with the given GPUs (index → trace, pid); every trace starts at t = 0."""
    store = Store(path)
    traces = {}
    for i, (directory, _) in gpus.items():
        start = int(read_csv(directory / "gpu_samples_energy.csv")["t_ns"][0])
        traces[i] = _trace(directory, 10**9 - start)
    end = max(int(t[3][-1]) for t in traces.values())
    run_id = store.create_run(
        program="ddp.py",
        status="finished",
        t_start_ns=0,
        t_end_ns=end,
        idle={f"nvml:{i}:energy": t[5] for i, t in traces.items()},
    )
    store.upsert_repetition(run_id, 1, t_start_ns=0, t_end_ns=end, tail_end_ns=end, exit_code=0)
    for i, (_, pid) in gpus.items():
        apis, t0, t1, t_e, joules, _ = traces[i]
        sensor = store.add_sensor(
            run_id,
            name=f"nvml:{i}:energy",
            domain=f"gpu:{i}",
            unit="J",
            kind="counter",
            provenance="measured",
            period_s=0.1,
        )
        store.add_samples(zip([sensor] * t_e.size, t_e.tolist(), joules.tolist(), strict=True))
        keys = [f"gpu{i}.py:1:{a}" for a in apis]
        manifest = {k: {"api": f"torch.{k.rsplit(':', 1)[1]}"} for k in set(keys)}
        ids = store.site_ids(run_id, set(keys), manifest)
        with store.transaction():
            store.add_events(run_id, 1, pid, plain_calls([ids[k] for k in keys], t0, t1))
            store.put_process(run_id, pid, {"rank": i, "local_rank": i, "device": f"gpu:{i}"})
    return store, run_id


def test_each_gpu_s_energy_goes_to_the_calls_of_its_own_process(tmp_path):
    store, run_id = _store(tmp_path / "two.sqlite", GPUS)
    a = analyse_run(store, run_id, "overlap", compare_levels=False)
    pid = a.calls["pid"]
    for i, (_, own) in GPUS.items():
        energy = a.calls["energy_J"][f"gpu:{i}"]
        domain = next(d for d in a.domains if d["domain"] == f"gpu:{i}")
        assert energy[pid != own].sum() == 0  # the other rank's calls get none of this GPU
        assert energy[pid == own].sum() > 0
        assert energy[(pid == own) & (a.calls["depth"] == 0)].sum() == pytest.approx(
            domain["in_calls_J"]
        )
        # as if this process had run alone: the other GPU's process takes nothing away
        alone, alone_id = _store(tmp_path / f"alone{i}.sqlite", {i: GPUS[i]})
        ref = analyse_run(alone, alone_id, "overlap", compare_levels=False)
        np.testing.assert_allclose(energy[pid == own], ref.calls["energy_J"][f"gpu:{i}"], rtol=1e-9)
        alone.close()
    store.close()


def _add_worker(store, run_id, pid, rank, directory):
    """A DataLoader worker of RANK (a forked child: it never initialises CUDA, so "cpu"),
    its calls at the very times its rank's GPU computed."""
    start = int(read_csv(directory / "gpu_samples_energy.csv")["t_ns"][0])
    _, t0, t1, *_ = _trace(directory, 10**9 - start)
    ids = store.site_ids(run_id, {"worker.py:1:load"}, {"worker.py:1:load": {"api": "load"}})
    store.add_events(run_id, 1, pid, plain_calls([ids["worker.py:1:load"]] * len(t0), t0, t1))
    store.put_process(run_id, pid, {"rank": rank, "local_rank": rank, "device": "cpu"})


def test_a_rank_s_worker_counts_for_its_rank_but_takes_none_of_its_gpu(tmp_path):
    store, run_id = _store(tmp_path / "two.sqlite", GPUS)
    _add_worker(store, run_id, 101, 0, GPUS[0][0])
    a = analyse_run(store, run_id, "overlap", compare_levels=False)
    pid = a.calls["pid"]
    for i in GPUS:
        assert a.calls["energy_J"][f"gpu:{i}"][pid == 101].sum() == 0
    alone, alone_id = _store(tmp_path / "alone0.sqlite", {0: GPUS[0]})
    ref = analyse_run(alone, alone_id, "overlap", compare_levels=False)
    own = a.calls["energy_J"]["gpu:0"][pid == 100]  # the worker took nothing from its rank
    np.testing.assert_allclose(own, ref.calls["energy_J"]["gpu:0"], rtol=1e-9)
    alone.close()

    ranks = add_rank_figures(a, store.processes(run_id))
    assert {r["rank"]: (sorted(r["pids"]), r["device"]) for r in ranks} == {
        0: ([100, 101], "gpu:0"),
        1: ([200], "gpu:1"),
    }
    load = next(row for row in a.apis if row["api"] == "load")
    assert load["calls_by_rank"] == {"0": int((pid == 101).sum())}
    for row in a.apis:  # each domain's energy by rank sums to the API's; gpu:1 all rank 1's
        for domain, split in row["energy_by_rank"].items():
            total = a.calls["energy_J"][domain][a.calls["api"] == a.api_names.index(row["api"])]
            assert sum(split.values()) == pytest.approx(total.sum(), abs=1e-9)
            if domain == "gpu:1":
                assert all(v == 0 for r, v in split.items() if r != "1")
    store.close()
