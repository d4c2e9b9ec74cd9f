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
"""

from __future__ import annotations

from typing import Any

from fecomlite.analysis import attribution as at
from fecomlite.analysis.sensors_baseline import choose_energy_sensors, read_samples
from fecomlite.runtime.batch_codec import CONTINUES, RAISED
from fecomlite.store import Store

SENSOR_PID = 0  # the pseudo-process that holds the counter tracks
MEMORY_DOMAINS = ("process-memory", "gpu-memory", "process-gpu-memory")
MIB = 1 << 20


def trace(store: Store, run_id: int) -> dict[str, Any]:
    """The whole trace as a JSON-ready dict ({"traceEvents": [...], ...})."""
    run = store.run(run_id)
    events = _call_rows(store, run_id)
    sensors = store.sensors(run_id)
    reps = store.repetitions(run_id)
    origin = _origin(store, run_id, events, reps)
    out: list[dict[str, Any]] = [
        _meta("process_name", SENSOR_PID, 0, "fecomlite sensors"),
    ]
    ranks = {p["pid"]: p["rank"] for p in store.processes(run_id)}
    out += _calls(events, origin, ranks)
    out += _power(store, run_id, sensors, origin)
    out += _memory(store, sensors, origin)
    out += _markers(reps, origin)
    return {
        "traceEvents": out,
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


def _call_rows(store: Store, run_id: int) -> list[tuple[Any, ...]]:
    return store.calls_with_sites(run_id)


def _origin(store: Store, run_id: int, events: list[Any], reps: list[dict[str, Any]]) -> int:
    """The earliest instant the run recorded: its zero on the trace's time axis."""
    first_sample = store.first_sample_ns(run_id)
    starts = [e[3] for e in events[:1]] + [r["t_start_ns"] for r in reps if r["t_start_ns"]]
    candidates = [*starts, *([first_sample] if first_sample is not None else [])]
    return min(candidates) if candidates else 0


def _us(t_ns: int, origin: int) -> float:
    return (t_ns - origin) / 1000.0


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _calls(rows: list[tuple[Any, ...]], origin: int,
           ranks: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Complete events; threads get small ids (pthread ids do not fit every viewer); a process
    of a distributed run is named with its rank (`ranks`: pid -> rank)."""
    ranks = ranks or {}
    out: list[dict[str, Any]] = []
    threads: dict[tuple[int, int], int] = {}
    calls: dict[tuple[int, int, str], list[Any]] = {}  # thread and site -> [first ts, pieces]
    for rep, pid, tid, t0, t1, status, in_b, out_b, api, key, written, kind in rows:
        if (pid, tid) not in threads:
            small = sum(1 for p, _ in threads if p == pid) + 1
            threads[pid, tid] = small
            if small == 1:
                rank = f"rank {ranks[pid]}, " if pid in ranks else ""
                out.append(_meta("process_name", pid, 0, f"program ({rank}rep {rep}, pid {pid})"))
            out.append(_meta("thread_name", pid, small, f"thread {small} ({tid:#x})"))
        args: dict[str, Any] = {"site": key, "written": written, "rep": rep}
        if status & RAISED:
            args["raised"] = True
        call = calls.setdefault((pid, tid, key), [_us(t0, origin), 0])
        if status & CONTINUES:
            call[1] += 1
            args["piece"], args["call_ts"] = call[1], call[0]
        else:
            call[:] = [_us(t0, origin), 1]
        if in_b is not None and in_b >= 0:
            args["in_bytes"] = in_b
        if out_b is not None and out_b >= 0:
            args["out_bytes"] = out_b
        out.append(
            {
                "ph": "X",
                "name": api or key,
                "cat": kind or "call",
                "pid": pid,
                "tid": threads[pid, tid],
                "ts": _us(t0, origin),
                "dur": (t1 - t0) / 1000.0,
                "args": args,
            }
        )
    return out


def _power(
    store: Store, run_id: int, sensors: list[dict[str, Any]], origin: int
) -> list[dict[str, Any]]:
    """One counter track per energy domain: the power of each update interval of the sensor
    the analysis attributes with."""
    details = store.result(run_id, "sensors") or {}
    chosen, _ = choose_energy_sensors(sensors, details)
    out: list[dict[str, Any]] = []
    for domain, sensor in sorted(chosen.items()):
        t, v = read_samples(store, sensor["id"])
        try:
            iv = at.sensor_intervals(sensor["kind"], t, v, period_s=sensor.get("period_s"))
        except ValueError:
            continue
        name = f"power {domain} (W, {sensor['provenance']})"
        for edge, watts in zip(iv.edges_ns[:-1], iv.power_W, strict=True):
            out.append(_counter(name, _us(int(edge), origin), {"W": float(watts)}))
        if iv.count:
            out.append(_counter(name, _us(int(iv.edges_ns[-1]), origin), {"W": 0.0}))
    return out


def _memory(store: Store, sensors: list[dict[str, Any]], origin: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for sensor in sensors:
        if sensor["kind"] != "gauge" or sensor["domain"] not in MEMORY_DOMAINS:
            continue
        t, v = read_samples(store, sensor["id"])
        name = f"memory {sensor['name']} (MiB)"
        out += [
            _counter(name, _us(int(a), origin), {"MiB": float(b) / MIB})
            for a, b in zip(t, v, strict=True)
        ]
    return out


def _counter(name: str, ts: float, args: dict[str, float]) -> dict[str, Any]:
    return {"ph": "C", "name": name, "pid": SENSOR_PID, "tid": 0, "ts": ts, "args": args}


def _markers(reps: list[dict[str, Any]], origin: int) -> list[dict[str, Any]]:
    out = []
    for r in reps:
        for column, what in (
            ("t_start_ns", "start"),
            ("t_end_ns", "end"),
            ("tail_end_ns", "tail end"),
        ):
            if r.get(column):
                out.append(
                    {
                        "ph": "i",
                        "s": "g",
                        "name": f"rep {r['rep']} {what}",
                        "pid": SENSOR_PID,
                        "tid": 0,
                        "ts": _us(r[column], origin),
                        "args": {"exit_code": r.get("exit_code")},
                    }
                )
    return out
