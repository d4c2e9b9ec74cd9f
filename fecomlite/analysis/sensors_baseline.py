"""Which sensor stands for each energy domain, its idle baseline and ceiling, and how domains
combine (`domain_role`): the analysis' reading of the run's sensors before any call is looked at.

Per energy domain (cpu-package, dram, gpu:N, ...) one sensor is used, the best the run has: a
measured counter, else measured power, else an estimated power model.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fecomlite.analysis.run_mode import idle_sigma_bound
from fecomlite.analysis.units import scaled, with_noise
from fecomlite.sensors.estimate import ABOVE_IDLE_MODELS
from fecomlite.store import Store

ENERGY_KINDS = ("counter", "power")
MOVING_AVERAGE_S = 0.5  # a power sensor that averages over longer than this is never attributed
ADDITIVE_DOMAINS = ("cpu-package", "dram")  # plus gpu:N; cpu-core/uncore/psys overlap these
# A *share* domain is the measured program's part of another domain (its whole): never added to
# a total, and compared with its whole to see whether other processes loaded the machine.
SHARE_OF = {"cpu-process": "cpu-package"}
PART_OF = {"cpu-core": "cpu-package", "uncore": "cpu-package"}  # psys: the whole platform
BUSY_SHARE = 0.10  # other processes above this share of all CPUs: the machine was not quiet
# The host runs the user's own Python between wrapped calls: there, time outside calls is an
# activity of its own (a GPU, synchronised at probe boundaries, is idle between calls).
HOST_DOMAINS = ("cpu-package", "cpu-core", "uncore", "psys", "dram", "cpu-process")


def read_samples(store: Store, sensor_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(t_ns int64, value float64) of one sensor's whole series (`Store.sample_arrays`)."""
    return store.sample_arrays(sensor_id)


def choose_energy_sensors(
    sensors: list[dict[str, Any]], details: dict[str, Any] | None = None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The sensor used for each energy domain, and notes on what was passed over and why.

    Rank: measured counter, measured power, estimated counter, estimated power. A power sensor
    that is a moving average over ≥ MOVING_AVERAGE_S (NVML's power usage) is never used: it
    smears a call's energy over the next second.
    """
    details = details or {}
    chosen: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for s in sensors:
        if s["kind"] not in ENERGY_KINDS:
            continue
        averaging = (details.get(s["name"]) or {}).get("averaging_s") or 0
        if s["kind"] == "power" and averaging >= MOVING_AVERAGE_S:
            notes.append(f"{s['name']} not attributed: a {averaging:g} s moving average")
            continue
        best = chosen.get(s["domain"])
        if best is None or _rank(s) < _rank(best):
            chosen[s["domain"]] = s
    return chosen, notes


def _rank(sensor: dict[str, Any]) -> tuple[int, int]:
    return (sensor["provenance"] != "measured", sensor["kind"] != "counter")


def _idle_W(run: dict[str, Any], name: str) -> float | None:
    value = (run.get("idle") or {}).get(name)
    if isinstance(value, dict):
        value = value.get("mean_w")
    return None if value is None else float(value)


def idle_baseline(run: dict[str, Any], sensor: dict[str, Any]) -> tuple[float | None, str]:
    """The idle level subtracted from a sensor's readings, and where it came from: 0 W for a
    model that reads above idle, else the run's measured baseline (None: none was stored)."""
    if sensor.get("model") in ABOVE_IDLE_MODELS:
        return 0.0, f"0 W: model {sensor['model']} reads above idle"
    return _idle_W(run, sensor["name"]), "measured baseline"


def idle_sigma_W(baseline: dict[str, Any], name: str) -> float:
    """The idle baseline's spread (σ of its readings) at the 95 % upper bound its number of
    readings allows (`run_mode.idle_sigma_bound`: a 1 s baseline's σ is no tighter than its
    readings say), NaN when no baseline was measured."""
    entry = (baseline.get("sensors") or {}).get(name) or {}
    value = entry.get("std_w")
    if value is None:
        return math.nan
    n = entry.get("n")
    return idle_sigma_bound(float(value), int(n) if isinstance(n, (int, float)) else None)


CPU_BUSY_MEANS = ("machine-level above-idle figures (CPU package, DRAM) are unreliable; the "
                  "program's own share (cpu-process) holds none of their work, but contention "
                  "inflates the CPU time it is made from (see the load below)")


def busy_at(other_pct: float) -> bool:
    """Whether other processes' use of a device (% of it) makes its machine-level figures
    unreliable: the one rule of the analysis and the live view."""
    return other_pct > 100 * BUSY_SHARE


def reliable_when(domain: str, busy: bool) -> bool:
    """Whether a domain's above-idle figures hold when other processes used the machine (busy):
    the machine-level host domains do not (their baseline or power held others' work); a
    share (the program's own part) and a GPU do (GPUs are checked apart)."""
    return not (busy and domain in HOST_DOMAINS and domain_role(domain)["role"] != "share")


def domain_role(domain: str) -> dict[str, Any]:
    """How a domain's figures combine with the others': `disjoint` domains (CPU package, DRAM,
    each GPU) are separate hardware and add up; a `share` is the measured program's part of
    another domain (`of`); a `part` lies inside another domain; `overlaps` covers several."""
    if domain in ADDITIVE_DOMAINS or domain.startswith("gpu:"):
        return {"role": "disjoint", "of": None, "addable": True,
                "meaning": "its own hardware: adds to the other disjoint domains"}
    if domain in SHARE_OF or domain.startswith("process-gpu:"):
        whole = SHARE_OF.get(domain) or "gpu:" + domain.split(":", 1)[1]
        return {"role": "share", "of": whole, "addable": False,
                "meaning": f"the measured program's share of {whole}, counted from 0 W: "
                           f"part of {whole}, never added to it"}
    if domain in PART_OF:
        return {"role": "part", "of": PART_OF[domain], "addable": False,
                "meaning": f"a part of {PART_OF[domain]}: never added to it"}
    return {"role": "overlaps", "of": None, "addable": False,
            "meaning": "overlaps the other domains: never added to them"}


def addable(domain: str) -> bool:
    return bool(domain_role(domain)["addable"])


def ceiling_W(
    sensor: dict[str, Any], details: dict[str, Any], values: np.ndarray, idle: float
) -> float:
    """The most any call can draw above idle in this domain: an estimate's model maximum (less
    idle), else a power sensor's highest reading above idle; unbounded for a counter."""
    params = (details.get(sensor["name"]) or {}).get("model_params") or {}
    top = None
    if params.get("max_w") is not None:
        top = float(params["max_w"]) - (float(params.get("idle_w") or 0.0)
                                        if sensor["model"] in ABOVE_IDLE_MODELS else idle)
    elif params.get("gib") is not None and params.get("static_w_per_gib") is not None:
        top = float(params["gib"]) * (float(params["static_w_per_gib"])
                                      + float(params.get("active_w_per_gib") or 0.0)) - idle
    elif sensor["kind"] == "power" and values.size:
        top = float(np.nanmax(values)) - idle
    return max(top, 0.0) if top is not None and math.isfinite(top) else math.inf


def sensor_rows(
    sensors: list[dict[str, Any]], details: dict[str, Any], chosen: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    used = {s["name"] for s in chosen.values()}
    return [{**s, **{k: v for k, v in (details.get(s["name"]) or {}).items() if k not in s},
             "attributed": s["name"] in used} for s in sensors]


def share_notes(domains: list[dict[str, Any]]) -> list[str]:
    """A share domain beside its whole: what each counts, and a warning where the share exceeds
    the whole (the whole's idle baseline held other processes' load)."""
    by_name = {d["domain"]: d for d in domains}
    notes = []
    for d in domains:
        whole = by_name.get(d["of"] or "")
        if d["role"] != "share" or whole is None:
            continue
        text = (f"{d['domain']} is the program's own share of {whole['domain']}, counted from "
                f"0 W; {whole['domain']} above idle is the whole machine's power less its idle "
                "baseline. The two are never added.")
        if d["program_J"] > whole["program_J"] + finite_or_zero(whole["noise_J"]):
            text += (f" Here the share ({scaled(d['program_J'], 'J')}) exceeds the whole above "
                     f"idle ({with_noise(whole['program_J'], whole['noise_J'])}): the baseline was "
                     "not idle (other "
                     f"processes were running), so {whole['domain']} above idle is too low.")
        notes.append(text)
    return notes


def finite_or_zero(value: Any) -> float:
    """A figure that may be missing (None, NaN, not a number) as a term of a sum: 0."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0
