"""Predictions from models fitted on synthetic sweeps: intervals that cover, notes that warn."""

from __future__ import annotations

import numpy as np
import pytest
from test_model_fit import (
    ENERGY,
    ESTIMATED,
    PLANTED,
    TIME,
    grid_configs,
    synthetic_rows,
    truth,
)

from fecomlite.model.cache import CacheLevel, MemoryHierarchy
from fecomlite.model.features import ApiFeatures, api_features, dense, run_features, training_step
from fecomlite.model.fit import FitError, fit_models
from fecomlite.model.network import NetworkConfig
from fecomlite.model.predict import predict, predict_call

NOISE = 0.05


@pytest.fixture(scope="module")
def models():
    rows = synthetic_rows(np.random.default_rng(20), grid_configs(), noise=NOISE)
    return fit_models(rows, PLANTED.to_json(), ESTIMATED, source={"sweep_id": 1})


def true_values(config: NetworkConfig) -> tuple[dict[str, float], int]:
    step = training_step(config.layers(), PLANTED)
    return run_features(step.flops, step.params, step.bytes_by_level, config.steps), config.steps


def test_interval_covers_new_measurements_at_about_its_rate(models):
    """New configurations, measured from the same noisy world: 90 % intervals hold ~90 %."""
    rng = np.random.default_rng(21)
    configs = grid_configs(widths=(12, 24, 48, 96, 192, 384), depths=(1, 2, 4), batches=(32, 128))
    hits = []
    for config in configs:
        for _ in range(10):
            values, steps = true_values(config)
            time_s = truth(values, TIME) * (1 + NOISE * rng.standard_normal())
            values["time_s"] = time_s
            measured = truth(values, ENERGY) * (1 + NOISE * rng.standard_normal())
            p = predict(models, training_step(config.layers(), PLANTED), steps, time_s=time_s,
                        confidence=0.9)
            hits.append(p.low_J <= measured <= p.high_J)
    assert 0.82 < np.mean(hits) < 0.97


def test_predicted_time_widens_the_interval_and_is_itself_an_interval(models):
    config = NetworkConfig(96, 2, batch_size=64, dataset_size=2048)
    step = training_step(config.layers(), PLANTED)
    values, steps = true_values(config)
    true_time = truth(values, TIME)
    given = predict(models, step, steps, time_s=true_time)
    guessed = predict(models, step, steps)
    assert given.time_source == "given" and guessed.time_source == "predicted"
    assert guessed.time_low_s < true_time < guessed.time_high_s
    assert guessed.high_J - guessed.low_J > given.high_J - given.low_J
    values["time_s"] = true_time
    assert guessed.low_J < truth(values, ENERGY) < guessed.high_J
    assert guessed.low_J < guessed.energy_J < guessed.high_J
    assert set(guessed.naive) == {"time_flops", "flops_only", "params_only"}
    assert guessed.provenance["label"].startswith("estimated")
    assert guessed.notes == []


def test_notes_say_what_the_interval_does_not_cover():
    rows = synthetic_rows(np.random.default_rng(22), grid_configs(widths=(8, 16, 32, 64)))
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    assert "bytes_DRAM" in models.memory_aware.dropped
    big = NetworkConfig(2048, 2, batch_size=64, dataset_size=2048)
    layers = [*big.layers(), ApiFeatures("keras.layers.LSTM", False)]
    p = predict(models, training_step(layers, PLANTED), big.steps)
    text = " ".join(p.notes)
    assert "1 layer(s) without a FLOP model" in text and "keras.layers.LSTM" in text
    assert "DRAM: this network's working set reaches a level no fitted configuration" in text
    assert "outside the fitted range in" in text and "flops" in p.extrapolated


def test_predict_inside_the_grid_is_not_flagged_and_outside_is(models):
    """A configuration of the grid itself is inside every fitted range; one 8× wider than the
    widest is flagged. Both: point estimate ≥ 0 and inside its own interval, energy and time."""
    inside = NetworkConfig(64, 2, batch_size=64, dataset_size=2048)
    outside = NetworkConfig(4096, 3, batch_size=256, dataset_size=2048)
    for config, flagged in ((inside, False), (outside, True)):
        p = predict(models, training_step(config.layers(), PLANTED), config.steps)
        assert bool(p.extrapolated) is flagged
        assert 0 <= p.low_J <= p.energy_J <= p.high_J
        assert 0 <= p.time_low_s <= p.time_s <= p.time_high_s
        assert p.model == models.best_name
    assert "flops" in predict(models, training_step(outside.layers(), PLANTED),
                              outside.steps).extrapolated


def test_bad_predictions_are_refused(models):
    step = training_step(NetworkConfig(16, 1).layers(), PLANTED)
    with pytest.raises(FitError, match="steps must be positive"):
        predict(models, step, 0)
    for time_s in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(FitError, match="time must be a positive number"):
            predict(models, step, 10, time_s=time_s)
    with pytest.raises(FitError, match="confidence must be between 0 and 1"):
        predict(models, step, 10, confidence=1.5)
    other = MemoryHierarchy("cpu", (CacheLevel("L3", 1 << 30), CacheLevel("DRAM", None)), "x")
    with pytest.raises(FitError, match="hierarchy the model was fitted on"):
        predict(models, training_step(NetworkConfig(16, 1).layers(), other), 10)


def test_prediction_json_is_plain():
    rows = synthetic_rows(np.random.default_rng(23), grid_configs(widths=(16, 64, 256)))
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    out = predict(models, training_step(NetworkConfig(32, 2).layers(), PLANTED), 50).to_json()
    assert out["time_source"] == "predicted" and out["time_model"] == models.time_model
    assert out["low_J"] < out["energy_J"] < out["high_J"]
    assert isinstance(out["naive"]["flops_only"], list)


def test_one_call_is_priced_by_the_memory_aware_coefficients(models):
    call = dense(64, 256, 256, api="keras.layers.Dense.__call__")
    mean, low, high = predict_call(models, call, PLANTED, time_s=0.002)
    fit = models.memory_aware
    coef = dict(zip(fit.features, fit.coef, strict=True))
    level = PLANTED.level_of(call.working_set)
    expected = (coef["flops"] * call.flops + coef[f"bytes_{level}"] * (
        call.bytes_read + call.bytes_written) + coef["time_s"] * 0.002)
    assert mean == pytest.approx(expected)
    assert 0 <= low < mean < high
    with pytest.raises(FitError, match="no FLOP model"):
        predict_call(models, api_features("tensorflow.nn.softmax"), PLANTED, 0.001)


def test_lower_bounds_never_go_below_zero(models):
    """The naive models miss by far more than 100 % here: their intervals are wide on the log
    scale, from the data's spread, not cut at zero."""
    p = predict(models, training_step(NetworkConfig(32, 2).layers(), PLANTED), 50)
    assert models.fits["flops_only"].sigma > 1
    mean, low, high = p.naive["flops_only"]
    assert 0.0 < low < mean < high and high / mean > 10
    assert mean / low == pytest.approx(high / mean)
    assert p.low_J > 0 and p.time_low_s > 0
