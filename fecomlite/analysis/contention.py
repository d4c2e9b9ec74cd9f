"""What load did to a run, from what was measured while its repetitions ran (sensors/contention.py):
the program's run-queue wait against its CPU time, steal time, the machine's runnable tasks.

Each domain is affected differently:
- cpu-process (the program's own share) is made from the program's CPU time. Under contention
  that time grows: threads that spin while their peers wait for a CPU (OpenMP/MKL barriers,
  PyTorch's intra-op pool) count the wait as CPU time. The distortion is bounded by the
  run-queue wait per CPU second (a spinning thread burns at most the time its peers waited),
  and that bound is what the figures are marked with.
- cpu-package, dram (machine level) hold other processes' work besides (`machine_load`).
- a GPU's energy per call is its kernels'; load stretches the host time between them (the calls'
  wall time), not the kernels' energy.
- every call's wall time includes the time its thread waited for a CPU.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DISTORTION_LIMIT = 0.10  # figures distorted beyond this (relative) are marked
LOAD_DIFFERS = 1.10  # runs whose CPU-time inflation bounds (1 + distortion) differ by more than
# this factor are not compared: at 7 s of wait per CPU second both runs are loaded alike
OTHER_DIFFERS_PCT = 10.0  # nor runs whose other processes' CPU use differs by more points
CPU_TIME_DOMAINS = ("cpu-process",)
SENSORS = ("sched:wait", "util:process", "util:steal", "load:runnable")


def _mean_in(t: np.ndarray, v: np.ndarray, a: int, b: int) -> float:
    inside = (t > a) & (t <= b) & np.isfinite(v)
    return float(v[inside].mean()) if inside.any() else math.nan


def measure(series: dict[str, tuple[np.ndarray, np.ndarray]],
            windows: list[tuple[int, int, int]]) -> dict[str, Any]:
    """Per repetition (rep, start, end) and over the run: wait per CPU second (`sched:wait` over
    `util:process`, both % of all CPUs), steal %, runnable tasks per CPU; `distortion`: the
    bound on how much load inflated the CPU-time domains; `checked`: whether the program's wait
    was recorded at all (runs from before these sensors have none)."""
    empty = (np.zeros(0, np.int64), np.zeros(0))
    wait, own = series.get("sched:wait", empty), series.get("util:process", empty)
    steal, runnable = series.get("util:steal", empty), series.get("load:runnable", empty)
    per_rep = []
    for rep, a, b in windows:
        w, cpu = _mean_in(*wait, a, b), _mean_in(*own, a, b)
        per_rep.append({
            "rep": rep, "wait_per_cpu_s": w / cpu if cpu > 0 else math.nan,
            "steal_pct": _mean_in(*steal, a, b), "runnable_per_cpu": _mean_in(*runnable, a, b),
        })
    out = {"checked": bool(wait[0].size), "per_rep": per_rep,
           **{key: _mean_of(per_rep, key)
              for key in ("wait_per_cpu_s", "steal_pct", "runnable_per_cpu")}}
    out["distortion"] = _bound(out["wait_per_cpu_s"], out["steal_pct"]) if out["checked"] \
        else math.nan
    out["distorted"] = out["checked"] and out["distortion"] > DISTORTION_LIMIT
    out["text"] = describe(out)
    return out


def _mean_of(per_rep: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in per_rep if math.isfinite(r[key])]
    return float(np.mean(values)) if values else math.nan


def _bound(wait_per_cpu_s: float, steal_pct: float) -> float:
    """The CPU-time inflation bound: the wait per CPU second (NaN: too short to be sampled, so
    not known) plus the steal share."""
    return wait_per_cpu_s + (steal_pct / 100 if math.isfinite(steal_pct) else 0.0)


def describe(c: dict[str, Any]) -> str:
    """What load did to the run, in words, with the size of the distortion."""
    if not c["checked"]:
        return ("The program's run-queue wait was not recorded: what load did to its own CPU "
                "share (cpu-process) is not known.")
    wait = c["wait_per_cpu_s"]
    parts = [f"the program waited {wait:.2f} s for a CPU per second of CPU time"
             if math.isfinite(wait) else
             "the program's wait for a CPU was not sampled (its repetitions were too short)"]
    if math.isfinite(c["runnable_per_cpu"]):
        parts.append(f"{c['runnable_per_cpu']:.1f} runnable tasks per CPU")
    if math.isfinite(c["steal_pct"]) and c["steal_pct"] > 0.5:
        parts.append(f"{c['steal_pct']:.0f} % steal time")
    head = "Load while the repetitions ran: " + ", ".join(parts) + "."
    if not math.isfinite(c["distortion"]):
        return head + " How much load distorted the program's own share is not known."
    if not c["distorted"]:
        return head + " Too little to distort the figures (under " + (
            f"{DISTORTION_LIMIT:.0%}).")
    return (head + f" The program's own share (cpu-process), made from CPU time, may be "
            f"inflated by up to {c['distortion']:.0%} (threads spinning while their peers "
            "waited count that wait as CPU time); calls' wall times include their waits; a "
            "GPU's energy per call is its kernels' and is not affected.")


def effects(c: dict[str, Any], domain: str) -> str | None:
    """Why load distorts a domain's figures, with the size, or None when it does not."""
    if c.get("distorted") and domain in CPU_TIME_DOMAINS:
        return (f"load: up to +{c['distortion']:.0%} from CPU time spent waiting for peers "
                f"(the program waited {c['wait_per_cpu_s']:.2f} s for a CPU per CPU second)")
    return None


def quiet_repetitions(c: dict[str, Any]) -> list[int]:
    """The repetitions load did not distort (wait per CPU second plus steal within
    DISTORTION_LIMIT): on a shared machine a repetition that waited for CPUs stretches every
    call (10× seen here), and its calls are not the program's cost on a quiet machine."""
    out = []
    for r in c.get("per_rep") or []:
        bound = _bound(r.get("wait_per_cpu_s", math.nan), r.get("steal_pct", math.nan))
        if math.isfinite(bound) and bound <= DISTORTION_LIMIT:
            out.append(int(r["rep"]))
    return out


def over_repetitions(c: dict[str, Any], reps: list[int]) -> dict[str, Any]:
    """A run's contention (`measure`) over some of its repetitions only."""
    kept = [r for r in c.get("per_rep") or [] if int(r["rep"]) in set(reps)]
    out = {**c, "per_rep": kept, **{key: _mean_of(kept, key)
                                    for key in ("wait_per_cpu_s", "steal_pct",
                                                "runnable_per_cpu")}}
    out["distortion"] = _bound(out["wait_per_cpu_s"], out["steal_pct"]) if c.get("checked") \
        else math.nan
    return out


def load_differs(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why two runs' loads differ too much to compare their host figures, or None.

    a, b: each run's `machine_load` (with its `contention`)."""
    ca, cb = a.get("contention") or {}, b.get("contention") or {}
    da, db = ca.get("distortion", math.nan), cb.get("distortion", math.nan)
    if math.isfinite(da) and math.isfinite(db) and max(1 + da, 1 + db) > LOAD_DIFFERS * min(
            1 + da, 1 + db):
        return (f"load: the program waited {ca['wait_per_cpu_s']:.2f} s for a CPU per CPU "
                f"second in run A, {cb['wait_per_cpu_s']:.2f} s in run B (CPU-time figures "
                f"inflated by up to {da:.0%} and {db:.0%})")
    oa, ob = a.get("program_other_pct", math.nan), b.get("program_other_pct", math.nan)
    if (isinstance(oa, (int, float)) and isinstance(ob, (int, float)) and math.isfinite(oa)
            and math.isfinite(ob) and abs(oa - ob) > OTHER_DIFFERS_PCT):
        return (f"load: other processes used {oa:.0f} % of all CPUs in run A, {ob:.0f} % in "
                "run B")
    return None
