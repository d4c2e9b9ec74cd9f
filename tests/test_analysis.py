"""`analyse_run` over a run store built in tmp_path from the recorded H200 trace.

The store holds what the server would write: the real NVML counter, instant and averaged power
and device memory (replayed from tests/fixtures/h200-nvml, twice: two repetitions), an
estimated CPU power series computed from the calls' busy time, process RSS with a known peak,
sites from a manifest (two sites of one API, one of another, a region around three calls) and
the recorded bursts as events.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fecomlite.analysis import attribution as at
from fecomlite.analysis import run_analysis as an
from fecomlite.sensors.replay import load_trace
from fecomlite.store import Store

H200 = Path(__file__).resolve().parent / "fixtures" / "h200-nvml"
MS = 1_000_000
SHIFT = 30_000 * MS  # repetition 2 replays the trace 30 s later
GPU_IDLE, CPU_IDLE, CPU_BUSY = 130.4, 20.0, 30.0
RSS_BASE, RSS_PEAK, RSS_AFTER = 1e9, 3e9, 1.5e9
SITES = {
    8192: ("train.py:10:4", "torch.matmul", "x @ w"),
    4096: ("train.py:12:8", "torch.matmul", "torch.matmul"),
    2048: ("train.py:14:8", "torch.mm", "torch.mm"),
}


def bursts() -> list[dict[str, str]]:
    with open(H200 / "gpu_calls.csv", newline="") as f:
        return list(csv.DictReader(f))


def _events(rows: list[dict[str, str]], shift: int) -> list[tuple[str, int, int]]:
    events = []
    for r in rows:
        key = SITES[int(r["api"].rsplit("_", 1)[1])][0]
        events.append((key, int(r["t_start_ns"]) + shift, int(r["t_end_ns"]) + shift))
    first, third = events[0], events[2]
    events.append(("region:warmup", first[1] - MS, third[2] + MS))
    return events


def _cpu_power(t_ns: np.ndarray, events: list[tuple[str, int, int]]) -> np.ndarray:
    """An estimated CPU power: idle + CPU_BUSY × the busy share of each 100 ms window."""
    t0 = np.array([e[1] for e in events if not e[0].startswith("region")])
    t1 = np.array([e[2] for e in events if not e[0].startswith("region")])
    busy = np.array([np.clip(np.minimum(t1, b) - np.maximum(t0, b - 100 * MS), 0, None).sum()
                     for b in t_ns]) / (100 * MS)
    return CPU_IDLE + CPU_BUSY * np.minimum(busy, 1.0)


def _rss(t_ns: np.ndarray, call: tuple[str, int, int]) -> np.ndarray:
    """RSS_BASE before `call`, up to RSS_PEAK in its middle, RSS_AFTER from its end on."""
    _, a, b = call
    mid = (a + b) // 2
    return np.where(t_ns < a, RSS_BASE,
                    np.where(t_ns >= b, RSS_AFTER,
                             np.where(np.abs(t_ns - mid) < 2 * MS, RSS_PEAK, 2e9)))


def build_run(store: Store, *, level: str = "method", cpu: bool = True, idle: bool = True,
              reps: int = 2, project_site: bool = False) -> int:
    rows = bursts()
    idle_map = {"nvml:0:energy": GPU_IDLE, "est:cpu-package": CPU_IDLE} if idle else {}
    run_id = store.create_run(program="train.py", level=level, idle=idle_map)
    energy = load_trace(H200 / "gpu_samples_energy.csv", "energy_mJ")
    sensors = {
        "nvml:0:energy": ("gpu:0", "J", "counter", "measured", None, 0.1,
                          energy.t_ns, energy.values),
    }
    for column, name, domain, kind in (
        ("power_instant_mW", "nvml:0:power_instant", "gpu:0", "power"),
        ("power_avg_mW", "nvml:0:power_avg", "gpu:0", "power"),
        ("mem_used_B", "nvml:0:memory_used", "gpu-memory", "gauge"),
    ):
        trace = load_trace(H200 / "gpu_samples_power.csv", column)
        unit = "B" if kind == "gauge" else "W"
        sensors[name] = (domain, unit, kind, "measured", None, 0.1, trace.t_ns, trace.values)
    ids = {name: store.add_sensor(run_id, name=name, domain=s[0], unit=s[1], kind=s[2],
                                  provenance=s[3], model=s[4], period_s=s[5])
           for name, s in sensors.items()}
    if cpu:
        ids["est:cpu-package"] = store.add_sensor(
            run_id, name="est:cpu-package", domain="cpu-package", unit="W", kind="power",
            provenance="estimated", model="cpu-util-linear", period_s=0.1)
    ids["proc:rss"] = store.add_sensor(run_id, name="proc:rss", domain="process-memory",
                                       unit="B", kind="gauge", provenance="measured",
                                       period_s=0.005)
    store.put_result(run_id, "sensors", {"nvml:0:power_avg": {"averaging_s": 1.0}})
    span = int(energy.t_ns[-1] - energy.t_ns[0])
    total = float(energy.values[-1] - energy.values[0])
    samples = []
    for rep in range(1, reps + 1):
        shift = (rep - 1) * SHIFT
        events = _events(rows, shift)
        offset = (rep - 1) * (total + GPU_IDLE * (SHIFT - span) / 1e9)  # idle between the two
        for name, s in sensors.items():
            values = s[7] + (offset if name == "nvml:0:energy" else 0.0)
            samples += [(ids[name], int(t) + shift, float(v)) for t, v in zip(s[6], values,
                                                                               strict=True)]
        grid = np.arange(energy.t_ns[0], energy.t_ns[-1], 5 * MS) + shift
        samples += [(ids["proc:rss"], int(t), float(v)) for t, v in
                    zip(grid, _rss(grid, events[0]), strict=True)]
        if cpu:
            windows = np.arange(energy.t_ns[0], energy.t_ns[-1], 100 * MS) + shift
            samples += [(ids["est:cpu-package"], int(t), float(v)) for t, v in
                        zip(windows, _cpu_power(windows, events), strict=True)]
        start, end = events[0][1] - 500 * MS, max(e[2] for e in events) + MS
        store.upsert_repetition(run_id, rep, t_start_ns=start, t_end_ns=end,
                                tail_end_ns=end + 2000 * MS, exit_code=0)
        if project_site:
            events = [("<program>", start, end)]
        _add_events(store, run_id, rep, events)
    store.add_samples(samples)
    return run_id


def _add_events(store: Store, run_id: int, rep: int, events: list[tuple[str, int, int]]) -> None:
    names = sorted({e[0] for e in events})
    manifest = {key: {"file": "train.py", "line": int(key.split(":")[1]), "col": 4, "api": api,
                      "written": written, "kind": "function", "function": "main",
                      "source": written}
                for key, api, written in SITES.values()}
    n = len(events)
    store.add_batch(run_id, {"sites": names, "rep": rep, "pid": 4242}, {
        "site": np.array([names.index(e[0]) for e in events]),
        "t_start_ns": np.array([e[1] for e in events]),
        "t_end_ns": np.array([e[2] for e in events]),
        "tid": np.full(n, 7, np.uint64), "status": np.zeros(n, np.uint8),
        "in_bytes": np.full(n, -1), "out_bytes": np.full(n, -1),
    }, manifest=manifest)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("store") / "store.sqlite")
    run_id = build_run(store)
    result = an.analyse_run(store, run_id)
    yield store, run_id, result
    store.close()


def api_row(result: an.RunAnalysis, api: str) -> dict:
    return next(r for r in result.apis if r["api"] == api)


def test_each_domain_uses_its_best_sensor_and_keeps_its_provenance(analysed):
    _, _, result = analysed
    domains = {d["domain"]: d for d in result.domains}
    assert set(domains) == {"gpu:0", "cpu-package"}
    assert domains["gpu:0"]["sensor"] == "nvml:0:energy"  # the counter, not the power fields
    assert domains["gpu:0"]["provenance"] == "measured"
    assert domains["cpu-package"]["provenance"] == "estimated"
    assert domains["cpu-package"]["model"] == "cpu-util-linear"
    assert domains["gpu:0"]["idle_W"] == GPU_IDLE
    assert any("power_avg" in n and "moving average" in n for n in result.notes)
    cpu = api_row(result, "torch.matmul")["energy"]["cpu-package"]
    assert (cpu["provenance"], cpu["model"]) == ("estimated", "cpu-util-linear")
    assert api_row(result, "torch.matmul")["all_domains"]["provenance"] == "estimated"


def test_per_call_energy_is_the_attribution_of_the_recorded_trace(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        result = an.analyse_run(store, build_run(store), method="overlap")
    events = _events(bursts(), 0)  # repetition 1, the region included: it is a call too
    energy = load_trace(H200 / "gpu_samples_energy.csv", "energy_mJ")
    iv = at.counter_intervals(energy.t_ns, energy.values, period_s=0.1)
    t0 = np.array([e[1] for e in events])
    t1 = np.array([e[2] for e in events])
    direct = at.attribute(iv, t0, t1, idle_W=GPU_IDLE)
    calls = result.calls
    mine = calls["rep"] == 1
    got = calls["energy_J"]["gpu:0"][mine][np.lexsort((-calls["t_end_ns"][mine],
                                                        calls["t_start_ns"][mine]))]
    assert got == pytest.approx(direct.energy_J[np.lexsort((-t1, t0))], rel=1e-6, abs=1e-6)


def result_api_index(result: an.RunAnalysis, api: str) -> int:
    return result.api_names.index(api)


def test_per_api_aggregates_over_sites_calls_and_repetitions(analysed):
    _, _, result = analysed
    calls = result.calls
    matmul = api_row(result, "torch.matmul")
    n_8192 = sum(1 for r in bursts() if r["api"].endswith("8192"))
    n_4096 = sum(1 for r in bursts() if r["api"].endswith("4096"))
    assert matmul["calls"] == 2 * (n_8192 + n_4096)
    assert matmul["sites"] == 2 and matmul["written"] == ["torch.matmul", "x @ w"]
    gpu = matmul["energy"]["gpu:0"]
    in_api = calls["api"] == result_api_index(result, "torch.matmul")
    assert gpu["above_idle_J"] == pytest.approx(calls["energy_J"]["gpu:0"][in_api].sum())
    per_call = gpu["per_call"]
    assert per_call["ci95_low"] < per_call["mean"] < per_call["ci95_high"]
    assert per_call["mean"] == pytest.approx(gpu["above_idle_J"] / matmul["calls"])
    assert len(gpu["per_rep_J"]) == 2
    assert gpu["per_rep_J"][0] == pytest.approx(gpu["per_rep_J"][1], rel=0.02)  # same trace
    assert gpu["rep_ci95_low"] <= gpu["rep_mean_J"] <= gpu["rep_ci95_high"]
    assert 0 < gpu["uncertainty_J"] < 0.1 * gpu["above_idle_J"]
    # the sites of the API add up to it
    sites = [r for r in result.sites if r["api"] == "torch.matmul"]
    assert sum(s["energy"]["gpu:0"]["above_idle_J"] for s in sites) == pytest.approx(
        gpu["above_idle_J"])
    assert {s["key"] for s in sites} == {"train.py:10:4", "train.py:12:8"}
    # rows come most costly first
    energies = [r["energy"]["gpu:0"]["above_idle_J"] for r in result.apis]
    assert energies == sorted(energies, reverse=True)


def test_an_api_of_one_site_has_its_sites_row_and_group_sums_are_its_calls(tmp_path,
                                                                          monkeypatch):
    """`aggregate` copies a site's row for an API of that site alone (the same calls, the same
    fit group): the rows are those made afresh for every API; the sums `Groups` keeps by
    bincount (self, with idle, below resolution) are those of each group's calls."""
    with Store(tmp_path / "store.sqlite") as store:
        run_id = build_run(store)
        result = an.analyse_run(store, run_id, compare_levels=False)
        monkeypatch.setattr(an, "by_calls", lambda *args: {})
        fresh = an.analyse_run(store, run_id, compare_levels=False)
    assert {r["sites"] for r in result.apis} >= {1, 2}  # both kinds of API
    assert json.dumps(result.apis, default=str) == json.dumps(fresh.apis, default=str)
    calls = result.calls
    for row in result.sites:
        mine = calls["site"] == result.site_keys.index(row["key"])
        for domain, e in row["energy"].items():
            assert e["raw_self_J"] == pytest.approx(
                calls["self_energy_J"][domain][mine].sum(), rel=1e-12, abs=1e-12)
            assert e["total_J"] == pytest.approx(
                calls["energy_total_J"][domain][mine].sum(), rel=1e-12)
            assert e["below_resolution_share"] == calls["below_resolution"][domain][mine].mean()


def test_a_region_is_inclusive_of_the_calls_inside_it(analysed):
    _, _, result = analysed
    calls = result.calls
    region = np.flatnonzero(calls["api"] == result_api_index(result, "region:warmup"))
    assert region.size == 2
    for i in region:
        children = calls["parent"] == i
        assert children.sum() == 3
        total = calls["self_energy_J"]["gpu:0"][i] + calls["energy_J"]["gpu:0"][children].sum()
        assert calls["energy_J"]["gpu:0"][i] == pytest.approx(total)
    row = api_row(result, "region:warmup")["energy"]["gpu:0"]
    assert row["self_J"] < 0.5 * row["above_idle_J"]  # its own time between the calls


def test_domain_totals_shares_and_repetitions(analysed):
    _, _, result = analysed
    gpu = next(d for d in result.domains if d["domain"] == "gpu:0")
    # the program's figures add up; the tail and the rest of the recording stand apart
    assert gpu["in_calls_J"] + gpu["outside_calls_J"] == pytest.approx(gpu["program_J"])
    assert gpu["program_J"] + gpu["tail_J"] + gpu["other_J"] == pytest.approx(gpu["above_idle_J"])
    assert gpu["program_J"] == pytest.approx(
        sum(r["energy"]["gpu:0"]["above_idle_J"] for r in result.per_rep))
    assert gpu["role"] == "disjoint" and gpu["addable"]
    assert gpu["total_J"] == pytest.approx(gpu["idle_J"] + gpu["above_idle_J"])
    # calls share the sensor intervals cut by a repetition's start or end: up to that much over
    assert 0.95 < result.share_in_calls["gpu:0"] <= 1.0 + gpu["resolution_J"] / gpu["program_J"]
    assert -gpu["outside_calls_J"] <= gpu["outside_calls_noise_J"]
    assert len(result.per_rep) == 2
    for rep in result.per_rep:
        e = rep["energy"]["gpu:0"]
        assert e["in_calls_J"] == pytest.approx(e["above_idle_J"], rel=0.02)
        assert e["tail_J"] == pytest.approx(0.0, abs=20.0)  # the trace ends idle
        assert rep["calls"] == len(bursts()) + 1


def test_memory_per_call(analysed):
    _, _, result = analysed
    calls = result.calls
    first = np.flatnonzero((calls["rep"] == 1) & (calls["parent"] >= 0))[0]
    assert calls["rss_start_B"][first] == RSS_BASE
    assert calls["rss_peak_B"][first] == RSS_PEAK
    assert calls["rss_end_B"][first] == RSS_AFTER
    later = (calls["rep"] == 1) & (calls["t_start_ns"] > calls["t_end_ns"][first] + 10 * MS)
    assert np.all(calls["rss_peak_B"][later] == RSS_AFTER)
    mem = load_trace(H200 / "gpu_samples_power.csv", "mem_used_B")
    long = np.argmax(calls["duration_s"] * (calls["rep"] == 1) * (calls["parent"] >= 0))
    inside = (mem.t_ns >= calls["t_start_ns"][long]) & (mem.t_ns <= calls["t_end_ns"][long])
    assert calls["gpu_mem_peak_B"][long] >= mem.values[inside].max()
    row = api_row(result, "torch.matmul")["memory"]
    assert row["rss_peak_max_B"] == RSS_PEAK
    # issue 13: each API's own memory, not the process's peak: above the level its call began
    assert row["rss_peak_above_start_max_B"] == RSS_PEAK - RSS_BASE
    assert row["rss_transient_mean_B"] <= row["rss_peak_above_start_mean_B"]


def test_intensities_are_stored_with_the_run(analysed):
    store, run_id, result = analysed
    result = an.analyse_run(store, run_id, method="auto", compare_levels=False)
    stored = store.result(run_id, "intensities")
    assert stored == json.loads(json.dumps(result.to_json()["intensities"]))
    gpu = stored["gpu:0"]
    assert gpu["asked"] == "auto" and gpu["method"] in ("overlap", "intensity")
    assert gpu["fell_back"] == (gpu["method"] == "overlap")
    assert set(gpu["apis"]) == {"torch.matmul", "torch.mm", "region:warmup"}
    assert all(a["intensity_W"] > 0 and a["busy_s"] > 0 for a in gpu["apis"].values())


def test_json_and_csv_exports(analysed):
    _, _, result = analysed
    text = json.dumps(result.to_json(include_calls=True), allow_nan=False)
    assert json.loads(text)["apis"][0]["energy"]["gpu:0"]["provenance"] == "measured"
    tables = result.tables_csv()
    apis = list(csv.DictReader(tables["apis"].splitlines()))
    assert {r["api"] for r in apis} == {"torch.matmul", "torch.mm", "region:warmup"}
    row = next(r for r in apis if r["api"] == "torch.mm")
    assert row["cpu-package provenance"] == "estimated"
    assert row["cpu-package model"] == "cpu-util-linear"
    assert row["gpu:0 provenance"] == "measured"
    assert row["all_domains_provenance"] == "estimated"
    assert float(row["gpu:0 above_idle_J"]) == pytest.approx(
        api_row(result, "torch.mm")["energy"]["gpu:0"]["above_idle_J"])
    sites = list(csv.DictReader(tables["sites"].splitlines()))
    assert {r["key"] for r in sites} >= {"train.py:10:4", "train.py:12:8", "train.py:14:8"}


def test_gpu_only_totals_are_measured_and_missing_idle_is_estimated(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        run_id = build_run(store, cpu=False, idle=False, reps=1)
        result = an.analyse_run(store, run_id, method="overlap")
    gpu = result.domains[0]
    assert gpu["idle_source"].startswith("estimated")
    assert 120 <= gpu["idle_W"] <= 131
    assert api_row(result, "torch.matmul")["all_domains"]["provenance"] == "measured"
    assert result.intensities["gpu:0"] == {"asked": "overlap", "method": "overlap",
                                           "fell_back": False}


def test_project_level_total_against_method_level_calls(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        method_run = build_run(store, cpu=False, reps=1)
        project_run = build_run(store, cpu=False, reps=1, level="project", project_site=True)
        result = an.analyse_run(store, project_run)
    levels = result.levels
    assert (levels["project_run"], levels["method_run"]) == (project_run, method_run)
    gpu = levels["domains"]["gpu:0"]
    assert 0.95 < gpu["ratio"] <= 1.01  # nearly all of the program's energy is in the calls
    assert gpu["project_J"] == pytest.approx(result.per_rep[0]["energy"]["gpu:0"]["above_idle_J"])


def test_the_programs_own_cpu_share_is_above_idle_and_never_added(tmp_path):
    """est:cpu-process (model process-cpu-share) reads above idle: its idle is 0 W, not a guess
    from quiet intervals, and it stays out of the cross-domain total (it overlaps cpu-package)."""
    with Store(tmp_path / "s.sqlite") as store:
        run_id = build_run(store, reps=1)
        sensor = store.add_sensor(
            run_id, name="est:cpu-process", domain="cpu-process", unit="W", kind="power",
            provenance="estimated", model="process-cpu-share", period_s=0.1)
        rep = store.repetitions(run_id)[0]
        grid = np.arange(rep["t_start_ns"], rep["tail_end_ns"], 100 * MS)
        watts = 2.0 + 0.1 * (-1.0) ** np.arange(grid.size)  # about 2 W of its own
        store.add_samples([(sensor, int(t), float(w)) for t, w in zip(grid, watts, strict=True)])
        result = an.analyse_run(store, run_id, method="overlap")
    own = next(d for d in result.domains if d["domain"] == "cpu-process")
    assert own["idle_W"] == 0.0 and own["idle_source"].startswith("0 W")
    assert own["above_idle_J"] == pytest.approx(own["total_J"])
    assert own["above_idle_J"] == pytest.approx(2.0 * (grid[-1] - grid[0]) / 1e9, rel=0.01)
    row = api_row(result, "torch.matmul")
    assert row["energy"]["cpu-process"]["above_idle_J"] > 0
    assert "cpu-process" not in row["all_domains"]["domains"]


def test_calls_inside_a_project_level_program_nest_under_it(tmp_path):
    """The server stores `<program>` on thread 0; a region the program records on its own thread
    lies inside it, so it takes all of its intervals' energy (it used to get half: two threads)."""
    with Store(tmp_path / "s.sqlite") as store:
        run_id = store.create_run(program="sweep.py", level="project", idle={})
        sensor = store.add_sensor(
            run_id, name="est:cpu-process", domain="cpu-process", unit="W", kind="power",
            provenance="estimated", model="process-cpu-share", period_s=0.1)
        start, end = 1_000 * MS, 11_000 * MS
        grid = np.arange(start, end + 2_000 * MS, 100 * MS)
        store.add_samples([(sensor, int(t), 2.0) for t in grid])  # 2 W throughout
        store.upsert_repetition(run_id, 1, t_start_ns=start, t_end_ns=end,
                                tail_end_ns=end + 2_000 * MS, exit_code=0)
        for site, t0, t1, tid in (("region:train", 3_000 * MS, 9_000 * MS, 7),
                                  ("<program>", start, end, 0)):
            store.add_batch(run_id, {"sites": [site], "rep": 1, "pid": 4242}, {
                "site": np.array([0]), "t_start_ns": np.array([t0]),
                "t_end_ns": np.array([t1]), "tid": np.array([tid], np.uint64),
                "status": np.zeros(1, np.uint8), "in_bytes": np.full(1, -1),
                "out_bytes": np.full(1, -1)})
        result = an.analyse_run(store, run_id, method="overlap")
    region = api_row(result, "region:train")["energy"]["cpu-process"]
    program = api_row(result, "<program>")["energy"]["cpu-process"]
    assert region["above_idle_J"] == pytest.approx(2.0 * 6.0, rel=0.02)
    assert program["above_idle_J"] == pytest.approx(2.0 * 10.0, rel=0.02)  # inclusive
