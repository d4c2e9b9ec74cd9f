"""Whether other processes used the machine while the run was measured: their share of the CPUs
and of each GPU during the idle baseline and the repetitions, and what contention did."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fecomlite.analysis import contention
from fecomlite.analysis.sensors_baseline import (
    CPU_BUSY_MEANS,
    HOST_DOMAINS,
    busy_at,
    read_samples,
)
from fecomlite.store import Store


def machine_load(
    store: Store, sensors: list[dict[str, Any]], baseline: dict[str, Any],
    reps: list[dict[str, Any]],
) -> dict[str, Any]:
    """Whether other processes used the CPUs or a GPU during the idle baseline or the
    repetitions. CPUs: the machine's utilisation (util:cpu) less the measured process tree's
    (util:process), in % of all CPUs. GPUs: NVML's per-process SM utilisation of every process
    (nvml:N:processes_sm) less the tree's (nvml:N:process_sm), in % of that GPU's SM time.
    Above BUSY_SHARE the machine-level above-idle figures of that device are unreliable: its
    baseline or the program's power held other processes' work. `busy_domains`: {domain: why}."""
    out: dict[str, Any] = {"checked": [], "not_checked": [], "busy": False, "text": "",
                           "baseline_other_pct": math.nan, "program_other_pct": math.nan,
                           "cpu_busy": False, "gpus": [], "busy_domains": {}}
    windows = [(r["t_start_ns"], r["t_end_ns"]) for r in reps
               if r.get("t_start_ns") is not None and r.get("t_end_ns") is not None]
    span = (baseline.get("t_start_ns"), baseline.get("t_end_ns"))
    baseline_window = span if None not in span else None
    by_name = {s["name"]: s for s in sensors}
    texts = []
    machine = by_name.get("util:cpu")
    if machine is None:
        out["not_checked"].append("CPU: no machine utilisation was recorded")
    else:
        cpu = _other_load(store, machine, by_name.get("util:process"), baseline_window, windows,
                          "CPU", "the program's own utilisation")
        out["checked"] += cpu["checked"]
        out["not_checked"] += cpu["not_checked"]
        out["baseline_other_pct"], out["program_other_pct"] = cpu["baseline"], cpu["program"]
        out["program_other_pct_per_rep"] = cpu.get("per_rep", [])  # in `reps`' order
        out["cpu_busy"] = cpu["busy"]
        if cpu["busy"]:
            out["busy_domains"].update(dict.fromkeys(HOST_DOMAINS, (
                f"other processes used the CPUs ({cpu['parts']} of all CPUs): the machine's "
                "above-idle power includes their work")))
            texts.append("The CPUs were busy: other processes used them ("
                         + cpu["parts"] + " of all CPUs): " + CPU_BUSY_MEANS + ".")
        else:
            texts.append("The CPUs were quiet: other processes used "
                         + (cpu["parts"] or "nothing measurable") + " of all CPUs.")
    gpus = sorted({s["domain"] for s in sensors if s["domain"].startswith("gpu:")})
    if not gpus:
        out["checked"].append("GPUs: none on this machine")
        texts.append("No GPU.")
    for gpu in gpus:
        index = gpu.partition(":")[2]
        every = by_name.get(f"nvml:{index}:processes_sm")
        if every is None:
            out["not_checked"].append(f"{gpu}: NVML gave no per-process utilisation, so other "
                                      "processes' use of this GPU could not be read")
            continue
        g = _other_load(store, every, by_name.get(f"nvml:{index}:process_sm"), baseline_window,
                        windows, gpu, "the program's own use of it")
        out["checked"] += g["checked"]
        out["not_checked"] += g["not_checked"]
        out["gpus"].append({"gpu": gpu, "baseline_other_pct": g["baseline"],
                            "program_other_pct": g["program"], "busy": g["busy"]})
        if g["busy"]:
            out["busy_domains"][gpu] = (f"other processes used {gpu} ({g['parts']} of its "
                                        "compute time): its above-idle power includes their work")
            texts.append(f"Other processes used {gpu} ({g['parts']} of its compute time): its "
                         "above-idle figures are unreliable.")
        else:
            texts.append(f"{gpu} was quiet: other processes used "
                         f"{g['parts'] or 'nothing measurable'} of its compute time.")
    out["busy"] = bool(out["busy_domains"])
    rep_windows = [(r["rep"], r["t_start_ns"], r["t_end_ns"]) for r in reps
                   if r.get("t_start_ns") is not None and r.get("t_end_ns") is not None]
    out["contention"] = contention.measure(
        {name: read_samples(store, by_name[name]["id"]) for name in contention.SENSORS
         if name in by_name}, rep_windows)
    texts.append(out["contention"]["text"])
    out["text"] = " ".join(texts)
    return out


def _other_load(
    store: Store, machine: dict[str, Any], own: dict[str, Any] | None,
    baseline: tuple[int, int] | None, windows: list[tuple[int, int]], device: str,
    own_words: str,
) -> dict[str, Any]:
    """Other processes' mean utilisation of one device (%), during the baseline (everything
    there is other) and the repetitions (the machine's less the tree's `own` sensor)."""
    tm, vm = read_samples(store, machine["id"])
    tp, vp = read_samples(store, own["id"]) if own else (np.zeros(0, np.int64), np.zeros(0))

    def other(a: int, b: int, with_program: bool) -> float:
        inside = (tm > a) & (tm <= b)
        if not inside.any():
            return math.nan
        mine = np.interp(tm[inside], tp, vp) if with_program and tp.size else 0.0
        return float(np.mean(np.clip(vm[inside] - mine, 0, None)))

    out: dict[str, Any] = {"checked": [], "not_checked": [], "baseline": math.nan,
                           "program": math.nan}
    if baseline is not None:
        out["baseline"] = other(*baseline, False)
        out["checked"].append(f"{device} during the idle baseline")
    if windows and own is not None:
        values = [other(a, b, True) for a, b in windows]
        out["per_rep"] = values
        out["program"] = float(np.nanmean(values)) if np.isfinite(values).any() else math.nan
        out["checked"].append(f"{device} during the repetitions")
    elif windows:
        out["not_checked"].append(f"{device} during the repetitions: {own_words} was not "
                                  "recorded")
    worst = np.nanmax([out["baseline"], out["program"], 0.0])
    out["busy"] = busy_at(float(worst))
    out["parts"] = ", ".join(f"{label} {value:.0f} %" for label, value in (
        ("during the idle baseline", out["baseline"]),
        ("during the repetitions", out["program"])) if math.isfinite(value))
    return out
