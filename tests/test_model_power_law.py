"""The time model's two forms compete by their error on held-out configurations: a sweep whose
time follows a power law of the FLOPs per step gets the power law, and a prediction inside its
grid within the targets; one whose time is a sum of costs per FLOP and per step keeps the
linear model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_model_fit import ESTIMATED, PLANTED
from test_model_repetitions import ENERGY, GRID, NEW, measure

from fecomlite.model.command import _print_fit, _print_prediction
from fecomlite.model.features import training_step
from fecomlite.model.fit import EnergyModels, fit_models
from fecomlite.model.power_law import PowerLawFit, fit_power_law
from fecomlite.model.predict import predict

# a loaded machine's time: 0.45 power of the FLOPs per step (800× the FLOPs, 20× the time)
SCALE, EXPONENT = 4e-5, 0.45


def power_time(values: dict[str, float]) -> float:
    return SCALE * (values["flops"] / values["steps"]) ** EXPONENT * values["steps"]


def test_a_power_law_sweep_gets_the_power_law_and_predicts_inside_its_grid_within_the_targets(
    capsys,
):
    rng = np.random.default_rng(40)
    models = fit_models([measure(c, rng, spread=0.15, time_law=power_time) for c in GRID],
                        PLANTED.to_json(), ESTIMATED)
    time = models.fits["time"]
    assert isinstance(time, PowerLawFit)
    chosen = [m for m in models.time_models if m["chosen"]]
    assert [m["form"] for m in chosen] == ["power law (time ∝ steps)"]
    linear = np.nanmin([m["cv_rel_rmse"] for m in models.time_models if m["form"] == "linear"])
    assert time.cv_rel_rmse < 0.5 * linear
    assert time.coef[1] == pytest.approx(EXPONENT, abs=0.05)
    for config in NEW:  # inside the grid: the true mean within 25 %, the interval within ±50 %
        step = training_step(config.layers(), PLANTED)
        p = predict(models, step, config.steps)
        true_time = power_time(p.features)
        true_energy = sum(c * (true_time if f == "time_s" else p.features[f])
                          for f, c in ENERGY.items())
        assert p.energy_J == pytest.approx(true_energy, rel=0.25)
        assert p.time_low_s < true_time < p.time_high_s
        assert p.low_J > 0 and p.high_J / p.energy_J < 1.5 and p.energy_J / p.low_J < 1.5
    _print_fit(models)  # `model fit` names the law and ranks the time models
    _print_prediction(p, models)
    shown = capsys.readouterr().out
    assert "time (power law): time = " in shown and "power law (time ∝ steps) (used)" in shown
    assert f"time model: {models.time_model}" in shown
    again = EnergyModels.from_json(json.loads(json.dumps(models.to_json())))
    step = training_step(NEW[0].layers(), PLANTED)
    assert predict(again, step, NEW[0].steps).energy_J == pytest.approx(
        predict(models, step, NEW[0].steps).energy_J)


def test_a_linear_sweep_keeps_the_linear_time_model():
    rng = np.random.default_rng(41)
    models = fit_models([measure(c, rng, spread=0.05) for c in GRID], PLANTED.to_json(),
                        ESTIMATED)
    assert not isinstance(models.fits["time"], PowerLawFit)
    assert [m["form"] for m in models.time_models if m["chosen"]] == ["linear"]
    assert any(m["form"].startswith("power law") for m in models.time_models)


def test_the_steps_exponent_is_fitted_only_where_the_steps_vary():
    rng = np.random.default_rng(42)
    flops = rng.uniform(1e6, 1e9, 24)
    steps = np.repeat([32.0, 64.0, 128.0], 8)
    values = [{"flops": f * s, "steps": s} for f, s in zip(flops, steps, strict=True)]
    time = 1e-4 * flops**0.5 * steps**0.8 * np.exp(0.02 * rng.standard_normal(24))
    group = np.arange(24)
    free = fit_power_law(values, time, group, steps_free=True, folds=5)
    assert free.coef[1:] == pytest.approx([0.5, 0.8], abs=0.03) and not free.fixed
    again = PowerLawFit.from_json(free.to_json())
    assert again.interval(values[0]) == free.interval(values[0])
    median, low, high, _ = free.interval({"flops": 1e8 * 64, "steps": 64.0})
    assert 0 < low < median < high and high / median == pytest.approx(median / low)
    assert free.outside({"flops": 1e12, "steps": 64.0}) == ["flops_per_step"]
