"""One test's measurement: its call phase inside `fecomlite.measure()` (the in-process sensors),
the host memory it reached (the kernel's high-water mark, reset at its start), whether other
processes kept the CPUs busy meanwhile, and the probe's events of its framework calls.

A test's figures come once the sensors were read past its end (about 0.1 s later, on the
sensor thread), so a test never waits for its own: rows are resolved at the session's end, or
earlier once ready, which keeps the suite's wall time close to a plain run.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from fecomlite.analysis.run_analysis import RSS_SENSOR, busy_at, gauge_during
from fecomlite.api.measure import Measurement, measure
from fecomlite.api.notebook_magic import _CellSink, api_table

PROBE = "fecomlite.runtime.probe"
# The probe's event columns (`drain_columns`): site index, t0, t1, thread, status, in, out bytes
COLUMN_TYPES = (np.int32, np.int64, np.int64, np.uint64, np.uint8, np.int64, np.int64)
_STATUS = f"/proc/{os.getpid()}/status"
NS = 1e9
# Above this many calls in one test, an API's energy is the test's shared by its calls' time:
# the report's attribution, per call, would cost more than many tests do.
ATTRIBUTED_CALLS_MAX = 5000


class EventSink(_CellSink):
    """Stands in for the probe's sender during the session: events stay in this process and each
    test takes those of its own window (`take`)."""

    replaced: Any = None  # the probe's own sender, while this one stands in

    def send(self, drain: Any, *_final: Any) -> None:
        super().send(drain)

    def take(self, start_ns: int, end_ns: int) -> _CellSink:
        """The events that began and ended inside [start, end], as a sink of their own (names
        shared), and forget every batch so far."""
        batches, self.batches = self.batches, []
        kept = []
        for names, columns in batches:
            cols = [np.frombuffer(c, d) for c, d in zip(columns, COLUMN_TYPES, strict=False)]
            inside = (cols[1] >= start_ns) & (cols[2] <= end_ns)
            if inside.any():
                kept.append((names, [c[inside].tobytes() for c in cols]))
        return _CellSink(batches=kept, names=self.names)


def probe_sink(sink: EventSink) -> bool:
    """Route the probe's events to `sink` when instrumented code loaded the probe (else there are
    no events to take); what it buffered before is dropped (not this test's). The sender it had
    is kept on the sink, to be put back (`restore_probe`)."""
    probe = sys.modules.get(PROBE)
    if probe is None:
        return False
    if probe._sender is not sink:
        probe.flush()
        sink.replaced, probe._sender = probe._sender, sink
    probe.flush()
    resample(probe)
    return True


def resample(probe: Any) -> None:
    """As the probe's own resample, but one sized call per known site: each site's first call in
    the test records its results' bytes (a site new to the session takes the usual first calls,
    which also name it)."""
    again = probe.SLOW_CALLS_PER_SITE - 1
    for site in probe._fast:
        probe._slow_counts[site] = again
    probe._fast.clear()


def restore_probe(sink: EventSink) -> None:
    """Give the probe back the sender it had before the session."""
    probe = sys.modules.get(PROBE)
    if probe is not None and probe._sender is sink:
        probe.flush()
        probe._sender = sink.replaced


def _status_kib(*keys: str) -> dict[str, float]:
    out = {}
    try:
        with open(_STATUS, "rb") as f:
            for line in f:
                key = line.split(b":", 1)[0].decode()
                if key in keys:
                    out[key] = float(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def reset_peak() -> bool:
    """Reset this process's high-water mark of resident memory to its current RSS (Linux
    `clear_refs` 5), so VmHWM at the end is the peak inside the test."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_B = 128 * 1024  # glibc's own default, before it starts to move


def steady_allocator() -> bool:
    """Keep glibc's mmap threshold at its default (128 KiB) for the session. glibc raises it
    after a large block is freed, so a later block of that size comes from the heap, whose freed
    pages may still be resident: a test's peak would then depend on the tests before it and its
    own earlier repetitions. Fixed, every large block is mapped when allocated and unmapped when
    freed, and shows in RSS each time. The program's results do not change; its large
    allocations cost a map and unmap each. False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_B)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_B))
    except (OSError, AttributeError):
        return False


def _busy_cpu_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(
        t, "softirq", 0.0)


def _own_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system + t.children_user + t.children_system


@dataclass
class Repetition:
    """One measured call of a test; `figures()` once its window is covered."""

    m: Measurement
    rss_start: float = math.nan
    rss_end: float = math.nan
    hwm_end: float = math.nan
    hwm_reset: bool = False
    cpu: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # machine, own: start, end
    events: _CellSink | None = None

    def ready(self) -> bool:
        return self.m._pending is not None and self.m._pending.done.is_set()

    def other_cpu_pct(self) -> float:
        """Other processes' CPU use during the call, % of all CPUs."""
        wall = self.m.duration_s * (psutil.cpu_count() or 1)
        machine, own = self.cpu[1] - self.cpu[0], self.cpu[3] - self.cpu[2]
        return 100 * max(machine - own, 0.0) / wall if wall > 0 else math.nan

    def host_peak_B(self) -> float | None:
        """How far host RSS rose above its level at the test's start: the kernel's high-water
        mark, reset at the start (exact). Where it cannot be reset, the sampled RSS of the
        process tree; not the sampled high-water mark, whose first read after the test may
        fall in the next one."""
        if self.hwm_reset and math.isfinite(self.hwm_end - self.rss_start):
            return self.hwm_end - self.rss_start
        start = self.m._memory("host", 0)
        samples = self.m._pending.result().samples.get(RSS_SENSOR)
        if start is None or samples is None or samples[0].size == 0:
            return None
        t, v, _ = samples
        inside = (t >= self.m.start_ns) & (t <= self.m.end_ns)
        return float(max(v[inside].max(initial=start), start) - start)

    def figures(self, sites: dict[str, dict[str, Any]]) -> dict[str, Any]:
        m = self.m
        return {
            "duration_s": m.duration_s,
            "energy_J": m.energy_J,
            "sensors": {d: {"provenance": e.provenance, "sensor": e.sensor, "model": e.model,
                            "resolution_s": e.resolution_s} for d, e in m.domains.items()},
            "below_resolution": m.below_resolution,
            "host_peak_B": self.host_peak_B(),
            "host_retained_B": (self.rss_end - self.rss_start
                                if math.isfinite(self.rss_end - self.rss_start) else None),
            "gpu_peak_B": (m.gpu_memory_peak_B - m._memory(m._gpu_key(), 0)  # type: ignore[arg-type,operator]
                           if m.gpu_memory_peak_B is not None else None),
            "gpu_retained_B": m.gpu_memory_added_B,
            "other_cpu_pct": self.other_cpu_pct(),
            "apis": api_rows(m, self.events, sites) if self.events is not None else [],
        }


def api_rows(m: Measurement, events: _CellSink,
             sites: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per API inside the test: calls, time, energy per domain (the report's attribution; none in
    a test shorter than a sensor's update period, whose energy the sensors cannot split; the
    test's energy shared by call time past ATTRIBUTED_CALLS_MAX calls, `energy_by`), the
    bytes its sized calls returned (`result_B`: each site's first call in the test), and
    the host memory its calls added (RSS after − before, summed; sampled every 5 ms, so a short
    call's part may be missed) and rose to above their start."""
    keys, t0, t1, _ = events.events()
    if not keys:
        return []
    named = {k: events.api_of(k, sites.get(k, {})) for k in set(keys)}
    api_of = np.array([named[k] for k in keys], dtype=object)
    if m.below_resolution or len(keys) > ATTRIBUTED_CALLS_MAX:
        rows = [{"api": a, "calls": int(mine.sum()), "time_s": float((t1 - t0)[mine].sum() / NS),
                 "energy": {}} for a in sorted(set(api_of)) for mine in [api_of == a]]
        if not m.below_resolution:  # the test's energy shared by its calls' time
            for row in rows:
                row["energy"] = {d: j * row["time_s"] / m.duration_s for d, j in m.energy_J.items()}
                row["energy_by"] = "time share"
    else:
        rows = api_table(m, events, sites)
    out_bytes = np.concatenate([np.frombuffer(cols[6], np.int64) for _, cols in events.batches])
    rss = m._pending.result().samples.get(RSS_SENSOR)
    start, end, peak = gauge_during(rss[0], rss[1], t0, t1) if rss is not None else (None,) * 3
    for row in rows:
        mine = api_of == row["api"]
        sized = out_bytes[mine & (out_bytes >= 0)]
        row["result_B"] = float(sized.sum()) if sized.size else None
        if start is not None:
            row["memory_added_B"] = float((end - start)[mine].sum())
            row["memory_peak_B"] = float((peak - start)[mine].max())
    return rows


@dataclass
class _Open:
    """A repetition being measured."""

    nodeid: str
    block: measure
    m: Measurement
    probed: bool
    cpu: tuple[float, float]  # machine's and own busy CPU seconds at the start
    rss: float
    reset: bool


class Recorder:
    """Measures test calls and keeps their repetitions until their figures are ready."""

    def __init__(self, sink: EventSink | None = None,
                 sites: dict[str, dict[str, Any]] | None = None) -> None:
        self.steady_allocator = steady_allocator()
        self.own_sink = sink is None  # else the import hook's, put back when it stops
        self.sink = sink or EventSink()
        self.sites = sites if sites is not None else {}  # the import hook's manifest entries
        self.pending: dict[str, list[Repetition]] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, str] = {}
        self.notes: dict[str, list[str]] = {}

    def begin(self, nodeid: str) -> _Open:
        """Start measuring one repetition of `nodeid` (then `end` it, whatever the test did)."""
        probed = probe_sink(self.sink)
        block = measure(nodeid)
        cpu = (_busy_cpu_s(), _own_cpu_s())
        m = block.__enter__()
        rss = _status_kib("VmRSS").get("VmRSS", math.nan)
        return _Open(nodeid, block, m, probed, cpu, rss, reset_peak())

    def end(self, o: _Open, keep: bool = True) -> None:
        """Stop measuring; `keep` False: the repetition is left out (its events dropped)."""
        status = _status_kib("VmRSS", "VmHWM")
        o.block.__exit__(None, None, None)
        if o.probed:
            sys.modules[PROBE].flush()
        if not keep:
            self.sink.take(o.m.start_ns, o.m.end_ns)
            return
        rep = Repetition(
            o.m, o.rss, status.get("VmRSS", math.nan), status.get("VmHWM", math.nan), o.reset,
            (o.cpu[0], _busy_cpu_s(), o.cpu[1], _own_cpu_s()),
            self.sink.take(o.m.start_ns, o.m.end_ns) if o.probed else None)
        self.pending.setdefault(o.nodeid, []).append(rep)

    def note(self, nodeid: str, text: str) -> None:
        self.notes.setdefault(nodeid, []).append(text)

    def finished(self, nodeid: str, outcome: str) -> None:
        """The test's report is in: its row can be made once its figures are ready."""
        self.outcomes[nodeid] = outcome
        self.resolve(wait=False)

    def close(self) -> dict[str, dict[str, Any]]:
        """Every row, once all are ready; the probe gets its sender back."""
        if self.own_sink:
            restore_probe(self.sink)
        return self.resolve(wait=True)

    def resolve(self, wait: bool = True) -> dict[str, dict[str, Any]]:
        """Make the rows of finished tests whose figures are ready (all of them when `wait`)."""
        for nodeid in [n for n in self.pending if n in self.outcomes]:
            reps = self.pending[nodeid]
            if wait or all(r.ready() for r in reps):
                del self.pending[nodeid]
                self.rows[nodeid] = make_row(nodeid, self.outcomes[nodeid], reps,
                                             self.notes.pop(nodeid, []), self.sites)
        return self.rows


def make_row(nodeid: str, outcome: str, reps: list[Repetition], notes: list[str],
             sites: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One test's row: per-repetition figures (for the noise), sensors, load and APIs."""
    figures = [r.figures(sites) for r in reps]
    domains = sorted({d for f in figures for d in f["energy_J"]})
    other = [f["other_cpu_pct"] for f in figures if math.isfinite(f["other_cpu_pct"])]
    return {
        "nodeid": nodeid,
        "outcome": outcome,
        "repetitions": len(reps),
        "duration_s": [f["duration_s"] for f in figures],
        "energy_J": {d: [f["energy_J"].get(d, math.nan) for f in figures] for d in domains},
        "sensors": figures[0]["sensors"],
        "below_resolution": sorted({d for f in figures for d in f["below_resolution"]}),
        "memory": {k: [f[k] for f in figures] for k in
                   ("host_peak_B", "host_retained_B", "gpu_peak_B", "gpu_retained_B")},
        "other_cpu_pct": max(other) if other else None,
        "busy": any(busy_at(p) for p in other),
        "instrumented": any(r.events is not None for r in reps),
        "apis": merged_apis([f["apis"] for f in figures]),
        "notes": notes,
    }


def merged_apis(per_rep: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per API, its mean figures per repetition, costliest (time) first."""
    n = len(per_rep)
    out: dict[str, dict[str, Any]] = {}
    for rows in per_rep:
        for row in rows:
            a = out.setdefault(row["api"], {"api": row["api"], "calls": 0.0, "time_s": 0.0,
                                            "energy_J": {}, "memory_added_B": 0.0,
                                            "memory_peak_B": None, "result_B": None})
            a["calls"] += row["calls"] / n
            a["time_s"] += row["time_s"] / n
            for d, j in row["energy"].items():
                a["energy_J"][d] = a["energy_J"].get(d, 0.0) + j / n
            a["memory_added_B"] += row.get("memory_added_B", 0.0) / n
            if row.get("result_B") is not None:
                a["result_B"] = (a["result_B"] or 0.0) + row["result_B"] / n
            peak = row.get("memory_peak_B")
            if peak is not None:
                a["memory_peak_B"] = max(peak, a["memory_peak_B"] or peak)
    return sorted(out.values(), key=lambda a: -a["time_s"])
