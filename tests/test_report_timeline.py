"""Downsampling for the timeline: energy kept, peaks kept, busy shares exact, sizes bounded."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fecomlite.report.timeline import busy_per_bin, peak_per_bin, rebin_power


def test_rebin_power_keeps_the_energy() -> None:
    rng = np.random.default_rng(1)
    edges = np.cumsum(rng.integers(50_000_000, 150_000_000, 5000)).astype(np.int64)
    power = rng.uniform(100, 700, edges.size - 1)
    energy = float((power * np.diff(edges) / 1e9).sum())
    bins = np.linspace(edges[0], edges[-1], 2001).astype(np.int64)
    mean = rebin_power(edges, power, bins)
    assert mean.size == 2000
    assert np.isclose((mean * np.diff(bins) / 1e9).sum(), energy, rtol=1e-9)
    assert power.min() <= mean.min() and mean.max() <= power.max()


def test_rebin_power_is_nan_outside_the_samples() -> None:
    edges = np.array([10, 20, 30], np.int64) * 1_000_000_000
    bins = np.array([0, 5, 15, 25, 40, 50], np.int64) * 1_000_000_000
    mean = rebin_power(edges, np.array([100.0, 300.0]), bins)
    assert np.isnan(mean[0]) and np.isnan(mean[-1])
    # the mean over the part of a bin that has data: a bin half outside is not diluted
    np.testing.assert_allclose(mean[1:4], [100.0, 200.0, 300.0])


def test_peak_per_bin_keeps_the_maximum() -> None:
    t = np.arange(100_000, dtype=np.int64) * 1_000_000
    v = np.sin(np.arange(t.size) / 50.0)
    v[54_321] = 5.0
    bins = np.linspace(t[0], t[-1] + 1, 2001).astype(np.int64)
    starts, peaks = peak_per_bin(t, v, bins)
    assert peaks.size <= 2000 and peaks.max() == 5.0
    assert np.all(np.diff(starts) > 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), min_size=1, max_size=40),
       st.integers(1, 30))
def test_busy_per_bin_matches_brute_force(calls: list[tuple[int, int]], nbins: int) -> None:
    t0 = np.array([a for a, _ in calls], np.int64)
    t1 = t0 + np.array([d for _, d in calls], np.int64)
    bins = np.linspace(0, 1300, nbins + 1).astype(np.int64)
    bins = np.unique(bins)
    got = busy_per_bin(t0, t1, bins)
    want = []
    for a, b in zip(bins[:-1], bins[1:], strict=True):
        overlap = np.clip(np.minimum(t1, b) - np.maximum(t0, a), 0, None).sum()
        want.append(min(1.0, overlap / (b - a)))
    np.testing.assert_allclose(got, want, atol=1e-9)
