"""The program's figures per domain and repetition: its windows, the time between its calls as an
activity of its own, and how the sensor's energy splits into calls, outside calls and tail."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis.sensors_baseline import domain_role, idle_sigma_W
from fecomlite.sensors.estimate import ABOVE_IDLE_MODELS

OUTSIDE_CALLS = "<program outside calls>"


def program_gaps(
    t0: np.ndarray, t1: np.ndarray, windows: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """The stretches of each [start, end) window covered by no call (of any thread)."""
    starts, ends = [], []
    for a, b in windows:
        inside = (t1 > a) & (t0 < b)
        order = np.argsort(t0[inside], kind="stable")
        s = np.clip(t0[inside][order], a, b)
        e = np.maximum.accumulate(np.clip(t1[inside][order], a, b)) if s.size else s
        gap_start = np.concatenate(([a], e))
        gap_end = np.concatenate((s, [b]))
        keep = gap_end > gap_start
        starts.append(gap_start[keep])
        ends.append(gap_end[keep])
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(starts).astype(np.int64), np.concatenate(ends).astype(np.int64)


def with_program_gaps(
    t0: np.ndarray, t1: np.ndarray, thread: np.ndarray, api_of: np.ndarray, n_apis: int,
    reps: list[dict[str, Any]], replay_starts: np.ndarray,
    nest: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any] | None:
    """attribute() arguments with the program's time outside calls as one more activity; a
    calibration repetition's program ends where its replays begin (the gaps between replays are
    idle, not the program's). nest: the calls' (parent, depth) when known: the gaps, on a
    thread of their own and disjoint, are all top-level, so the calls' nesting is unchanged."""
    windows = []
    for r in reps:
        a, b = r.get("t_start_ns"), r.get("t_end_ns")
        if a is not None and b is not None:
            inside = replay_starts[(replay_starts >= a) & (replay_starts <= b)]
            windows.append((int(a), int(inside.min()) if inside.size else int(b)))
    g0, g1 = program_gaps(t0, t1, windows)
    if g0.size == 0:
        return None
    all_t0, all_t1 = np.concatenate((t0, g0)), np.concatenate((t1, g1))
    gap_thread = (int(thread.max()) + 1) if thread.size else 0
    threads = np.concatenate((thread, np.full(g0.size, gap_thread, np.int64)))
    order = np.argsort(g0, kind="stable")
    if nest is None or (g0[order][1:] < g1[order][:-1]).any():  # overlapping windows' gaps
        nest = at.nesting(all_t0, all_t1, threads)
    else:
        top = np.full(g0.size, -1, np.int64)
        nest = (np.concatenate((nest[0], top)), np.concatenate((nest[1], top + 1)))
    return {
        "t_start_ns": all_t0, "t_end_ns": all_t1, "thread": threads,
        "group": np.concatenate((api_of, np.full(g0.size, n_apis, np.int64))),
        "ngroups": n_apis + 1, "nest": nest,
    }


def calls_only(res: at.Attribution, n: int) -> at.Attribution:
    """The wrapped calls' part of an attribution made with the program-gap activity."""
    per_call = {
        f.name: getattr(res, f.name)[:n] for f in dataclasses.fields(res)
        if isinstance(getattr(res, f.name), np.ndarray) and getattr(res, f.name).ndim == 1
        and getattr(res, f.name).size >= n
    }
    top = per_call["parent"] < 0
    in_calls = float(per_call["energy_J"][top].sum())
    in_calls_total = float(per_call["energy_total_J"][top].sum())
    return dataclasses.replace(
        res, **per_call, in_calls_J=in_calls, in_calls_total_J=in_calls_total,
        outside_calls_J=res.above_idle_J - in_calls,
        outside_calls_total_J=res.total_J - in_calls_total,
    )


def rep_spans(reps: list[dict[str, Any]],
              calls_span: tuple[int, int] | None) -> list[tuple[int, int]]:
    """[start, end of tail] of each repetition; the calls' span (first start, last end) when no
    repetition is stored."""
    windows = []
    for r in reps:
        end = r.get("tail_end_ns") or r.get("t_end_ns")
        if r.get("t_start_ns") is not None and end is not None:
            windows.append((int(r["t_start_ns"]), int(end)))
    if not windows and calls_span is not None:
        windows.append(calls_span)
    return windows


def rep_window_energy(
    iv: at.SensorIntervals, idle: float, reps: list[dict[str, Any]]
) -> list[dict[str, float]]:
    """Per repetition: the sensor's energy from its start to the program's end, and its tail."""
    out = []
    for r in reps:
        a, b, c = r.get("t_start_ns"), r.get("t_end_ns"), r.get("tail_end_ns")
        total, above = at.window_energy(iv, idle, a, b) if None not in (a, b) else (
            math.nan, math.nan)
        tail = at.window_energy(iv, idle, b, c)[1] if None not in (b, c) else math.nan
        out.append({"total_J": total, "above_idle_J": above, "tail_J": tail})
    return out


def program_figures(
    rep_energy: list[dict[str, float]], res: at.Attribution, reps: list[dict[str, Any]]
) -> dict[str, float]:
    """The run's figures of one domain, each with what it covers (`RunAnalysis.domains`).

    program_J: above idle while the program ran (the repetitions, start to end), the base of
    every share; in_calls_J (wrapped calls, top level) + outside_calls_J (the program between
    calls) = program_J; tail_J: after the program ended, sampled on; other_J: the rest of the
    recording (idle baseline, gate waits, pauses), when no program ran; above_idle_J = program_J
    + tail_J + other_J. program_s and tail_s: how long each lasted, for the noise figures."""
    program = sum(e["above_idle_J"] for e in rep_energy if math.isfinite(e["above_idle_J"]))
    tail = sum(e["tail_J"] for e in rep_energy if math.isfinite(e["tail_J"]))
    program_s = sum(span_s(r.get("t_start_ns"), r.get("t_end_ns")) for r in reps
                    if r.get("t_end_ns") is not None and r.get("t_start_ns") is not None)
    tail_s = sum(span_s(r.get("t_end_ns"), r.get("tail_end_ns")) for r in reps
                 if r.get("tail_end_ns") is not None and r.get("t_end_ns") is not None)
    if not reps:  # no repetition stored: the recording is the program
        program = res.above_idle_J
    return {
        "program_J": program, "program_s": program_s,
        "outside_calls_J": program - res.in_calls_J,
        "tail_J": tail, "tail_s": tail_s,
        "other_J": res.above_idle_J - program - tail,
    }


def rep_call_figures(
    calls: dict[str, Any], reps: list[dict[str, Any]], domains: list[str],
) -> tuple[list[int], dict[str, list[float]]]:
    """Per repetition: its events, and per domain the energy inside its calls (top-level calls,
    so nesting is not counted twice), from the calls' columns."""
    top = calls["parent"] < 0
    mine = [calls["rep"] == r["rep"] for r in reps]
    return ([int(m.sum()) for m in mine],
            {d: [float(calls["energy_J"][d][m & top].sum()) for m in mine] for d in domains})


def per_rep_rows(
    reps: list[dict[str, Any]], events: list[int], in_calls: dict[str, list[float]],
    domains: dict[str, dict[str, Any]], rep_energy: dict[str, list[dict[str, float]]],
) -> list[dict[str, Any]]:
    """Per repetition: duration, events, and per domain the sensor's energy in the repetition,
    the part inside calls (`rep_call_figures`) and the tail."""
    rows = []
    for i, r in enumerate(reps):
        row: dict[str, Any] = {"rep": r["rep"], "exit_code": r.get("exit_code"),
                               "duration_s": span_s(r.get("t_start_ns"), r.get("t_end_ns")),
                               "calls": events[i], "energy": {}}
        for domain, info in domains.items():
            row["energy"][domain] = {"in_calls_J": in_calls[domain][i],
                                     "provenance": info["provenance"], **rep_energy[domain][i]}
        rows.append(row)
    return rows


def span_s(a: int | None, b: int | None) -> float:
    return (b - a) / at.NS if a is not None and b is not None else math.nan


def intensity_record(res: at.Attribution, api_names: list[str], asked: str) -> dict[str, Any]:
    fit = res.fit
    record: dict[str, Any] = {"asked": asked, "method": res.method, "fell_back": res.fell_back}
    if fit is None:
        return record
    record.update({
        "supported": fit.supported, "reason": fit.reason, "pooled_W": fit.pooled_W,
        "cv_gain": fit.cv_gain, "wald_p": fit.wald_p, "rel_residual": fit.rel_residual,
        "intervals": fit.rows, "ceiling_W": fit.ceiling_W,
        "apis": {
            name: {"intensity_W": float(fit.intensity_W[i]), "sigma_W": float(fit.sigma_W[i]),
                   "busy_s": float(fit.busy_s[i]), "distinct": bool(fit.distinct[i]),
                   "identifiable": bool(fit.identifiable[i]), "capped": bool(fit.capped[i])}
            for i, name in enumerate(api_names) if fit.busy_s[i] > 0
        },
    })
    return record


def domain_row(
    sensor: dict[str, Any], iv: at.SensorIntervals, idle: tuple[float, str], ceiling: float,
    res: Any, reps: list[dict[str, Any]], rep_energy: list[dict[str, float]],
    baseline: dict[str, Any], windows: list[tuple[int, int]],
) -> dict[str, Any]:
    """One domain's row of `RunAnalysis.domains` from its sensor, intervals, idle level (and
    where it came from), ceiling and attribution (an `attribution.Attribution`, or the streamed
    one's run figures: total_J, idle_J, above_idle_J, in_calls_J, in_calls_total_J, method,
    fell_back); windows: `rep_spans`."""
    domain = sensor["domain"]
    return {
        "domain": domain, "sensor": sensor["name"], "kind": sensor["kind"],
        "provenance": sensor["provenance"], "model": sensor["model"],
        **domain_role(domain),
        "period_s": iv.period_s, "idle_W": idle[0], "idle_source": idle[1],
        "ceiling_W": ceiling,  # no call is given more power above idle (attribution)
        "idle_sigma_W": 0.0 if sensor["model"] in ABOVE_IDLE_MODELS else idle_sigma_W(
            baseline, sensor["name"]),
        "total_J": res.total_J, "idle_J": res.idle_J, "above_idle_J": res.above_idle_J,
        "in_calls_J": res.in_calls_J, "in_calls_total_J": res.in_calls_total_J,
        "above_idle_in_reps_J": sum(at.window_energy(iv, idle[0], a, b)[1]
                                    for a, b in windows),
        "method": res.method, "fell_back": res.fell_back,
        **program_figures(rep_energy, res, reps),
        "recording_s": float(iv.lengths_s.sum()),
    }
