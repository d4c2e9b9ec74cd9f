"""A sweep's trainings long enough for the sensors, and its framework threads."""

from __future__ import annotations

import pytest
from cli_runner import invoke

from fecomlite.model.duration import (
    FLOOR_S,
    MIN_PERIODS,
    SAFETY,
    Minimum,
    minimum_training,
    plan,
    scaled,
)
from fecomlite.model.network import NetworkConfig
from fecomlite.model.sweep import default_threads


def sensor(name: str, period_s: float, kind: str = "power", unit: str = "W") -> dict:
    return {"name": name, "kind": kind, "unit": unit, "period_s": period_s}


def test_the_minimum_is_twenty_periods_of_the_coarsest_energy_sensor():
    minimum = minimum_training([sensor("rapl:package-0", 0.001, "counter", "J"),
                                sensor("est:cpu-process", 0.1),
                                sensor("mem:rss", 5.0, "gauge", "B")])  # a gauge is no energy
    assert minimum.seconds == pytest.approx(MIN_PERIODS * 0.1)
    assert "est:cpu-process" in minimum.reason


def test_fast_sensors_and_none_give_the_floor():
    assert minimum_training([sensor("rapl:package-0", 0.001, "counter", "J")]).seconds == FLOOR_S
    none = minimum_training([sensor("mem:rss", 0.1, "gauge", "B")])
    assert none.seconds == FLOOR_S and "no energy sensor" in none.reason


def test_samples_double_until_the_training_lasts_the_target():
    config = NetworkConfig(64, 1, batch_size=64, dataset_size=8192)  # 128 steps
    longer = scaled(config, 0.001, 3.0)  # 0.128 s now: 3 s needs 23.4×, so 32×
    assert longer.dataset_size == 8192 * 32 and longer.steps * 0.001 >= 3.0
    assert longer.width == config.width and longer.batch_size == config.batch_size
    assert scaled(config, 0.1, 3.0) == config  # 12.8 s already


def test_a_plan_scales_only_the_short_configurations_unless_the_samples_are_fixed():
    short = NetworkConfig(64, 1, batch_size=64, dataset_size=8192)
    long = NetworkConfig(1024, 3, batch_size=64, dataset_size=8192)
    unknown = NetworkConfig(256, 2, batch_size=64, dataset_size=8192)
    rates = {short.key: 0.0004, long.key: 0.025}  # s a step: 0.05 s and 3.2 s of training
    minimum = Minimum(2.0, "test")
    scaled_plan = plan([short, long, unknown], rates, minimum, scale=True)
    assert [p.scaled_up for p in scaled_plan] == [True, False, False]
    assert scaled_plan[0].expected_s >= SAFETY * minimum.seconds
    assert scaled_plan[0].config.steps * 0.0004 == pytest.approx(scaled_plan[0].expected_s)
    assert not any(p.too_short for p in scaled_plan)
    edge = plan([long], {long.key: 2.1 / long.steps}, minimum, scale=True)[0]
    assert edge.scaled_up and edge.expected_s == pytest.approx(4.2)  # above 2 s, under 1.5 × 2 s
    assert scaled_plan[2].expected_s is None  # no pilot figure: run as given, nothing claimed
    fixed = plan([short, long], rates, minimum, scale=False)
    assert [p.config for p in fixed] == [short, long]
    assert [p.too_short for p in fixed] == [True, False]
    assert fixed[0].to_json()["samples"] == fixed[0].to_json()["grid_samples"] == 8192


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 1), (4, 3), (64, 63)])
def test_the_default_threads_leave_one_cpu_free(cpus, threads):
    assert default_threads(cpus) == threads


def test_threads_and_minimum_are_checked_before_anything_runs(tmp_path):
    done = invoke(["sweep", "--threads", "0", "--home", str(tmp_path / "h")])
    assert done.exit_code == 2 and "--threads" in done.stderr
    assert "Traceback" not in done.stderr
    done = invoke(["sweep", "--min-training", "-1", "--home", str(tmp_path / "h")])
    assert done.exit_code == 2 and "--min-training" in done.stderr
    assert not (tmp_path / "h").exists()  # no server started, nothing written
