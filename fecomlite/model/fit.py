"""Least-squares fits of energy (and time) on network features, with their uncertainty.

`fit_linear` is one linear model through the origin, y = X·β with β ≥ 0, fitted by non-negative
least squares (scipy's `nnls`): every coefficient is a physical cost (joules per FLOP, per byte at a
cache level, static watts; seconds per FLOP, per step), and a negative one would be a fit of the
noise that predicts negative energy for some network. Fitting is by least squares:
weighting "relative" (the default) assumes errors proportional to the value (a measured energy's
spread grows with it, and sweep energies span orders of magnitude) and is fitted as weighted least
squares with weights 1/ŷ² (ŷ from an ordinary fit, refined twice); "absolute" is ordinary least
squares. Each fit keeps its coefficients with their covariance, R² (on the original scale),
k-fold cross-validated error (relative RMS on held-out rows), residuals and the range of each
feature it was fitted on: enough to predict with an interval (`LinearFit.interval`), to flag an
extrapolation, and to compare models on the same data. Models are ranked by their cross-validated
(out-of-sample) error, never by R², which always favours the model with more terms; the best
ranked energy model is the one `predict` uses.

`fit_models` fits, on one sweep table, the memory-aware model of BUTTER-E

    energy = c·FLOPs + Σ_level m_level·bytes(level) + s·time

(bytes charged to the cache level each layer's working set fits in, s the static power the other
terms do not explain), the time/FLOP model energy = c·FLOPs + s·time, the naive models energy ∝
FLOPs and energy ∝ parameters × steps, and a time model (time from FLOPs, bytes by level, steps
and a fixed set-up cost per run, the simpler sums, and the power laws of `model.power_law`;
the one that predicts held-out configurations best), which `predict` needs when the time of a
new configuration is not known. A sweep with
fewer configurations than a model has terms gets the largest model its rows support: per-level
terms with the fewest configurations go first (`LinearFit.omitted` names them). Whether the data
identify the per-level costs at all is checked (`identify`): where they do not, the report
presents the model as a time/FLOP model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.model.features import run_features
from fecomlite.model.identify import identify
from fecomlite.model.power_law import POWER_LAW, PowerLawFit, power_law_candidates
from fecomlite.model.spread import (
    FitError,
    FittedRows,
    bounds,
    fold_count,
    held_out_folds,
    out_of_sample_floor,
    saved_fit,
    variance_components,
)
from fecomlite.sensors.estimate import PROCESS_MODEL

MODEL_FORMAT = "fecomlite-energy-model/1"
WEIGHTINGS = ("relative", "absolute")
TARGETS = ("above-idle", "total")
DEFAULT_FOLDS = 5
_REWEIGHT_ROUNDS = 2


@dataclass
class LinearFit(FittedRows):
    """y ≈ X·coef over `features` (those with data; `dropped` had none and are 0)."""

    name: str
    target: str
    features: list[str]
    dropped: list[str]
    coef: np.ndarray
    cov: np.ndarray
    sigma: float  # residual scale: relative (a fraction) or absolute (target's unit)
    dof: int
    weighting: str
    r2: float
    cv_rel_rmse: float  # relative RMS error on held-out rows of k-fold cross-validation
    cv_folds: int
    y: np.ndarray
    fitted: np.ndarray
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # feature -> (min, max)
    omitted: list[str] = field(default_factory=list)  # terms with data the rows cannot support
    # with repetitions as rows (`variance_components`): the spread between a configuration's
    # repetitions and the model's misfit between configurations, both on the residuals' scale
    sigma_within: float = math.nan
    sigma_between: float = 0.0
    reps: float = 1.0  # repetitions per configuration: what a new configuration is measured with
    groups: int = 0  # configurations (0: every row its own)

    @property
    def residuals(self) -> np.ndarray:
        return self.y - self.fitted

    def vector(self, values: dict[str, float]) -> np.ndarray:
        """The feature vector of one row (missing dropped features count as 0)."""
        missing = [f for f in self.features if f not in values]
        if missing:
            raise FitError(f"{self.name}: no value for {', '.join(missing)}")
        return np.array([float(values[f]) for f in self.features])

    def predict(self, values: dict[str, float]) -> float:
        return float(self.vector(values) @ self.coef)

    def outside(self, values: dict[str, float]) -> list[str]:
        """The features of `values` outside the range the fit saw (an extrapolation)."""
        return [
            f for f, (low, high) in self.ranges.items()
            if f in values and not low * (1 - 1e-9) <= values[f] <= high * (1 + 1e-9)
        ]

    def interval(
        self, values: dict[str, float], confidence: float = 0.9, reps: float | None = None
    ) -> tuple[float, float, float, float]:
        """(mean, low, high, sd) of a new configuration measured as the mean of `reps`
        repetitions (default: as many as the fit's configurations had): parameter uncertainty,
        the model's misfit between configurations and the repetitions' spread
        (`bounds`: relative errors give an interval on the log scale, never cut at zero)."""
        if not 0 < confidence < 1:
            raise FitError(f"confidence must be between 0 and 1, not {confidence}")
        x0 = self.vector(values)
        mean = float(x0 @ self.coef)
        scale = abs(mean) if self.weighting == "relative" else 1.0
        noise = scale * self.residual_sd(self.reps if reps is None else reps)
        sd = float(np.sqrt(max(float(x0 @ self.cov @ x0), 0.0) + noise**2))
        low, high = bounds(mean, sd, self.t(confidence), self.weighting)
        return mean, low, high, sd

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "target": self.target, "features": self.features,
            "dropped": self.dropped, **self.shared_json(),
            "ranges": {f: list(r) for f, r in self.ranges.items()}, "omitted": self.omitted,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinearFit:
        try:
            return cls(
                name=data["name"], target=data["target"], features=list(data["features"]),
                dropped=list(data["dropped"]), weighting=data["weighting"],
                ranges={f: (float(r[0]), float(r[1])) for f, r in data.get("ranges", {}).items()},
                omitted=list(data.get("omitted", [])),
                **saved_fit(data),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FitError(f"not a saved fit: {exc!r}") from exc


def _solve(
    x: np.ndarray, y: np.ndarray, weighting: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(coef, weights, (XᵀWX)⁻¹) of a weighted non-negative least-squares fit.

    Columns are scaled to unit RMS first (FLOPs ~1e12 next to seconds ~1), so that the solve and
    the inverse see a well-conditioned matrix; the results are scaled back. The inverse is the
    unconstrained one: a coefficient held at 0 keeps the spread the data leave it (its upper
    bound is honest, not a false certainty of exactly zero).
    """
    from scipy.optimize import nnls  # here: scipy takes a second to import

    scale = np.sqrt(np.mean(x**2, axis=0))
    scale[scale == 0] = 1.0
    xs = x / scale
    weights = np.ones_like(y)
    coef = nnls(xs, y)[0]
    if weighting == "relative":
        for _ in range(_REWEIGHT_ROUNDS):
            fitted = xs @ coef
            ok = fitted > 0
            weights = 1.0 / np.where(ok, fitted, y)  # a row the fit puts at 0 keeps its own
            coef = nnls(xs * weights[:, None], y * weights)[0]
    xw = xs * weights[:, None]
    inverse = np.linalg.pinv(xw.T @ xw) / np.outer(scale, scale)
    return coef / scale, weights, inverse


def fit_linear(
    x: np.ndarray, y: np.ndarray, features: Sequence[str], *, name: str = "model",
    target: str = "energy_J", weighting: str = "relative", folds: int = DEFAULT_FOLDS,
    groups: Sequence[int] | np.ndarray | None = None,
) -> LinearFit:
    """Fit y = X·β through the origin; features whose column is all zero are dropped (no data).

    groups: each row's configuration when rows are repetitions (`variance_components` splits
    the residuals into the repetitions' spread and the model's misfit; cross-validation holds
    out whole configurations)."""
    if weighting not in WEIGHTINGS:
        raise FitError(f"weighting must be one of {WEIGHTINGS}, not {weighting!r}")
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    if x.ndim != 2 or x.shape[0] != y.size or x.shape[1] != len(features):
        raise FitError(f"{name}: {x.shape} features for {y.size} rows and {len(features)} names")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise FitError(f"{name}: features and {target} must be finite numbers")
    if np.any(x < 0):
        raise FitError(f"{name}: features are counts and sizes, never negative")
    if weighting == "relative" and np.any(y <= 0):
        raise FitError(f"{name}: relative weighting needs positive {target} in every row "
                       f"({int(np.sum(y <= 0))} are ≤ 0); use absolute weighting")
    group = np.arange(y.size) if groups is None else np.unique(groups, return_inverse=True)[1]
    if group.size != y.size:
        raise FitError(f"{name}: {group.size} group labels for {y.size} rows")
    configs = int(group.max()) + 1 if group.size else 0
    used = np.any(x != 0, axis=0)
    names = [f for f, u in zip(features, used, strict=True) if u]
    dropped = [f for f, u in zip(features, used, strict=True) if not u]
    x = x[:, used]
    p = x.shape[1]
    if p == 0:
        raise FitError(f"{name}: every feature is zero")
    if configs <= p:
        raise FitError(f"{name}: {configs} rows cannot fit {p} coefficients "
                       f"({', '.join(names)}); measure more configurations")
    coef, weights, inverse = _solve(x, y, weighting)
    fitted = x @ coef
    cv, k = _cross_validate(x, y, weighting, folds, group)
    parts = variance_components((y - fitted) * weights, group, p)
    if groups is not None and weighting == "relative":
        parts = out_of_sample_floor(parts, cv)
    cov = parts.coef_variance * inverse
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - fitted) ** 2)) / total if total > 0 else float("nan")
    ranges = {f: (float(x[:, i].min()), float(x[:, i].max())) for i, f in enumerate(names)}
    return LinearFit(name, target, names, dropped, coef, cov, parts.sigma, parts.dof, weighting,
                     r2, cv, k, y, fitted, ranges, sigma_within=parts.within,
                     sigma_between=parts.between, reps=parts.reps,
                     groups=configs if groups is not None else 0)


def _cross_validate(
    x: np.ndarray, y: np.ndarray, weighting: str, folds: int, group: np.ndarray
) -> tuple[float, int]:
    """Relative RMS error of k-fold held-out predictions, whole configurations held out (folds
    too small to fit are skipped)."""
    errors: list[np.ndarray] = []
    for train, held in held_out_folds(group, folds):
        if train.size <= x.shape[1] or np.linalg.matrix_rank(x[train]) < x.shape[1]:
            continue
        coef = _solve(x[train], y[train], weighting)[0]
        held = held[y[held] != 0]  # (absolute weighting only) a zero has no relative error
        errors.append((x[held] @ coef - y[held]) / y[held])
    k = fold_count(group, folds)
    if not errors:
        return float("nan"), k
    return float(np.sqrt(np.mean(np.concatenate(errors) ** 2))), k


def fit_from_json(data: dict[str, Any]) -> LinearFit | PowerLawFit:
    """A saved fit of either form."""
    if isinstance(data, dict) and data.get("form") == POWER_LAW:
        return PowerLawFit.from_json(data)
    return LinearFit.from_json(data)


# -- the models of one sweep table -------------------------------------------------------------


@dataclass
class EnergyModels:
    """The memory-aware, naive and time models fitted on one table, and what they came from."""

    target: str  # above-idle | total
    domain: str  # "all" or one energy domain (cpu-package, dram, gpu:0, ...)
    levels: list[str]
    hierarchy: dict[str, Any]  # MemoryHierarchy.to_json()
    provenance: dict[str, Any]  # label, per-domain provenance and model, source runs
    fits: dict[str, LinearFit | PowerLawFit]  # the time model may be a power law
    points: list[dict[str, Any]]  # per configuration: measured and fitted, for the report
    identification: dict[str, Any] = field(default_factory=dict)  # `identify.identify`
    repetitions: dict[str, Any] = field(default_factory=dict)  # `RepetitionRows.summary`
    load: dict[str, Any] = field(default_factory=dict)  # `RepetitionRows.at_one_load`
    time_models: list[dict[str, Any]] = field(default_factory=list)  # `time_model_row`s

    @property
    def memory_aware(self) -> LinearFit:
        return self.fits["memory_aware"]

    @property
    def configurations(self) -> int:
        """How many configurations the fits rest on (their rows may be repetitions)."""
        return int(self.repetitions.get("configurations", self.memory_aware.n))

    @property
    def best_name(self) -> str:
        """The energy model with the lowest cross-validated error (memory-aware on a tie or
        when no model could be cross-validated)."""
        return self.comparison()[0]["model"]

    @property
    def best(self) -> LinearFit:
        return self.fits[self.best_name]

    @property
    def left_out(self) -> str:
        """The repetitions the fits left out (`RepetitionRows.without_outliers`), in words; empty
        where none were."""
        left = self.repetitions.get("left_out") or []
        if not left:
            return ""
        return (f"{len(left)} repetition{'s' if len(left) != 1 else ''} left out, more than "
                f"{OUTLIER_FACTOR:g}× from the median time of their configuration: " + "; ".join(
                    f"{r['key']} repetition {r['repetition']}: {r['time_s']:.3g} s against "
                    f"{r['median_s']:.3g} s" for r in left))

    @property
    def time_model(self) -> str:
        """The time model predictions use, in words (its form and terms)."""
        fit = self.fits["time"]
        row = time_model_row(fit, True)
        return row["form"] + ": " + (fit.formula() if isinstance(fit, PowerLawFit)
                                     else row["terms"])

    @property
    def time_proportional(self) -> bool:
        """Every energy domain is an estimate proportional to the process's CPU time: energy is
        then time × a constant, and any energy model is a time model on this machine."""
        domains = self.provenance.get("domains", {})
        return bool(domains) and all(
            meta.get("provenance") == "estimated" and meta.get("model") in TIME_PROPORTIONAL
            for meta in domains.values()
        )

    def comparison(self) -> list[dict[str, Any]]:
        """Energy models on the same rows, best first by cross-validated (out-of-sample) error;
        the time model is not one of them."""
        rows = [
            {"model": name, "features": fit.features, "r2": fit.r2,
             "cv_rel_rmse": fit.cv_rel_rmse, "n": fit.n}
            for name, fit in self.fits.items() if name in ENERGY_MODELS
        ]
        rows.sort(key=lambda r: (math.isnan(r["cv_rel_rmse"]), r["cv_rel_rmse"],
                                 ENERGY_MODELS.index(r["model"])))
        for rank, row in enumerate(rows, 1):
            row["rank"] = rank
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MODEL_FORMAT, "target": self.target, "domain": self.domain,
            "levels": self.levels, "hierarchy": self.hierarchy, "provenance": self.provenance,
            "fits": {name: fit.to_json() for name, fit in self.fits.items()},
            "comparison": self.comparison(), "best": self.best_name,
            "time_proportional": self.time_proportional, "points": self.points,
            "identification": self.identification, "repetitions": self.repetitions,
            "load": self.load, "time_models": self.time_models, "breakpoints": [
                {"level": lv["name"], "size_bytes": lv["size_bytes"]}
                for lv in self.hierarchy.get("levels", []) if lv["size_bytes"] is not None
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EnergyModels:
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            raise FitError(f"not a fitted model (format {MODEL_FORMAT})")
        try:
            return cls(
                data["target"], data["domain"], list(data["levels"]), data["hierarchy"],
                data["provenance"],
                {name: fit_from_json(fit) for name, fit in data["fits"].items()},
                list(data.get("points", [])), dict(data.get("identification") or {}),
                dict(data.get("repetitions") or {}), dict(data.get("load") or {}),
                list(data.get("time_models") or []),
            )
        except KeyError as exc:
            raise FitError(f"a fitted model without {exc.args[0]!r}") from exc


ENERGY_MODELS = ("memory_aware", "time_flops", "flops_only", "params_only")
# estimation models whose energy is the process's CPU time × a constant power
TIME_PROPORTIONAL = frozenset({PROCESS_MODEL})
TIME_MODEL_NOTE = (
    f"the energy is an estimate proportional to the process's CPU time (model {PROCESS_MODEL}): "
    "on this machine the energy model is effectively a time model; its per-FLOP and per-byte "
    "costs are time costs × one power, not measured energy"
)


OUTLIER_FACTOR = 3.0  # a repetition this many times off its configuration's median time
TIME_CANDIDATES = (["flops", "steps", "fixed"], ["flops", "steps"])  # beside the full one


def model_features(levels: Sequence[str]) -> dict[str, list[str]]:
    """Each model's features; `bytes_<level>` are the bytes moved at each cache level."""
    memory = [f"bytes_{level}" for level in levels]
    return {
        "memory_aware": ["flops", *memory, "time_s"],
        "time_flops": ["flops", "time_s"],
        "flops_only": ["flops"],
        "params_only": ["params_steps"],
        "time": ["flops", *memory, "steps", "fixed"],
    }


def target_energy(row: dict[str, Any], domains: Sequence[str], target: str) -> float:
    """A row's energy for the fit: above idle, or plus idle power × time ("total")."""
    energy = sum(float(row[f"energy_J_{d}"]) for d in domains)
    if target == "total":
        energy += sum(float(row[f"idle_W_{d}"]) for d in domains) * float(row["time_s"])
    return energy


def provenance_label(domains: dict[str, dict[str, Any]]) -> str:
    """measured, estimated (with the models named) or mixed — never left unsaid."""
    kinds = {meta.get("provenance", "unknown") for meta in domains.values()}
    models = sorted({meta["model"] for meta in domains.values() if meta.get("model")})
    if kinds == {"measured"}:
        return "measured"
    named = f" (model {', '.join(models)})" if models else ""
    if kinds == {"estimated"}:
        return f"estimated{named}"
    return "mixed: " + ", ".join(
        f"{d} {meta.get('provenance', 'unknown')}" for d, meta in sorted(domains.items())
    ) + named


def fit_models(
    rows: Sequence[dict[str, Any]], hierarchy: dict[str, Any],
    domains: dict[str, dict[str, Any]], *, target: str = "above-idle", domain: str = "all",
    weighting: str = "relative", folds: int = DEFAULT_FOLDS, source: dict[str, Any] | None = None,
) -> EnergyModels:
    """Fit every model on sweep rows (see `fecomlite.model.sweep` for the columns).

    domains: each energy domain's {"provenance", "model"}, as the sweep recorded them.
    """
    if target not in TARGETS:
        raise FitError(f"target must be one of {TARGETS}, not {target!r}")
    if domain != "all" and domain not in domains:
        raise FitError(f"no energy domain {domain!r} in these runs; they have "
                       f"{', '.join(sorted(domains)) or 'none'}")
    used = ({d: m for d, m in domains.items() if m.get("additive", True)} if domain == "all"
            else {domain: domains[domain]})
    if not used:
        raise FitError("these runs hold no energy domain")
    levels = [lv["name"] for lv in hierarchy["levels"]]
    names = model_features(levels)
    values = [_row_values(row, levels) for row in rows]
    energy = np.array([target_energy(row, list(used), target) for row in rows])
    reps = repetition_rows(rows, values, list(used), target).without_outliers(
        [str(row.get("key", i)) for i, row in enumerate(rows)])
    reps, load = reps.at_one_load()
    fits: dict[str, LinearFit | PowerLawFit] = {}
    time_models: list[dict[str, Any]] = []
    for model, features in names.items():
        tried = _linear_candidates(model, features, reps, len(rows), weighting, folds)
        if model == "time":  # the power laws compete with the sums of costs, out of sample
            tried += power_law_candidates(reps.values, reps.time, reps.group, folds)
        fits[model] = min(tried, key=lambda f: (math.isnan(f.cv_rel_rmse), f.cv_rel_rmse))
        if model == "time":
            time_models = [time_model_row(f, f is fits[model]) for f in tried]
    memory = fits["memory_aware"]
    points = [
        {"key": row.get("key", str(i)), "flops": v["flops"], "steps": v["steps"],
         "max_working_set": float(row["max_working_set_bytes"]),
         "level": row.get("working_set_level"), "measured_J": float(energy[i]),
         "fitted_J": memory.predict(v),
         "pj_per_flop": float(energy[i] / v["flops"] * 1e12) if v["flops"] else None}
        for i, (row, v) in enumerate(zip(rows, values, strict=True))
    ]
    provenance = {
        "label": provenance_label(used), "domains": used, **(source or {}),
    }
    design = np.array([[v[f] for f in memory.features] for v in values])
    if weighting == "relative":  # the rows as the fit weighs them: each relative to its energy
        design = design / energy[:, None]
    check = identify(design, memory.features, memory.coef, memory.std_errors, levels)
    if memory.omitted:
        terms = len(memory.features)
        check["reasons"].append(f"{len(rows)} configurations support no more than {terms} "
                                f"term{'s' if terms != 1 else ''}: "
                                f"{', '.join(memory.omitted)} left out")
        check["identified"] = False
    return EnergyModels(target, domain, levels, hierarchy, provenance, fits, points, check,
                        repetitions=reps.summary(), load=load, time_models=time_models)


def _linear_candidates(
    model: str, features: list[str], reps: RepetitionRows, configs: int, weighting: str,
    folds: int,
) -> list[LinearFit]:
    """A model's linear fits on the rows: the largest `configs` configurations support, and
    for the time model the simpler sums (`TIME_CANDIDATES`); each names the terms it has no
    data for (`dropped`) and the terms with data it leaves out (`omitted`)."""
    y = reps.time if model == "time" else reps.energy
    x = np.array([[v[f] for f in features] for v in reps.values])
    twin = twins(x, features)
    distinct = [f for f in features if f not in twin]
    candidates = [supported(x[:, [features.index(f) for f in distinct]], distinct, configs)]
    if model == "time":
        simpler = [[f for f in c if f not in twin] for c in TIME_CANDIDATES]
        candidates += [c for c in simpler if len(c) < min(len(candidates[0]), configs)]
    candidates = [c for i, c in enumerate(candidates) if c not in candidates[:i]]
    has_data = {f for i, f in enumerate(features) if np.any(x[:, i] != 0)}
    fits = []
    for keep in candidates:
        fit = fit_linear(x[:, [features.index(f) for f in keep]], y, keep, name=model,
                         target="time_s" if model == "time" else "energy_J",
                         weighting=weighting, folds=folds, groups=reps.group)
        fit.dropped = [f for f in features if f not in has_data]
        fit.omitted = [f for f in features if f in has_data and f not in fit.features]
        fits.append(fit)
    return fits


def time_model_row(fit: LinearFit | PowerLawFit, chosen: bool) -> dict[str, Any]:
    """One competing time model, for the CLI and the report: its form and held-out error."""
    if isinstance(fit, PowerLawFit):
        form = "power law" + (" (time ∝ steps)" if fit.fixed else "")
        terms = f"log time on log FLOPs per step{'' if fit.fixed else ' and log steps'}"
    else:
        form, terms = "linear", "time = " + " + ".join(f"c·{f}" for f in fit.features)
    return {"form": form, "terms": terms, "cv_rel_rmse": fit.cv_rel_rmse, "r2": fit.r2,
            "chosen": chosen}


@dataclass
class RepetitionRows:
    """The rows the fits see: each repetition of each configuration (`group` its index in the
    sweep's rows), or each configuration's mean where its repetitions were not recorded."""

    values: list[dict[str, float]]
    time: np.ndarray
    energy: np.ndarray
    group: np.ndarray
    per_config: list[int]
    wait: np.ndarray  # each row's run-queue wait per CPU second (NaN: not recorded)
    left_out: list[dict[str, Any]] = field(default_factory=list)  # `without_outliers`

    def without_outliers(self, keys: Sequence[str]) -> RepetitionRows:
        """These rows less each repetition whose time is more than OUTLIER_FACTOR × from its
        configuration's median (of three or more): not the same experiment. On a 2-CPU machine
        loaded 8 times over, one repetition of a configuration took 0.19 s and its others 16 s
        and 14 s (threads that spin at a barrier wait for a descheduled sibling, or get the
        CPUs to themselves for a moment); one such row makes every interval span 10⁴×."""
        median = {g: float(np.median(self.time[self.group == g])) for g in np.unique(self.group)}
        far = np.array([
            self.per_config[g] >= 3 and abs(math.log(t / median[g])) > math.log(OUTLIER_FACTOR)
            for t, g in zip(self.time, self.group, strict=True)])
        emptied = {g for g in median if far[self.group == g].all()}  # no middle to keep
        far &= ~np.isin(self.group, list(emptied))
        if not far.any():
            return self
        keep = ~far
        rank = [int(np.sum(self.group[: i + 1] == g)) for i, g in enumerate(self.group)]
        left = [{"key": keys[g], "repetition": rank[i], "time_s": float(self.time[i]),
                 "median_s": median[g]} for i, g in enumerate(self.group) if far[i]]
        per_config = np.bincount(self.group[keep], minlength=len(self.per_config)).tolist()
        return RepetitionRows([v for v, k in zip(self.values, keep, strict=True) if k],
                              self.time[keep], self.energy[keep], self.group[keep],
                              per_config, self.wait[keep], left)

    def at_one_load(self) -> tuple[RepetitionRows, dict[str, Any]]:
        """These rows brought to the sweep's median load where load clearly changed them
        (`model.load`), and what was done."""
        from fecomlite.model.load import normalise

        energy, on_energy = normalise(self.energy, self.wait, self.group, "energy")
        time, on_time = normalise(self.time, self.wait, self.group, "time")
        values = [{**v, "time_s": float(t)} for v, t in zip(self.values, time, strict=True)]
        return (RepetitionRows(values, time, energy, self.group, self.per_config, self.wait,
                               self.left_out), {"energy": on_energy, "time": on_time})

    def summary(self) -> dict[str, Any]:
        return {"rows": int(self.energy.size), "configurations": len(self.per_config),
                "per_configuration": self.per_config, "left_out": self.left_out}


def repetition_rows(
    rows: Sequence[dict[str, Any]], values: Sequence[dict[str, float]], domains: Sequence[str],
    target: str,
) -> RepetitionRows:
    """One row per repetition where a row lists its repetitions' times and energies
    (`reps_time_s`, `reps_energy_J_<domain>`, equal lengths, every energy positive); else one
    row with the configuration's mean. Repetitions vary with what else the machine did: rows of
    them give the fit honest residuals and the interval the spread a new measurement has."""
    out_values, times, energies, groups, per_config, waits = [], [], [], [], [], []
    for i, (row, v) in enumerate(zip(rows, values, strict=True)):
        time_reps = row.get("reps_time_s") or []
        energy_reps = [row.get(f"reps_energy_J_{d}") or [] for d in domains]
        usable = len(time_reps) > 1 and all(len(e) == len(time_reps) for e in energy_reps)
        if usable:
            total = [sum(float(e[k]) for e in energy_reps) for k in range(len(time_reps))]
            if target == "total":
                idle = sum(float(row[f"idle_W_{d}"]) for d in domains)
                total = [e + idle * float(t) for e, t in zip(total, time_reps, strict=True)]
            usable = all(math.isfinite(e) and e > 0 for e in total)
        wait = [float(w) for w in row.get("reps_wait_per_cpu_s") or []]
        if not usable:
            time_reps, total = [v["time_s"]], [target_energy(row, domains, target)]
            wait = [sum(wait) / len(wait)] if wait else []
        waits += wait if len(wait) == len(total) else [math.nan] * len(total)
        for t, e in zip(time_reps, total, strict=True):
            out_values.append({**v, "time_s": float(t)})
            times.append(float(t))
            energies.append(e)
            groups.append(i)
        per_config.append(len(total))
    return RepetitionRows(out_values, np.array(times), np.array(energies), np.array(groups),
                          per_config, np.array(waits))


def twins(x: np.ndarray, features: Sequence[str]) -> list[str]:
    """The features whose column is a constant multiple of an earlier feature's (`fixed` beside
    `steps` where every configuration ran the same steps): a fit cannot tell twins apart, and a
    model with both is rank-deficient in every fold of cross-validation, so it is never
    validated, never chosen, and the terms beside the twins are never tried."""
    norms = np.linalg.norm(x, axis=0)
    unit = x / np.where(norms > 0, norms, 1.0)
    return [f for j, f in enumerate(features) if norms[j] > 0 and any(
        norms[i] > 0 and np.allclose(unit[:, i], unit[:, j], rtol=1e-9, atol=1e-12)
        for i in range(j))]


def supported(x: np.ndarray, features: Sequence[str], rows: int) -> list[str]:
    """The features a fit on `rows` rows can take (fewer terms than rows): the per-level bytes
    terms with the fewest configurations go first, then the other terms from the last; FLOPs
    stay. Terms without data are kept (`fit_linear` drops and names them)."""
    has_data = [f for i, f in enumerate(features) if np.any(x[:, i] != 0)]
    levels = sorted((f for f in has_data if f.startswith("bytes_")),
                    key=lambda f: (np.count_nonzero(x[:, features.index(f)]), f))
    rest = [f for f in reversed(has_data) if not f.startswith("bytes_") and f != "flops"]
    order = levels + rest
    keep = list(features)
    while sum(f in has_data for f in keep) >= rows and order:
        keep.remove(order.pop(0))
    return keep


def _row_values(row: dict[str, Any], levels: Sequence[str]) -> dict[str, float]:
    try:
        values = run_features(
            float(row["flops_per_step"]), int(row["params"]),
            {lv: float(row[f"bytes_per_step_{lv}"]) for lv in levels}, int(row["steps"]),
        )
        values["time_s"] = float(row["time_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FitError(f"row {row.get('key', '?')}: missing or bad column {exc}") from exc
    return values
