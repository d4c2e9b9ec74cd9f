"""Predicted energy of a network's training, with an interval and the data it rests on.

The energy model used is the one ranked best by cross-validated error (`EnergyModels.best`).
The memory-aware model needs the run's time. When it is not given, the time model fitted on the
same sweep predicts it (a sum of costs or a power law, whichever predicts held-out configurations
better; named in `time_model`), and its uncertainty is added: var(E) = var(E | time) + s² ·
var(time), s the model's static power (the two fits' errors are treated as independent).
Intervals are Student-t intervals of a new configuration measured as the sweep's were, the mean
of as many repetitions (`LinearFit.interval`): parameter spread, the model's misfit between
configurations and the repetitions' spread, the residuals relative (the spread grows with the
energy), so the interval is taken on the log scale (`spread.bounds`): mean ×/÷ a factor, never
a bound at zero. A feature outside the range the fits saw is named in `extrapolated` (and in
the notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.model.cache import MemoryHierarchy
from fecomlite.model.features import ApiFeatures, StepFeatures, run_features
from fecomlite.model.fit import ENERGY_MODELS, EnergyModels, LinearFit
from fecomlite.model.load import at_wait
from fecomlite.model.spread import FitError, bounds


@dataclass
class Prediction:
    energy_J: float
    low_J: float
    high_J: float
    confidence: float
    time_s: float
    time_low_s: float
    time_high_s: float
    time_source: str  # "given" or "predicted"
    features: dict[str, float]
    naive: dict[str, tuple[float, float, float]]  # model -> (mean, low, high)
    provenance: dict[str, Any]
    model: str = "memory_aware"
    time_model: str = ""  # the time model that predicted the time (empty: the time was given)
    extrapolated: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "energy_J": self.energy_J, "low_J": self.low_J, "high_J": self.high_J,
            "confidence": self.confidence, "time_s": self.time_s, "time_low_s": self.time_low_s,
            "time_high_s": self.time_high_s, "time_source": self.time_source,
            "features": self.features,
            "naive": {k: list(v) for k, v in self.naive.items()},
            "provenance": self.provenance, "model": self.model, "time_model": self.time_model,
            "extrapolated": self.extrapolated, "notes": self.notes,
        }


def predict(
    models: EnergyModels, step: StepFeatures, steps: int, *, time_s: float | None = None,
    confidence: float = 0.9, wait: float | None = None,
) -> Prediction:
    """Energy of `steps` training steps of a network whose one step is `step`; wait: the
    run-queue wait per CPU second of the run predicted (default: the sweep's median, where
    the sweep took load out, `model.load`)."""
    if steps < 1:
        raise FitError(f"steps must be positive, not {steps}")
    if not 0 < confidence < 1:
        raise FitError(f"confidence must be between 0 and 1 (e.g. 0.9), not {confidence}")
    levels = set(models.levels)
    strange = set(step.bytes_by_level) - levels
    if strange:
        raise FitError(f"the features use cache levels {sorted(strange)}, the model "
                       f"{models.levels}: predict on the hierarchy the model was fitted on")
    values = run_features(step.flops, step.params, step.bytes_by_level, steps)
    for level in levels - set(step.bytes_by_level):
        values[f"bytes_{level}"] = 0.0
    notes = _notes(models, step, values)
    notes += [info["text"] for info in models.load.values() if info.get("applied")]
    notes += [models.left_out] if models.left_out else []
    if wait is not None and not 0 <= wait < math.inf:
        raise FitError(f"the wait must be a number of seconds per CPU second ≥ 0, not {wait}")
    memory = models.best
    if time_s is None:
        t_mean, t_low, t_high, t_sd = models.fits["time"].interval(values, confidence)
        source = "predicted"
        if t_mean <= 0:
            notes.append("the time model predicts no positive time here: outside its data")
    else:
        if not 0 < time_s < math.inf:
            raise FitError(f"time must be a positive number of seconds, not {time_s}")
        t_mean, t_low, t_high, t_sd, source = time_s, time_s, time_s, 0.0, "given"
    values["time_s"] = t_mean  # at the sweep's median load, as the energy models were fitted
    mean, low, high = _energy(models, memory, values, t_sd, source, confidence, wait)
    naive = {name: _energy(models, models.fits[name], values, t_sd, source, confidence, wait)
             for name in ENERGY_MODELS if name != models.best_name}
    if wait is not None and any(info.get("applied") for info in models.load.values()):
        if source == "predicted":
            t_mean, t_sd = at_wait(t_mean, t_sd, models.load.get("time", {}), wait)
            t_low, t_high = bounds(t_mean, t_sd, models.fits["time"].t(confidence),
                                   models.fits["time"].weighting)
        notes.append(f"moved to a run that waits {wait:.2f} s for a CPU per CPU second")
    outside = sorted({*memory.outside(values),
                      *(models.fits["time"].outside(values) if source == "predicted" else [])})
    if outside:
        notes.append(f"outside the fitted range in {', '.join(outside)}: an extrapolation")
    return Prediction(mean, low, high, confidence, t_mean,
                      t_low, t_high, source, values, naive, models.provenance,
                      models.best_name, models.time_model if source == "predicted" else "",
                      outside, notes)


def _energy(
    models: EnergyModels, fit: LinearFit, values: dict[str, float], t_sd: float, source: str,
    confidence: float, wait: float | None,
) -> tuple[float, float, float]:
    """(mean, low, high) of one energy model: with a predicted time, its spread × the model's
    static power joins in (and the t of the fewer degrees of freedom of the two fits); moved to
    `wait` where the sweep took load out."""
    mean, _, _, sd = fit.interval(values, confidence)
    if "time_s" in fit.features:
        static = float(fit.coef[fit.features.index("time_s")])
        sd = float(np.hypot(sd, static * t_sd))
    dof_fit = fit if source == "given" else min(fit, models.fits["time"], key=lambda f: f.dof)
    if wait is not None:
        mean, sd = at_wait(mean, sd, models.load.get("energy", {}), wait)
    low, high = bounds(mean, sd, dof_fit.t(confidence), fit.weighting)
    return mean, low, high


def predict_call(
    models: EnergyModels, call: ApiFeatures, hierarchy: MemoryHierarchy, time_s: float,
    confidence: float = 0.9,
) -> tuple[float, float, float]:
    """(mean, low, high) energy of one forward call that took `time_s` (e.g. a measured call of a
    method-level run): its FLOPs, its bytes at the level its working set fits in, its time."""
    if not call.known:
        raise FitError(call.note or f"no FLOP model for {call.api}")
    values = {f"bytes_{level}": 0.0 for level in models.levels}
    values[f"bytes_{hierarchy.level_of(call.working_set)}"] = call.bytes_read + call.bytes_written
    values.update(flops=call.flops, time_s=time_s)
    mean, low, high, _ = models.memory_aware.interval(values, confidence)
    return mean, low, high


def _notes(models: EnergyModels, step: StepFeatures, values: dict[str, float]) -> list[str]:
    """What makes this prediction less certain than its interval says."""
    notes = []
    if step.unknown:
        notes.append(f"{len(step.unknown)} layer(s) without a FLOP model are not counted: "
                     f"{', '.join(step.unknown)}")
    memory = models.memory_aware
    for feature in memory.dropped:
        if values.get(feature, 0.0) > 0:
            notes.append(f"{feature.removeprefix('bytes_')}: this network's working set reaches "
                         "a level no fitted configuration reached; its cost is not in the model "
                         "(the prediction is too low by that much)")
    return notes
