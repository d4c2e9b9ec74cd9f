"""`fecomlite run`: measure a script, method by method or as a whole, with gated repetitions."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fecomlite import datasize as datasize_analysis
from fecomlite.calibration import run_calibration
from fecomlite.experiment import Program, RunOutcome, prepare_program, run_experiment
from fecomlite.server.client import ServerClient, ServerError, ensure_server
from fecomlite.settings import RunSettings, SettingsError, find_project_config, resolve
from fecomlite.store import Store, default_home

console = Console()


def run_command(
    script: Annotated[
        Path, typer.Argument(help="The script to measure (original or instrumented).")
    ],
    args: Annotated[
        list[str] | None, typer.Argument(help="Arguments for the script, after `--`.")
    ] = None,
    level: Annotated[
        str | None, typer.Option(help="method: every framework call; project: the whole script.")
    ] = None,
    repeat: Annotated[int | None, typer.Option(help="Repetitions (default 3).")] = None,
    api: Annotated[
        list[str] | None, typer.Option(help="Another API root to wrap (e.g. numpy); repeatable.")
    ] = None,
    idle: Annotated[
        float | None, typer.Option(help="Seconds of idle baseline (default 5).")
    ] = None,
    tail: Annotated[
        float | None, typer.Option(help="Seconds sampled after each repetition.")
    ] = None,
    gate: Annotated[
        bool | None, typer.Option("--gate/--no-gate", help="Wait for stable power/temperature.")
    ] = None,
    gate_max_wait: Annotated[
        float | None, typer.Option(help="Longest wait of the stability gate, s (default 120).")
    ] = None,
    sync: Annotated[
        str | None, typer.Option(help="GPU sync at probe boundaries: auto | on | off.")
    ] = None,
    param: Annotated[
        list[str] | None, typer.Option(help="A hyperparameter by hand, KEY=VALUE; repeatable.")
    ] = None,
    datasize: Annotated[
        str | None,
        typer.Option(help="Data-size experiment: a site key (file:line:col) or an API name."),
    ] = None,
    fractions: Annotated[
        str, typer.Option(help="Fractions of the first dimension for --datasize.")
    ] = ",".join(str(f) for f in datasize_analysis.DEFAULT_FRACTIONS),
    calibrate: Annotated[
        bool, typer.Option(help="Replay the costliest side-effect-free calls alone afterwards.")
    ] = False,
    top: Annotated[int, typer.Option(help="Call sites replayed by --calibrate.")] = 5,
    home: Annotated[
        Path | None, typer.Option(help="fecomlite's folder: store, server state (./.fecomlite).")
    ] = None,
    show_output: Annotated[
        bool, typer.Option(help="Show the program's output instead of logging it.")
    ] = False,
    trace_layers: Annotated[
        bool | None,
        typer.Option(
            "--trace-layers/--no-trace-layers",
            help="Time each framework layer (forward, PyTorch backward) inside calls.",
        ),
    ] = None,
) -> None:
    """Run SCRIPT under the measurement server and store per-call energy and memory."""
    if not script.is_file():
        raise typer.BadParameter(f"{script} is not a file", param_hint="SCRIPT")
    try:
        config_path, config = find_project_config(script.resolve().parent)
        settings = resolve(
            config,
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
                "trace_layers": trace_layers,
            },
        )
        fraction_list = datasize_analysis.parse_fractions(fractions) if datasize else []
    except (SettingsError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    home = (home or default_home()).resolve()
    if config_path:
        console.print(f"settings from [bold]{config_path}[/]")
    program = prepare_program(script, list(args or []), settings, home / "work")
    client = ensure_server(home)
    console.print(f"measurement server: [bold]{client.url}[/] (live view)")
    after = functools.partial(run_calibration, top=top) if calibrate else None
    outcome = _measure(client, program, settings, home, show_output=show_output, after=after)
    if calibrate and outcome.status == "finished":
        _print_calibration(client, outcome.run_id)
    if datasize and outcome.status == "finished":
        _datasize_runs(client, program, settings, home, outcome.run_id, datasize, fraction_list)
    _summarise(client, outcome)
    if outcome.status != "finished":
        raise typer.Exit(outcome.exit_code or 1)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SettingsError(f"--param takes KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def _measure(
    client: ServerClient, program: Program, settings: RunSettings, home: Path, **options: Any
) -> RunOutcome:
    stages = {"idle": "idle baseline", "gate": "stability gate", "run": "running", "tail": "tail"}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        total = settings.repeat + (1 if options.get("after") else 0)  # + the calibration replays
        task = progress.add_task("repetitions", total=total)

        def on_progress(stage: str, rep: int) -> None:
            progress.update(
                task, completed=max(rep - 1, 0), description=f"rep {rep}: {stages[stage]}"
            )

        log_dir = home / "logs" / f"{program.original.stem}-{_stamp()}"
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
            console.print(
                f"[red]the measurement server stopped answering[/] ({exc}). What it stored is "
                f"kept in {client.store_path}; the program's events since are in "
                f"{log_dir}/*.spool: `fecomlite ingest {log_dir}/*.spool` adds them."
            )
            raise typer.Exit(3) from exc
        progress.update(task, completed=len(outcome.repetitions), description="repetitions")
    if outcome.status == "failed":
        console.print(
            f"[red]the program exited with status {outcome.exit_code}[/]; "
            f"measurements up to the failure are kept. Log: {outcome.logs[-1]}"
        )
        _print_log_tail(outcome.logs[-1])
    elif outcome.status == "interrupted":
        console.print("[yellow]interrupted[/]: measurements so far are kept.")
    return outcome


def _print_calibration(client: ServerClient, run_id: int) -> None:
    with Store(client.store_path) as store:
        result = store.result(run_id, "calibration") or {}
    for item in result.get("replayed", []):
        console.print(f"calibration: replayed [bold]{item.get('api')}[/] ({item.get('site')})")
    for item in result.get("skipped", []):
        console.print(f"calibration: skipped {item.get('api')} ({item.get('site')}): "
                      f"{item.get('reason')}", markup=False)


def _stamp() -> str:
    import time

    return time.strftime("%Y%m%d-%H%M%S")


def _print_log_tail(log: Path, lines: int = 15) -> None:
    if log.is_file():
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        console.print("\n".join(text), markup=False, highlight=False)


def _datasize_runs(
    client: ServerClient,
    program: Program,
    settings: RunSettings,
    home: Path,
    parent: int,
    target: str,
    fractions: list[float],
) -> None:
    from fecomlite.datasize import datasize_point

    points = []
    for fraction in fractions:
        console.print(f"data size: [bold]{target}[/] at {fraction:g}")
        outcome = run_experiment(
            client,
            program,
            settings,
            kind="datasize",
            parent_id=parent,
            datasize=f"{target}={fraction}",
            extra={"fraction": fraction},
            log_dir=home / "logs" / f"{program.original.stem}-{_stamp()}-ds{fraction:g}",
        )
        with Store(client.store_path) as store:
            points += datasize_point(store, outcome.run_id, target, fraction)
    with Store(client.store_path) as store:
        store.put_result(
            parent, "datasize", {"target": target, **datasize_analysis.summarise(points)}
        )


def _summarise(client: ServerClient, outcome: RunOutcome) -> None:
    from fecomlite.analysis import analyse_run
    from fecomlite.summary import summary_table

    with Store(client.store_path) as store:
        analysis = analyse_run(store, outcome.run_id)
        console.print(summary_table(analysis))
    console.print(
        f"run [bold]{outcome.run_id}[/] stored in [bold]{client.store_path}[/]; "
        f"`fecomlite report {outcome.run_id}` renders it."
    )
    if outcome.logs:
        console.print(f"the program's output: {outcome.logs[0].parent}/rep-N.log")
