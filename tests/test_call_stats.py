"""Per-API and per-site figures streamed over event chunks (fecomlite/analysis/call_stats.py)
agree with the whole-run analysis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fecomlite.analysis.call_stats import Moments, call_stats
from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.runtime.batch_codec import CONTINUES, RAISED
from fecomlite.store import Store

SITES = {"a.py:1:0": "np.add", "a.py:2:0": "np.add", "a.py:3:0": "np.dot", "a.py:4:0": "np.sum"}
piece = st.tuples(st.integers(0, 3), st.integers(0, 10**9), st.integers(1, 10**7),
                  st.integers(0, 1), st.sampled_from([0, RAISED, CONTINUES]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(piece, min_size=1, max_size=30), min_size=1, max_size=4))
def test_streamed_figures_agree_with_the_whole_run_analysis(tmp_path_factory, chunks):
    store = Store(tmp_path_factory.mktemp("s") / "s.sqlite")
    run = store.create_run(program="a.py")
    store.upsert_repetition(run, 1, t_start_ns=0, t_end_ns=2 * 10**9, tail_end_ns=2 * 10**9,
                            exit_code=0)
    ids = store.site_ids(run, SITES, {k: {"api": v} for k, v in SITES.items()})
    keys = list(SITES)
    for rows in chunks:
        site, t0, dur, tid, status = (np.array(c) for c in zip(*rows, strict=True))
        store.add_events(run, 1, 9, {
            "site_id": np.array([ids[keys[i]] for i in site]), "tid": tid + 1,
            "t_start_ns": t0, "t_end_ns": t0 + dur, "status": status,
            "in_bytes": np.full(len(rows), -1), "out_bytes": np.full(len(rows), -1)})
    streamed = call_stats(store, run)
    whole = analyse_run(store, run, compare_levels=False)
    for kind, name in (("apis", "api"), ("sites", "key")):
        rows = {r[name]: r for r in getattr(whole, kind)}
        got = {k: m for k, m in streamed[kind].items() if m.calls}
        assert got.keys() == rows.keys()
        for key, moments in got.items():
            assert moments.calls == rows[key]["calls"]
            assert moments.total_time_s == pytest.approx(rows[key]["total_time_s"], rel=1e-9)
            assert moments.mean_time_s == pytest.approx(rows[key]["mean_time_s"], rel=1e-9)
    cols = store.event_columns(run)
    for key, moments in streamed["sites"].items():
        mine = cols["site_id"] == ids[key]
        seconds = (cols["t_end_ns"][mine] - cols["t_start_ns"][mine]) / 1e9
        assert moments.pieces == seconds.size
        assert moments.raised == int(((cols["status"][mine] & RAISED) != 0).sum())
        if seconds.size > 1:
            assert moments.piece_variance_s2 == pytest.approx(seconds.var(ddof=1), rel=1e-9,
                                                              abs=1e-30)
    store.close()


@given(st.lists(st.floats(0, 10), min_size=2, max_size=40), st.integers(1, 39))
def test_moments_merge_as_if_computed_at_once(values, cut):
    def of(xs: list[float]) -> Moments:
        a = np.array(xs)
        return Moments(len(xs), len(xs), 0, float(a.mean()) if xs else 0.0,
                       float(((a - a.mean()) ** 2).sum()) if xs else 0.0)

    cut = min(cut, len(values))
    merged = of(values[:cut]).merge(of(values[cut:]))
    assert merged.pieces == len(values)
    assert merged.mean_s == pytest.approx(np.mean(values), rel=1e-9, abs=1e-12)
    assert merged.piece_variance_s2 == pytest.approx(np.var(values, ddof=1), rel=1e-9, abs=1e-12)
