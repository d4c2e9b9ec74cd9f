"""What a fit's residuals say, whatever the model's form: the spread of a configuration's mean.

Shared by the linear fits (`model.fit`) and the power-law time model (`model.power_law`): the
residuals split into the repetitions' own spread and the model's misfit between configurations
(a lack-of-fit analysis), a misfit no smaller than held-out configurations show, the folds of
cross-validation (whole configurations held out, the same folds for every model so that their
held-out errors compare), and intervals on the log scale where errors are relative.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

CV_SEED = 20240917


class FitError(ValueError):
    """Data a model cannot be fitted to (too few rows, no positive energies, bad columns)."""


def bounds(mean: float, sd: float, t: float, weighting: str) -> tuple[float, float]:
    """(low, high) of mean ± t·sd. With relative errors (the spread grows with the value) the
    interval is the same on the log scale: mean ×/÷ exp(t·sd/mean), from the data's relative
    spread, never a bound at zero; with absolute errors, mean ± t·sd with the low end cut at 0
    (no energy or time is negative)."""
    if weighting == "relative" and mean > 0:
        factor = float(np.exp(t * sd / mean))
        return mean / factor, mean * factor
    return max(mean - t * sd, 0.0), mean + t * sd


@dataclass
class Components:
    """The residuals' spread: `sigma` of one row, `coef_variance` the factor of (XᵀWX)⁻¹ that
    gives the coefficients' covariance, `dof` the degrees of freedom the interval's t uses."""

    sigma: float
    dof: int
    coef_variance: float
    within: float = math.nan
    between: float = 0.0
    reps: float = 1.0


def variance_components(residuals: np.ndarray, group: np.ndarray, p: int) -> Components:
    """Residuals split as in the classical lack-of-fit analysis: pure error (repetitions about
    their configuration's mean, N − G dof) and lack of fit (configuration means about the model,
    G − p dof). Where the configuration means scatter no more than the repetitions' spread
    explains (MS_lof ≤ MS_pe), both pool into one σ on N − p dof, and a configuration's mean
    over r repetitions has variance σ²/r. Otherwise the model misses each configuration by a
    spread of its own, σ_between² = (MS_lof − MS_pe) / reps, that more repetitions do not
    shrink, and intervals use the G − p dof of the configuration means: wider, as the data say.
    (No significance test decides this: pooling after a test that lacks power, as one with
    three repetitions does, gives intervals that cover less than they say.)"""
    n, configs = residuals.size, int(group.max()) + 1
    counts = np.bincount(group, minlength=configs).astype(float)
    means = np.bincount(group, weights=residuals, minlength=configs) / counts
    pure = float(np.sum((residuals - means[group]) ** 2))
    lack = float(np.sum(counts * means**2))
    dof_pure, dof_lack = n - configs, configs - p
    if dof_pure == 0:  # one row per configuration: the ordinary residual σ
        sigma = math.sqrt(lack / dof_lack)
        return Components(sigma, dof_lack, sigma**2)
    reps = n / configs
    ms_pure = pure / dof_pure
    ms_lack = lack / dof_lack if dof_lack else 0.0
    if dof_lack == 0 or ms_lack <= ms_pure:  # no misfit beyond the repetitions' spread
        sigma = math.sqrt((pure + lack) / (n - p))
        return Components(sigma, n - p, sigma**2, within=sigma, reps=reps)
    between = math.sqrt((ms_lack - ms_pure) / reps)
    return Components(math.sqrt(ms_pure + between**2), dof_lack, ms_lack,
                      within=math.sqrt(ms_pure), between=between, reps=reps)


OUT_OF_SAMPLE_GAP = 1.5  # held-out error this many times the residual σ: a misfit unseen


def out_of_sample_floor(parts: Components, cv_rel_rmse: float) -> Components:
    """The misfit between configurations no smaller than held-out configurations show, where
    they clearly show more than the fit's own residuals (cross-validated error over
    OUT_OF_SAMPLE_GAP × σ): a repetition of a configuration the fit did not see missed by
    `cv_rel_rmse`, of which the repetitions' spread explains σ_within², the rest is misfit
    (a cache step or a load pattern between the grid's points). Below the gap the held-out
    error is what refitting on fewer configurations costs, and the residuals stand."""
    if not (math.isfinite(cv_rel_rmse) and math.isfinite(parts.within)
            and cv_rel_rmse > OUT_OF_SAMPLE_GAP * parts.sigma):
        return parts
    seen = math.sqrt(max(cv_rel_rmse**2 - parts.within**2, 0.0))
    if seen <= parts.between:
        return parts
    return dataclasses.replace(parts, between=seen, sigma=math.hypot(parts.within, seen),
                               coef_variance=max(parts.coef_variance,
                                                 parts.within**2 + parts.reps * seen**2))


def residual_sd(sigma: float, within: float, between: float, groups: int, reps: float) -> float:
    """The spread of a configuration's mean over `reps` repetitions about the model: the
    misfit between configurations and the repetitions' spread over √reps (rows without
    repetitions: the residual σ)."""
    if groups == 0 or not math.isfinite(within):
        return sigma
    return math.sqrt(between**2 + within**2 / max(reps, 1.0))


def student_t(confidence: float, dof: int) -> float:
    """Student's t quantile of a two-sided `confidence` interval on `dof` degrees of freedom."""
    from scipy import stats  # here: scipy takes a second to import

    return float(stats.t.ppf((1 + confidence) / 2, max(dof, 1)))


def fold_count(group: np.ndarray, folds: int) -> int:
    """How many folds cross-validation makes: `folds`, at least 2, at most one a configuration."""
    return min(max(folds, 2), int(group.max()) + 1)


def held_out_folds(group: np.ndarray, folds: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(train, held) row indices of k-fold cross-validation, a configuration's repetitions held
    out together (else its other repetitions would predict it); the same folds for any model
    fitted on the same groups."""
    configs = int(group.max()) + 1
    k = fold_count(group, folds)
    order = np.random.default_rng(CV_SEED).permutation(configs)
    for fold in range(k):
        held = np.flatnonzero(np.isin(group, order[fold::k]))
        yield np.setdiff1d(np.arange(group.size), held), held


def saved_spread(data: dict[str, Any]) -> dict[str, Any]:
    """The repetitions' spread, the misfit, the repetitions and configurations of a saved fit
    (keyword arguments of its constructor; a fit saved before repetitions: none)."""
    within = data.get("sigma_within")
    return {"sigma_within": math.nan if within is None else float(within),
            "sigma_between": float(data.get("sigma_between", 0.0)),
            "reps": float(data.get("reps", 1.0)), "groups": int(data.get("groups", 0))}


class FittedRows:
    """What a fit on rows says of itself, whatever its form (a mixin for the fit dataclasses,
    which hold the fields named here): its rows, its parameters' standard errors, the spread
    of a configuration's mean, its t quantiles, and the fields every saved fit shares."""

    y: np.ndarray
    fitted: np.ndarray
    coef: np.ndarray
    cov: np.ndarray
    sigma: float
    dof: int
    r2: float
    cv_rel_rmse: float
    cv_folds: int
    weighting: str
    sigma_within: float
    sigma_between: float
    reps: float
    groups: int

    @property
    def n(self) -> int:
        return int(self.y.size)

    @property
    def std_errors(self) -> np.ndarray:
        return np.sqrt(np.clip(np.diag(self.cov), 0, None))

    def residual_sd(self, reps: float) -> float:
        """The spread of a configuration's mean over `reps` repetitions about the model."""
        return residual_sd(self.sigma, self.sigma_within, self.sigma_between, self.groups, reps)

    def t(self, confidence: float) -> float:
        """Student's t quantile of a two-sided `confidence` interval on this fit's dof."""
        return student_t(confidence, self.dof)

    def shared_json(self) -> dict[str, Any]:
        """The fields every saved fit has (`saved_fit` reads them back)."""
        return {
            "coef": self.coef.tolist(), "cov": self.cov.tolist(),
            "std_errors": self.std_errors.tolist(), "sigma": self.sigma, "dof": self.dof,
            "weighting": self.weighting, "r2": self.r2, "cv_rel_rmse": self.cv_rel_rmse,
            "cv_folds": self.cv_folds, "y": self.y.tolist(), "fitted": self.fitted.tolist(),
            "sigma_within": None if math.isnan(self.sigma_within) else self.sigma_within,
            "sigma_between": self.sigma_between, "reps": self.reps, "groups": self.groups,
        }


def saved_fit(data: dict[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments of the fields every saved fit has (`shared_json`)."""
    return {
        "coef": np.asarray(data["coef"], float),
        "cov": np.asarray(data["cov"], float).reshape(len(data["coef"]), -1),
        "sigma": float(data["sigma"]), "dof": int(data["dof"]), "r2": float(data["r2"]),
        "cv_rel_rmse": float(data["cv_rel_rmse"]), "cv_folds": int(data["cv_folds"]),
        "y": np.asarray(data["y"], float), "fitted": np.asarray(data["fitted"], float),
        **saved_spread(data),
    }

