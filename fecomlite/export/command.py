"""`fecomlite export RUN --format perfetto|openmetrics`: a stored run for other tools."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fecomlite.store import (
    Store,
    StoreError,
    default_store_path,
    run_ids_in_range,
    write_error,
)
from fecomlite.terminal import plain

console = Console()


class Format(str, enum.Enum):
    perfetto = "perfetto"
    openmetrics = "openmetrics"


SUFFIX = {Format.perfetto: ".trace.json", Format.openmetrics: ".om.txt"}


def export_command(
    run: Annotated[
        int | None, typer.Argument(help="Run id. Default: the latest run.", show_default=False)
    ] = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            "-f",
            help="perfetto: a Chrome JSON trace (Perfetto "
            "UI, chrome://tracing); openmetrics: the run's summary as text.",
        ),
    ] = Format.perfetto,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="File to write. Default: "
            "run-<id>.trace.json / run-<id>.om.txt here; - for stdout.",
            show_default=False,
        ),
    ] = None,
    store: Annotated[
        Path | None,
        typer.Option(
            "--store",
            help="The run store. Default: $FECOMLITE_HOME/store.sqlite.",
            show_default=False,
        ),
    ] = None,
    carbon_intensity: Annotated[
        float | None, typer.Option(help="gCO2e/kWh for the CO2e metric (default: the run's).")
    ] = None,
    region: Annotated[str | None, typer.Option(help="Or a country code from the table.")] = None,
    pue: Annotated[float | None, typer.Option(help="Data-centre PUE (default 1).")] = None,
) -> None:
    """Write a run as a Perfetto/Chrome trace or as OpenMetrics text."""
    from fecomlite.analysis import carbon

    try:
        with Store(store or default_store_path(), readonly=True) as db:
            run_id = db.latest_run_id() if run is None else run_ids_in_range([run])[0]
            if fmt is Format.perfetto:
                from fecomlite.export.perfetto import trace

                text = json.dumps(trace(db, run_id), separators=(",", ":"), allow_nan=False)
            else:
                from fecomlite.analysis.run_analysis import analyse_run
                from fecomlite.export.openmetrics import text as openmetrics

                a = analyse_run(db, run_id)
                intensity = carbon.resolve(carbon_intensity, region, pue) or (
                    carbon.from_settings(a.run.get("settings") or {})
                )
                text = openmetrics(a, intensity, db.processes(run_id))
    except (StoreError, ValueError) as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(1) from exc
    if out is not None and str(out) == "-":
        typer.echo(text, nl=False)
        return
    path = out or Path(f"run-{run_id}{SUFFIX[fmt]}")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        console.print(f"[red]error:[/] {plain(write_error(exc))}", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"wrote [bold]{plain(path)}[/]")
