"""`fecomlite export RUN --format perfetto|openmetrics`: a stored run for other tools."""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TextIO

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
    try:
        with Store(store or default_store_path(), readonly=True) as db:
            run_id = db.latest_run_id() if run is None else run_ids_in_range([run])[0]
            to_stdout = out is not None and str(out) == "-"
            path = out or Path(f"run-{run_id}{SUFFIX[fmt]}")
            if fmt is Format.perfetto:
                from fecomlite.export.perfetto import write_trace

                _write(lambda f: write_trace(db, run_id, f), None if to_stdout else path)
            else:
                text = _openmetrics(db, run_id, carbon_intensity, region, pue)
                _write(lambda f: f.write(text), None if to_stdout else path)
    except (StoreError, ValueError) as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(1) from exc
    except OSError as exc:
        console.print(f"[red]error:[/] {plain(write_error(exc))}", highlight=False)
        raise typer.Exit(1) from None


def _openmetrics(db: Store, run_id: int, carbon_intensity: float | None, region: str | None,
                 pue: float | None) -> str:
    """The run's summary as OpenMetrics text, with its CO2e at the given or the run's grid."""
    from fecomlite.analysis import carbon
    from fecomlite.analysis.run_analysis import analyse_run
    from fecomlite.export.openmetrics import text as openmetrics

    a = analyse_run(db, run_id)
    intensity = carbon.resolve(carbon_intensity, region, pue) or (
        carbon.from_settings(a.run.get("settings") or {}))
    return openmetrics(a, intensity, db.processes(run_id))


def _write(write: Callable[[TextIO], object], path: Path | None) -> None:
    """Write to stdout (None), or to `path` through a part file renamed once whole: a failed
    export (a full disk, a broken store) leaves no half-written trace under the name asked."""
    if path is None:
        write(sys.stdout)
        sys.stdout.flush()
        return
    part = path.with_name(path.name + ".part")
    try:
        with open(part, "w", encoding="utf-8") as f:
            write(f)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    console.print(f"wrote [bold]{plain(path)}[/]")
