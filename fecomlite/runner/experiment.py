"""One measured run: instrument, baseline, gated repetitions, tails, and what comes back.

The orchestration of `fecomlite run`. The measurement server does the sampling and storing; this
module decides the order of things and starts the user's program with the environment the probe
reads (docs/internals.md §2). A failing or interrupted program still leaves a finished run with
everything measured up to that point.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fecomlite.instrument.hookview import VIEW_ENV
from fecomlite.runner.output import Output, stream_fd
from fecomlite.runner.settings import RunSettings
from fecomlite.runtime import batch_codec
from fecomlite.runtime.event_ring import recorded_counts, recover_unsent
from fecomlite.runtime.layers import layer_env

if TYPE_CHECKING:
    from fecomlite.server.client import ServerClient

PROBE_IMPORT = "import fecomlite.runtime.probe as __fecomlite__"
PROJECT_SITE = batch_codec.PROJECT_SITE
PUMP_DRAIN_S = 5.0  # how long output may still come after the program exited
MAX_LOOKBACK_S = 60.0  # how far back a gate may look at a machine left alone
START_UP_S = 15.0  # a process this young is still starting: its load so far is its start-up
NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/dxg")  # Linux, WSL 2


@dataclasses.dataclass
class Program:
    """What is executed: the script (the user's, run in place, or a notebook's instrumented
    copy), and the manifest of its sites."""

    script: Path  # the file run by Python, as the user named it (its `sys.argv[0]`)
    cwd: Path
    argv: list[str]
    manifest_path: Path | None
    manifest: dict[str, Any]
    original: Path  # the user's script
    skipped: list[str] = dataclasses.field(default_factory=list)  # files left uninstrumented
    launcher: list[str] = dataclasses.field(default_factory=lambda: [sys.executable])
    hook_env: dict[str, str] | None = None  # run in place: the import hook's environment
    argv0: str | None = None  # the script as the user typed it (`./x.py`), else `script`


@dataclasses.dataclass
class RepetitionResult:
    rep: int
    exit_code: int
    seconds: float
    gate: dict[str, Any]


@dataclasses.dataclass
class RunOutcome:
    run_id: int
    status: str  # finished | failed | interrupted | incomplete (events lost: `lost_events`)
    exit_code: int
    repetitions: list[RepetitionResult]
    logs: list[Path]
    lost_events: int = 0
    lost_at_exit: int = 0  # of lost_events: recorded by a process that died before sending them
    kept_spools: list[Path] = dataclasses.field(default_factory=list)  # the store refused them


def is_instrumented(script: Path) -> bool:
    """An instrumented copy imports the probe (the instrumenter refuses to wrap it twice)."""
    try:
        return PROBE_IMPORT in script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def find_manifest(script: Path) -> Path | None:
    for folder in script.resolve().parents:
        candidate = folder / ".fecomlite" / "manifest.json"
        if candidate.is_file():
            return candidate
    return None


def prepare_program(
    script: Path, argv: list[str], settings: RunSettings, work_dir: Path,
    root: Path | None = None,
) -> Program:
    """Method level: the script runs in place, its project (`root`, else found from the
    script) rewritten into the cache `work_dir/rewrite` (a notebook: instrumented into a copy in
    `work_dir`); project level, or a script that is itself instrumented: as it is.
    Raises `fecomlite.runner.workcopy.ScriptError` when the script itself cannot be
    instrumented."""
    from fecomlite.runner.inplace import prepare_in_place
    from fecomlite.runner.workcopy import check_syntax, work_copy

    original = script.resolve()
    check_syntax(original)
    if settings.level == "project":
        return Program(script, Path.cwd(), argv, None, {}, original)
    if is_instrumented(original):
        manifest_path = find_manifest(original)
        manifest = _read_manifest(manifest_path)
        return Program(script, Path.cwd(), argv, manifest_path, manifest, original)
    if original.suffix == ".ipynb":
        copy = work_copy(original, work_dir, settings.api)
        manifest = _read_manifest(copy.manifest)
        return Program(copy.script, Path.cwd(), argv, copy.manifest, manifest, original,
                       skipped=copy.skipped)
    prepared = prepare_in_place(script, work_dir / "rewrite", settings.api, root)
    return Program(script, Path.cwd(), argv, prepared.manifest_path, prepared.manifest,
                   original, skipped=prepared.skipped, hook_env=prepared.env)


def _read_manifest(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def gpu_present() -> bool:
    """Whether NVML sees a GPU: then method-level runs synchronise it at probe boundaries.
    On Linux without NVIDIA's driver (no /proc/driver/nvidia, nor WSL's /dev/dxg) none can:
    pynvml, a twentieth of a second of every run's start-up, is not loaded then."""
    if sys.platform == "linux" and not any(map(os.path.exists, NVIDIA_DRIVER_PATHS)):
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def program_command(program: Program) -> list[str]:
    """How the script runs: a notebook's cells through IPython; a script run in place by the
    import hook's main (`python -m fecomlite.instrument.hookmain SCRIPT`: torchrun's `-m` too);
    anything else by the launcher (Python, or torchrun's command for a distributed job)."""
    from fecomlite.runner.inplace import HOOK_MAIN

    launcher, script = program.launcher, str(program.script)
    if program.script.suffix == ".ipynb":
        return [*launcher, "-m", "fecomlite.runner.notebook", script]
    if program.hook_env is not None:
        return [*launcher, "-m", HOOK_MAIN, program.argv0 or script]
    return [*launcher, script]


def carbon_environment(settings: RunSettings) -> dict[str, str]:
    """The carbon intensity the run was given, for `fecomlite.measure()` in the program."""
    from fecomlite.analysis import carbon

    return carbon.environment(carbon.from_settings(settings.to_json()))


def sync_enabled(settings: RunSettings) -> bool:
    if settings.level != "method" or settings.sync == "off":
        return False
    return settings.sync == "on" or gpu_present()


def program_env(
    client: ServerClient,
    run_id: int,
    token: str,
    rep: int,
    program: Program,
    sync: bool,
    spool: Path,
    datasize: str | None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env.update(
        FECOMLITE_URL=client.url,
        FECOMLITE_RUN=str(run_id),
        FECOMLITE_REP=str(rep),
        FECOMLITE_TOKEN=token,
        FECOMLITE_SPOOL=str(spool),
        FECOMLITE_SYNC="1" if sync else "0",
        FECOMLITE_STORE=client.store_id,
    )
    if program.manifest_path is not None:
        env["FECOMLITE_MANIFEST"] = str(program.manifest_path)
    if datasize:
        env["FECOMLITE_DATASIZE"] = datasize
    env.update(program.hook_env or {})
    env.update(extra_env or {})
    return env


def changed_for_the_runner(env: dict[str, str]) -> dict[str, str | None]:
    """The variables (not fecomlite's, nor PYTHONPATH: `hookview` takes its bootstrap out) the
    runner set or changed for its own sake, with the user's values (None: unset): the program
    run in place sees those (`instrument.hookview`)."""
    return {k: os.environ.get(k) for k, v in env.items()
            if not k.startswith("FECOMLITE_") and k != "PYTHONPATH" and os.environ.get(k) != v}


def project_level_batch(program: Program, rep: int, pid: int, t0: int, t1: int, code: int) -> bytes:
    """Project level: the whole process, imports included, is one call of `<program>`."""
    from array import array

    columns = (
        array("i", [0]).tobytes(),
        array("q", [t0]).tobytes(),
        array("q", [t1]).tobytes(),
        array("Q", [0]).tobytes(),
        bytes([1 if code else 0]),
        array("q", [-1]).tobytes(),
        array("q", [-1]).tobytes(),
    )
    meta = {"rep": rep, "pid": pid, "proc": os.urandom(8).hex(), "seq": 0}  # its id, once
    return batch_codec.encode(meta, [PROJECT_SITE], columns)


def run_experiment(
    client: ServerClient,
    program: Program,
    settings: RunSettings,
    *,
    kind: str = "instrumented",
    parent_id: int | None = None,
    datasize: str | None = None,
    extra: dict[str, Any] | None = None,
    log_dir: Path,
    on_progress: Callable[[str, int], None] = lambda stage, rep: None,
    quiet: bool = False,
    after: Callable[[OpenRun], object] | None = None,
) -> RunOutcome:
    """Baseline, then for each repetition: gate, run, tail. Always finishes the run it made.

    `after`, when every repetition succeeded, may add repetitions to the run before it is
    finished (`fecomlite.runner.calibration.run_calibration`: replays of the costliest calls)."""
    # numpy now: from the run's start the machine is judged (a client importing there would
    # read as a busy machine)
    import fecomlite.server.baseline  # noqa: F401
    import fecomlite.store  # noqa: F401

    sync = sync_enabled(settings)
    manifest = dict(program.manifest.get("sites", {}))
    if settings.level == "project":
        manifest[PROJECT_SITE] = {
            "api": PROJECT_SITE,
            "written": program.original.name,
            "kind": "program",
            "file": program.original.name,
            "function": "<module>",
        }
    used = {**settings.to_json(), "sync_used": sync, "datasize": datasize, **(extra or {})}
    run_id, token = client.create_run(
        program=str(program.original),
        argv=program.argv,
        level=settings.level,
        settings=used,
        kind=kind,
        parent_id=parent_id,
        manifest=manifest,
    )
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    outcome = RunOutcome(run_id, "finished", 0, [], [])
    run = OpenRun(
        client,
        program,
        settings,
        run_id,
        token,
        sync,
        datasize,
        log_dir,
        quiet,
        outcome,
        on_progress,
        sites=manifest,
    )
    try:
        on_progress("idle", 0)
        if settings.idle_s > 0:
            run.baseline = measure_idle(client, run_id, settings)
            if "rolling" in run.baseline:  # the server saw the machine quiet since then
                run.quiet_since_ns = run.baseline["t_start_ns"]
        for rep in range(1, settings.repeat + 1):
            result = run.repetition(rep)
            if result.exit_code != 0:
                outcome.status, outcome.exit_code = "failed", result.exit_code
                break
        if after is not None and outcome.status == "finished":
            after(run)
    except KeyboardInterrupt:
        outcome.status, outcome.exit_code = "interrupted", 130
    finally:
        recover_unsent(log_dir)  # a dead process's unsent events, spooled from its ring
        outcome.kept_spools = _ingest_spools(client, log_dir)
        finished = client.finish_run(run_id, outcome.status, outcome.exit_code,
                                     recorded_counts(log_dir))  # every process has ended
        outcome.status = str(finished.get("status", outcome.status))
        outcome.lost_events = int(finished.get("lost_events", 0))
        outcome.lost_at_exit = int(finished.get("lost_at_exit", 0))
        if settings.params:
            client.hyperparams(run_id, settings.params)
    return outcome


def _ingest_spools(client: ServerClient, log_dir: Path) -> list[Path]:
    """Ingest the spools of events the probe could not post, and remove those stored whole;
    the spools the store refused (a full disk: the run still ends, its events counted lost)
    stay for `fecomlite ingest`, and are returned."""
    from fecomlite.server.client import ServerError

    refused = []
    for spool in sorted(log_dir.glob("*.spool")):
        try:
            report = client.ingest_report(spool)
        except ServerError as exc:
            if exc.status is None:  # no answer: the server is gone, nothing can end the run
                raise
            refused.append(spool)
            continue
        if report.get("whole"):  # else kept: torn records' events
            spool.unlink()
    return refused


def unique_dir(path: Path) -> Path:
    """A new folder (0700) at `path`, or `path-2`, `path-3`...: two runs started in the same
    second never share one (nor overwrite each other's logs)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir(mode=0o700)
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free folder name like {path}")


@dataclasses.dataclass
class OpenRun:
    """A run still recording and accepting events: what adding a repetition to it takes."""

    client: ServerClient
    program: Program
    settings: RunSettings
    run_id: int
    token: str
    sync: bool
    datasize: str | None
    log_dir: Path
    quiet: bool  # the program's output only in rep-N.log, not also on the terminal
    outcome: RunOutcome
    on_progress: Callable[[str, int], None]
    baseline: dict[str, Any] | None = None  # the run's idle baseline, measured or reused
    sites: dict[str, Any] = dataclasses.field(default_factory=dict)  # the run's manifest
    quiet_since_ns: int = dataclasses.field(default_factory=time.monotonic_ns)
    # our stdout and stderr as the program's output reaches them (a live display's included)
    targets: tuple[int, int] = dataclasses.field(
        default_factory=lambda: (stream_fd(sys.stdout, 1), stream_fd(sys.stderr, 2)))

    def repetition(
        self,
        rep: int,
        extra_env: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> RepetitionResult:
        """Pause (after the first), gate, run the program once with the probe's environment
        plus `extra_env`, tail; `extra` is stored with the repetition."""
        settings = self.settings
        if rep > 1:
            time.sleep(random.uniform(*settings.pause_s))
        self.on_progress("gate", rep)
        quiet_s = min((time.monotonic_ns() - self.quiet_since_ns) / 1e9, MAX_LOOKBACK_S)
        gate = (
            self.client.gate(self.run_id, rep=rep, lookback_s=quiet_s, **_gate_thresholds(settings))
            if settings.gate
            else {"checked": [], "passed": True, "skipped": "gate disabled", "waited_s": 0.0}
        )
        self.on_progress("run", rep)
        result = self._run_program(rep, gate, extra_env, extra)
        self.outcome.repetitions.append(result)
        self.outcome.logs.append(self.log_dir / f"rep-{rep}.log")
        self.on_progress("tail", rep)
        self.quiet_since_ns = self._tail(rep) if settings.tail_s > 0 else time.monotonic_ns()
        return result

    def _tail(self, rep: int) -> int:
        """Sample after the program until its power is back at the idle baseline, at most
        `tail_s` (the server judges it as the samples come); returns since when the machine
        has been back (for the next gate)."""
        reply = self.client.tail(
            self.run_id, rep, self.settings.tail_s, until_baseline=self.baseline is not None
        )
        back = reply.get("back_since_ns")
        return int(back) if back is not None else time.monotonic_ns()

    def _run_program(
        self,
        rep: int,
        gate: dict[str, Any],
        extra_env: dict[str, str] | None,
        extra: dict[str, Any] | None,
    ) -> RepetitionResult:
        """One execution of the program, watched by the server, its output in rep-N.log and,
        unless quiet, on the terminal as it comes."""
        client, run_id = self.client, self.run_id
        spool = self.log_dir / f"rep-{rep}.spool"
        env = program_env(
            client,
            run_id,
            self.token,
            rep,
            self.program,
            self.sync,
            spool,
            self.datasize,
            {**carbon_environment(self.settings), **layer_env(self.settings),
             **self._site_log_env(), **(extra_env or {})},
        )
        if not self.quiet:
            env.setdefault("PYTHONUNBUFFERED", "1")  # as live through the pipe as on a terminal
        if self.program.hook_env is not None:
            env[VIEW_ENV] = json.dumps(changed_for_the_runner(env))
        client.rep_start(run_id, rep, extra=extra or {})
        t0 = time.monotonic_ns()
        log_fd = os.open(
            self.log_dir / f"rep-{rep}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
        )  # argv, output: private
        with open(log_fd, "wb", buffering=0) as log:  # unbuffered: a full disk fails a write
            output = None if self.quiet else Output(self.targets, log)
            try:
                proc = subprocess.Popen(
                    [*program_command(self.program), *self.program.argv],
                    cwd=self.program.cwd,
                    env=env,
                    stdout=log if output is None else output.child[0],
                    stderr=subprocess.STDOUT if output is None else output.child[1],
                )
            except BaseException:
                if output is not None:
                    output.close_unstarted()
                raise
            if output is not None:
                output.start()
            client.watch(run_id, proc.pid)
            try:
                code = proc.wait()
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)  # it had its own SIGINT too, from the terminal
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                self._end_program(rep, proc.pid, t0, 130)
                raise
            finally:
                if output is not None:
                    output.join(PUMP_DRAIN_S)
        self._end_program(rep, proc.pid, t0, code)
        return RepetitionResult(rep, code, (time.monotonic_ns() - t0) / 1e9, gate)

    def _site_log_env(self) -> dict[str, str]:
        """Run in place: where the program's processes log the sites of modules the manifest
        does not hold (`importhook.SiteLog`)."""
        if self.program.hook_env is None:
            return {}
        from fecomlite.instrument.importhook import SITES_ENV

        folder = self.log_dir / "sites"
        folder.mkdir(mode=0o700, exist_ok=True)
        return {SITES_ENV: str(folder)}

    def _add_logged_sites(self) -> None:
        """The sites of modules the program loaded by a name computed at run time join the
        run's manifest, so that the report names them as it names the others."""
        from fecomlite.runner.inplace import logged_sites
        from fecomlite.store import Store

        if self.program.hook_env is None:
            return
        new = {k: v for k, v in logged_sites(self.log_dir / "sites").items()
               if k not in self.sites}
        if new:
            with Store(self.client.store_path) as store:
                stored = store.run(self.run_id)["manifest"]  # calibration's sites too
            self.sites = {**stored, **new}
            self.client.set_manifest(self.run_id, self.sites)

    def _end_program(self, rep: int, pid: int, t0: int, code: int) -> None:
        t1 = time.monotonic_ns()
        self.client.rep_end(self.run_id, rep, code)
        self._add_logged_sites()
        if self.settings.level == "project":
            batch = project_level_batch(self.program, rep, pid, t0, t1, code)
            self.client.post_batch(self.run_id, self.token, batch)


def measure_idle(client: ServerClient, run_id: int, settings: RunSettings) -> dict[str, Any]:
    """The run's idle baseline: the server's rolling estimate of the machine between runs when
    a recent one matches the machine as the run began (server/idlewatch.py); else a recent one
    of this store when a short check agrees with it (`fecomlite.server.baseline`); else `idle_s`
    measured now."""
    from fecomlite.server import baseline as bl
    from fecomlite.store import Store

    if settings.baseline_max_age_s > 0:
        rolling = client.idle_estimate(
            run_id, settings.idle_s, settings.baseline_max_age_s, start_up_began_ns()
        )
        if "refused" not in rolling:
            return rolling
    if settings.baseline_max_age_s > 0 and settings.idle_s > bl.CHECK_S:
        with Store(client.store_path) as store:
            found = bl.latest_baseline(store, run_id, settings.baseline_max_age_s,
                                       min_seconds=settings.idle_s)
        if found is not None:
            origin, stored, age_s = found
            check = client.idle(run_id, bl.CHECK_S)
            share = bl.agreement(check, stored)
            if share is not None and share <= 1.0:
                with Store(client.store_path) as store:
                    return bl.reuse(store, run_id, origin, stored, age_s, check, share)
    return client.idle(run_id, settings.idle_s)


def start_up_began_ns() -> int | None:
    """When this process started (monotonic clock), if that was at most START_UP_S ago: its
    own start-up then is the machine's load just before the run, which is ours, not the
    machine's state. None where unknown, or in a process that has run for longer."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        suspended_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    started = ticks * 10**9 // os.sysconf("SC_CLK_TCK") - suspended_ns  # ticks: since boot
    return started if 0 <= time.monotonic_ns() - started <= START_UP_S * 1e9 else None


def _gate_thresholds(settings: RunSettings) -> dict[str, Any]:
    return {
        "max_wait_s": settings.gate_max_wait_s,
        "window": settings.gate_window,
        "cpu_temp_max_c": settings.cpu_temp_max_c,
        "gpu_temp_max_c": settings.gpu_temp_max_c,
        "cpu_power_cv_max": settings.cpu_power_cv_max,
        "gpu_power_cv_max": settings.gpu_power_cv_max,
    }
