"""Data-size scaling per API: the power-law fit recovers a known exponent within its own
interval, and every API whose calls or inputs change with the fraction gets its fits."""

from __future__ import annotations

import numpy as np
import pytest

from fecomlite.analysis.datasize import fit_curves, largest_exponents, summarise


@pytest.mark.parametrize("exponent", [0.5, 1.0, 2.0])
def test_the_power_law_recovers_a_known_exponent_within_its_interval(exponent: float) -> None:
    rng = np.random.default_rng(7)
    x = np.repeat([0.1, 0.25, 0.5, 0.75, 1.0], 4)
    y = 3.0 * x**exponent * np.exp(rng.normal(0, 0.05, x.size))
    power = fit_curves(x, y)["power"]
    low, high = power["exponent_ci95"]
    assert low < exponent < high
    assert abs(power["exponent"] - exponent) < 0.1
    assert 0 < power["exponent_se"] < 0.05
    assert power["dropped"] == 0


def test_two_points_give_an_exponent_without_an_interval_and_nonpositive_points_are_dropped():
    fits = fit_curves(np.array([0.5, 1.0, 1.0]), np.array([0.0, 2.0, 2.0]))
    assert "power" not in fits  # the positive points lie at one fraction only
    fits = fit_curves(np.array([0.5, 1.0, 0.25]), np.array([1.0, 2.0, -1.0]))
    assert fits["power"]["dropped"] == 1 and fits["power"]["exponent_ci95"] is None
    assert fits["power"]["exponent"] == pytest.approx(1.0)
    assert fits["linear"]["slope_ci95"] is not None  # three points: the line has an interval


def _point(
    api: str, fraction: float, rep: int, calls: int, seconds: float, in_bytes: float = 4096.0
) -> dict:
    return {
        "api": api,
        "fraction": fraction,
        "rep": rep,
        "calls": calls,
        "seconds": seconds,
        "in_bytes": in_bytes,
        "energy_by_domain": {"cpu-package": 2 * seconds, "cpu-process": seconds},
        "provenance_by_domain": {"cpu-package": "estimated", "cpu-process": "estimated"},
        "lead_domain": "cpu-package" if rep == 1 or fraction < 1 else "cpu-process",
        "mem_added_B": 1e6,
        "gpu_mem_added_B": None,
        "run_id": 1,
    }


def test_apis_whose_calls_or_inputs_change_are_fitted_and_ranked_first() -> None:
    points = []
    for f in (0.25, 0.5, 1.0):
        for rep in (1, 2):
            points += [
                _point(
                    "torch.optim.SGD.step", f, rep, int(256 * f), 0.01 * 256 * f * (1 + rep / 50)
                ),
                _point("torch.utils.data.TensorDataset", f, rep, 1, 3e-5, in_bytes=5e5 * f),
                _point("torch.manual_seed", f, rep, 1, 1e-5 * (1 + rep / 10)),
            ]
    result = summarise([], points)
    # one domain for every point, though one busy run led with the process's share
    assert result["domain"] == "cpu-package" and result["provenance"] == "estimated"
    rows = {r["api"]: r for r in result["apis"]}
    step = rows["torch.optim.SGD.step"]
    assert step["changes"] and step["fractions"] == [0.25, 0.5, 1.0]
    assert step["fits"]["calls"]["power"]["exponent"] == pytest.approx(1.0)
    assert step["fits"]["seconds"]["power"]["exponent"] == pytest.approx(1.0, abs=0.02)
    assert step["fits"]["energy_J"]["power"]["exponent"] == pytest.approx(1.0, abs=0.02)
    assert rows["torch.utils.data.TensorDataset"]["changes"]  # its input shrank, not its calls
    assert not rows["torch.manual_seed"]["changes"]
    assert list(rows)[-1] == "torch.manual_seed"  # unchanged APIs last
    assert [r["api"] for r in largest_exponents(result)] == [
        "torch.optim.SGD.step",
        "torch.utils.data.TensorDataset",
    ]


def test_the_terminal_summary_gives_the_linear_fit_with_its_fixed_cost() -> None:
    """A cost of 2 J fixed + 3 µJ per byte looks sub-linear as a power law; the summary says
    both, the line with its fixed cost first."""
    from fecomlite.analysis.datasize import program_fit_lines

    x = np.array([1e5, 2e5, 4e5, 8e5, 1.6e6])
    fits = {"energy_J": fit_curves(x, 2.0 + 3e-6 * x)}
    (line,) = program_fit_lines({"fits": fits})
    assert line.startswith("energy: 2.00 J fixed + 3.00 µJ per byte (linear, R² 1.000)")
    exponent = fits["energy_J"]["power"]["exponent"]
    assert 0 < exponent < 1 and f"∝ bytes^{exponent:.2f} (power law" in line
