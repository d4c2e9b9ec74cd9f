"""What the measurement server does, apart from HTTP: runs, tokens, sampling, idle, gate, ingest,
and the live state the live view and /metrics read (`monitor`, fed by `activity`).

Every method may be called from any request thread; each thread has its own store connection
(SQLite connections are per thread). Run tokens live in memory only: a restarted server refuses
events for runs it did not start (the probe then spools them, and `ingest` brings them in), and
marks the runs an earlier server left open `interrupted` when it starts. A run whose client
process died (`owner_pid`) is marked `interrupted` too, by the watchdog thread.

Each run follows its own process tree (`watch`): its process sensors record into it alone, so two
runs at once never share memory or CPU figures. Events a probe produced that never arrived (its
batches say how many it had produced: `Store.lost_events`) make the run end `incomplete`.

The store is checked whole (SQLite's quick_check) before the first run: a damaged store gets no
new run. A store that refuses a write (a full disk) never stops the server: a refused batch makes
its run end `incomplete` with the reason, and a refused end first gets the disk kept in reserve
(RESERVE_BYTES), else is written by the watchdog or at shutdown once the store takes it.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import platform
import secrets
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fecomlite import __version__
from fecomlite.runtime import batch_codec
from fecomlite.server import spool
from fecomlite.server.baseline import back_since, keep, lagless_tail_ns
from fecomlite.server.folding import Folder, keep_of
from fecomlite.server.gate import GateThresholds, gated, wait_for_stable
from fecomlite.server.idlewatch import IdleWatch
from fecomlite.server.monitor import Monitor
from fecomlite.server.sampler import Sampler, SamplingRates, Sensor, sensor_details, sensor_row
from fecomlite.server.series import POWER_KINDS, Series, idle_stats
from fecomlite.server.state import pid_alive
from fecomlite.store import Store, StoreError

MAX_WINDOW_S = 3600.0
FINISHED_STATUSES = ("finished", "failed", "interrupted")
WATCHDOG_S = 1.0  # how often the owners of open runs are checked
CHECK_AT_START_BYTES = 256 * 1024 * 1024  # larger stores are checked while the server serves
RESERVE_BYTES = 2 * 1024 * 1024  # disk kept back beside the store: a full disk can still end runs
TAIL_POLL_S = 0.1  # how often a tail checks whether power is back at the idle baseline

ProcessSensors = Callable[[int], tuple[list[Sensor], list[str]]]


class RunNotFound(LookupError):
    """The run is unknown to this server (or was never started by it)."""


class StoreFailure(RuntimeError):
    """The store could not take a batch (full disk, I/O error): the sender should keep it."""


@dataclass
class _Run:
    token: str
    sites: dict[str, Any]  # the manifest's site table, for naming events' sites
    owner_pid: int | None = None  # the client that runs it; its death interrupts the run
    watched_until_ns: int | None = None  # the idle watch's readings judged: those before this
    ended: bool = False
    store_error: str | None = None  # the first write the store refused (a full disk)
    totals: dict[str, int] = field(default_factory=dict)  # proc -> events it said it made
    # proc -> (seq, pid, threads): its calls in progress as of its latest batch that said
    open: dict[str, tuple[int, int, list[dict[str, Any]]]] = field(default_factory=dict)
    folder: Folder | None = None  # `--keep`: folds the calls past the detail window


class MeasurementService:
    """Runs measured by this server process, over one store and one sampler."""

    def __init__(
        self,
        store_path: Path,
        sensors: list[Sensor],
        *,
        notes: list[str] | None = None,
        machine: dict[str, Any] | None = None,
        process_sensors: ProcessSensors | None = None,
        rates: SamplingRates | None = None,
        flush_s: float = 0.5,
        use_ticker: bool = True,
        watch_sensors: list[Sensor] | None = None,
    ) -> None:
        """`sensors` are the machine's; `process_sensors(pid)` makes those that follow a pid;
        `use_ticker=False` keeps every cheap sensor on a Python thread (server/sampler.py);
        `watch_sensors`, other instances of the machine's, are read between runs for the
        rolling idle estimate (server/idlewatch.py; none: no estimate)."""
        self.store_path = store_path
        self.notes = list(notes or [])
        self.process_sensors = process_sensors
        self.machine = machine or {}
        self.started = time.time()
        self._local = threading.local()
        self._pending_ends: dict[int, dict[str, Any]] = {}  # run -> an end the store refused
        self._damage: str | None = None  # what the store check found, once it has
        self._open_store()
        self.sampler = Sampler(sensors, store_path, rates=rates, flush_s=flush_s,
                               use_ticker=use_ticker)
        self.sampler.start()
        self.idle_watch = IdleWatch(watch_sensors or [], lambda: bool(self.sampler.recording()))
        self.idle_watch.start()
        self._runs: dict[int, _Run] = {}
        self._lock = threading.Lock()
        self.closing = threading.Event()  # set at shutdown: long waits and live streams end
        self._activity: dict[int, dict[str, Any]] = {}  # run -> what it waits for, last gate
        self.monitor = Monitor(self._db, self.sampler.recording, self.activity,
                               host=self.machine.get("hostname") or platform.node())
        threading.Thread(target=self._watchdog, name="run-watchdog", daemon=True).start()

    def _db(self) -> Store:
        """This thread's store connection (SQLite connections are per thread). A kept-alive
        connection, like the probe's, is served by one thread: it opens the store once."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = Store(self.store_path)
        return store

    def _run(self, run_id: int) -> _Run:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise RunNotFound(f"run {run_id} was not started by this server")
        return run

    # -- status --------------------------------------------------------------------------------

    def activity(self, run_id: int) -> dict[str, Any]:
        """What the server is doing for a run now (`current`: idle baseline, gate or tail, with
        when it began), the run's last gate verdict (`gate`) and the calls its processes said
        were in progress (`open`: one row per call, outermost first), for the live view."""
        with self._lock:
            out = dict(self._activity.get(run_id, {}))
            run = self._runs.get(run_id)
            if run is not None:
                out["open"] = [
                    {"pid": pid, "tid": t["tid"], "level": level, "depth": t["depth"],
                     "site": site, "t_start_ns": t0, **_site_names(run.sites.get(site))}
                    for _seq, pid, threads in run.open.values() for t in threads
                    for level, (site, t0) in enumerate(t["calls"])
                ]
            return out

    @contextmanager
    def _doing(self, run_id: int, stage: str, **detail: Any) -> Iterator[None]:
        current = {"stage": stage, "since_ns": time.monotonic_ns(), **detail}
        with self._lock:
            self._activity.setdefault(run_id, {})["current"] = current
        try:
            yield
        finally:
            with self._lock:
                self._activity[run_id]["current"] = None

    def status(self) -> dict[str, Any]:
        return {
            "server": "fecomlite", "version": __version__, "pid": os.getpid(),
            "store": str(self.store_path), "uptime_s": round(time.time() - self.started, 1),
            "recording": self.sampler.recording(), "sensors": self.sampler.metadata(),
            "sensor_errors": dict(self.sampler.errors), "notes": self.notes,
        }

    # -- runs ----------------------------------------------------------------------------------

    def create_run(
        self, *, program: str = "", argv: list[str] | None = None, level: str = "method",
        settings: dict[str, Any] | None = None, kind: str = "instrumented",
        parent_id: int | None = None, manifest: dict[str, Any] | None = None,
        owner_pid: int | None = None,
    ) -> dict[str, Any]:
        """A new run, recording samples from now on; returns its id, its event token and the
        store's identity (which the run's spools name)."""
        if self._damage:
            raise StoreError(self._damage)
        token = secrets.token_urlsafe(32)
        store = self._db()
        run_id = store.create_run(
            program=program, argv=argv or [], level=level, settings=settings or {},
            kind=kind, parent_id=parent_id, manifest=manifest or {}, machine=self.machine,
            t_start_ns=time.monotonic_ns(),
        )
        keep_setting = keep_of(settings or {})
        self._register(store, run_id, self.sampler.sensors)
        with self._lock:
            self._runs[run_id] = _Run(token, spool.site_table(manifest or {}), owner_pid,
                                      folder=Folder(keep_setting, self._own_store)
                                      if keep_setting else None)
        self.sampler.record(run_id)
        return {"run_id": run_id, "token": token, "store_id": self.store_id}

    @staticmethod
    def _register(store: Store, run_id: int, sensors: list[Sensor]) -> None:
        """List sensors in the run's `sensors` table, and keep their full metadata (model
        parameters, how the period was found) in the run's `sensors` result."""
        for sensor in sensors:
            store.add_sensor(run_id, **sensor_row(sensor))
        details = store.result(run_id, "sensors") or {}
        details.update({s.name: sensor_details(s) for s in sensors})
        store.put_result(run_id, "sensors", details)

    def set_manifest(self, run_id: int, manifest: dict[str, Any]) -> None:
        run = self._run(run_id)
        self._db().update_run(run_id, manifest=manifest)
        run.sites = spool.site_table(manifest)
        self._db().describe_sites(run_id, run.sites)  # sites whose events came first

    def hyperparams(self, run_id: int, params: dict[str, Any]) -> None:
        """Merge hyperparameters known outside the program (e.g. from the command line)."""
        self._run(run_id)
        self._db().merge_hyperparams(run_id, params)

    def watch(self, run_id: int, pid: int | None) -> dict[str, Any]:
        """Follow another process (a new repetition's): its memory and CPU sensors replace the
        run's previous process's, and record into this run only. The sensors' notes say what
        could not be read."""
        self._run(run_id)
        if pid is not None and not 0 < pid < 2**22 + 1:
            raise ValueError("pid must be a process id")
        sensors, notes = self.process_sensors(pid) if self.process_sensors and pid else ([], [])
        self.sampler.set_group(_process_group(run_id), sensors, owner=run_id)
        self._register(self._db(), run_id, sensors)
        return {"sensors": [s.name for s in sensors], "notes": notes}

    def finish_run(self, run_id: int, status: str, exit_code: int | None,
                   recorded: dict[str, int] | None = None) -> dict[str, Any]:
        """Stop recording (after writing every sample read so far) and close the run; a run
        that lost events (`lost_events`) or batches the store refused ends `incomplete` rather
        than `finished`. `recorded`: proc -> events each process recorded (read by the runner from
        `runtime.event_ring`'s files): those never stored, nor told by a batch's `total`, were
        lost by a process that died before sending them (`lost_at_exit`); they are lost events
        too, and make a `failed` run (the program's death lost them) `incomplete` as well. A
        store that cannot record the end (a full disk) gets the disk space kept in reserve, else
        the end is kept and written when it can (watchdog, shutdown); the reply says so."""
        run = self._run(run_id)
        if status not in FINISHED_STATUSES:
            raise ValueError(f"status must be one of {FINISHED_STATUSES}")
        self.sampler.set_group(_process_group(run_id), [], owner=run_id)
        self.sampler.stop_recording(run_id)
        with self._lock:
            totals = dict(run.totals)
        told = self._db().lost_events(run_id, totals)
        if run.folder is not None:
            with contextlib.suppress(sqlite3.Error, StoreError):  # unfolded stays in detail
                run.folder.finish(run_id)
        for proc, n in (recorded or {}).items():
            totals[proc] = max(totals.get(proc, 0), n)
        lost = self._db().lost_events(run_id, totals)
        lost_at_exit = lost - told
        if ((lost or run.store_error) and status == "finished"
                or lost_at_exit and status == "failed"):
            status = "incomplete"
        end = {"status": status, "exit_code": exit_code, "t_end_ns": time.monotonic_ns(),
               "lost": lost, "lost_at_exit": lost_at_exit, "store_error": run.store_error}
        reply: dict[str, Any] = {"ok": True, "status": status, "lost_events": lost}
        if lost_at_exit:
            reply["lost_at_exit"] = lost_at_exit
        if run.store_error:
            reply["store_error"] = run.store_error
        error = self._record_end(run_id, end)
        if not error and not self.sampler.recording():
            self._checkpoint()  # the server goes idle: the store file alone holds every run
        if error:
            reply.update(ok=False, error=f"the store could not record the run's end: {error}; "
                                         "the server records it once the disk has room")
        run.ended = True
        return reply

    def _record_end(self, run_id: int, end: dict[str, Any]) -> str | None:
        """Write a run's end; on a refusal, give the reserve back to the disk and try again.
        Returns the store's error when it still refuses (the end is then kept to retry)."""
        error = self._write_with_reserve(lambda: self._write_end(run_id, end))
        with self._lock:
            if error:
                self._pending_ends[run_id] = end
            else:
                self._pending_ends.pop(run_id, None)
        return error

    def _write_with_reserve(self, write: Callable[[], object]) -> str | None:
        """`write` to the store; on a refusal (a full disk), give the reserve back to the disk
        and try once more. Returns the store's error when it still refuses."""
        try:
            write()
            return None
        except (sqlite3.Error, StoreError) as exc:
            if not self._release_reserve():
                return str(exc)
        try:
            write()
            return None
        except (sqlite3.Error, StoreError) as exc:
            return str(exc)

    def _write_end(self, run_id: int, end: dict[str, Any]) -> None:
        store = self._db()
        with store.transaction():
            if end["lost"]:
                store.put_result(run_id, "lost_events", {"events": end["lost"],
                                                         "at_exit": end.get("lost_at_exit", 0)})
            if end["store_error"]:
                store.put_result(run_id, "store_error", {"reason": end["store_error"]})
            store.update_run(run_id, status=end["status"], exit_code=end["exit_code"],
                             t_end_ns=end["t_end_ns"])

    def _checkpoint(self) -> None:
        try:
            self._db().checkpoint()
        except sqlite3.Error as exc:  # a full disk: the -wal file keeps the rows meanwhile
            print(f"fecomlite server: checkpoint: {exc}", file=sys.stderr)

    def _keep_reserve(self) -> None:
        """Hold RESERVE_BYTES of disk in a file beside the store, while the disk has them."""
        reserve = Path(f"{self.store_path}-reserve")
        if reserve.exists():
            return
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            reserve.unlink(missing_ok=True)

    def _release_reserve(self) -> bool:
        """Give the reserve back to the disk (True: there was one)."""
        try:
            Path(f"{self.store_path}-reserve").unlink()
        except OSError:
            return False
        return True

    def _open_store(self) -> None:
        """Check the store whole before the first run, note an upgrade, end an earlier
        server's runs (nobody can finish them now), and keep disk in reserve."""
        store = self._db()
        if store.upgrade_note:
            self.notes.append(store.upgrade_note)
            print(f"fecomlite server: {store.upgrade_note}", file=sys.stderr)
        if _bytes_of(self.store_path) <= CHECK_AT_START_BYTES:
            store.check()  # refuse to start on a damaged store
        else:  # ~3-30 s per GB: the server answers meanwhile; once damage is found, no new run
            threading.Thread(target=self._check_store, name="store-check", daemon=True).start()
        self.store_id = store.store_id
        try:
            store.interrupt_open_runs()
        except sqlite3.OperationalError as exc:
            self.notes.append(f"could not mark an earlier server's runs interrupted: {exc}")
        self._keep_reserve()

    def _check_store(self) -> None:
        """A large store's page check, in the background: a damaged store takes no new run."""
        try:
            with Store(self.store_path) as store:
                store.check()
        except StoreError as exc:
            self._damage = str(exc)
            self.notes.append(self._damage)
            print(f"fecomlite server: {self._damage}", file=sys.stderr)

    def _watchdog(self) -> None:
        """Mark `interrupted` the runs whose client process has died (SIGKILL, a crash), and
        write the ends the store refused before. Nothing here may end the thread."""
        while not self.closing.wait(WATCHDOG_S):
            try:
                self._watch_once()
            except Exception as exc:  # noqa: BLE001 - a full disk must not stop the watchdog
                print(f"fecomlite server: watchdog: {exc!r}", file=sys.stderr)

    def _watch_once(self) -> None:
        with self._lock:
            orphans = [r for r, run in self._runs.items()
                       if run.owner_pid and not run.ended and not _alive(run.owner_pid)]
            pending = dict(self._pending_ends)
        for run_id in orphans:
            try:
                self.finish_run(run_id, "interrupted", None)
            except (RunNotFound, sqlite3.Error, StoreError, OSError) as exc:
                print(f"fecomlite server: ending run {run_id}: {exc}", file=sys.stderr)
        for run_id, end in pending.items():
            self._record_end(run_id, end)
        if not pending and not orphans and not self._pending_ends:
            self._keep_reserve()

    # -- repetitions ---------------------------------------------------------------------------

    def rep_start(
        self, run_id: int, rep: int, t_ns: int | None, extra: dict[str, Any] | None
    ) -> None:
        self._run(run_id)
        self._db().upsert_repetition(
            run_id, rep, t_start_ns=t_ns or time.monotonic_ns(), extra=extra or {}
        )

    def rep_end(self, run_id: int, rep: int, t_ns: int | None, exit_code: int | None) -> None:
        """Close a repetition. A store that refuses it (a full disk) gets the reserve, as a
        run's end does; if it still refuses, the run is marked with the store's error (it ends
        `incomplete`) rather than failing the runner, which still has a run to end."""
        run = self._run(run_id)
        with self._lock:
            run.open.clear()  # its processes ended: nothing of theirs is in progress
        end = {"t_end_ns": t_ns or time.monotonic_ns(), "exit_code": exit_code}
        error = self._write_with_reserve(
            lambda: self._db().upsert_repetition(run_id, rep, **end))
        if error and not run.store_error:
            run.store_error = f"repetition {rep}'s end not stored: {error}"

    def tail(
        self, run_id: int, rep: int, seconds: float, until_baseline: bool = False
    ) -> dict[str, Any]:
        """Keep sampling after the repetition ended (power decays late), `seconds` at most; with
        `until_baseline`, only until the machine's power is back at the run's idle baseline
        (`fecomlite.server.baseline.back_since`, checked every `TAIL_POLL_S` on what was read
        up to then); where every power sensor is a model of CPU time, only until their readings
        cover none of the program (`lagless_tail_ns`). Returns when the tail ended and since when
        power was back (None: not seen back)."""
        self._run(run_id)
        store = self._db()
        began = time.monotonic_ns()
        deadline = began + int(_window(seconds) * 1e9)
        ended = next((r["t_end_ns"] for r in store.repetitions(run_id)
                      if r["rep"] == rep and r["t_end_ns"] is not None), began)
        baseline = (store.result(run_id, "idle_baseline") or {}) if until_baseline else {}
        settle = {s.name: tail_settle_ns(self.sampler.interval(s), s.period_s)
                  for s in self.sampler.sensors}
        if (lagless := lagless_tail_ns(self.sampler.sensors, settle)) is not None:
            deadline = min(deadline, ended + lagless)  # nothing of the program can show later
        poll_s = TAIL_POLL_S if baseline.get("sensors") else None
        back = None
        with self._doing(run_id, "tail", rep=rep, seconds=seconds):
            while back is None and (left := (deadline - time.monotonic_ns()) / 1e9) > 0:
                self._sleep(left if poll_s is None else min(poll_s, left))
                if poll_s is not None:
                    self.sampler.flush()
                    series = self._series(store, run_id, ended, None,
                                          wanted=lambda d, k: k in POWER_KINDS)
                    back = back_since(series, baseline, ended, settle)
        tail_end = time.monotonic_ns()
        store.upsert_repetition(run_id, rep, tail_end_ns=tail_end)
        return {"tail_end_ns": tail_end, "back_since_ns": back}

    # -- idle baseline and gate ----------------------------------------------------------------

    def idle(self, run_id: int, seconds: float) -> dict[str, Any]:
        """Mean power (and σ) of every power or counter sensor over the next `seconds`."""
        self._run(run_id)
        t0 = time.monotonic_ns()
        with self._doing(run_id, "idle", seconds=seconds):
            self._sleep(_window(seconds))
        t1 = time.monotonic_ns()
        self.sampler.flush()
        baseline: dict[str, Any] = {}
        store = self._db()
        for series in self._series(store, run_id, t0, t1, wanted=lambda d, k: k in POWER_KINDS):
            if (stats := idle_stats(series)) is not None:
                baseline[series.name] = stats
        detail = {"seconds": seconds, "t_start_ns": t0, "t_end_ns": t1, "sensors": baseline}
        return keep(store, run_id, detail)

    def idle_estimate(
        self, run_id: int, seconds: float, max_age_s: float, client_started_ns: int | None = None
    ) -> dict[str, Any]:
        """The run's idle baseline from the rolling estimate of the machine between runs, when
        a recent one matches the machine's state as the run began: stored as a measured one is,
        with `rolling` (its age, the readings, the state then and now). Else {"refused": why},
        kept as the run's `rolling_idle` result. The readings taken after `client_started_ns`
        (the client's own start-up) are left out, here and in the run's gates."""
        run = self._run(run_id)
        store = self._db()
        began = store.run(run_id)["t_start_ns"]
        run.watched_until_ns = min(began, client_started_ns or began)
        found = self.idle_watch.estimate(
            _window(seconds), float(max_age_s), began, run.watched_until_ns
        )
        if "refused" in found:
            store.put_result(run_id, "rolling_idle", found)
            return found
        rolling = ("age_s", "readings", "period_s", "conditions", "now", "checked")
        detail = {
            "seconds": found["seconds"], "t_start_ns": found["t_start_ns"],
            "t_end_ns": found["t_end_ns"], "sensors": found["sensors"],
            "rolling": {**{k: found[k] for k in rolling},
                        "client_start_up_s": round((began - run.watched_until_ns) / 1e9, 3)},
        }
        return keep(store, run_id, detail)

    def gate(self, run_id: int, rep: int | None, thresholds: dict[str, Any]) -> dict[str, Any]:
        """Wait (bounded) until the machine is stable; store the verdict with the repetition.
        Readings the idle watch took before the run began (before its client started, when the
        client said) count too, within `lookback_s`."""
        run = self._run(run_id)
        th = GateThresholds.from_mapping(thresholds)
        since = time.monotonic_ns() - int(th.lookback_s * 1e9)
        lookback_ns = int((th.window + 2) * max(th.bin_s, self.sampler.rates.max_interval_s) * 1e9)
        store = self._db()
        began = run.watched_until_ns or store.run(run_id)["t_start_ns"]
        gate_began = time.monotonic_ns()
        before_run = 0

        def latest() -> list[Series]:
            nonlocal before_run
            self.sampler.flush()  # judge what was read up to now, not up to the last write
            t0 = max(since, time.monotonic_ns() - lookback_ns)
            earlier = self.idle_watch.series(t0, began)
            # with readings from before the client started, its own setup since (creating the
            # run, the first reads after the sampler's park) is left out as its start-up is
            fresh = gate_began if any(t.size for t, _ in earlier.values()) else t0
            series = self._series(store, run_id, max(t0, fresh), None, wanted=gated)
            before_run = _prepend(series, earlier)
            return series

        with self._doing(run_id, "gate", max_wait_s=th.max_wait_s):
            result = wait_for_stable(latest, th, sleep=self._sleep)
        if before_run:
            result["readings_before_run"] = before_run
        with self._lock:
            self._activity[run_id]["gate"] = result
        if rep is not None:
            store.upsert_repetition(run_id, rep, gate=result)
        else:
            store.put_result(run_id, "gates", [*(store.result(run_id, "gates") or []), result])
        return result

    def _series(
        self, store: Store, run_id: int, t0: int, t1: int | None,
        wanted: Callable[[str, str], bool] = lambda domain, kind: True,
    ) -> list[Series]:
        """The samples in [t0, t1] of each of the run's sensors `wanted(domain, kind)`."""
        devices = {s.name: getattr(s, "device", "") for s in self.sampler.sensors}
        out = []
        for row in store.sensors(run_id):
            if not wanted(row["domain"], row["kind"]):
                continue
            rows = store.samples(row["id"], t0, t1)
            out.append(Series(
                row["name"], row["domain"], row["unit"], row["kind"], row["provenance"],
                row["model"], np.array([r[0] for r in rows], dtype=np.int64),
                np.array([r[1] for r in rows], dtype=float), devices.get(row["name"], ""),
            ))
        return out

    def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at shutdown: a long idle window must not hold the server up."""
        if self.closing.wait(seconds):
            raise RuntimeError("the server is shutting down")

    # -- events and spool ----------------------------------------------------------------------

    def check_token(self, run_id: int, token: str) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
        return run is not None and hmac.compare_digest(run.token.encode(), token.encode())

    def post_events(self, run_id: int, body: bytes) -> int:
        """Store one probe batch (`fecomlite.runtime.batch_codec`) whole, once: a batch stored
        before
        (a retry, or one that timed out at the sender) stores nothing and returns 0. The caller
        checked the token."""
        run = self._run(run_id)
        header, columns = batch_codec.decode(body, require_id=True)
        if "total" in header:  # kept even if the store cannot take the batch (a full disk)
            with self._lock:
                proc = header["proc"]
                run.totals[proc] = max(run.totals.get(proc, 0), header["total"])
        if "open" in header:
            with self._lock:
                known = run.open.get(header["proc"])
                if known is None or header["seq"] > known[0]:  # a retried batch is older news
                    run.open[header["proc"]] = (header["seq"], header.get("pid", 0),
                                                header["open"])
        try:
            stored = self._db().add_batch(run_id, header, columns, run.sites)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise
            run.store_error = run.store_error or f"the store could not take a batch: {exc}"
            raise StoreFailure(f"the store could not take the batch: {exc}") from exc
        if stored and run.folder is not None:  # `--keep`: fold what left the detail window
            run.folder.after_batch(run_id, int(header.get("rep", 0)), columns["t_start_ns"],
                                   columns["t_end_ns"])
        return stored

    def _own_store(self) -> Store:
        """A store connection of its own, for a thread that closes it (the folding's)."""
        return Store(self.store_path)

    def ingest(self, path: Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
        return spool.ingest(self._db(), path, manifest, self.machine)

    # -- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop sampling; runs still open are marked `interrupted` (what they hold is kept),
        and ends the store refused before are tried once more (the next server marks a run
        it still cannot close `interrupted`)."""
        self.closing.set()
        with self._lock:
            open_runs = [r for r, run in self._runs.items() if not run.ended]
            self._runs.clear()
            pending = dict(self._pending_ends)
        self.idle_watch.close()
        self.sampler.close()
        now = time.monotonic_ns()
        ends = {**{r: {"status": "interrupted", "exit_code": None, "t_end_ns": now, "lost": 0,
                       "store_error": None} for r in open_runs}, **pending}
        for run_id, end in ends.items():
            error = self._record_end(run_id, end)
            if error:
                print(f"fecomlite server: could not end run {run_id} in the store: {error}",
                      file=sys.stderr)
        self._release_reserve()  # the next server keeps its own


def tail_settle_ns(interval_s: float, period_s: float | None) -> int:
    """How long after a program's end a sensor's readings cover none of it: one read interval
    (a utilisation or a counter's power spans the time since the read before) plus the sensor's
    own averaging period. A reading that came late still covers a little of the program: that
    can only show more power than idle and make the tail longer, never end it early, so no
    further margin is kept (it was 2 x max(interval, period): ~0.1 s more per run)."""
    return int((interval_s + (period_s or 0.0)) * 1e9)


def _bytes_of(store_path: Path) -> int:
    """The store's size, its -wal file's included."""
    wal = Path(f"{store_path}-wal")
    return store_path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def _site_names(site: dict[str, Any] | None) -> dict[str, Any]:
    """What the manifest says of a site: its API (static name), what the user wrote, where."""
    site = site or {}
    return {k: site.get(k) for k in ("api", "written", "file", "line")}


def _prepend(series: list[Series], earlier: dict[str, tuple[np.ndarray, np.ndarray]]) -> int:
    """Put each sensor's `earlier` readings (t_ns, values) before its own; how many were."""
    added = 0
    for s in series:
        t, v = earlier.get(s.name, (np.empty(0, np.int64), np.empty(0)))
        keep = t < (s.t_ns[0] if s.t_ns.size else np.iinfo(np.int64).max)
        if keep.any():
            s.t_ns = np.concatenate([t[keep], s.t_ns])
            s.values = np.concatenate([v[keep], s.values])
            added = max(added, int(keep.sum()))
    return added


def _process_group(run_id: int) -> str:
    return f"process:{run_id}"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b") ", 1)[1][:1] != b"Z"
    except IndexError:
        return True
    except OSError:
        return pid_alive(pid) if not os.path.isdir("/proc") else False


def _window(seconds: float) -> float:
    seconds = float(seconds)
    if not 0 <= seconds <= MAX_WINDOW_S:
        raise ValueError(f"a window must be within 0..{MAX_WINDOW_S:g} s")
    return seconds
