"""The repetitions' common factor, for `fecomlite report A B`: on a machine whose speed drifts
between repetitions (a VM's neighbours, contention, the idle level under the above-idle
figures), every API of a repetition gets dearer or cheaper together. That drift is in each
API's spread between repetitions and hides an API's own change behind it.

Model, within each run x: log(energy per call of API a in repetition r) = the API's level in the
run + loading_a × factor_r + noise. The loading is how much of the API's cost the drift moves:
on a contended VM a small element-wise call's per-call energy halves in a quiet repetition
while a large matrix product's moves by 15 % (its fixed compute dominates), so one factor with
the same size for every API leaves most of the drift in place (measured: 82 % of the spread
left on `torch.matmul` in a real pair, 13 % with loadings). The factor and the loadings are the
first singular pair of the APIs' deviations from their own mean in each run (both runs'
repetitions together, each run centred on its own: a run's level never enters the factor, and
neither does an API's change between the runs).

Between the runs, each API's change (log of B's mean over A's, after the factor) is the
program's change plus the machine's: a change common to all APIs (a run wholly dearer) and the
factor's drift between the runs (the loading × how far it moved). That line, change = c + d ×
loading, is fitted across the APIs by Theil–Sen (medians of pairwise slopes: one API's change,
however large, does not move it), and an API's own change is its distance from the line.

Between the runs, the APIs do not all follow the line: a machine whose speed moved between two
runs moves each API by more than its loading says (measured on this project's VM, identical
code 10 minutes apart, quiet: whole runs 20–45 % cheaper, and each API ±8 % about the line where
its repetitions said ±3 %). That scatter is a random effect of each (API, run) that more
repetitions do not shrink; it is estimated from the pair itself, across its APIs, as the
variance τ² at which the median of distance² / (its expected value from the repetitions + τ²)
is χ²₁'s median (a robust random-effects scale: a median, so that the few APIs that changed do
not make it), refined by the mean of those ratios over the APIs within 3σ of the line at it
(a mean is far less noisy than a median of χ²₁ ratios), each API's distance taken from the
line fitted without it (a robust line through few APIs passes through some of them, whose
distances of 0 would make the median), and it joins each API's noise (`between_runs`).

Honesty of the spread left: the factor is fitted to the same repetitions it is removed from,
so it takes some noise with it (on pure noise, the first singular pair takes the largest share
there is), and the line's error joins each API's distance from it. Both are calibrated by
simulating the whole procedure on pure noise of the same shape (APIs, repetitions of each
run): `scale` is how much the spread left understates an API's distance from the line, and
`dof_share` the share of the repetitions' degrees of freedom the spread left keeps. Pure noise
is the worst case: where a real drift dominates, the factor is fixed by it and takes little
noise. Guard rails: fewer than MIN_APIS APIs, or one API making more than MAX_LEVERAGE of the
factor (it would be that API's own noise), and the factor is not used.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

MIN_APIS = 4  # a factor, its loadings and a line of two parameters across the APIs
MIN_REPETITIONS = 3  # per run: with two, the factor leaves one degree of freedom in all
MAX_LEVERAGE = 0.5  # an API's share of the factor beyond which the factor would be its own
MAX_APIS = 24  # the factor is fitted to this many APIs at most, the costliest
SIMULATIONS = 2000  # draws that calibrate `scale` and `dof_share` (their error: ~3 %)
CHI2_1_MEDIAN = 0.454936423119572  # the median of χ² with one degree of freedom
TRIM_Z = 3.0  # an API this many σ off the line is left out of the scatter's mean: it changed
TRIMMED_MEAN = 0.97331  # the mean of χ²₁ below TRIM_Z² (P(χ²₃ ≤ 9) / P(χ²₁ ≤ 9))


@dataclass
class RepetitionFactor:
    """The repetitions' common factor of two runs and how the comparison uses it. removed:
    whether it is used (else `why` says why not); apis: the APIs it rests on; loadings: API →
    its loading; factors: each run's factor per compared repetition (log scale, centred);
    common: API → the runs' common change at its loading (log scale, c + d × loading, the line
    through all of them); spread_removed: the share of those APIs' variance between
    repetitions the factor took (their noise, `calibration`'s σ², against it); scale,
    dof_share: per API, the calibration of the spread left; between_runs: τ², the variance of an
    API's change beyond the line that its repetitions do not explain (log scale, the change
    between the runs: each run's share is half), and its degrees of freedom: the APIs' less
    the line's two (module docstring)."""

    removed: bool
    why: str
    apis: list[str] = field(default_factory=list)
    loadings: dict[str, float] = field(default_factory=dict)
    factors: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))
    common: dict[str, float] = field(default_factory=dict)
    spread_removed: float = math.nan
    scale: dict[str, float] = field(default_factory=dict)
    dof_share: dict[str, float] = field(default_factory=dict)
    between_runs: float = 0.0
    between_runs_dof: float = math.inf

    def adjusted(self, api: str, reps: tuple[np.ndarray, np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """An API's energy per call in each compared repetition of A and B without the factor
        and, in B, without the runs' common change at its loading (B then differs from A by the
        API's own change); None for an API without a loading or with missing repetitions."""
        loading = self.loadings.get(api)
        if loading is None or any(r.size != f.size for r, f in zip(reps, self.factors,
                                                                   strict=True)):
            return None
        return (reps[0] * np.exp(-loading * self.factors[0]),
                reps[1] * np.exp(-loading * self.factors[1] - self.common[api]))


def _first_pair(deviations: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loadings (APIs), factor (repetitions, unit length) and leverages of the first singular
    pair of `deviations` (..., APIs, repetitions)."""
    u, s, vt = np.linalg.svd(deviations, full_matrices=False)
    return u[..., :, 0] * s[..., None, 0], vt[..., 0, :], u[..., :, 0] ** 2


def _theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intercept and slope of y on x (..., points): the median of the pairwise slopes, then the
    median of y − slope × x; pairs with nearly equal x are left out (slope 0 when none is
    left)."""
    i, j = np.triu_indices(x.shape[-1], 1)
    dx, dy = x[..., j] - x[..., i], y[..., j] - y[..., i]
    wide = np.abs(dx) > 1e-9 * (np.abs(x).max(axis=-1, keepdims=True) + 1e-300)
    slopes = np.where(wide, dy / np.where(wide, dx, 1.0), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row: no pair wide enough
        slope = np.nan_to_num(np.nanmedian(slopes, axis=-1))
    return np.median(y - slope[..., None] * x, axis=-1), slope


def _fit(logs: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """The procedure on log energies per call (..., APIs, repetitions of run A / B): loadings,
    factor, leverages, the line, each API's change and its distance from the line, and its
    spread left (pooled within-run variance of the logs without the factor, repetitions − 2
    degrees of freedom)."""
    n_a = logs[0].shape[-1]
    centred = [x - x.mean(axis=-1, keepdims=True) for x in logs]
    deviations = np.concatenate(centred, axis=-1)
    loadings, factor, leverage = _first_pair(deviations)
    left = deviations - loadings[..., :, None] * factor[..., None, :]
    adjusted = [x - loadings[..., :, None] * f[..., None, :]
                for x, f in zip(logs, (factor[..., :n_a], factor[..., n_a:]), strict=True)]
    change = adjusted[1].mean(axis=-1) - adjusted[0].mean(axis=-1)
    c, d = _theil_sen(loadings, change)
    common = c[..., None] + d[..., None] * loadings
    return {"loadings": loadings, "factor": factor, "leverage": leverage,
            "common": common, "change": change, "distance": change - common,
            "variance": (left**2).sum(axis=-1) / (deviations.shape[-1] - 2),
            "raw_variance": (deviations**2).sum(axis=-1) / (deviations.shape[-1] - 2)}


def calibration(loadings: np.ndarray, factor: np.ndarray, sigmas: np.ndarray, n_a: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per API (scale, dof_share) of its spread left, from the procedure run on data like
    these under no change between the runs: the fitted loadings × factor plus noise of each
    API's `sigmas` (a fixed seed: the same data give the same figures). scale: E[distance²]
    over E[variance left] × (1/n_a + 1/n_b); dof_share: E[variance left] over σ²."""
    rng = np.random.default_rng(30)
    n = factor.size
    drift = loadings[:, None] * factor[None, :]
    draws = drift + sigmas[:, None] * rng.standard_normal((SIMULATIONS, *drift.shape))
    fit = _fit((draws[..., :n_a], draws[..., n_a:]))
    variance = fit["variance"].mean(axis=0)
    scale = (fit["distance"] ** 2).mean(axis=0) / (variance * (1 / n_a + 1 / (n - n_a)))
    return scale, variance / sigmas**2


def left_out_distances(loadings: np.ndarray, change: np.ndarray) -> np.ndarray:
    """Each API's distance from the line (`_theil_sen`) through the other APIs."""
    out = np.empty_like(change)
    for i in range(change.size):
        others = np.arange(change.size) != i
        c, d = _theil_sen(loadings[others], change[others])
        out[i] = change[i] - (c + d * loadings[i])
    return out


def _root(statistic: Callable[[np.ndarray], float], distance2: np.ndarray,
          expected: np.ndarray, target: float) -> float:
    """The τ² ≥ 0 at which statistic(distance² / (expected + τ²)), which falls as τ² grows,
    is `target` (bisection; 0 where it is there already at 0)."""
    if not distance2.size or statistic(distance2 / expected) <= target:
        return 0.0
    low, high = 0.0, float(distance2.max()) / min(target, 0.5)  # every ratio below target
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if statistic(distance2 / (expected + mid)) > target \
            else (low, mid)
    return (low + high) / 2


def between_runs_variance(distance: np.ndarray, expected: np.ndarray) -> float:
    """τ² (module docstring): from the median (robust: a few changed APIs do not make it),
    then, over the APIs within TRIM_Z of the line at that τ², from the mean, which is
    several times less noisy than the median of χ²₁ ratios (the mean of χ²₁ cut at TRIM_Z²
    is TRIMMED_MEAN); a few rounds, until the APIs kept no longer change."""
    distance2 = distance**2
    tau2 = _root(np.median, distance2, expected, CHI2_1_MEDIAN)
    for _ in range(10):
        kept = distance2 <= TRIM_Z**2 * (expected + tau2)
        new = _root(np.mean, distance2[kept], expected[kept], TRIMMED_MEAN)
        if new == tau2:
            break
        tau2 = new
    return tau2


def estimate(series: dict[str, tuple[np.ndarray, np.ndarray]], eligible: list[str]
             ) -> RepetitionFactor:
    """The factor of both runs from `series` (API → each compared repetition's energy per call
    in run A and in run B), fitted to the first MAX_APIS of the `eligible` APIs (enough calls
    to be resolved, costliest first) with a positive figure in every compared repetition of
    both runs; the others are judged as measured."""
    sizes = [max((s[i].size for s in series.values()), default=0) for i in (0, 1)]
    if min(sizes) < MIN_REPETITIONS:
        return RepetitionFactor(False, (
            f"{min(sizes)} repetitions compared in a run; with fewer than {MIN_REPETITIONS} "
            "the factor leaves almost no spread to judge by"))
    apis = [api for api in eligible if api in series
            and all(s.size == n and np.all(np.isfinite(s)) and np.all(s > 0)
                    for s, n in zip(series[api], sizes, strict=True))][:MAX_APIS]
    if len(apis) < MIN_APIS:
        return RepetitionFactor(False, (
            f"{len(apis)} API(s) with energy in every repetition and enough calls to be "
            f"resolved; the factor, its loadings and the runs' common change need {MIN_APIS} "
            "or more, or they would be one API's own change"))
    fit = _fit(tuple(np.log(np.array([series[api][i] for api in apis])) for i in (0, 1)))
    top = int(np.argmax(fit["leverage"]))
    if fit["leverage"][top] > MAX_LEVERAGE:
        return RepetitionFactor(False, (
            f"{apis[top]} makes {fit['leverage'][top]:.0%} of the factor: it would be that "
            "API's own spread, not the repetitions'"), apis)
    # each API's noise: its spread left, less the degrees of freedom its own loading and its
    # share of the factor took from its repetitions
    n = sum(sizes)
    kept = 1 - (1 + fit["leverage"] * (n - 2)) / (n - 2)
    sigmas = np.sqrt(fit["variance"] / np.clip(kept, 0.1, 1))
    scale, share = calibration(fit["loadings"], fit["factor"], sigmas, sizes[0])
    expected = scale * fit["variance"] * (1 / sizes[0] + 1 / sizes[1])
    sign = 1.0 if np.median(fit["loadings"]) >= 0 else -1.0  # shown with most loadings > 0
    factor = sign * fit["factor"]
    return RepetitionFactor(
        True, f"fitted to {len(apis)} APIs", apis,
        {api: sign * float(v) for api, v in zip(apis, fit["loadings"], strict=True)},
        (factor[: sizes[0]], factor[sizes[0]:]),
        {api: float(v) for api, v in zip(apis, fit["common"], strict=True)},
        1 - float((fit["variance"] / share).sum()) / float(fit["raw_variance"].sum()),
        dict(zip(apis, scale.tolist(), strict=True)), dict(zip(apis, share.tolist(), strict=True)),
        between_runs_variance(left_out_distances(fit["loadings"], fit["change"]), expected),
        float(len(apis) - 2))


def describe(factor: RepetitionFactor, domain: str) -> str:
    """One line for the report: which method judged the domain's energy per call, and why."""
    if not factor.removed:
        return (f"{domain}: each API judged as measured, against its whole spread (the "
                f"repetitions' common factor is not used: {factor.why}).")
    common = [math.exp(v) - 1 for v in factor.common.values()]
    return (f"{domain}: the repetitions' common factor was removed ({factor.why}; it took "
            f"{factor.spread_removed:.0%} of their spread between repetitions); each API is "
            "judged beyond the runs' common change (from "
            f"{min(common):+.1%} to {max(common):+.1%} by API), with the APIs' own scatter "
            f"between the runs (±{math.sqrt(factor.between_runs / 2):.1%} per run) in its "
            "noise.")


def as_json(factor: RepetitionFactor) -> dict[str, object]:
    """The factor as compare.json keeps it."""
    return {"removed": factor.removed, "why": factor.why, "apis": factor.apis,
            "loadings": factor.loadings, "factors": [f.tolist() for f in factor.factors],
            "common_change": {api: math.exp(v) - 1 for api, v in factor.common.items()},
            "spread_removed": factor.spread_removed,
            "scale": factor.scale, "dof_share": factor.dof_share,
            "between_runs_per_run": math.sqrt(factor.between_runs / 2)}
