"""Power from a sensor's sample series: the arithmetic the idle baseline and the gate share.

Pure numpy. A power sensor (W) is its own series. A counter (J) is only seen to change when it
updates (NVML's every ~100 ms, however often it is read), and the time of a change is known only
to the spacing of the reads that saw it; RAPL updates every millisecond, so a 10 ms read interval
holds 10 ± 1 updates. Either way the step between two reads is too noisy to judge stability by,
so a counter's power is taken over bins much longer than both (`bin_s`, 0.5 s by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POWER_KINDS = ("counter", "power")
BIN_S = 0.5


@dataclass
class StoredSensor:
    """A sensor as a run's `sensors` table holds it (the columns the server's readers need)."""

    name: str
    domain: str
    unit: str
    kind: str
    provenance: str
    model: str | None


@dataclass
class Series(StoredSensor):
    """One sensor's samples in a time window, with the metadata the checks need."""

    t_ns: np.ndarray
    values: np.ndarray
    device: str = ""  # "gpu:N", "cpu", "process"... where the sensor says


def power_values(series: Series, bin_s: float = BIN_S) -> np.ndarray:
    """Comparable power values (W): a power sensor's readings, or a counter's mean power over
    consecutive bins of `bin_s`, interpolated between the reads where it changed."""
    if series.kind != "counter":
        return np.asarray(series.values, dtype=float)
    t, v = _updates(series.t_ns, series.values)
    if t.size < 2:
        return np.empty(0)
    edges = np.arange(t[0], t[-1] + 1, int(bin_s * 1e9), dtype=np.int64)
    energy = np.interp(edges, t, v)
    return np.diff(energy) / bin_s


def _updates(t_ns: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reads at which a counter was seen to grow: when it updated, to a read's precision.
    The first read is not one (the counter may have updated long before it), nor is a decrease
    (a reset the sensor did not unwrap: the counting restarts after it)."""
    t = np.asarray(t_ns, dtype=np.int64)
    v = np.asarray(values, dtype=float)
    if v.size and (drop := np.flatnonzero(np.diff(v) < 0)).size:
        t, v = t[drop[-1] + 1 :], v[drop[-1] + 1 :]
    grew = np.diff(v, prepend=v[:1]) > 0
    return t[grew], v[grew]


def mean_power(series: Series) -> float | None:
    """Mean power over the window: energy over time for counters, the average for power sensors."""
    if series.kind != "counter":
        return float(np.mean(series.values)) if len(series.values) else None
    t, v = _updates(series.t_ns, series.values)
    if v.size < 2:
        return None
    return float((v[-1] - v[0]) / ((t[-1] - t[0]) / 1e9))


def idle_stats(series: Series, bin_s: float = BIN_S) -> dict[str, object] | None:
    """Idle baseline of one power or counter sensor: mean W, and σ of its power values."""
    mean = mean_power(series)
    if mean is None:
        return None
    p = power_values(series, bin_s)
    return {
        "mean_w": mean,
        "std_w": float(p.std(ddof=1)) if p.size > 1 else None,
        "n": int(p.size),
        "provenance": series.provenance,
        "model": series.model,
    }
