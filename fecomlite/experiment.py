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
from typing import Any

from fecomlite import batch_codec
from fecomlite.instrument.project import instrument_path
from fecomlite.layers import layer_env
from fecomlite.server.client import ServerClient
from fecomlite.settings import RunSettings

PROBE_IMPORT = "import fecomlite.probe as __fecomlite__"
PROJECT_SITE = "<program>"


@dataclasses.dataclass
class Program:
    """What is executed: the (instrumented) script, its folder, and its manifest."""

    script: Path  # the file run by Python
    cwd: Path
    argv: list[str]
    manifest_path: Path | None
    manifest: dict[str, Any]
    original: Path  # the user's script


@dataclasses.dataclass
class RepetitionResult:
    rep: int
    exit_code: int
    seconds: float
    gate: dict[str, Any]


@dataclasses.dataclass
class RunOutcome:
    run_id: int
    status: str  # finished | failed | interrupted
    exit_code: int
    repetitions: list[RepetitionResult]
    logs: list[Path]


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
    script: Path, argv: list[str], settings: RunSettings, work_dir: Path
) -> Program:
    """Instrument the script's folder into `work_dir` (method level), or use it as it is."""
    script = script.resolve()
    if settings.level == "project":
        return Program(script, Path.cwd(), argv, None, {}, script)
    if is_instrumented(script):
        manifest_path = find_manifest(script)
        manifest = _read_manifest(manifest_path)
        return Program(script, Path.cwd(), argv, manifest_path, manifest, script)
    project = script.parent
    out = work_dir / f"{project.name}-instrumented"
    result = instrument_path(project, out, api_roots=settings.api)
    manifest_path = result.manifest
    return Program(
        out / script.relative_to(project),
        Path.cwd(),
        argv,
        manifest_path,
        _read_manifest(manifest_path),
        script,
    )


def _read_manifest(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def gpu_present() -> bool:
    """Whether NVML sees a GPU: then method-level runs synchronise it at probe boundaries."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


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
    )
    if program.manifest_path is not None:
        env["FECOMLITE_MANIFEST"] = str(program.manifest_path)
    if datasize:
        env["FECOMLITE_DATASIZE"] = datasize
    env.update(extra_env or {})
    return env


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
    return batch_codec.encode({"rep": rep, "pid": pid}, [PROJECT_SITE], columns)


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
    show_output: bool = False,
    after: Callable[[OpenRun], object] | None = None,
) -> RunOutcome:
    """Baseline, then for each repetition: gate, run, tail. Always finishes the run it made.

    `after`, when every repetition succeeded, may add repetitions to the run before it is
    finished (`fecomlite.calibration.run_calibration`: replays of the costliest calls)."""
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
    log_dir.mkdir(parents=True, exist_ok=True)
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
        show_output,
        outcome,
        on_progress,
    )
    try:
        on_progress("idle", 0)
        if settings.idle_s > 0:
            client.idle(run_id, settings.idle_s)
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
        for spool in log_dir.glob("*.spool"):  # events the probe could not post
            client.ingest(spool)
            spool.unlink()
        client.finish_run(run_id, outcome.status, outcome.exit_code)
        if settings.params:
            client.hyperparams(run_id, settings.params)
    return outcome


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
    show_output: bool
    outcome: RunOutcome
    on_progress: Callable[[str, int], None]

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
        gate = (
            self.client.gate(self.run_id, rep=rep, **_gate_thresholds(settings))
            if settings.gate
            else {"checked": [], "passed": True, "skipped": "gate disabled", "waited_s": 0.0}
        )
        self.on_progress("run", rep)
        result = self._run_program(rep, gate, extra_env, extra)
        self.outcome.repetitions.append(result)
        self.outcome.logs.append(self.log_dir / f"rep-{rep}.log")
        self.on_progress("tail", rep)
        if settings.tail_s > 0:
            self.client.tail(self.run_id, rep, settings.tail_s)
        return result

    def _run_program(
        self,
        rep: int,
        gate: dict[str, Any],
        extra_env: dict[str, str] | None,
        extra: dict[str, Any] | None,
    ) -> RepetitionResult:
        """One execution of the program, watched by the server, its output in rep-N.log."""
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
            {**layer_env(self.settings), **(extra_env or {})},
        )
        client.rep_start(run_id, rep, extra=extra or {})
        t0 = time.monotonic_ns()
        with open(self.log_dir / f"rep-{rep}.log", "wb") as log:
            out = None if self.show_output else log
            proc = subprocess.Popen(
                [sys.executable, str(self.program.script), *self.program.argv],
                cwd=self.program.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
            )
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
        self._end_program(rep, proc.pid, t0, code)
        return RepetitionResult(rep, code, (time.monotonic_ns() - t0) / 1e9, gate)

    def _end_program(self, rep: int, pid: int, t0: int, code: int) -> None:
        t1 = time.monotonic_ns()
        self.client.rep_end(self.run_id, rep, code)
        if self.settings.level == "project":
            batch = project_level_batch(self.program, rep, pid, t0, t1, code)
            self.client.post_batch(self.run_id, self.token, batch)


def _gate_thresholds(settings: RunSettings) -> dict[str, Any]:
    return {
        "max_wait_s": settings.gate_max_wait_s,
        "window": settings.gate_window,
        "cpu_temp_max_c": settings.cpu_temp_max_c,
        "gpu_temp_max_c": settings.gpu_temp_max_c,
        "cpu_power_cv_max": settings.cpu_power_cv_max,
        "gpu_power_cv_max": settings.gpu_power_cv_max,
    }
