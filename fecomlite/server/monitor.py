"""What is happening now, for the live view and /metrics: power per domain, memory, temperatures,
calls, progress and gate of the active run, read from the store a little at a time.

Why the store: the sampler keeps nothing in memory (its writer commits every `flush_s`), and the
rows added since the last look are cheap to read (rowid cursors). The monitor never runs on its
own: it refreshes when a viewer or a scraper asks, at most every MIN_REFRESH_S however many ask,
so a server nobody watches spends nothing on it.

Each sensor is binned on one fixed grid (BIN_S): a bin's power is the energy seen in it over the
time it covers, so a counter and a power sensor read alike; a memory bin keeps its peak. Energy
(`Track.energy_J`) adds every increment seen since the server started, so it only ever grows.
Per-API energy is a running *overlap estimate* (`LIVE_METHOD`) in the analysis' model of the
figures (`FIGURES`): the part of each settled bin's energy above the run's idle baseline that lies
in a repetition is the program's, shared by time among the calls active in it (innermost, by leaf
time: `attribution.leaf_time`) and the program outside calls; tails and the rest (baseline, gate,
pauses) stand apart. Calls reach the server when they end, so a call counts only for the bins
that settle after it arrived (SETTLE_S); the calls in progress, which the probe reports with its
batches, count as active up to now. `fecomlite report` attributes the whole run afterwards, and
better.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis.run_analysis import choose_energy_sensors, idle_baseline
from fecomlite.runtime.batch_codec import RAISED
from fecomlite.server import overview as ov
from fecomlite.server.series import StoredSensor
from fecomlite.store import Store
from fecomlite.store.reads import distinct_pairs

BIN_S = 0.5
BIN_NS = int(BIN_S * 1e9)
HISTORY_S = 300.0  # binned points kept per sensor for the live charts
MIN_REFRESH_S = 0.2
SETTLE_S = 2.0  # a bin is attributed once its calls have had this long to arrive (probe: 0.2 s)
MAX_GAP_S = 2.0  # samples further apart (the sampler was parked) add no energy between them
FRESH_S = 5.0  # a value older than this is no longer "now"
ROWS_PER_QUERY = 50_000
CHUNKS_PER_READ = 16  # event chunks (stored batches, ≤ 65,536 events each) read at once
LIVE_METHOD = "live-overlap"
ENERGY_KINDS = ("counter", "power")
# as fecomlite.analysis.run_analysis: such a power sensor smears a call over a second
MOVING_AVERAGE_S = 0.5
PEAK_DOMAINS = ("process-memory", "gpu-memory", "process-gpu-memory")
# A domain's figures so far, as the analysis defines them (`RunAnalysis.domains`): program_J =
# in_calls_J + outside_calls_J, above idle while a repetition ran; tail_J and other_J apart.
FIGURES = ("program_J", "in_calls_J", "outside_calls_J", "tail_J", "other_J")


@dataclass
class Bin:
    seq: int  # increases with every bin closed, across sensors: what a viewer has seen
    start_ns: int
    value: float  # W for energy sensors, the peak for memory, the mean for other gauges
    energy_J: float  # energy sensors: energy seen in the bin
    seconds: float  # energy sensors: time the bin's samples cover


@dataclass
class Track(StoredSensor):
    """One sensor, by name, followed across runs: latest value, energy so far, binned history."""

    # before any sample: CLOCK_MONOTONIC counts from boot, and the readings a store holds
    # may be older than that on a machine just started (or stamped by another host)
    last_t: int = -(2**63)
    last_v: float | None = None
    energy_J: float = 0.0
    bins: deque[Bin] = field(default_factory=lambda: deque(maxlen=int(HISTORY_S / BIN_S)))
    _index: int | None = None
    _a: float = 0.0  # energy (J), or the bin's sum or peak
    _b: float = 0.0  # seconds covered, or the number of values
    overview: ov.Overview | None = None  # the followed run's whole chart

    @property
    def energetic(self) -> bool:
        return self.kind in ENERGY_KINDS and self.unit in ("J", "W")

    def follow(self, origin_ns: int) -> None:
        """Keep a whole-run chart from `origin_ns` (a run's start), from the bins kept since."""
        how = ov.ENERGY if self.energetic else ov.PEAK if self.domain in PEAK_DOMAINS else ov.MEAN
        self.overview = ov.Overview(origin_ns, how, BIN_NS)
        for b in self.bins:
            self.overview.add(b.start_ns, *((b.energy_J, b.seconds) if how == ov.ENERGY
                                            else (b.value, 1.0)))

    def add(self, t: int, v: float, seq: Callable[[], int]) -> None:
        """One sample; a sample at or before the last one is the same read stored for another
        run that records at the same time, and is skipped."""
        if t <= self.last_t:
            return
        index = t // BIN_NS
        if self._index is not None and index != self._index:
            self._close(seq())
        self._index = index
        if self.energetic:
            gap = t - self.last_t
            if self.last_v is not None and gap <= MAX_GAP_S * 1e9:
                dt = gap / 1e9
                energy = v - self.last_v if self.kind == "counter" else v * dt
                if energy >= 0:  # a counter that went back was reset: count from its new value
                    self.energy_J += energy
                    self._a += energy
                self._b += dt
        elif self.domain in PEAK_DOMAINS:
            self._a, self._b = max(self._a, v) if self._b else v, 1.0
        else:
            self._a, self._b = self._a + v, self._b + 1.0
        self.last_t, self.last_v = t, v

    def _close(self, seq: int) -> None:
        if self._b > 0 and self._index is not None:
            if self.energetic:
                value, energy, seconds = self._a / self._b, self._a, self._b
            else:
                value = self._a if self.domain in PEAK_DOMAINS else self._a / self._b
                energy, seconds = 0.0, 0.0
            self.bins.append(Bin(seq, self._index * BIN_NS, value, energy, seconds))
            if self.overview is not None:
                self.overview.add(self._index * BIN_NS, self._a, self._b)
        self._a = self._b = 0.0

    def now(self, t_ns: int) -> float | None:
        """The current value: the last closed bin's power for energy sensors, the last reading
        for gauges; None when the sensor has not been read for FRESH_S."""
        if t_ns - self.last_t > FRESH_S * 1e9:
            return None
        if self.energetic:
            return self.bins[-1].value if self.bins else None
        return self.last_v

    def bin_energy(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(energy J, seconds covered) of the closed bins starting at each of edges[:-1]."""
        energy, seconds = np.zeros(edges.size - 1), np.zeros(edges.size - 1)
        for b in reversed(self.bins):
            if b.start_ns < edges[0]:
                break
            k = (b.start_ns - int(edges[0])) // BIN_NS
            if k < energy.size:
                energy[k], seconds[k] = b.energy_J, b.seconds
        return energy, seconds


@dataclass
class ApiStats:
    api: str
    calls: int = 0
    seconds: float = 0.0
    energy_J: dict[str, float] = field(default_factory=dict)  # domain -> live overlap estimate
    node: str = ""  # a distributed run's node (GROUP_RANK) and rank; "" for a process without
    rank: str = ""
    self_s: float = 0.0  # time its calls were the innermost, over the steps attributed so far

    def add(self, other: ApiStats) -> None:
        self.calls += other.calls
        self.seconds += other.seconds
        self.self_s += other.self_s
        for domain, joules in other.energy_J.items():
            self.energy_J[domain] = self.energy_J.get(domain, 0.0) + joules


@dataclass(frozen=True)
class Energy:
    """A sensor's energy since the server started (only grows)."""

    name: str
    domain: str
    provenance: str
    model: str | None
    joules: float


@dataclass(frozen=True)
class Snapshot:
    """One refresh, copied out of the monitor: safe to read while the next refresh runs."""

    t_ns: int
    host: str
    run: dict[str, Any] | None
    stage: dict[str, Any]
    progress: dict[str, Any]
    gate: dict[str, Any] | None
    sensors: list[dict[str, Any]]  # the active run's sensors, with their value now
    energy_domains: dict[str, str]  # domain -> the sensor the per-API estimate uses
    calls: dict[str, Any]
    apis: list[ApiStats]  # by time in calls, most first
    api_ranks: list[ApiStats]  # the same per API, node and rank (a process without rank: "")
    energy: list[Energy]  # every sensor the server has read, runs past included
    notes: list[str]
    figures: dict[str, dict[str, float]] = field(default_factory=dict)  # domain -> FIGURES


RankKey = tuple[str, str, str]  # api, node, rank


class RunView:
    """The active run as the live view shows it: calls per API so far, the latest call, the
    calls in progress, the running per-API energy estimate and the run's figures so far; each
    per node and rank too, for /metrics (a process's rank is known once its first batch is
    stored, before its calls are read)."""

    def __init__(self, store: Store, run_id: int) -> None:
        self.run_id = run_id
        first = store.first_event_rowid(run_id)
        self.cursor = (first - 1) if first is not None else store.last_rowid("events")
        self.sites: dict[int, str] = {}  # site id -> API
        self.apis: dict[RankKey, ApiStats] = {}
        self.ranks: dict[int, tuple[str, str]] = {}  # pid -> (node, rank)
        self.last_call: dict[str, Any] | None = None
        self.total_calls = 0
        self.threads: dict[tuple[int, int], int] = {}
        self.pending = np.zeros((0, 4), np.int64)  # t0, t1, thread, api index: not yet settled
        self.api_index: dict[RankKey, int] = {}
        self.attributed_ns: int | None = None
        self.figures: dict[str, dict[str, float]] = {}  # domain -> FIGURES so far
        self.site_names: dict[str, tuple[str, str | None]] = {}  # site key -> (API, written)
        self.notes: list[str] = []  # what the estimate cannot do, as of its last step
        self.details: dict[str, Any] = {}
        self.sensor_names: set[str] = set()
        self.row: dict[str, Any] = {}
        self.folded_read = False  # the calls --keep folded before this view began are counted

    def update(self, store: Store, now: int, tracks: dict[str, Track],
               open_calls: list[dict[str, Any]]) -> list[str]:
        """Read what is new for this run; returns notes on what the estimate could not do.
        `open_calls`: the calls in progress (`MeasurementService.activity`), active in the steps
        they cover so far like calls that ended (their energy is not left outside calls)."""
        self.row = store.run_columns(self.run_id)
        names = store.sensor_names(self.run_id)
        if names != self.sensor_names:
            self.sensor_names = names
            self.details = store.result(self.run_id, "sensors") or {}
        limit = (now - int(SETTLE_S * 1e9)) // BIN_NS * BIN_NS
        if self.attributed_ns is None:  # a run first seen late: its last HISTORY_S at most
            start = self.row.get("t_start_ns") or limit
            self.attributed_ns = max(start // BIN_NS * BIN_NS, limit - int(HISTORY_S * 1e9))
        self._read_events(store)
        self._attribute(limit, tracks, self._running(store, open_calls))
        return self.notes

    def _running(self, store: Store, open_calls: list[dict[str, Any]]) -> np.ndarray:
        """The calls in progress as events that have not ended: t0, end of time, thread, API."""
        if any(c["site"] not in self.site_names for c in open_calls):
            self._load_sites(store)  # a site whose first call is still running
        rows = [(c["t_start_ns"], np.iinfo(np.int64).max,
                 self.threads.setdefault((c["pid"], c["tid"]), len(self.threads)),
                 self._api_number((self._name(c)[0], *self.ranks.get(c["pid"], ("", "")))))
                for c in open_calls]
        return np.array(rows, dtype=np.int64).reshape(-1, 4)

    def _name(self, call: dict[str, Any]) -> tuple[str, str | None]:
        """(API, written) of a call in progress: as the store names its site, else the
        manifest."""
        api, written = self.site_names.get(call["site"], (call.get("api"), call.get("written")))
        return api or call["site"], written

    def _read_events(self, store: Store) -> None:
        """The run's chunks stored since the last look, CHUNKS_PER_READ at a time: a viewer
        who comes an hour into a run holds a slice of its events at once, not the hour."""
        top = store.last_rowid("events")
        if not self.folded_read:  # a viewer who comes late: calls folded by --keep count too
            self.folded_read = True
            self._count(store, store.folded_by_site_and_process(self.run_id))
        fresh = [self.pending]
        while self.cursor < top:
            fresh.append(self._read_chunks(store, min(top, self.cursor + CHUNKS_PER_READ)))
        self.pending = np.concatenate(fresh)

    def _read_chunks(self, store: Store, top: int) -> np.ndarray:
        """Count the calls of the chunks up to `top`; returns those still to attribute (t0, t1,
        thread, API)."""
        self._count(store, store.new_calls_by_site_and_process(self.run_id, self.cursor, top))
        last = store.last_new_call(self.run_id, self.cursor, top)
        if last is not None:
            self.last_call = {"api": self.sites[last[0]], "t_start_ns": last[1],
                              "t_end_ns": last[2], "raised": bool(last[3] & RAISED)}
        late = store.new_calls_ending_after(self.run_id, self.cursor, top, self.attributed_ns)
        self.cursor = top
        if not late["t_start_ns"].size:
            return np.zeros((0, 4), np.int64)
        return np.stack((late["t_start_ns"], late["t_end_ns"],
                         self._numbers(late["pid"], late["tid"], self._thread_number),
                         self._numbers(late["site_id"], late["pid"], self._api_of)),
                        axis=1).astype(np.int64)

    def _count(self, store: Store, grouped: list[tuple[int, int, int, int]]) -> None:
        """Add (site id, pid, calls, ns) to the calls and seconds per API."""
        self._learn_sites(store, {r[0] for r in grouped})
        self._learn_ranks(store, {r[1] for r in grouped})
        for site_id, pid, count, ns in grouped:
            stats = self._api(self._key(site_id, pid))
            stats.calls += count
            stats.seconds += (ns or 0) / 1e9
            self.total_calls += count

    @staticmethod
    def _numbers(a: np.ndarray, b: np.ndarray, number: Callable[[int, int], int]) -> np.ndarray:
        """number(a, b) of every pair, asked once per distinct pair (threads, sites: few)."""
        pairs, which = distinct_pairs(a, b)
        return np.array([number(int(x), int(y)) for x, y in pairs], np.int64)[which]

    def _thread_number(self, pid: int, tid: int) -> int:
        return self.threads.setdefault((pid, tid), len(self.threads))

    def _api_of(self, site_id: int, pid: int) -> int:
        return self.api_index[self._key(site_id, pid)]

    def _learn_sites(self, store: Store, ids: set[int]) -> None:
        if ids - self.sites.keys():
            self._load_sites(store)

    def _load_sites(self, store: Store) -> None:
        for site in store.sites(self.run_id):
            self.sites[site["id"]] = site["api"]
            self.site_names[site["key"]] = (site["api"], site["written"] or None)

    def _api_number(self, key: RankKey) -> int:
        self._api(key)
        return self.api_index[key]

    def in_progress(self, open_calls: list[dict[str, Any]], now: int) -> list[dict[str, Any]]:
        """The calls the run's processes said were running (`MeasurementService.activity`),
        named as the store names their sites (the API that ran, once the probe named it; the
        manifest's static name before), each with how long it has run."""
        out = []
        for c in open_calls:
            api, written = self._name(c)
            out.append({**c, "api": api, "static_api": c.get("api"), "written": written,
                        "elapsed_s": max(now - c["t_start_ns"], 0) / 1e9})
        return sorted(out, key=lambda c: (c["pid"], c["tid"], c["level"]))

    def _learn_ranks(self, store: Store, pids: set[int]) -> None:
        if pids - self.ranks.keys():
            for p in store.processes(self.run_id):
                self.ranks[p["pid"]] = (str(p["node"]), str(p["rank"]))

    def _key(self, site_id: int, pid: int) -> RankKey:
        return (self.sites[site_id], *self.ranks.get(pid, ("", "")))

    def _api(self, key: RankKey) -> ApiStats:
        stats = self.apis.get(key)
        if stats is None:
            stats = self.apis[key] = ApiStats(key[0], node=key[1], rank=key[2])
            self.api_index[key] = len(self.api_index)
        return stats

    def totals(self) -> list[ApiStats]:
        """Per API, over nodes and ranks."""
        out: dict[str, ApiStats] = {}
        for stats in self.apis.values():
            out.setdefault(stats.api, ApiStats(stats.api)).add(stats)
        return list(out.values())

    def energy_sensors(self, tracks: dict[str, Track]) -> dict[str, Track]:
        """The sensor the estimate uses per energy domain, among this run's sensors."""
        rows = [{"name": t.name, "domain": t.domain, "kind": t.kind, "provenance": t.provenance}
                for n, t in tracks.items() if n in self.sensor_names]
        return {domain: tracks[row["name"]]
                for domain, row in choose_energy_sensors(rows, self.details)[0].items()}

    def _attribute(self, limit: int, tracks: dict[str, Track], running: np.ndarray) -> None:
        """Share the above-idle energy of every bin settled by `limit` as the analysis' model
        does (`analysis._program_figures`): the part of a bin inside a repetition is the
        program's, shared by time among the calls active in it (innermost, by leaf time) and the
        program outside calls; the part in a repetition's tail is the tail's; the rest (idle
        baseline, gate, pauses) is other."""
        assert self.attributed_ns is not None
        end = min(limit, self.row.get("t_end_ns") or limit)
        end = max(self.attributed_ns, end // BIN_NS * BIN_NS)
        if end <= self.attributed_ns:
            return
        edges = np.arange(self.attributed_ns, end + 1, BIN_NS, dtype=np.int64)
        ev = np.concatenate((self.pending, running))
        inside = (ev[:, 1] > edges[0]) & (ev[:, 0] < edges[-1])
        t0 = np.clip(ev[inside, 0], edges[0], edges[-1])
        t1 = np.clip(ev[inside, 1], edges[0], edges[-1])
        parent, _ = at.nesting(t0, t1, ev[inside, 2])
        ngroups = max(len(self.api_index), 1)
        leaf = at.leaf_time(edges, t0, t1, ev[inside, 3], parent, ngroups)
        for key, seconds in zip(self.api_index, leaf.sum(axis=0), strict=False):
            self.apis[key].self_s += float(seconds)
        program_s, tail_s = _window_seconds(edges, self.row.get("repetitions") or [])
        busy = leaf.sum(axis=1)
        outside = np.maximum(program_s - busy, 0.0)  # the program's own time between calls
        shared = busy + outside
        share = np.divide(leaf, shared[:, None], out=np.zeros_like(leaf),
                          where=shared[:, None] > 0)
        outside_share = np.divide(outside, shared, out=np.zeros_like(outside), where=shared > 0)
        bin_s = BIN_NS / 1e9
        program_frac = np.clip(np.maximum(program_s, busy) / bin_s, 0.0, 1.0)
        tail_frac = np.clip(tail_s / bin_s, 0.0, 1.0 - program_frac)
        notes = []
        for domain, track in self.energy_sensors(tracks).items():
            idle_w, _ = idle_baseline(self.row, {"name": track.name, "model": track.model})
            if idle_w is None:
                notes.append(f"{track.name}: no idle baseline, so no per-API energy estimate")
                continue
            energy, seconds = track.bin_energy(edges)
            above = np.maximum(energy - float(idle_w) * seconds, 0.0)  # a counter never shrinks
            program = above * program_frac
            per_api = program @ share
            for key, k in self.api_index.items():
                if (joules := per_api[k]) > 0:
                    stats = self.apis[key]
                    stats.energy_J[domain] = stats.energy_J.get(domain, 0.0) + float(joules)
            figures = self.figures.setdefault(domain, dict.fromkeys(FIGURES, 0.0))
            figures["in_calls_J"] += float(per_api.sum())
            figures["outside_calls_J"] += float((program * outside_share).sum())
            figures["tail_J"] += float((above * tail_frac).sum())
            figures["other_J"] += float((above * (1.0 - program_frac - tail_frac)).sum())
            figures["program_J"] = figures["in_calls_J"] + figures["outside_calls_J"]
        self.pending = self.pending[self.pending[:, 1] > edges[-1]]
        self.attributed_ns = int(edges[-1])
        self.notes = notes


def _window_seconds(edges: np.ndarray, reps: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Per bin, the seconds it lies inside a repetition (the program ran), and inside a
    repetition's tail. A run without repetitions (a watched process) is all program."""
    lo, hi = edges[:-1], edges[1:]
    if not reps:
        return (hi - lo) / 1e9, np.zeros(lo.size)

    def overlap(a: int, b: int) -> np.ndarray:
        return np.clip(np.minimum(hi, b) - np.maximum(lo, a), 0, None) / 1e9

    program, tail = np.zeros(lo.size), np.zeros(lo.size)
    for r in reps:
        if r.get("t_start_ns") is None:
            continue
        stop = r.get("t_end_ns") or int(hi[-1])
        program += overlap(r["t_start_ns"], stop)
        if r.get("t_end_ns") is not None:
            tail += overlap(r["t_end_ns"], r.get("tail_end_ns") or int(hi[-1]))
    return program, tail


class Monitor:
    """The live state of one server, refreshed on demand (thread-safe, rate-limited)."""

    def __init__(
        self, db: Callable[[], Store], recording: Callable[[], list[int]],
        activity: Callable[[int], dict[str, Any]], host: str,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """`db()` is the calling thread's store; `recording()` the runs now recording;
        `activity(run)` what the server is doing for a run (idle, gate, tail) and its last gate."""
        self._db, self._recording, self._activity = db, recording, activity
        self.host = host
        self._clock = clock
        self._lock = threading.Lock()
        store = db()
        self._cursor = store.last_rowid("samples")  # energy counts from the server's start
        self._sensor_max = store.last_rowid("sensors")
        self._sensor_ids: dict[int, Track] = {}
        self._tracks: dict[str, Track] = {}
        self._seq = 0
        self._run: RunView | None = None
        self._charted: tuple[int, int] | None = None  # (run, start) the overviews follow
        self._snapshot: Snapshot | None = None
        self._refreshed = 0
        self.refreshes = 0  # how often the store was read: zero while nobody asks

    def refresh(self) -> Snapshot:
        """The state now (at most MIN_REFRESH_S old)."""
        with self._lock:
            now = self._clock()
            if self._snapshot is None or now - self._refreshed >= MIN_REFRESH_S * 1e9:
                store = self._db()
                self._chart_run(store)
                self._read_samples(store)
                notes = self._follow_run(store, now)
                self._snapshot = self._build(store, now, notes)
                self._refreshed = now
                self.refreshes += 1
            return self._snapshot

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _chart_run(self, store: Store) -> None:
        """Point every sensor's whole-run chart at the run now recording, from its start (before
        its samples are read, so a viewer who comes late still gets the whole run)."""
        recording = self._recording()
        if not recording or (self._charted and self._charted[0] == max(recording)):
            return
        start = store.run(max(recording)).get("t_start_ns")
        if start is None:
            return
        self._charted = (max(recording), int(start))
        for track in self._tracks.values():
            track.follow(int(start))

    def _read_samples(self, store: Store) -> None:
        while True:
            rows = store.samples_after(self._cursor, ROWS_PER_QUERY)
            if not rows:
                return
            if any(r[1] not in self._sensor_ids for r in rows):
                self._learn_sensors(store)
            for _, sensor_id, t, value in rows:
                track = self._sensor_ids.get(sensor_id)  # None: a sensor of a run before ours
                if track is not None:
                    track.add(t, value, self._next_seq)
            self._cursor = rows[-1][0]
            if len(rows) < ROWS_PER_QUERY:
                return

    def _learn_sensors(self, store: Store) -> None:
        for row in store.sensors_after(self._sensor_max):
            sensor_id, name = row[0], row[1]
            track = self._tracks.get(name)
            if track is None:
                track = self._tracks[name] = Track(*row[1:])
                if self._charted is not None:
                    track.follow(self._charted[1])
            self._sensor_ids[sensor_id] = track
            self._sensor_max = max(self._sensor_max, sensor_id)

    def _follow_run(self, store: Store, now: int) -> list[str]:
        recording = self._recording()
        if recording and (self._run is None or self._run.run_id != max(recording)):
            self._run = RunView(store, max(recording))
        if self._run is None:
            return []
        open_calls = self._activity(self._run.run_id).get("open") or []
        return self._run.update(store, now, self._tracks, open_calls)

    def _build(self, store: Store, now: int, notes: list[str]) -> Snapshot:
        energy = [Energy(t.name, t.domain, t.provenance, t.model, t.energy_J)
                  for t in self._tracks.values() if t.energetic]
        view = self._run
        calls = {"total": 0, "last": None, "in_progress": [], "outside_J": {},
                 "method": LIVE_METHOD, "settle_s": SETTLE_S}
        if view is None:
            return Snapshot(now, self.host, None, {"stage": "waiting"}, {}, None, [],
                            {}, calls, [], [], energy, [])
        row = view.row
        activity = self._activity(view.run_id)
        calls.update(
            total=view.total_calls, last=view.last_call,
            in_progress=view.in_progress(activity.get("open") or [], now),
            outside_J={d: f["outside_calls_J"] for d, f in view.figures.items()},
        )
        sensors = [
            {"name": t.name, "domain": t.domain, "unit": t.unit, "kind": t.kind,
             "provenance": t.provenance, "model": t.model, "now": t.now(now),
             "averaging_s": (view.details.get(t.name) or {}).get("averaging_s"),
             "idle_w": idle_baseline(row, {"name": t.name, "model": t.model})[0]}
            for name, t in sorted(self._tracks.items()) if name in view.sensor_names
        ]
        ranked = [ApiStats(a.api, a.calls, a.seconds, dict(a.energy_J), a.node, a.rank,
                           a.self_s) for a in view.apis.values()]
        return Snapshot(
            t_ns=now, host=self.host,
            run={k: row.get(k) for k in ("id", "kind", "program", "argv", "level", "status",
                                         "exit_code", "t_start_ns", "t_end_ns", "created_unix")},
            stage=_stage(row, row["repetitions"], activity, now),
            progress=_progress(row, row["repetitions"]),
            gate=activity.get("gate"),
            sensors=sensors,
            energy_domains={d: t.name for d, t in view.energy_sensors(self._tracks).items()},
            calls=calls,
            apis=sorted(view.totals(), key=lambda a: -a.seconds),
            api_ranks=sorted(ranked, key=lambda a: -a.seconds),
            energy=energy,
            notes=notes,
            figures={d: dict(f) for d, f in view.figures.items()},
        )

    def history(
        self, names: list[str], since_seq: int, t0_ns: int
    ) -> tuple[dict[str, list[tuple[float, float]]], int]:
        """The binned points of these sensors closed after `since_seq` and starting at or after
        `t0_ns`, as (seconds since t0, value); and the seq they go up to (the next call's
        `since_seq`: a refresh may have come between the snapshot and this call)."""
        out: dict[str, list[tuple[float, float]]] = {}
        with self._lock:
            for name in names:
                track = self._tracks.get(name)
                if track is None:
                    continue
                points = []
                for b in reversed(track.bins):
                    if b.seq <= since_seq:
                        break
                    if b.start_ns >= t0_ns:
                        points.append(((b.start_ns - t0_ns) / 1e9, b.value))
                out[name] = points[::-1]
            return out, self._seq

    def overview(
        self, names: list[str], seen: dict[str, tuple[int, int]]
    ) -> dict[str, dict[str, Any]]:
        """The followed run's whole chart of these sensors that a viewer lacks (`Overview.since`);
        `seen` (sensor -> what it has) is updated."""
        out = {}
        with self._lock:
            for name in names:
                track = self._tracks.get(name)
                if track is not None and track.overview is not None:
                    out[name], seen[name] = track.overview.since(seen.get(name))
        return out


def _stage(
    row: dict[str, Any], reps: list[dict[str, Any]], activity: dict[str, Any], now: int
) -> dict[str, Any]:
    """What the run is doing: idle baseline, gate, a repetition, its tail, or finished."""
    if row.get("status") != "running":
        return {"stage": row.get("status")}
    current = activity.get("current")
    if current:
        return {**current, "for_s": (now - current["since_ns"]) / 1e9}
    running = [r for r in reps if r["t_start_ns"] is not None and r["t_end_ns"] is None]
    if running:
        r = running[-1]
        return {"stage": "run", "rep": r["rep"], "for_s": (now - r["t_start_ns"]) / 1e9}
    return {"stage": "between"}


def _progress(row: dict[str, Any], reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Repetitions done of those planned (the run's `repeat` setting, where it has one)."""
    total = (row.get("settings") or {}).get("repeat")
    done = sum(1 for r in reps if r["t_end_ns"] is not None)
    return {"done": done, "total": total if isinstance(total, int) else None,
            "started": len(reps)}
