"""Sweeps whose repetitions are rows of the fit: intervals that cover a new configuration's
measured mean at their stated rate and are no wider than the noise makes them; load taken out
where the repetitions record it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from test_model_fit import ESTIMATED, PLANTED, truth

from fecomlite.model.features import run_features, training_step
from fecomlite.model.fit import fit_linear, fit_models
from fecomlite.model.identify import sentence
from fecomlite.model.load import normalise
from fecomlite.model.network import NetworkConfig
from fecomlite.model.predict import predict
from fecomlite.model.spread import Components, out_of_sample_floor, variance_components
from fecomlite.model.sweep import feature_columns

# a 3 × 3 grid like a researcher's first sweep, inside which new configurations are predicted
GRID = [NetworkConfig(w, d, "rectangle", 64, 4096) for w in (64, 256, 1024) for d in (1, 2, 3)]
NEW = [NetworkConfig(w, d, "rectangle", 64, 4096) for w in (128, 512) for d in (1, 2, 3)]
REPS = 3
SPREAD = 0.2  # relative spread of one repetition's time (a loaded machine's)
# known coefficients the models can represent: J or s per FLOP, W, s per step
ENERGY = {"flops": 20e-12, "time_s": 3.0}
TIME = {"flops": 0.1e-9, "steps": 1e-3}


def linear_time(values: dict[str, float]) -> float:
    return truth(values, TIME)


def measure(config: NetworkConfig, rng: np.random.Generator, reps: int = REPS,
            spread: float = SPREAD, gamma: float = 0.0,
            time_law: Callable[[dict[str, float]], float] = linear_time) -> dict:
    """A sweep row with its repetitions: each repetition's time (`time_law` of the run's
    features) varies by `spread` and by its wait (energy and time × exp(gamma·wait)); energy
    follows ENERGY on that time."""
    row = feature_columns(config, PLANTED)
    values = run_features(row["flops_per_step"], row["params"],
                          {lv: row[f"bytes_per_step_{lv}"] for lv in PLANTED.level_names},
                          row["steps"])
    wait = rng.uniform(0.0, 2.0, reps)
    times = time_law(values) * (1 + spread * rng.standard_normal(reps)).clip(0.3)
    times *= np.exp(gamma * wait)
    energies = np.array([truth({**values, "time_s": t}, ENERGY) for t in times])
    energies *= 1 + 0.02 * rng.standard_normal(reps)
    row.update({"time_s": float(times.mean()), "reps_time_s": times.tolist(),
                "energy_J_cpu-package": float(energies.mean()),
                "reps_energy_J_cpu-package": energies.tolist(), "idle_W_cpu-package": 10.0,
                "energy_J_all": float(energies.mean()), "reps_wait_per_cpu_s": wait.tolist()})
    return row


def test_repetitions_are_rows_and_cross_validation_holds_out_whole_configurations():
    rng = np.random.default_rng(30)
    models = fit_models([measure(c, rng) for c in GRID], PLANTED.to_json(), ESTIMATED)
    assert models.repetitions == {"rows": 27, "configurations": 9,
                                  "per_configuration": [3] * 9, "left_out": []}
    fit = models.fits["time_flops"]
    assert fit.n == 27 and fit.groups == 9 and fit.reps == 3
    assert len(models.points) == 9  # the report's points stay one per configuration
    # the repetitions' spread is measured: about SPREAD for the time model
    assert models.fits["time"].sigma_within == pytest.approx(SPREAD, rel=0.4)
    # bytes by level grow with the FLOPs over this grid: a time/FLOP model, said so
    check = models.identification
    assert check["identified"] is False and "collinear" in check["reasons"][0]
    assert "time/FLOP model" in sentence(check)


def test_the_interval_covers_a_new_configuration_s_mean_at_its_rate_and_is_no_wider_than_needed():
    """Fitted on 3 × 3 configurations × 3 repetitions whose times vary by 20 %, predicting new
    configurations inside the grid (time not given, as a researcher predicts): the 90 %
    interval holds the mean of their 3 repetitions about 90 % of the time, and its half-width
    (on the log scale) is within 1.6× of what the noise of such a mean needs."""
    rng = np.random.default_rng(31)
    hits, widths = [], []
    for _ in range(40):
        models = fit_models([measure(c, rng) for c in GRID], PLANTED.to_json(), ESTIMATED)
        for config in NEW:
            new = measure(config, rng)
            p = predict(models, training_step(config.layers(), PLANTED), config.steps)
            hits.append(p.low_J <= new["energy_J_all"] <= p.high_J)
            widths.append(np.log(p.high_J / p.energy_J))
    assert 0.84 < np.mean(hits) < 0.97
    needed = 1.645 * SPREAD / np.sqrt(REPS)  # a mean of 3 repetitions, known spread
    assert np.median(widths) < 1.6 * needed
    assert np.exp(np.median(widths)) < 1.5  # the target: within ±50 %


def test_a_misfit_between_configurations_widens_the_interval_beyond_the_repetitions_spread():
    """Residual misfit that repetitions cannot average away (each configuration off by 30 %):
    the lack-of-fit analysis finds it, and the interval keeps it."""
    rng = np.random.default_rng(32)
    group = np.repeat(np.arange(12), 3)
    x = rng.uniform(1, 10, size=(12, 2))[group]
    offsets = (1 + 0.3 * rng.standard_normal(12))[group]
    y = x @ [1.0, 2.0] * offsets * (1 + 0.02 * rng.standard_normal(36))
    fit = fit_linear(x, y, ["a", "b"], groups=group)
    assert fit.sigma_between > 0.15 and fit.sigma_within < 0.05
    assert fit.dof == 12 - 2  # the configurations' degrees of freedom, not the rows'
    _, low, high, _ = fit.interval({"a": 5.0, "b": 5.0})
    assert high / low > np.exp(2 * 1.645 * 0.15)
    # configuration means on the model (no misfit): the rows pool, N − p degrees of freedom
    noise = 0.05 * rng.standard_normal(36)
    noise -= np.bincount(group, weights=noise)[group] / 3
    pooled = variance_components(noise, group, 2)
    assert pooled.dof == 34 and pooled.between == 0.0
    assert pooled.sigma == pytest.approx(np.sqrt(np.sum(noise**2) / 34))


def test_load_is_taken_out_of_the_repetitions_where_they_record_it():
    rng = np.random.default_rng(33)
    rows = [measure(c, rng, spread=0.03, gamma=0.4) for c in GRID]
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    energy = models.load["energy"]
    assert energy["applied"] and energy["gamma"] == pytest.approx(0.4, rel=0.35)
    assert "median wait" in energy["text"]
    unrecorded = [{k: v for k, v in r.items() if k != "reps_wait_per_cpu_s"} for r in rows]
    plain = fit_models(unrecorded, PLANTED.to_json(), ESTIMATED)
    assert not plain.load["energy"]["applied"]
    assert models.fits["time"].sigma < 0.6 * plain.fits["time"].sigma
    step = training_step(NEW[3].layers(), PLANTED)
    p = predict(models, step, NEW[3].steps)
    assert any("median wait" in note for note in p.notes)
    # the same configuration for a run that waits 1 s more per CPU second: e^0.4 more, wider
    busier = predict(models, step, NEW[3].steps, wait=energy["reference_wait_per_cpu_s"] + 1)
    assert busier.energy_J / p.energy_J == pytest.approx(np.exp(energy["gamma"]))
    assert busier.high_J / busier.low_J > p.high_J / p.low_J
    assert busier.time_s > p.time_s
    # no effect of load: nothing is changed
    y = np.array([1.0, 1.1, 0.9] * 4)
    same, info = normalise(y, rng.uniform(0, 2, 12), np.repeat(np.arange(4), 3), "time")
    assert not info["applied"] and same is y


def test_held_out_configurations_missed_by_far_more_than_the_residuals_widen_the_misfit():
    """In-sample the model fits its configurations (σ 20 %, all of it the repetitions'
    spread), held out it misses them by 34 % (a real sweep at load 8): the misfit is the
    difference, not 0. A held-out error near σ (refitting on fewer configurations) changes
    nothing."""
    parts = Components(0.2, 19, 0.04, within=0.2, between=0.0, reps=3.0)
    wider = out_of_sample_floor(parts, 0.344)
    assert wider.between == pytest.approx(np.sqrt(0.344**2 - 0.2**2))
    assert wider.sigma == pytest.approx(0.344) and wider.coef_variance > parts.coef_variance
    assert out_of_sample_floor(parts, 0.25) is parts


def test_a_repetition_far_from_its_configuration_s_others_is_left_out_and_named():
    """A repetition 80× faster than its configuration's two others (a 2-CPU machine loaded 8×
    over, seen on a real sweep) is left out, named, and the interval stays about as narrow as
    without it; the same sweep with every repetition kept would span orders of magnitude."""
    rng = np.random.default_rng(34)
    rows = [measure(c, rng, spread=0.1) for c in GRID]
    clean = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    odd = rows[4]
    odd["reps_time_s"][0] /= 80
    odd["reps_energy_J_cpu-package"][0] /= 80
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    assert models.repetitions["rows"] == 26 and models.repetitions["per_configuration"][4] == 2
    assert [(r["key"], r["repetition"]) for r in models.repetitions["left_out"]] == [
        (odd["key"], 1)]
    assert odd["key"] in models.left_out and "left out" in models.left_out
    step = training_step(NEW[3].layers(), PLANTED)
    p, before = predict(models, step, NEW[3].steps), predict(clean, step, NEW[3].steps)
    assert p.high_J / p.low_J < 1.2 * before.high_J / before.low_J
    assert models.left_out in p.notes and not clean.left_out


def test_twin_terms_go_so_that_every_time_model_is_cross_validated():
    """Every configuration of GRID runs the same steps: `steps` and `fixed` are one column
    twice. With both, every fold was rank-deficient, the full time model (with the per-level
    bytes) had no held-out error and could never be chosen; without the twin it competes."""
    from fecomlite.model.fit import twins

    x = np.array([[1.0, 64.0, 1.0, 0.0], [2.0, 64.0, 1.0, 0.0], [5.0, 64.0, 1.0, 3.0]])
    assert twins(x, ["flops", "steps", "fixed", "bytes_L2"]) == ["fixed"]
    assert twins(x[:, [0, 3]], ["flops", "bytes_L2"]) == []
    models = fit_models([measure(c, np.random.default_rng(35)) for c in GRID], PLANTED.to_json(),
                        ESTIMATED)
    assert all(np.isfinite(row["cv_rel_rmse"]) for row in models.time_models)
    assert any("bytes_" in row["terms"] for row in models.time_models)
    assert all("fixed" not in row["terms"] for row in models.time_models)
    assert "fixed" in models.fits["time"].omitted
