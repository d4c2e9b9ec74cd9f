"""A run as a Chrome JSON trace (Trace Event Format), which Perfetto UI and chrome://tracing open.

- every call and region: a complete event (`ph: X`) on its process (named with its repetition,
  pid, and in a distributed run its rank: `program (rank 1, rep 1, pid 4242)`) and thread, named
  by its canonical API, with its site, what was written, and whether it raised; a call recorded in
  pieces (a layer's span cut apart where other layers' work ran) is one event a piece, each
  after the first with `piece` (2, 3, …) and `call_ts` (the first piece's start) in its args;
- power per energy domain (the sensor the analysis attributes with; a counter becomes the mean
  power of each update interval) and memory (host RSS, GPU memory): counter tracks (`ph: C`) on a
  separate "fecomlite sensors" process, named with unit and provenance;
- each repetition's start, end and tail end: global instant markers (`ph: i`, `s: g`).

Timestamps are microseconds since the run's first recorded instant (CLOCK_MONOTONIC underneath).
`write_trace` writes the events as they are made, chunk of calls by chunk of samples: a day of
training (~90 M calls) is exported in the memory of one chunk, not of a list of every call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TextIO

from fecomlite.analysis import attribution as at
from fecomlite.analysis.sensors_baseline import choose_energy_sensors, read_samples
from fecomlite.runtime.batch_codec import CONTINUES, RAISED
from fecomlite.store import Store

SENSOR_PID = 0  # the pseudo-process that holds the counter tracks
MEMORY_DOMAINS = ("process-memory", "gpu-memory", "process-gpu-memory")
MIB = 1 << 20


def trace(store: Store, run_id: int) -> dict[str, Any]:
    """The whole trace as a JSON-ready dict ({"traceEvents": [...], ...}), for a short run."""
    return {"traceEvents": list(trace_events(store, run_id)), **_trailer(store, run_id)}


def write_trace(store: Store, run_id: int, out: TextIO) -> None:
    """The trace as JSON into `out`, each event written as it is made."""
    out.write('{"traceEvents":[')
    for i, event in enumerate(trace_events(store, run_id)):
        out.write(("," if i else "") + json.dumps(event, separators=(",", ":"), allow_nan=False))
    trailer = json.dumps(_trailer(store, run_id), separators=(",", ":"), allow_nan=False)
    out.write("]," + trailer[1:])


def trace_events(store: Store, run_id: int) -> Iterator[dict[str, Any]]:
    """Every event of the trace, calls chunk by chunk and memory readings chunk by chunk."""
    sensors = store.sensors(run_id)
    reps = store.repetitions(run_id)
    origin = _origin(store, run_id, reps)
    yield _meta("process_name", SENSOR_PID, 0, "fecomlite sensors")
    ranks = {p["pid"]: p["rank"] for p in store.processes(run_id)}
    yield from _calls(store, run_id, origin, ranks)
    yield from _power(store, run_id, sensors, origin)
    yield from _memory(store, sensors, origin)
    yield from _markers(reps, origin)


def _trailer(store: Store, run_id: int) -> dict[str, Any]:
    """What follows the events: the time unit and what the trace is of."""
    run = store.run(run_id)
    sensors = store.sensors(run_id)
    return {
        "displayTimeUnit": "ms",
        "otherData": {
            "run": str(run_id),
            "program": run.get("program") or "",
            "level": run.get("level") or "",
            "clock": "CLOCK_MONOTONIC, microseconds since the run's first recorded instant",
            "provenance": ", ".join(
                f"{s['domain']}: {s['provenance']}" for s in sensors if s["kind"] != "gauge"
            )
            or "no energy sensor",
            **_folded(store, run_id),
        },
    }


def _folded(store: Store, run_id: int) -> dict[str, str]:
    """What the trace leaves out of a run with bounded storage (`--keep`)."""
    folded = store.folded_calls(run_id)
    if not folded:
        return {}
    keep = (store.run(run_id).get("settings") or {}).get("keep", "")
    return {"folded_calls": f"{folded:,} calls past the detail window (--keep {keep}) are kept "
                            "as per-site buckets, not as calls: the trace shows the calls kept "
                            "in detail only"}


def _origin(store: Store, run_id: int, reps: list[dict[str, Any]]) -> int:
    """The earliest instant the run recorded: its zero on the trace's time axis."""
    candidates = [store.first_event_ns(run_id), store.first_sample_ns(run_id),
                  *(r["t_start_ns"] for r in reps if r["t_start_ns"])]
    found = [int(t) for t in candidates if t is not None]
    return min(found) if found else 0


def _us(t_ns: int, origin: int) -> float:
    return (t_ns - origin) / 1000.0


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _calls(store: Store, run_id: int, origin: int,
           ranks: dict[int, int] | None = None) -> Iterator[dict[str, Any]]:
    """Complete events, chunk of calls by chunk; threads get small ids (pthread ids do not fit
    every viewer); a process of a distributed run is named with its rank (`ranks`: pid ->
    rank)."""
    ranks = ranks or {}
    sites = {r["id"]: (r["api"], r["key"], r["written"], r["kind"]) for r in store.sites(run_id)}
    threads: dict[tuple[int, int], int] = {}
    calls: dict[tuple[int, int, str], list[Any]] = {}  # thread and site -> [first ts, pieces]
    columns = ("rep", "pid", "tid", "t_start_ns", "t_end_ns", "status", "in_bytes",
               "out_bytes", "site_id")
    for chunk in store.event_chunks(run_id):
        for rep, pid, tid, t0, t1, status, in_b, out_b, site in zip(
                *(chunk[c].tolist() for c in columns), strict=True):
            api, key, written, kind = sites[site]
            if (pid, tid) not in threads:
                small = sum(1 for p, _ in threads if p == pid) + 1
                threads[pid, tid] = small
                if small == 1:
                    rank = f"rank {ranks[pid]}, " if pid in ranks else ""
                    yield _meta("process_name", pid, 0, f"program ({rank}rep {rep}, pid {pid})")
                yield _meta("thread_name", pid, small, f"thread {small} ({tid:#x})")
            args: dict[str, Any] = {"site": key, "written": written, "rep": rep}
            if status & RAISED:
                args["raised"] = True
            call = calls.setdefault((pid, tid, key), [_us(t0, origin), 0])
            if status & CONTINUES:
                call[1] += 1
                args["piece"], args["call_ts"] = call[1], call[0]
            else:
                call[:] = [_us(t0, origin), 1]
            if in_b >= 0:
                args["in_bytes"] = in_b
            if out_b >= 0:
                args["out_bytes"] = out_b
            yield {"ph": "X", "name": api or key, "cat": kind or "call", "pid": pid,
                   "tid": threads[pid, tid], "ts": _us(t0, origin), "dur": (t1 - t0) / 1000.0,
                   "args": args}


def _power(
    store: Store, run_id: int, sensors: list[dict[str, Any]], origin: int
) -> Iterator[dict[str, Any]]:
    """One counter track per energy domain: the power of each update interval of the sensor
    the analysis attributes with."""
    details = store.result(run_id, "sensors") or {}
    chosen, _ = choose_energy_sensors(sensors, details)
    for domain, sensor in sorted(chosen.items()):
        t, v = read_samples(store, sensor["id"])
        try:
            iv = at.sensor_intervals(sensor["kind"], t, v, period_s=sensor.get("period_s"))
        except ValueError:
            continue
        name = f"power {domain} (W, {sensor['provenance']})"
        for edge, watts in zip(iv.edges_ns[:-1].tolist(), iv.power_W.tolist(), strict=True):
            yield _counter(name, _us(edge, origin), {"W": watts})
        if iv.count:
            yield _counter(name, _us(int(iv.edges_ns[-1]), origin), {"W": 0.0})


def _memory(
    store: Store, sensors: list[dict[str, Any]], origin: int
) -> Iterator[dict[str, Any]]:
    """One counter track per memory gauge, its readings chunk by chunk (a day of 200 Hz RSS is
    17 M readings)."""
    for sensor in sensors:
        if sensor["kind"] != "gauge" or sensor["domain"] not in MEMORY_DOMAINS:
            continue
        name = f"memory {sensor['name']} (MiB)"
        for chunk in store.sample_chunks(sensor["id"]):
            for a, b in zip(chunk["t"].tolist(), chunk["v"].tolist(), strict=True):
                yield _counter(name, _us(a, origin), {"MiB": b / MIB})


def _counter(name: str, ts: float, args: dict[str, float]) -> dict[str, Any]:
    return {"ph": "C", "name": name, "pid": SENSOR_PID, "tid": 0, "ts": ts, "args": args}


def _markers(reps: list[dict[str, Any]], origin: int) -> Iterator[dict[str, Any]]:
    for r in reps:
        for column, what in (
            ("t_start_ns", "start"),
            ("t_end_ns", "end"),
            ("tail_end_ns", "tail end"),
        ):
            if r.get(column):
                yield {"ph": "i", "s": "g", "name": f"rep {r['rep']} {what}",
                       "pid": SENSOR_PID, "tid": 0, "ts": _us(r[column], origin),
                       "args": {"exit_code": r.get("exit_code")}}
