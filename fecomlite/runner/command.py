"""`fecomlite run`: measure a script, method by method or as a whole, with gated repetitions.

Imports beyond typer wait until the command runs, so `fecomlite run --help` answers at once.
The script is instrumented (and a syntax error in it reported) before any server starts.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fecomlite.analysis.exit_status import exit_description, shell_status
from fecomlite.terminal import plain, without_control

if TYPE_CHECKING:
    from rich.console import Console

    from fecomlite.runner.experiment import Program, RunOutcome
    from fecomlite.runner.settings import RunSettings
    from fecomlite.server.client import ServerClient

DEFAULT_FRACTIONS = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0"
QUICK = {"repeat": 1, "idle_s": 1.0, "gate": False, "tail_s": 0.5}  # `--quick`: rough figures


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


console: Console  # set by run_command: stderr when stdout carries CSV or JSON


# The options of `fecomlite run`, declared apart so that run_command reads as what it does.
ScriptArg = Annotated[str, typer.Argument(help="The script to measure (original or instrumented).")]
ArgsArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Arguments for the script: everything after SCRIPT is the script's, as with "
        "`python SCRIPT ARGS` (a `--` right after SCRIPT is dropped)."
    ),
]
LevelArg = Annotated[
    str | None, typer.Option(help="method: every framework call; project: the whole script.")
]
RepeatArg = Annotated[int | None, typer.Option(help="Repetitions (default 3).")]
ApiArg = Annotated[
    list[str] | None, typer.Option(help="Another API root to wrap (e.g. numpy); repeatable.")
]
IdleArg = Annotated[float | None, typer.Option(help="Seconds of idle baseline (default 5).")]
TailArg = Annotated[float | None, typer.Option(help="Seconds sampled after each repetition.")]
GateArg = Annotated[
    bool | None, typer.Option("--gate/--no-gate", help="Wait for stable power/temperature.")
]
GateMaxWaitArg = Annotated[
    float | None, typer.Option(help="Longest wait of the stability gate, s (default 120).")
]
SyncArg = Annotated[str | None, typer.Option(help="GPU sync at probe boundaries: auto | on | off.")]
ParamArg = Annotated[
    list[str] | None, typer.Option(help="A hyperparameter by hand, KEY=VALUE; repeatable.")
]
DatasizeArg = Annotated[
    str | None,
    typer.Option(help="Data-size experiment: a site key (file:line:col) or an API name."),
]
FractionsArg = Annotated[str, typer.Option(help="Fractions of the first dimension for --datasize.")]
CalibrateArg = Annotated[
    bool, typer.Option(help="Replay the costliest side-effect-free calls alone afterwards.")
]
TopArg = Annotated[int, typer.Option(help="Call sites replayed by --calibrate.")]
CarbonIntensityArg = Annotated[
    float | None, typer.Option(help="Grid carbon intensity, gCO2e/kWh, for CO2e figures.")
]
RegionArg = Annotated[
    str | None, typer.Option(help="Or a country code (e.g. FRA) from the bundled table.")
]
PueArg = Annotated[float | None, typer.Option(help="Data-centre PUE for CO2e (default 1).")]
MlflowArg = Annotated[
    bool | None, typer.Option("--mlflow/--no-mlflow", help="Log the run to MLflow.")
]
HomeArg = Annotated[
    Path | None, typer.Option(help="fecomlite's folder: store, server state (./.fecomlite).")
]
QuietArg = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Only log the program's output (rep-N.log), do not also show it."
    ),
]
ProjectArg = Annotated[
    Path | None,
    typer.Option(
        help="The project whose modules are instrumented as they are imported (default: the "
        "nearest folder above the script that is the working directory or holds .git, "
        "pyproject.toml, setup.py or setup.cfg, short of the home and temporary folders; "
        "else the script's folder).",
    ),
]
NprocPerNodeArg = Annotated[
    int | None,
    typer.Option(help="Ranks on this machine, launched by torchrun (docs/distributed.md)."),
]
QuickArg = Annotated[
    bool,
    typer.Option(
        "--quick",
        help="Rough figures fast: 1 repetition, 1 s idle baseline, no "
        "stability gate, 0.5 s tail (options given override these).",
    ),
]
OutputFormatArg = Annotated[
    Format,
    typer.Option(
        "--format",
        help="The summary: a table, or CSV or JSON on stdout (messages then go to stderr).",
    ),
]
TraceLayersArg = Annotated[
    bool | None,
    typer.Option(
        "--trace-layers/--no-trace-layers",
        help="Time each framework layer (forward and backward) inside calls.",
    ),
]

KeepArg = Annotated[
    str | None,
    typer.Option(
        "--keep",
        metavar="WINDOW[/BUCKET]",
        help="Bounded storage for long runs: keep the first and the latest WINDOW of each "
        "repetition call by call (e.g. 10m, 90s, 2h) and fold the calls between into per-site "
        "buckets of BUCKET (default 1m) with counts, sums and sums of squares; the report "
        "marks the figures that come from buckets. Config key: keep. Default: every call kept.",
    ),
]


def run_command(
    ctx: typer.Context,
    script: ScriptArg,
    args: ArgsArg = None,
    level: LevelArg = None,
    repeat: RepeatArg = None,
    api: ApiArg = None,
    idle: IdleArg = None,
    tail: TailArg = None,
    gate: GateArg = None,
    gate_max_wait: GateMaxWaitArg = None,
    sync: SyncArg = None,
    param: ParamArg = None,
    datasize: DatasizeArg = None,
    fractions: FractionsArg = DEFAULT_FRACTIONS,
    calibrate: CalibrateArg = False,
    top: TopArg = 5,
    carbon_intensity: CarbonIntensityArg = None,
    region: RegionArg = None,
    pue: PueArg = None,
    mlflow: MlflowArg = None,
    home: HomeArg = None,
    quiet: QuietArg = False,
    project: ProjectArg = None,
    nproc_per_node: NprocPerNodeArg = None,
    quick: QuickArg = False,
    output_format: OutputFormatArg = Format.table,
    trace_layers: TraceLayersArg = None,
    keep: KeepArg = None,
) -> None:
    """Run SCRIPT under the measurement server and store per-call energy and memory.

    fecomlite's options go before SCRIPT; everything after it is the script's own, as with
    `python SCRIPT ARGS`. `fecomlite run -- torchrun [OPTIONS] SCRIPT [ARGS]` runs a launcher
    you name."""
    from fecomlite.runner.launch import LaunchError, resolve_launch
    from fecomlite.store import default_home

    args = script_arguments(Path(script), list(args or []))
    try:
        launch = resolve_launch(Path(script), args, nproc_per_node)
    except LaunchError as exc:
        raise typer.BadParameter(str(exc), param_hint="SCRIPT") from exc
    typed = script if launch.script == Path(script) else str(launch.script)  # `./x.py` stays
    script, args = launch.script, launch.args
    global console
    console = _console(stderr=output_format is not Format.table)
    if not script.is_file():
        raise typer.BadParameter(f"{script} is not a file", param_hint="SCRIPT")
    settings = _resolved_settings(
        script,
        quick,
        {
            "level": level,
            "repeat": repeat,
            "api": api,
            "idle_s": idle,
            "tail_s": tail,
            "gate": gate,
            "gate_max_wait_s": gate_max_wait,
            "sync": sync,
            "params": dict(_key_value(p) for p in param) if param else None,
            "carbon_intensity": carbon_intensity,
            "region": region,
            "pue": pue,
            "mlflow": mlflow,
            "trace_layers": trace_layers,
            "keep": keep,
        },
    )
    try:
        fraction_list = _fractions(fractions) if datasize else []
    except ValueError as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(2) from exc
    home = (home or default_home()).resolve()
    program = _prepared_program(script, args, settings, home, project)
    program.launcher = launch.prefix
    program.argv0 = typed
    client = _connected(home)
    after = functools.partial(_calibration, top=top) if calibrate else None
    with contextlib.redirect_stdout(sys.stdout if output_format is Format.table else sys.stderr):
        # CSV or JSON own stdout: the program's output shows on stderr meanwhile
        outcome = _measure(client, program, settings, home, quiet=quiet, after=after)
        _say_misplaced_options(ctx, outcome, program.argv)
        if calibrate and outcome.status == "finished":
            _print_calibration(client, outcome.run_id)
        if datasize and outcome.status == "finished":
            _datasize_runs(
                client, program, settings, home, outcome.run_id, datasize, fraction_list, quiet
            )
    _summarise(client, outcome, output_format)
    if settings.mlflow and outcome.status == "finished":
        _log_to_mlflow(client, outcome.run_id)
    if outcome.status != "finished":
        raise typer.Exit(shell_status(outcome.exit_code))


def _resolved_settings(script: Path, quick: bool, given: dict[str, Any]) -> RunSettings:
    """The run's settings: the project's `[tool.fecomlite]`, `--quick`'s, then the options
    given; a bad value ends the command with status 2."""
    from fecomlite.runner.settings import SettingsError, find_project_config, resolve

    try:
        config_path, config = find_project_config(script.resolve().parent)
        settings = resolve({**config, **(QUICK if quick else {})}, given)
    except (SettingsError, ValueError) as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(2) from exc
    if config_path:
        console.print(f"settings from [bold]{plain(config_path)}[/]")
    if quick:
        console.print(
            "[yellow]quick mode[/]: one repetition, 1 s idle baseline, no stability "
            "gate: rough figures"
        )
    return settings


def _prepared_program(
    script: Path, args: list[str], settings: RunSettings, home: Path, project: Path | None
) -> Program:
    """The program made ready to run in place (or a notebook's copy), or the command ends
    with the reason: a syntax error, a project it cannot instrument, an unwritable home."""
    from fecomlite.runner.experiment import prepare_program
    from fecomlite.runner.workcopy import CopyError, ScriptError
    from fecomlite.store import StoreError, private_home

    try:
        private_home(home)  # before the instrumented copy is written into it
        program = prepare_program(script, list(args), settings, home / "work", project)
    except ScriptError as exc:
        console.print(f"[red]cannot run {plain(script)}[/]: a syntax error")
        console.print(str(exc), markup=False, highlight=False)
        raise typer.Exit(2) from exc
    except CopyError as exc:
        console.print(
            f"[red]cannot instrument {plain(script.parent)}[/]: {plain(exc)}", highlight=False
        )
        raise typer.Exit(2) from exc
    except (StoreError, OSError) as exc:  # e.g. a read-only or full home
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(1) from None
    for note in program.skipped:
        console.print(f"note: {note}", markup=False, highlight=False)
    return program


def _connected(home: Path) -> ServerClient:
    """The home's measurement server, started if none runs, announced."""
    from fecomlite.server.client import ServerError, ensure_server
    from fecomlite.store import StoreError

    try:
        client = ensure_server(home)
    except (ServerError, StoreError, OSError) as exc:  # e.g. a read-only or full home
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(1) from None
    _say_server(client)
    return client


def script_arguments(script: Path, args: list[str]) -> list[str]:
    """The script's own arguments: all that follows it (a `--` right after it, the form older
    releases required, is dropped). A notebook takes none, so options after one are a mistake
    we can name."""
    args = args[1:] if args[:1] == ["--"] else args
    if args and script.suffix == ".ipynb":
        raise typer.BadParameter(
            f"a notebook takes no arguments, got {' '.join(args)!r}: fecomlite's options go "
            f"before it (`fecomlite run OPTIONS {script.name}`)",
            param_hint="SCRIPT",
        )
    return args


def _say_misplaced_options(ctx: typer.Context, outcome: RunOutcome, args: list[str]) -> None:
    """A program that failed with one of our own options among its arguments (`fecomlite run
    train.py --quick`) was likely given what was meant for us: say where options go."""
    if outcome.exit_code <= 0:
        return
    ours = {o for param in ctx.command.params for o in param.opts if o.startswith("--")}
    misplaced = [a for a in args if a.split("=", 1)[0] in ours]
    if misplaced:
        console.print(
            f"note: {plain(' '.join(misplaced))} went to the program, as everything after the "
            "script does: fecomlite's own options go before the script.",
            highlight=False,
        )


def _fractions(text: str) -> list[float]:
    from fecomlite.analysis.datasize import parse_fractions

    return parse_fractions(text)


def _calibration(run: Any, top: int) -> object:
    from fecomlite.runner.calibration import run_calibration

    return run_calibration(run, top=top)


def _console(stderr: bool) -> Console:
    """Piped output keeps whole names (rich would otherwise fit everything into 80 columns)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 1000)


def _say_server(client: ServerClient) -> None:
    from fecomlite.server.idle import IDLE_EXIT_S

    if client.started:
        console.print(
            "started a measurement server in the background: "
            f"[bold]{client.view_url}[/] (live view), pid {client.pid}, "
            f"store {plain(client.store_path)}. "
            "It exits by itself after "
            f"{IDLE_EXIT_S / 60:g} min unused; `fecomlite server stop` stops it now."
        )
    else:
        console.print(
            f"measurement server: [bold]{client.view_url}[/] (live view), pid {client.pid}"
        )


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        from fecomlite.runner.settings import SettingsError

        raise SettingsError(f"--param takes KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def _measure(
    client: ServerClient, program: Program, settings: RunSettings, home: Path, **options: Any
) -> RunOutcome:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fecomlite.runner.experiment import run_experiment, unique_dir
    from fecomlite.server.client import ServerError

    stages = {"idle": "idle baseline", "gate": "stability gate", "run": "running", "tail": "tail"}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        auto_refresh=console.is_terminal,  # a pipe or a file sees each bar once, at its stop
    ) as progress:
        total = settings.repeat + (1 if options.get("after") else 0)  # + the calibration replays
        task = progress.add_task("repetitions", total=total)

        def on_progress(stage: str, rep: int) -> None:
            """The live display stops while the program runs: its output then reaches the
            terminal as it wrote it, never under a redraw of the bar."""
            progress.update(
                task, completed=max(rep - 1, 0), description=f"rep {rep}: {stages[stage]}"
            )
            if stage == "gate" and settings.gate and not console.is_terminal:
                # a pipe or a log sees no progress bar: say why nothing happens for minutes
                console.print(f"rep {rep}: waiting at the stability gate for a quiet machine "
                              f"(at most {settings.gate_max_wait_s:g} s)", highlight=False)
            if stage == "run":
                progress.stop()
            elif not progress.live.is_started:
                progress.start()

        log_dir = unique_dir(home / "logs" / f"{program.original.stem}-{_stamp()}")
        try:
            outcome = run_experiment(
                client,
                program,
                settings,
                log_dir=log_dir,
                on_progress=on_progress,
                **options,
            )
        except ServerError as exc:
            spools = sorted(log_dir.glob("*.spool"))
            what = ("stopped answering" if exc.status is None  # unreachable: no HTTP status
                    else "refused a request")  # it answered, e.g. 507 on a full disk
            console.print(
                f"[red]the measurement server {what}[/] ({plain(exc)}). What it "
                f"stored is kept in {plain(client.store_path)}"
                + (
                    f"; the program's events since are in {plain(log_dir)}/*.spool: "
                    f"`fecomlite ingest {plain(log_dir)}/*.spool` adds them."
                    if spools
                    else "."
                ),
                highlight=False,
            )
            raise typer.Exit(3) from exc
        progress.update(task, completed=len(outcome.repetitions), description="repetitions")
    if outcome.status == "failed" or outcome.status == "incomplete" and outcome.exit_code:
        console.print(
            f"[red]the program {exit_description(outcome.exit_code)}[/]; "
            f"measurements up to the failure are kept. Log: {plain(outcome.logs[-1])}"
        )
        if options.get("quiet"):  # otherwise its output, the error included, has just shown
            _print_log_tail(outcome.logs[-1])
    elif outcome.status == "interrupted":
        console.print("[yellow]interrupted[/]: measurements so far are kept.")
    if outcome.status == "incomplete":
        console.print(f"[red]incomplete[/]: {_lost_reasons(outcome)}; the figures miss them.")
    return outcome


def _lost_reasons(outcome: RunOutcome) -> str:
    """Why events are missing: a process's death (counted by the runner), a failed send."""
    reasons = []
    if outcome.lost_at_exit:
        reasons.append(f"{outcome.lost_at_exit} events recorded by a process that died before "
                       "sending them")
    unsent = outcome.lost_events - outcome.lost_at_exit
    if unsent and outcome.kept_spools:
        folder = plain(outcome.kept_spools[0].parent)
        reasons.append(f"{unsent} events could not be stored (a full disk?); the spool files the "
                       f"store refused are kept: `fecomlite ingest {folder}/*.spool` adds the "
                       "events they hold once the disk has room")
    elif unsent:
        reasons.append(f"{unsent} events could be neither sent nor spooled (see the program's "
                       "log: a full disk?)")
    return "; ".join(reasons) or "the store refused some events"


def _print_calibration(client: ServerClient, run_id: int) -> None:
    from fecomlite.store import Store

    with Store(client.store_path) as store:
        result = store.result(run_id, "calibration") or {}
    for item in result.get("replayed", []):
        console.print(
            f"calibration: replayed [bold]{plain(item.get('api'))}[/] ({plain(item.get('site'))})"
        )
    for item in result.get("skipped", []):
        console.print(
            f"calibration: skipped {item.get('api')} ({item.get('site')}): {item.get('reason')}",
            markup=False,
        )


def _stamp() -> str:
    import time

    return time.strftime("%Y%m%d-%H%M%S")


def _print_log_tail(log: Path, lines: int = 15) -> None:
    if log.is_file():
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        console.print(without_control("\n".join(text)), markup=False, highlight=False)


def _datasize_runs(
    client: ServerClient,
    program: Program,
    settings: RunSettings,
    home: Path,
    parent: int,
    target: str,
    fractions: list[float],
    quiet: bool,
) -> None:
    from fecomlite.analysis import datasize as datasize_analysis
    from fecomlite.runner.experiment import run_experiment, unique_dir
    from fecomlite.store import Store

    points: list[dict[str, Any]] = []
    api_points: list[dict[str, Any]] = []
    for fraction in fractions:
        console.print(f"data size: [bold]{plain(target)}[/] at {fraction:g}")
        outcome = run_experiment(
            client,
            program,
            settings,
            kind="datasize",
            parent_id=parent,
            datasize=f"{target}={fraction}",
            extra={"fraction": fraction},
            log_dir=unique_dir(
                home / "logs" / f"{program.original.stem}-{_stamp()}-ds{fraction:g}"
            ),
            quiet=quiet,
        )
        with Store(client.store_path) as store:
            mine, apis = datasize_analysis.child_points(store, outcome.run_id, target, fraction)
        points += mine
        api_points += apis
    result = {"target": target, **datasize_analysis.summarise(points, api_points)}
    with Store(client.store_path) as store:
        store.put_result(parent, "datasize", result)
    _print_scaling(result)


def _print_scaling(result: dict[str, Any]) -> None:
    """The APIs whose cost grows fastest with the data size: exponents k of figure ∝ fraction^k
    (± the 95 % half-width), energy in the named domain."""
    from rich.table import Table

    from fecomlite.analysis.datasize import (
        API_METRICS,
        exponent_text,
        largest_exponents,
        program_fit_lines,
    )

    target = plain(str(result.get("target", "the target")))
    for line in program_fit_lines(result):
        console.print(f"data size of {target}, the whole program's {line}", highlight=False)
    rows = largest_exponents(result)
    if not rows:
        console.print("data size: no API's calls or inputs changed with the fraction")
        return
    domain = ", ".join(str(x) for x in (result.get("domain"), result.get("provenance")) if x)
    table = Table(
        title="data size: exponent k of figure ∝ fraction^k (± 95 % interval), largest first",
        title_justify="left",
    )
    table.add_column("API")
    for metric, _, label in API_METRICS:
        if metric == "energy_J" and domain:
            label += f" ({domain})"
        table.add_column(label, justify="right")
    for row in rows:
        table.add_row(plain(row["api"]), *(exponent_text(row, m) for m, _, _ in API_METRICS))
    console.print(table)


def _log_to_mlflow(client: ServerClient, run_id: int) -> None:
    from fecomlite.runner import mlflow_log
    from fecomlite.store import Store

    try:
        with Store(client.store_path) as store:
            mlflow_id = mlflow_log.log_run(store, run_id)
    except ImportError:
        console.print("MLflow is not installed: `pip install 'fecomlite[mlflow]'`; run kept.")
        return
    console.print(
        f"logged to MLflow ({plain(mlflow_log.tracking_uri())}): run [bold]{plain(mlflow_id)}[/]"
    )


def _summarise(client: ServerClient, outcome: RunOutcome, output_format: Format) -> None:
    from fecomlite.analysis.baseline_text import described
    from fecomlite.analysis.run_analysis import analyse_run
    from fecomlite.report.summary import summary_csv, summary_json, summary_notes, summary_table
    from fecomlite.store import Store

    try:
        with Store(client.store_path) as store:
            analysis = analyse_run(store, outcome.run_id)
            idle = store.result(outcome.run_id, "idle_baseline") or {}
    except sqlite3.OperationalError as exc:  # a full disk: the analysis cannot be kept
        if "locked" in str(exc):
            raise
        console.print(f"note: the summary is not kept in the store ({plain(exc)}).",
                      markup=False, highlight=False)
        with Store(client.store_path, readonly=True) as store:  # reads, writes nothing
            analysis = analyse_run(store, outcome.run_id)
            idle = store.result(outcome.run_id, "idle_baseline") or {}
    if "rolling" in idle or idle.get("reused_from_run") is not None:
        console.print(f"idle baseline: {described(idle)}", markup=False, highlight=False)
    if output_format is Format.csv:
        sys.stdout.write(summary_csv(analysis))
    elif output_format is Format.json:
        sys.stdout.write(summary_json(analysis) + "\n")
    else:
        console.print(summary_table(analysis))
        for note in summary_notes(analysis):
            console.print(note, markup=False, highlight=False)
    console.print(
        f"run [bold]{outcome.run_id}[/] stored in [bold]{plain(client.store_path)}[/]; "
        f"`fecomlite report {outcome.run_id}` renders it."
    )
    if outcome.logs:
        console.print(
            f"the program's output is logged in {plain(outcome.logs[0].parent)}/rep-N.log"
        )
