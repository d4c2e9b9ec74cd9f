"""A power-law time model: time = A·(FLOPs per step)^α·steps^β, a line on the log scale.

Why: on a loaded machine, and for networks whose steps are mostly the framework's own per-step
work, a step's time grows far slower than its FLOPs (on a real sweep, 800× the FLOPs per step
took 20× the time). A sum of costs per FLOP, per byte and per step through the origin cannot
follow that where the grid's middle lies; a line on the log scale can. The two forms compete
for the time model by their error on held-out configurations (`fit.fit_models`).

Fitted by least squares on log time: errors are relative (a time's spread grows with it). The
residuals split into the repetitions' spread and the misfit between configurations, and the
misfit is no smaller than held-out configurations show on the log scale (`model.spread`). The
models are ranked by the time's relative error on held-out configurations (the same folds as
the linear fits', so the errors compare). Intervals are taken on the log scale: the median ×/÷
a factor, never a bound at zero. Where every configuration ran the same number of steps, their
exponent cannot be fitted (it is the intercept's twin): time is then proportional to the steps
(β = 1, `fixed`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.model.spread import (
    FitError,
    FittedRows,
    fold_count,
    held_out_folds,
    out_of_sample_floor,
    saved_fit,
    variance_components,
)

POWER_LAW = "power_law"
# the fit's terms: log A, then the exponents of the FLOPs per step and of the steps
LOG_SCALE, PER_STEP, STEPS = "log_scale", "flops_per_step", "steps"


@dataclass
class PowerLawFit(FittedRows):
    """log time ≈ log A + α·log(FLOPs per step) + β·log(steps) (β in `fixed` when not fitted)."""

    name: str
    features: list[str]  # LOG_SCALE, PER_STEP[, STEPS]: the terms fitted
    coef: np.ndarray
    cov: np.ndarray
    sigma: float  # on the log scale: about a relative spread
    dof: int
    r2: float  # on the time scale
    cv_rel_rmse: float  # relative RMS error of the time of held-out configurations
    cv_folds: int
    y: np.ndarray
    fitted: np.ndarray  # the fitted median times
    ranges: dict[str, tuple[float, float]]  # PER_STEP and STEPS: what the fit saw
    fixed: dict[str, float] = field(default_factory=dict)  # exponents taken, not fitted
    sigma_within: float = math.nan
    sigma_between: float = 0.0
    reps: float = 1.0
    groups: int = 0
    target: str = "time_s"
    weighting: str = "relative"  # errors relative to the time: intervals on the log scale
    dropped: list[str] = field(default_factory=list)
    omitted: list[str] = field(default_factory=list)

    def _log(self, values: dict[str, float]) -> tuple[np.ndarray, float]:
        """(the row of the log design, the fixed terms' log) of one run's features."""
        raw = per_step(values)
        logs = {LOG_SCALE: 0.0, PER_STEP: math.log(raw[PER_STEP]), STEPS: math.log(raw[STEPS])}
        row = np.array([1.0 if f == LOG_SCALE else logs[f] for f in self.features])
        return row, sum(exponent * logs[f] for f, exponent in self.fixed.items())

    def predict(self, values: dict[str, float]) -> float:
        row, offset = self._log(values)
        return math.exp(float(row @ self.coef) + offset)

    def outside(self, values: dict[str, float]) -> list[str]:
        """The features of `values` outside the range the fit saw (an extrapolation)."""
        raw = per_step(values)
        return [f for f, (low, high) in self.ranges.items()
                if not low * (1 - 1e-9) <= raw[f] <= high * (1 + 1e-9)]

    def interval(
        self, values: dict[str, float], confidence: float = 0.9, reps: float | None = None
    ) -> tuple[float, float, float, float]:
        """(median, low, high, sd) of a new configuration's mean over `reps` repetitions (as
        many as the sweep's by default), on the log scale; sd is the median × the log's sd,
        which `spread.bounds` turns back into the same interval."""
        if not 0 < confidence < 1:
            raise FitError(f"confidence must be between 0 and 1, not {confidence}")
        row, offset = self._log(values)
        noise = self.residual_sd(self.reps if reps is None else reps)
        sd = math.sqrt(max(float(row @ self.cov @ row), 0.0) + noise**2)
        median = math.exp(float(row @ self.coef) + offset)
        factor = math.exp(self.t(confidence) * sd)
        return median, median / factor, median * factor, median * sd

    def formula(self) -> str:
        """The fitted law in words: time = A × (FLOPs per step)^α × steps^β."""
        coef = dict(zip(self.features, self.coef.tolist(), strict=True))
        steps = self.fixed.get(STEPS, coef.get(STEPS, 0.0))
        return (f"time = {math.exp(coef[LOG_SCALE]):.3g} s × (FLOPs per step)^{coef[PER_STEP]:.3f}"
                f" × steps^{steps:.3g}")

    def to_json(self) -> dict[str, Any]:
        return {
            "form": POWER_LAW, "name": self.name, "target": self.target,
            "features": self.features, **self.shared_json(),
            "ranges": {f: list(r) for f, r in self.ranges.items()}, "fixed": self.fixed,
            "formula": self.formula(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PowerLawFit:
        try:
            return cls(
                name=data["name"], features=list(data["features"]),
                ranges={f: (float(r[0]), float(r[1])) for f, r in data["ranges"].items()},
                fixed={f: float(v) for f, v in data.get("fixed", {}).items()},
                **saved_fit(data),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FitError(f"not a saved power-law fit: {exc!r}") from exc


def per_step(values: dict[str, float]) -> dict[str, float]:
    """A run's FLOPs per step and steps (from its total FLOPs and steps), both positive."""
    try:
        steps, flops = float(values["steps"]), float(values["flops"])
    except KeyError as exc:
        raise FitError(f"power-law time model: no value for {exc.args[0]}") from exc
    if not (steps > 0 and flops > 0):
        raise FitError("power-law time model: FLOPs and steps must be positive")
    return {PER_STEP: flops / steps, STEPS: steps}


def fit_power_law(
    values: Sequence[dict[str, float]], time: np.ndarray, group: np.ndarray, *,
    steps_free: bool, folds: int, name: str = "time",
) -> PowerLawFit:
    """Fit the law on rows (`group`: each row's configuration); steps_free: fit the steps'
    exponent (else it is 1)."""
    raw = [per_step(v) for v in values]
    if np.any(time <= 0):
        raise FitError(f"{name}: a power law needs positive times")
    features = [LOG_SCALE, PER_STEP, *([STEPS] if steps_free else [])]
    logs = {PER_STEP: np.log([r[PER_STEP] for r in raw]), STEPS: np.log([r[STEPS] for r in raw])}
    z = np.column_stack([np.ones(time.size), *(logs[f] for f in features[1:])])
    offset = np.zeros(time.size) if steps_free else logs[STEPS]
    target = np.log(time) - offset
    p, configs = z.shape[1], int(group.max()) + 1
    if configs <= p:
        raise FitError(f"{name}: {configs} configurations cannot fit a power law of {p} terms")
    coef = np.linalg.lstsq(z, target, rcond=None)[0]
    parts = variance_components(target - z @ coef, group, p)
    cv, cv_log = _cross_validate(z, target, offset, time, group, folds)
    parts = out_of_sample_floor(parts, cv_log)
    fitted = np.exp(z @ coef + offset)
    total = float(np.sum((time - time.mean()) ** 2))
    r2 = 1.0 - float(np.sum((time - fitted) ** 2)) / total if total > 0 else math.nan
    ranges = {f: (float(min(r[f] for r in raw)), float(max(r[f] for r in raw)))
              for f in (PER_STEP, STEPS)}
    return PowerLawFit(
        name, features, coef, parts.coef_variance * np.linalg.pinv(z.T @ z), parts.sigma,
        parts.dof, r2, cv, fold_count(group, folds), time, fitted, ranges,
        {} if steps_free else {STEPS: 1.0}, sigma_within=parts.within,
        sigma_between=parts.between, reps=parts.reps, groups=configs)


def power_law_candidates(
    values: Sequence[dict[str, float]], time: np.ndarray, group: np.ndarray, folds: int
) -> list[PowerLawFit]:
    """The power laws these rows support: time ∝ steps, and with the steps' exponent fitted
    where the configurations ran different numbers of steps."""
    steps = {float(v["steps"]) for v in values}
    fits = []
    for free in (False, True)[: 2 if len(steps) > 1 else 1]:
        try:
            fits.append(fit_power_law(values, time, group, steps_free=free, folds=folds))
        except FitError:
            continue  # too few configurations for this law: the others compete without it
    return fits


def _cross_validate(
    z: np.ndarray, target: np.ndarray, offset: np.ndarray, time: np.ndarray,
    group: np.ndarray, folds: int,
) -> tuple[float, float]:
    """RMS errors of held-out configurations' times: relative (to rank the time models on one
    measure) and of the log (the scale of this fit's residuals, for its held-out floor); NaN
    where no fold could be fitted."""
    errors = []
    for train, held in held_out_folds(group, folds):
        if train.size <= z.shape[1] or np.linalg.matrix_rank(z[train]) < z.shape[1]:
            continue
        coef = np.linalg.lstsq(z[train], target[train], rcond=None)[0]
        errors.append(z[held] @ coef + offset[held] - np.log(time[held]))
    if not errors:
        return math.nan, math.nan
    logs = np.concatenate(errors)
    return float(np.sqrt(np.mean(np.expm1(logs) ** 2))), float(np.sqrt(np.mean(logs**2)))
