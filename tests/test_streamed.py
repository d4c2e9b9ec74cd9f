"""The streamed attribution (fecomlite/analysis/streamed.py, sweep.py, streamed_run.py) agrees
with the whole-run analysis to 1e-9 relative: on generated runs with nested calls on several
threads and processes, chunks cut anywhere, and batches so small that nested calls straddle
their boundaries."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fecomlite.analysis import attribution as at
from fecomlite.analysis import sweep_fast
from fecomlite.analysis.run_analysis import analyse_run, finite_or_zero
from fecomlite.analysis.streamed_run import analyse_streamed, group_rows
from fecomlite.analysis.sweep import Threads, batches
from fecomlite.runtime.batch_codec import RAISED
from fecomlite.store import Store

SITES = {f"a.py:{i}:0": f"np.api{i % 3}" for i in range(5)}
NOT_STREAMED = {"median"}  # per call; not mergeable (module docstring of streamed_run)


def _tree(draw: Any, start: int, depth: int) -> tuple[list[tuple[int, int, int, int]], int]:
    """Calls (start, end, site, status) of one top-level call and its nested ones, and its end."""
    site = draw(st.integers(0, len(SITES) - 1))
    t = start + draw(st.integers(0, 3_000_000))
    calls = []
    for _ in range(draw(st.integers(0, 3)) if depth < 3 else 0):
        inner, t = _tree(draw, t, depth + 1)
        calls += inner
    end = t + draw(st.integers(1, 40_000_000))
    status = RAISED if draw(st.integers(0, 20)) == 0 else 0
    return [(start, end, site, status), *calls], end


@st.composite
def runs(draw: Any) -> dict[str, Any]:
    """Per (pid, tid): top-level calls with nested ones, one after another from a random start;
    two repetitions at most, one after the other."""
    threads = draw(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 3)), min_size=1,
                            max_size=3, unique=True))
    reps = draw(st.integers(1, 2))
    events = []
    for rep in range(1, reps + 1):
        base = rep * 10 * 10**9
        for pid, tid in threads:
            t = base + draw(st.integers(0, 10**8))
            for _ in range(draw(st.integers(1, 6))):
                calls, t = _tree(draw, t, 0)
                t += draw(st.integers(0, 2 * 10**8))
                events += [(rep, pid, tid, *c) for c in calls]
    return {"events": events, "reps": reps, "cuts": draw(st.integers(1, 9)),
            "batch": draw(st.integers(1, 12)), "method": draw(st.sampled_from(
                ["overlap", "intensity", "auto"])), "seed": draw(st.integers(0, 2**16))}


def _store(path: Any, spec: dict[str, Any]) -> tuple[Store, int]:
    rng = np.random.default_rng(spec["seed"])
    store = Store(path)
    run = store.create_run(program="a.py", idle={"est:cpu-package": 20.0})
    ids = store.site_ids(run, SITES, {k: {"api": v} for k, v in SITES.items()})
    keys = list(SITES)
    ev = np.array(spec["events"], np.int64)
    sensor = store.add_sensor(run, name="est:cpu-package", domain="cpu-package", unit="W",
                              kind="power", period_s=0.1, provenance="estimated",
                              model="cpu-util-linear")
    dram = store.add_sensor(run, name="est:dram", domain="dram", unit="W", kind="power",
                            period_s=0.1, provenance="estimated", model="cpu-util-linear")
    end = int(ev[:, 4].max()) + 2 * 10**9
    store.add_samples([(sensor, int(t), 22.0 + 15 * rng.random())
                       for t in range(5 * 10**9, end, 10**8)])
    rss = store.add_sensor(run, name="proc:rss", domain="process-memory", unit="B",
                           kind="gauge", provenance="measured", period_s=0.005)
    store.add_samples([(rss, int(t), float(10**9 + (t // 10**6 % 997) * 4096 * rng.random()))
                       for t in range(5 * 10**9, end, 5 * 10**6)])
    # read at the same instants as the package (they share the sweep's sums), no baseline
    store.add_samples([(dram, int(t), 3.0 + rng.random()) for t in range(5 * 10**9, end, 10**8)])
    for rep in range(1, spec["reps"] + 1):
        mine = ev[ev[:, 0] == rep]
        store.upsert_repetition(run, rep, t_start_ns=int(mine[:, 3].min()) - 10**8,
                                t_end_ns=int(mine[:, 4].max()) + 10**8,
                                tail_end_ns=int(mine[:, 4].max()) + 10**9, exit_code=0)
        for pid in np.unique(mine[:, 1]):
            part = mine[mine[:, 1] == pid]
            part = part[np.argsort(part[:, 4], kind="stable")]  # by end, as the probe sends
            for chunk in np.array_split(part, min(spec["cuts"], len(part))):
                store.add_events(run, rep, int(pid), {
                    "site_id": np.array([ids[keys[s]] for s in chunk[:, 5]]),
                    "tid": chunk[:, 2], "t_start_ns": chunk[:, 3], "t_end_ns": chunk[:, 4],
                    "status": chunk[:, 6], "in_bytes": np.full(len(chunk), -1),
                    "out_bytes": np.full(len(chunk), -1)})
    return store, run


def _same(a: Any, b: Any, where: str, scale: float = 1.0) -> None:
    """Equal, numbers within 1e-9 relative, or 1e-9 of `scale` (the run's energy: a self
    energy is a difference of nearly equal sums, whose rounding the two paths do apart)."""
    if isinstance(a, dict):
        for key, value in b.items():
            if key not in NOT_STREAMED:
                _same(a[key], value, f"{where}.{key}", scale)
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]", scale)
    elif isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or math.isnan(a) or math.isnan(b):
            assert (a is None or math.isnan(a)) and (b is None or math.isnan(b)), where
        else:
            assert b == pytest.approx(a, rel=1e-9, abs=1e-9 * scale), where
    else:
        assert a == b, where


@contextlib.contextmanager
def _sweep_path(path: str) -> Iterator[None]:
    """The C sweep (`sweep_fast`) or the numpy one, for the analyses made inside."""
    before = os.environ.get(sweep_fast.ENV)
    os.environ[sweep_fast.ENV] = path
    try:
        yield
    finally:
        if before is None:
            del os.environ[sweep_fast.ENV]
        else:
            os.environ[sweep_fast.ENV] = before


PATHS = ["c", "numpy"] if sweep_fast.Sweep is not None else ["numpy"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          report_multiple_bugs=False)
@given(runs())
def test_streamed_figures_agree_with_the_whole_run_analysis(tmp_path_factory, spec):
    """Either sweep (C where built, numpy)."""
    store, run = _store(tmp_path_factory.mktemp("s") / "s.sqlite", spec)
    whole = analyse_run(store, run, spec["method"], compare_levels=False)
    for path in PATHS:
        with _sweep_path(path):
            got = analyse_streamed(store, run, spec["method"], batch_events=spec["batch"])
        _agree(got, whole)
    store.close()


def _agree(got: Any, whole: Any) -> None:
    """The streamed figures are the whole-run analysis' (but the per-call median)."""
    assert [d["domain"] for d in got.domains] == [d["domain"] for d in whole.domains] != []
    scale = max([1.0, *(abs(d["above_idle_J"]) for d in whole.domains)])
    for mine, theirs in zip(got.domains, whole.domains, strict=True):
        _same(theirs, mine, mine["domain"], scale)
    info = {d["domain"]: d for d in whole.domains}
    above = {d["domain"]: d["program_J"] if d["program_J"] > finite_or_zero(d["noise_J"])
             else math.nan for d in whole.domains}
    n_sites = len(got.sites)
    tables = (("sites", "key", np.arange(n_sites), n_sites, got.site_fit),
              ("apis", "api", got.api_of_site, len(got.api_names),
               got.fit_of_api))
    for kind, label, group, count, fit in tables:
        rows = group_rows(got, group, count, fit, info, above)
        names = ([s["key"] for s in got.sites] if kind == "sites" else got.api_names)
        theirs = {r[label]: r for r in getattr(whole, kind)}
        mine = {name: r for name, r in zip(names, rows, strict=True) if r["calls"]}
        assert mine.keys() == theirs.keys()
        for name, row in mine.items():
            _same(theirs[name], row, f"{kind}.{name}", scale)


def test_calls_that_overlap_without_nesting_are_nested_as_the_whole_run_nests_them(tmp_path):
    """Calls on one thread that overlap without one inside the other (a data loader's, as the
    long-training benchmark makes them) beside nested ones: each sweep nests them as
    `attribution.nesting` does (the latest call a level up, climbed until it contains the call),
    so the figures are the whole-run analysis'."""
    rng = np.random.default_rng(5)
    events, t = [], 10 * 10**9
    for _ in range(700):  # an outer call around two inner ones, three loader calls beside: over
        # 2,048 calls a thread, so that the C sweep drops the records it no longer needs
        events += [(1, 1, 1, t, t + 9 * 10**7, 0, 0), (1, 1, 1, t + 10**6, t + 4 * 10**7, 1, 0),
                   (1, 1, 1, t + 4 * 10**7, t + 8 * 10**7, 2, 0)]
        for start in np.sort(rng.integers(0, 10**8, 3)).tolist():
            events.append((1, 1, 2, t + start, t + start + int(rng.integers(10**6, 6 * 10**7)),
                           3 + int(rng.integers(0, 2)), 0))
        t += 10**8
    spec = {"events": events, "reps": 1, "cuts": 5, "batch": 10**6, "method": "auto",
            "seed": 4}
    store, run = _store(tmp_path / "s.sqlite", spec)
    whole = analyse_run(store, run, "auto", compare_levels=False)
    for path in PATHS:
        with _sweep_path(path):
            _agree(analyse_streamed(store, run, "auto"), whole)
    store.close()


def test_a_call_open_across_batches_keeps_its_parent(tmp_path):
    """An outer call around many inner ones, released two at a time: every inner call's parent
    is the outer call, carried from batch to batch until it ends."""
    store = Store(tmp_path / "s.sqlite")
    run = store.create_run(program="a.py")
    ids = store.site_ids(run, SITES, {k: {"api": v} for k, v in SITES.items()})
    inner = np.arange(10, 100, 10, dtype=np.int64)
    chunks = [(inner[i:i + 2], inner[i:i + 2] + 5) for i in range(0, 8, 2)]
    chunks.append((np.array([inner[8], 0]), np.array([inner[8] + 5, 1000])))  # ends last
    for t0, t1 in chunks:  # as the probe sends them: by end, the outer call in the last
        outer = t0 == 0
        store.add_events(run, 1, 9, {
            "site_id": np.where(outer, ids["a.py:0:0"], ids["a.py:1:0"]),
            "tid": np.ones(t0.size, np.int64), "t_start_ns": t0, "t_end_ns": t1,
            "status": np.zeros(t0.size, np.int64), "in_bytes": np.full(t0.size, -1),
            "out_bytes": np.full(t0.size, -1)})
    seen = []
    for b in batches(store.event_chunks(run), Threads(), batch_events=2):
        starts_in = b.columns["t_start_ns"]
        for i in range(b.carried, b.size):
            p = b.parent[i]
            seen.append((int(starts_in[i]), int(starts_in[p]) if p >= 0 else None))
    assert seen[0] == (0, None)
    assert all(parent == 0 for _, parent in seen[1:])
    assert len(seen) == 10
    store.close()


def test_a_long_run_is_analysed_streamed_with_the_same_tables_and_reported(tmp_path):
    """`analyse_run` above its streaming limit: the same domain, site and API figures as the
    whole-run analysis (but the per-call median), no per-call columns, a
    note that says so; the report is written in every format from it."""
    from fecomlite.report.build import build_report
    from fecomlite.report.render import FORMATS, write_report

    spec = {"events": [], "reps": 1, "cuts": 4, "batch": 3, "method": "auto", "seed": 1}
    t = 10 * 10**9
    for step in range(40):  # an outer call around three inner ones, a loader call beside
        spec["events"] += [(1, 1, 1, t, t + 9 * 10**7, 0, 0),
                           *[(1, 1, 1, t + k * 3 * 10**7 + 10**6, t + (k + 1) * 3 * 10**7,
                              1 + k, RAISED if step == 7 and k == 1 else 0) for k in range(3)],
                           (1, 1, 2, t + 5 * 10**6, t + 4 * 10**7, 4, 0)]
        t += 10**8 + step * 10**5
    store, run = _store(tmp_path / "s.sqlite", spec)
    whole = analyse_run(store, run, compare_levels=False)
    streamed = analyse_run(store, run, compare_levels=False, stream_above=0)
    assert streamed.calls["t_start_ns"].size == 0 < whole.calls["t_start_ns"].size
    assert any("analysed streamed" in note for note in streamed.notes)
    _same(whole.to_json()["domains"], streamed.to_json()["domains"], "domains")
    _same(whole.to_json()["per_rep"], streamed.to_json()["per_rep"], "per_rep")
    for kind in ("sites", "apis"):
        for mine, theirs in zip(getattr(streamed, kind), getattr(whole, kind), strict=True):
            _same(theirs, mine, kind)
    written = write_report(build_report(store, run, analysis=streamed), tmp_path / "out",
                           FORMATS)
    assert {p.name for p in written} >= {"index.html", "report.json", "apis.csv"}
    store.close()


def _reference_nesting(t_start_ns: np.ndarray, t_end_ns: np.ndarray,
                       thread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`attribution.nesting` as it was before it counted ends by binary search: starts and ends
    merged into one sorted stream, depth their running count."""
    t0 = np.asarray(t_start_ns, np.int64)
    t1 = np.maximum(np.asarray(t_end_ns, np.int64), t0)
    n = t0.size
    th = np.asarray(thread, np.int64)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ids = np.arange(n)
    # events: ends (kind 0) before starts (kind 1) at one instant; outer starts first (later
    # end), inner ends first (later start); zero-length calls end after every start (kind 2)
    kind = np.concatenate((np.ones(n, np.int64), np.where(t1 > t0, 0, 2)))
    time = np.concatenate((t0, t1))
    tie = np.concatenate((-t1, -t0))
    who = np.concatenate((ids, ids))
    order = np.lexsort((tie, kind, time, np.concatenate((th, th))))
    step = np.where(kind[order] == 1, 1, -1)
    depth_after = np.cumsum(step)
    is_start = kind[order] == 1
    pos = np.flatnonzero(is_start)
    call = who[order][is_start]
    depth = np.empty(n, np.int64)
    depth[call] = depth_after[is_start] - 1
    parent = np.full(n, -1, np.int64)
    call_at = who[order]
    for d in range(1, int(depth.max()) + 1):
        outer = pos[depth[call] == d - 1]
        inner = depth[call] == d
        found = np.searchsorted(outer, pos[inner]) - 1
        parent[call[inner]] = np.where(found >= 0, call_at[outer[np.maximum(found, 0)]], -1)
    return at._contained(parent, t0, t1, th)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30), st.integers(0, 2)),
                min_size=1, max_size=30), st.booleans())
def test_nesting_is_the_merged_stream_count(calls, in_start_order):
    """Overlapping, tied, zero-length calls on three threads: the same parents and depths as
    the merged-stream count, whether the calls come in start order or not."""
    if in_start_order:
        calls = sorted(calls, key=lambda c: c[0])
    t0 = np.array([c[0] for c in calls], np.int64)
    t1 = t0 + np.array([c[1] for c in calls], np.int64)
    th = np.array([c[2] for c in calls], np.int64)
    want, got = _reference_nesting(t0, t1, th), at.nesting(t0, t1, th)
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])


def test_a_project_level_program_event_joins_its_main_thread_when_streamed(tmp_path):
    """The server stores a project-level run's `<program>` event on thread 0; both paths move
    it onto its process's main thread (the first other event's), so the calls inside it nest
    in it alike."""
    from fecomlite.runtime.batch_codec import PROJECT_SITE

    spec = {"events": [(1, 1, 7, 10 * 10**9 + k * 10**8, 10 * 10**9 + k * 10**8 + 6 * 10**7,
                        k % 3, 0) for k in range(30)], "reps": 1, "cuts": 3, "batch": 4,
            "method": "overlap", "seed": 2}
    store, run = _store(tmp_path / "s.sqlite", spec)
    program = store.site_ids(run, {"<program>": PROJECT_SITE}, {"<program>": {"api": PROJECT_SITE}})
    store.add_events(run, 1, 1, {
        "site_id": np.array([program["<program>"]]), "tid": np.zeros(1, np.int64),
        "t_start_ns": np.array([10 * 10**9 - 10**6]), "t_end_ns": np.array([14 * 10**9]),
        "status": np.zeros(1, np.int64), "in_bytes": np.full(1, -1), "out_bytes": np.full(1, -1)})
    whole = analyse_run(store, run, "overlap", compare_levels=False)
    streamed = analyse_run(store, run, "overlap", compare_levels=False, stream_above=0)
    scale = max(abs(d["above_idle_J"]) for d in whole.domains)
    program_row = next(r for r in whole.apis if r["api"] == PROJECT_SITE)
    assert program_row["energy"]["cpu-package"]["raw_self_J"] < program_row["energy"][
        "cpu-package"]["raw_above_idle_J"]  # its calls nest in it: not all of it is its own
    for kind in ("sites", "apis"):
        for mine, theirs in zip(getattr(streamed, kind), getattr(whole, kind), strict=True):
            _same(theirs, mine, kind, scale)
    store.close()


def test_calls_stored_during_the_sweeps_are_named_in_a_note(tmp_path, monkeypatch):
    """A run still recording gets chunks between the two sweeps: the analysis says its figures
    may count them in part."""
    from fecomlite.analysis import streamed

    spec = {"events": [(1, 1, 1, 10 * 10**9 + k * 10**8, 10 * 10**9 + k * 10**8 + 5 * 10**7,
                        k % 4, 0) for k in range(20)], "reps": 1, "cuts": 2, "batch": 5,
            "method": "overlap", "seed": 3}
    store, run = _store(tmp_path / "s.sqlite", spec)
    ids = store.site_ids(run, SITES, {k: {"api": v} for k, v in SITES.items()})
    sweep_two = streamed.sweep_two

    def recording(*args: Any, **kwargs: Any) -> Any:
        store.add_events(run, 1, 1, {
            "site_id": np.array([ids["a.py:0:0"]]), "tid": np.ones(1, np.int64),
            "t_start_ns": np.array([13 * 10**9]), "t_end_ns": np.array([13 * 10**9 + 10**6]),
            "status": np.zeros(1, np.int64), "in_bytes": np.full(1, -1),
            "out_bytes": np.full(1, -1)})
        return sweep_two(*args, **kwargs)

    assert not any("still recording" in n for n in analyse_streamed(store, run).notes)
    monkeypatch.setattr(streamed, "sweep_two", recording)
    assert any("still recording" in n for n in analyse_streamed(store, run).notes)
    store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 40), min_size=0, max_size=60),
       st.lists(st.tuples(st.integers(-50, 900), st.integers(0, 400)), min_size=1, max_size=40),
       st.integers(2, 9))
def test_a_gauge_read_a_window_at_a_time_gives_what_the_whole_series_gives(
        tmp_path_factory, gaps, calls, window):
    """`GaugeWindow` (a few samples held, calls past the window finished from the store) reads
    each call's start, end, peak and resolution as `gauge_during` and `below_gauge_resolution`
    read them from the whole series: calls before the first sample and after the last, calls
    spanning many windows, and two repetitions (the second starts again at the beginning)."""
    from fecomlite.analysis.call_memory import below_gauge_resolution, gauge_during
    from fecomlite.analysis.streamed_memory import GaugeWindow

    store = Store(tmp_path_factory.mktemp("g") / "s.sqlite")
    run = store.create_run(program="a.py")
    rss = store.add_sensor(run, name="proc:rss", domain="process-memory", unit="B",
                           kind="gauge", provenance="measured", period_s=0.005)
    t = np.cumsum(np.array(gaps, np.int64)) * 10
    rng = np.random.default_rng(len(gaps))
    v = rng.random(t.size) * 1e9
    store.add_samples([(rss, int(a), float(b)) for a, b in zip(t, v, strict=True)])
    gauge = GaugeWindow(store, rss, window=window)
    for _ in range(2):  # as two repetitions' batches: time goes back to the start
        t0 = np.sort(np.array([c[0] for c in calls], np.int64) * 10)
        t1 = t0 + np.array([c[1] for c in calls], np.int64) * 10
        got = gauge.during(t0, t1)
        want = (*gauge_during(t, v, t0, t1), below_gauge_resolution(t, t0, t1))
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w, equal_nan=True) if g.dtype != bool else (g == w).all()
    store.close()


def test_the_programs_gaps_are_summed_per_interval_as_the_batches_come():
    """Back-to-back calls leave a gap between every two: the streamed sweep sums them into each
    sensor interval batch by batch (kept whole they grew with the run), to the seconds the
    gaps themselves give, across batches and repetitions, a repetition without a call whole."""
    from fecomlite.analysis.streamed import Windows, _Gaps

    rng = np.random.default_rng(5)
    edges = np.arange(0, 2_000_000_001, 100_000_000, dtype=np.int64)
    spans = {1: (50_000_000, 1_100_000_000), 2: (1_200_000_000, 1_900_000_000),
             3: (1_950_000_000, 1_990_000_000)}
    gaps = _Gaps(Windows(spans), {"power": edges})
    expected: list[tuple[int, int]] = []
    for rep in (1, 2):
        a, b = spans[rep]
        t0 = np.sort(rng.integers(a - 10_000_000, b, 400))
        t1 = t0 + rng.integers(0, 3_000_000, t0.size)
        cover = a
        for s, e in zip(np.clip(t0, a, b).tolist(), np.clip(t1, a, b).tolist(), strict=True):
            if s > cover:
                expected.append((cover, s))
            cover = max(cover, e)
        if b > cover:
            expected.append((cover, b))
        for part in np.array_split(np.arange(t0.size), 7):  # batches of the sweep
            gaps.add(rep, t0[part], t1[part])
    gaps.finish()
    gaps.unseen()
    expected.append(spans[3])
    want = np.zeros(edges.size - 1)
    for s, e in expected:
        for k in range(edges.size - 1):
            want[k] += max(0, min(e, edges[k + 1]) - max(s, edges[k])) / 1e9
    assert gaps.count == len(expected)
    assert gaps.last_end == max(e for _, e in expected)
    np.testing.assert_allclose(gaps.seconds["power"], want, rtol=1e-12, atol=1e-15)
