"""Trainings long enough for the sensors: a sweep's minimum training time, a pilot that times each
configuration before it is measured, and the samples that make each one last that long.

A configuration's energy is the training region's share of the sensors' readings. Each end of
the region falls inside one reading interval, which attribution can only split by guess, so the
region's energy is uncertain by up to one interval's energy at each end: 2 × period ÷ duration of
it. `MIN_PERIODS` = 20 intervals keep that edge error under 10 %; `FLOOR_S` keeps trainings on
fast sensors (RAPL's 1 ms) long enough that the scheduler's ticks and the probe's start do not
matter either. On this project's machines (CPU-time models read every 0.1 s) the minimum is 2 s.

Measured on the 2-CPU machine fecomlite is built on: with the grid's default 8,192 samples a
PyTorch 64-wide, 1-deep network trains in 0.05 s, and a 1024-wide, 3-deep one in 3.2 s. The short
ones had no energy above their uncertainty, and the model fitted without them missed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fecomlite.model.network import ConfigError, NetworkConfig

MIN_PERIODS = 20
FLOOR_S = 1.0
# a scaled configuration aims at this multiple of the minimum: the pilot times a few steps, and
# a loaded machine runs the same steps faster or slower from one minute to the next
SAFETY = 1.5
PILOT_TIMEOUT_S = 600.0
ENERGY_KINDS = ("power", "counter")


@dataclass(frozen=True)
class Minimum:
    """The shortest training the sensors resolve, and the sentence that says why."""

    seconds: float
    reason: str


def minimum_training(sensors: Iterable[dict[str, Any]]) -> Minimum:
    """From the energy sensors' periods (the server's status): the coarsest decides."""
    periods = {s.get("name", "?"): float(s["period_s"]) for s in sensors
               if s.get("kind") in ENERGY_KINDS and s.get("unit") in ("W", "J")
               and isinstance(s.get("period_s"), int | float) and s["period_s"] > 0}
    if not periods:
        return Minimum(FLOOR_S, f"no energy sensor reports its period: the floor, {FLOOR_S:g} s")
    name, period = max(periods.items(), key=lambda item: item[1])
    seconds = max(FLOOR_S, MIN_PERIODS * period)
    return Minimum(seconds, f"{MIN_PERIODS} × the coarsest energy sensor's period ({name}, "
                            f"{period:.3g} s), at least {FLOOR_S:g} s: each end of the training "
                            f"then costs under 10 % of its energy in resolution")


def pilot(configs: Sequence[NetworkConfig], framework: str, threads: int) -> dict[str, float]:
    """Each configuration's training seconds per step at the least: its CPU seconds per step,
    timed by the sweep's program in one unmeasured process with the sweep's threads, ÷ the
    threads (no pool does better than sharing the work evenly; load only lengthens the wall
    time, while a pilot's wall time under load is as uncertain as the load). ConfigError says
    why there are none."""
    from fecomlite.model.sweep import FC_PROGRAM

    argv = [sys.executable, str(FC_PROGRAM), "--framework", framework, "--threads", str(threads),
            "--pilot", json.dumps([c.to_json() for c in configs])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PILOT_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"the pilot timing of the grid took over {PILOT_TIMEOUT_S:g} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"the pilot timing of the grid failed: {last}")
    return {str(k): float(v) / threads for k, v in json.loads(lines[-1]).items()}


@dataclass(frozen=True)
class Planned:
    """A configuration as the sweep will run it: its samples (scaled up from the grid's where the
    user did not fix them), its expected training time, and whether that is still too short."""

    config: NetworkConfig
    grid_samples: int
    s_per_step: float | None
    expected_s: float | None
    too_short: bool

    @property
    def scaled_up(self) -> bool:
        return self.config.dataset_size != self.grid_samples

    def to_json(self) -> dict[str, Any]:
        return {"key": self.config.key, "grid_samples": self.grid_samples,
                "samples": self.config.dataset_size, "pilot_s_per_step": self.s_per_step,
                "expected_s": self.expected_s, "too_short": self.too_short}


def scaled(config: NetworkConfig, s_per_step: float, target_s: float) -> NetworkConfig:
    """The configuration with its samples doubled until its training lasts `target_s`."""
    if s_per_step <= 0 or not math.isfinite(s_per_step):
        return config
    factor = max(1, math.ceil(target_s / (s_per_step * config.steps)))
    return replace(config, dataset_size=config.dataset_size << (factor - 1).bit_length())


def plan(
    configs: Sequence[NetworkConfig], per_step: dict[str, float], minimum: Minimum, *,
    scale: bool,
) -> list[Planned]:
    """Each configuration as it will run: scaled up where `scale` (the user did not fix the
    samples) and the pilot expects it under SAFETY × the minimum (a pilot's few steps are
    uncertain by ±20 %: one expected at 2.1 s trained 1.7 s); else marked too short."""
    out = []
    for config in configs:
        rate = per_step.get(config.key)
        expected = None if rate is None else rate * config.steps
        run = config
        if scale and expected is not None and expected < SAFETY * minimum.seconds:
            run = scaled(config, rate, SAFETY * minimum.seconds)
            expected = rate * run.steps
        out.append(Planned(run, config.dataset_size, rate, expected,
                           expected is not None and expected < minimum.seconds))
    return out
