"""The fits on data generated from known models with noise: recovery, honesty of the errors,
the memory-aware model against the naive ones on a planted cache step.

`synthetic_rows` is also used by the predict and command tests.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fecomlite.model.cache import CacheLevel, MemoryHierarchy
from fecomlite.model.features import run_features
from fecomlite.model.fit import EnergyModels, FitError, LinearFit, fit_linear, fit_models
from fecomlite.model.identify import identify, sentence
from fecomlite.model.network import NetworkConfig
from fecomlite.model.sweep import feature_columns

PLANTED = MemoryHierarchy(
    "cpu", (CacheLevel("L1d", 32 << 10), CacheLevel("L2", 1 << 20), CacheLevel("DRAM", None)),
    "planted for tests",
)
# J per feature unit: 20 pJ/FLOP, per-byte costs that jump 15× when the working set leaves L2
ENERGY = {"flops": 20e-12, "bytes_L1d": 5e-12, "bytes_L2": 20e-12, "bytes_DRAM": 300e-12,
          "time_s": 3.0}
TIME = {"flops": 0.1e-9, "bytes_L1d": 0.01e-9, "bytes_L2": 0.02e-9, "bytes_DRAM": 0.4e-9,
        "steps": 1e-3}
ESTIMATED = {"cpu-package": {"provenance": "estimated", "model": "cpu-util-linear",
                             "additive": True}}


def grid_configs(widths=(8, 16, 32, 64, 128, 256, 512), depths=(1, 2, 3),
                 batches=(16, 64, 256)) -> list[NetworkConfig]:
    return [NetworkConfig(w, d, "rectangle", b, 2048)
            for w, d, b in itertools.product(widths, depths, batches)]


def truth(values: dict[str, float], coefficients: dict[str, float]) -> float:
    return sum(c * values[f] for f, c in coefficients.items())


def synthetic_rows(
    rng: np.random.Generator, configs: list[NetworkConfig], noise: float = 0.03,
    energy: dict[str, float] = ENERGY, hierarchy: MemoryHierarchy = PLANTED,
) -> list[dict]:
    """Sweep rows whose time and energy follow TIME and `energy`, with relative noise."""
    rows = []
    for config in configs:
        row = feature_columns(config, hierarchy)
        values = run_features(row["flops_per_step"], row["params"],
                              {lv: row[f"bytes_per_step_{lv}"] for lv in hierarchy.level_names},
                              row["steps"])
        time_s = truth(values, TIME) * (1 + noise * rng.standard_normal())
        values["time_s"] = time_s
        joules = truth(values, energy) * (1 + noise * rng.standard_normal())
        row.update({"time_s": time_s, "energy_J_cpu-package": joules,
                    "idle_W_cpu-package": 10.0, "energy_J_all": joules, "status": "finished"})
        rows.append(row)
    return rows


def test_fit_recovers_known_coefficients_from_noisy_data():
    rng = np.random.default_rng(1)
    x = rng.uniform(0.1, 1.0, size=(80, 3)) * np.array([1e11, 1e10, 1.0])  # terms of a few J
    beta = np.array([2e-11, 3e-10, 4.0])
    y = x @ beta * (1 + 0.02 * rng.standard_normal(80))
    fit = fit_linear(x, y, ["flops", "bytes", "time_s"], weighting="relative")
    assert fit.features == ["flops", "bytes", "time_s"] and fit.dropped == []
    assert np.all(np.abs(fit.coef - beta) < 4 * fit.std_errors)
    np.testing.assert_allclose(fit.coef, beta, rtol=0.1)
    assert fit.sigma == pytest.approx(0.02, rel=0.25)
    assert fit.r2 > 0.99
    assert 0.01 < fit.cv_rel_rmse < 0.04
    np.testing.assert_allclose(fit.y - fit.fitted, fit.residuals)


def test_absolute_weighting_recovers_additive_noise_models():
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 10, size=(60, 2))
    y = x @ np.array([1.5, 0.5]) + 0.1 * rng.standard_normal(60)
    x[0], y[0] = (0.0, 0.0), 0.0  # a true zero: allowed here, and no relative error for it
    fit = fit_linear(x, y, ["a", "b"], weighting="absolute")
    np.testing.assert_allclose(fit.coef, [1.5, 0.5], atol=0.02)
    assert fit.sigma == pytest.approx(0.1, rel=0.3)
    assert np.isfinite(fit.cv_rel_rmse)


def test_a_cost_the_data_push_below_zero_is_held_at_zero_not_fitted_negative():
    """Unconstrained least squares gives b ≈ −0.5 here; no physical cost is negative, so the
    fit keeps b at 0 and the interval of any new row holds its (non-negative) point estimate."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 10, size=(60, 2))
    y = x @ np.array([1.5, -0.5]) + 0.1 * rng.standard_normal(60)
    assert np.linalg.lstsq(x, y, rcond=None)[0][1] < 0
    fit = fit_linear(x, y, ["a", "b"], weighting="absolute")
    assert fit.coef[1] == 0.0 and fit.coef[0] > 0
    mean, low, high, _ = fit.interval({"a": 0.1, "b": 10.0})
    assert 0.0 <= low <= mean <= high


@settings(max_examples=40, deadline=None)
@given(
    coefficients=st.lists(st.floats(0.05, 5.0), min_size=2, max_size=4),
    noise=st.floats(0.005, 0.05),
    seed=st.integers(0, 2**32 - 1),
)
def test_positive_coefficients_are_recovered_within_their_uncertainty_never_negative(
    coefficients, noise, seed
):
    """Data from known positive costs with relative noise: every fitted coefficient is ≥ 0 and
    within 5 standard errors (+ a hair for the bound) of its truth."""
    rng = np.random.default_rng(seed)
    beta = np.array(coefficients)
    scales = 10.0 ** rng.integers(-3, 4, size=beta.size)  # columns of very different sizes
    x = rng.uniform(0.1, 1.0, size=(40, beta.size)) * scales
    beta = beta / scales
    y = x @ beta * (1 + noise * rng.standard_normal(40))
    fit = fit_linear(x, y, [f"f{i}" for i in range(beta.size)])
    assert np.all(fit.coef >= 0)
    assert np.all(np.abs(fit.coef - beta) <= 5 * fit.std_errors + 1e-12 * np.abs(beta))


def test_standard_errors_are_honest():
    """Over many noisy data sets, the truth is within ±1.645 SE about 90 % of the time."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.1, 1.0, size=(30, 2))
    beta = np.array([2.0, 5.0])
    inside = []
    for _ in range(300):
        y = x @ beta * (1 + 0.05 * rng.standard_normal(30))
        fit = fit_linear(x, y, ["a", "b"], folds=2)
        inside.append(np.abs(fit.coef - beta) <= 1.645 * fit.std_errors)
    assert 0.84 < np.mean(inside) < 0.96


def test_features_without_data_are_dropped_and_named():
    rng = np.random.default_rng(4)
    x = np.column_stack([rng.uniform(1, 2, 20), np.zeros(20)])
    fit = fit_linear(x, 3 * x[:, 0], ["flops", "bytes_DRAM"])
    assert fit.features == ["flops"] and fit.dropped == ["bytes_DRAM"]
    assert fit.predict({"flops": 2.0}) == pytest.approx(6.0)


@pytest.mark.parametrize(("x", "y", "names", "kwargs", "message"), [
    (np.ones((2, 2)), np.ones(2), ["a", "b"], {}, "2 rows cannot fit 2 coefficients"),
    (np.ones((5, 1)), np.array([1, 2, 0, 3, 4.0]), ["a"], {}, "needs positive energy_J"),
    (np.ones((5, 1)), np.array([1, 2, np.nan, 3, 4.0]), ["a"], {}, "finite"),
    (np.zeros((5, 1)), np.ones(5), ["a"], {}, "every feature is zero"),
    (np.ones((5, 1)), np.ones(5), ["a"], {"weighting": "robust"}, "weighting must be"),
    (np.ones((5, 2)), np.ones(5), ["a"], {}, "and 1 names"),
])
def test_data_a_model_cannot_be_fitted_to(x, y, names, kwargs, message):
    with pytest.raises(FitError, match=message):
        fit_linear(x, y, names, **kwargs)


def test_interval_of_a_new_observation_covers_at_its_stated_rate():
    rng = np.random.default_rng(5)
    beta = np.array([2.0, 0.5])
    hits = []
    for _ in range(40):
        x = rng.uniform(0.1, 1.0, size=(25, 2))
        fit = fit_linear(x, x @ beta * (1 + 0.05 * rng.standard_normal(25)), ["a", "b"],
                         folds=2)
        for x0 in rng.uniform(0.1, 1.0, size=(25, 2)):
            y0 = x0 @ beta * (1 + 0.05 * rng.standard_normal())
            _, low, high, _ = fit.interval({"a": x0[0], "b": x0[1]}, 0.9)
            hits.append(low <= y0 <= high)
    assert 0.86 < np.mean(hits) < 0.94
    with pytest.raises(FitError, match="confidence"):
        fit.interval({"a": 1, "b": 1}, 1.5)
    with pytest.raises(FitError, match="no value for b"):
        fit.interval({"a": 1}, 0.9)


def test_a_saved_fit_predicts_the_same():
    rng = np.random.default_rng(6)
    x = rng.uniform(1, 2, size=(12, 2))
    fit = fit_linear(x, x @ [1.0, 2.0] + rng.uniform(0, 0.1, 12), ["a", "b"])
    again = LinearFit.from_json(fit.to_json())
    assert again.interval({"a": 1.5, "b": 1.2}) == fit.interval({"a": 1.5, "b": 1.2})
    with pytest.raises(FitError, match="not a saved fit"):
        LinearFit.from_json({"name": "x"})


def test_memory_aware_model_beats_flops_only_on_a_planted_cache_step():
    rows = synthetic_rows(np.random.default_rng(7), grid_configs())
    levels = {row["working_set_level"] for row in rows}
    assert levels == {"L1d", "L2", "DRAM"}
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    memory, flops = models.fits["memory_aware"], models.fits["flops_only"]
    assert memory.cv_rel_rmse < 0.06  # about the 3 % noise, plus errors in time
    assert flops.cv_rel_rmse > 3 * memory.cv_rel_rmse
    assert models.fits["params_only"].cv_rel_rmse > 3 * memory.cv_rel_rmse
    assert memory.r2 > flops.r2
    dram = memory.features.index("bytes_DRAM")
    assert memory.coef[dram] == pytest.approx(ENERGY["bytes_DRAM"], rel=0.3)
    assert models.fits["time"].coef[models.fits["time"].features.index("steps")] == \
        pytest.approx(TIME["steps"], rel=0.2)
    ranked = models.comparison()  # best first by out-of-sample error
    assert sorted(r["model"] for r in ranked) == [
        "flops_only", "memory_aware", "params_only", "time_flops"]
    assert [r["cv_rel_rmse"] for r in ranked] == sorted(r["cv_rel_rmse"] for r in ranked)
    assert models.best_name == "memory_aware" and models.best is memory


def test_energy_per_flop_jumps_at_the_breakpoint():
    """Without per-step overhead (which makes small networks dear per FLOP), every network whose
    working set is in DRAM costs more per FLOP than any that stays in L2."""
    no_overhead = {**ENERGY, "time_s": 0.0}
    rows = synthetic_rows(np.random.default_rng(8), grid_configs(), noise=0.0, energy=no_overhead)
    points = fit_models(rows, PLANTED.to_json(), ESTIMATED).to_json()["points"]
    by_level = {lv: [p["pj_per_flop"] for p in points if p["level"] == lv]
                for lv in ("L1d", "L2", "DRAM")}
    assert min(by_level["DRAM"]) > max(by_level["L2"] + by_level["L1d"])


def test_a_flops_only_world_is_fitted_as_well_by_both():
    """No cache step planted: the extra terms buy nothing, and the fits agree."""
    flat = {"flops": 20e-12, "bytes_L1d": 0.0, "bytes_L2": 0.0, "bytes_DRAM": 0.0, "time_s": 0.0}
    rows = synthetic_rows(np.random.default_rng(9), grid_configs(), energy=flat)
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    assert models.fits["flops_only"].coef[0] == pytest.approx(20e-12, rel=0.02)
    assert models.fits["flops_only"].cv_rel_rmse < 0.05


def test_provenance_label_names_the_estimation_models():
    rows = synthetic_rows(np.random.default_rng(10), grid_configs(widths=(16, 64, 256)))
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED, source={"sweep_id": 3})
    assert models.provenance["label"] == "estimated (model cpu-util-linear)"
    assert models.provenance["sweep_id"] == 3
    for row in rows:
        row["energy_J_gpu:0"] = 1.0 + row["flops_per_step"] * 1e-9
        row["idle_W_gpu:0"] = 100.0
    mixed = {**ESTIMATED, "gpu:0": {"provenance": "measured", "model": None, "additive": True}}
    label = fit_models(rows, PLANTED.to_json(), mixed).provenance["label"]
    assert label.startswith("mixed: cpu-package estimated, gpu:0 measured")
    gpu_only = fit_models(rows, PLANTED.to_json(), mixed, domain="gpu:0")
    assert gpu_only.provenance["label"] == "measured"
    assert gpu_only.fits["flops_only"].y[0] == pytest.approx(rows[0]["energy_J_gpu:0"])


def test_total_energy_adds_idle_power_times_time():
    rows = synthetic_rows(np.random.default_rng(11), grid_configs(widths=(16, 64, 256)))
    above = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    total = fit_models(rows, PLANTED.to_json(), ESTIMATED, target="total")
    expected = above.memory_aware.y + 10.0 * np.array([r["time_s"] for r in rows])
    np.testing.assert_allclose(total.memory_aware.y, expected)
    static = total.memory_aware.coef[total.memory_aware.features.index("time_s")]
    assert static == pytest.approx(ENERGY["time_s"] + 10.0, rel=0.15)


def test_bad_requests_and_saved_models():
    rows = synthetic_rows(np.random.default_rng(12), grid_configs(widths=(16, 64, 256)))
    with pytest.raises(FitError, match="no energy domain 'dram'"):
        fit_models(rows, PLANTED.to_json(), ESTIMATED, domain="dram")
    with pytest.raises(FitError, match="target must be"):
        fit_models(rows, PLANTED.to_json(), ESTIMATED, target="peak")
    with pytest.raises(FitError, match="1 rows cannot fit 1 coefficients"):
        fit_models(rows[:1], PLANTED.to_json(), ESTIMATED)
    broken = [dict(rows[0])]
    del broken[0]["time_s"]
    with pytest.raises(FitError, match="missing or bad column"):
        fit_models(broken, PLANTED.to_json(), ESTIMATED)
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)
    again = EnergyModels.from_json(models.to_json())
    values = {"flops": 1e9, "bytes_L1d": 1e6, "bytes_L2": 1e7, "bytes_DRAM": 0, "time_s": 1.0}
    assert again.memory_aware.interval(values) == models.memory_aware.interval(values)
    assert [b["level"] for b in models.to_json()["breakpoints"]] == ["L1d", "L2"]
    with pytest.raises(FitError, match="not a fitted model"):
        EnergyModels.from_json({"format": "something else"})


def test_a_small_sweep_gets_the_largest_model_its_rows_support_with_the_terms_left_out_named():
    rows = synthetic_rows(np.random.default_rng(13), grid_configs(widths=(16, 512), depths=(1, 3),
                                                                  batches=(64,)))
    models = fit_models(rows, PLANTED.to_json(), ESTIMATED)  # 4 rows, 5 terms with data
    memory = models.memory_aware
    assert len(memory.features) < len(rows) and "flops" in memory.features
    assert memory.omitted and all(f.startswith("bytes_") for f in memory.omitted)
    assert not set(memory.omitted) & set(memory.features)
    assert models.identification["identified"] is False
    assert any("left out" in r for r in models.identification["reasons"])
    assert models.fits["time"].omitted  # the time model too: 6 terms on 4 rows
    again = EnergyModels.from_json(models.to_json())
    assert again.memory_aware.omitted == memory.omitted
    assert again.identification == models.identification


def test_collinear_hierarchy_terms_are_reported_as_not_identified():
    """A grid where each level's bytes are a fixed multiple of the FLOPs: any split of the
    energy among the levels fits, so the per-level costs are not costs."""
    rng = np.random.default_rng(14)
    flops = rng.uniform(1e9, 1e11, 12)
    x = np.column_stack([flops, 0.5 * flops, 0.2 * flops * (1 + 1e-4 * rng.standard_normal(12)),
                         flops * 1e-10])
    features = ["flops", "bytes_L1d", "bytes_L2", "time_s"]
    fit = fit_linear(x, x @ [20e-12, 5e-12, 20e-12, 3.0] * (1 + 0.02 * rng.standard_normal(12)),
                     features)
    check = identify(x, features, fit.coef, fit.std_errors, ["L1d", "L2", "DRAM"])
    assert check["identified"] is False and check["separable"] is False
    assert check["condition_number"] > 30 and max(check["vif"].values()) > 10
    assert "collinear" in sentence(check) and "time/FLOP model" in sentence(check)
    rng = np.random.default_rng(15)  # independent terms, costs well above their errors
    x = rng.uniform(1, 10, size=(40, 3))
    fit = fit_linear(x, x @ [1.0, 2.0, 8.0] * (1 + 0.01 * rng.standard_normal(40)),
                     ["bytes_L1d", "bytes_L2", "bytes_DRAM"])
    check = identify(x, fit.features, fit.coef, fit.std_errors, ["L1d", "L2", "DRAM"])
    assert check["identified"] is True, check["reasons"]
    fit = fit_linear(x, x @ [8.0, 2.0, 1.0] * (1 + 0.01 * rng.standard_normal(40)),
                     ["bytes_L1d", "bytes_L2", "bytes_DRAM"])
    check = identify(x, fit.features, fit.coef, fit.std_errors, ["L1d", "L2", "DRAM"])
    assert check["ordered"] is False and not check["identified"]


def test_a_relative_interval_is_from_the_data_s_spread_never_cut_at_zero():
    rng = np.random.default_rng(16)
    x = rng.uniform(0.1, 1.0, size=(6, 2))
    fit = fit_linear(x, x @ [2.0, 0.5] * (1 + 0.4 * rng.standard_normal(6)).clip(0.1), ["a", "b"])
    mean, low, high, _ = fit.interval({"a": 0.5, "b": 0.5}, 0.9)
    assert 0 < low < mean < high
    assert mean / low == pytest.approx(high / mean)  # symmetric on the log scale
