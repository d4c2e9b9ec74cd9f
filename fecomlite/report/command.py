"""`fecomlite report`: one run's per-API energy and memory report, or two runs compared."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fecomlite.store import Store, StoreError, default_store_path

console = Console()


class Format(str, enum.Enum):
    html = "html"
    json = "json"
    csv = "csv"


def report_command(
    runs: Annotated[
        list[int] | None,
        typer.Argument(help="Run id. None: the latest run. Two: compare RUN_A (before) with "
                            "RUN_B (after).", metavar="RUN", show_default=False),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Folder to write into. Default: reports/<run-id>/ "
                                         "(reports/compare-<A>-<B>/ for two runs), relative to "
                                         "the current directory.", show_default=False),
    ] = None,
    formats: Annotated[
        list[Format] | None,
        typer.Option("--format", "-f", help="Write only this format (repeatable): html "
                                            "(index.html), json (report.json), csv (apis.csv, "
                                            "sites.csv). Default: all three.",
                     show_default=False),
    ] = None,
    store: Annotated[
        Path | None,
        typer.Option("--store", help="The run store. Default: $FECOMLITE_HOME/store.sqlite, "
                                     "FECOMLITE_HOME defaulting to ./.fecomlite.",
                     show_default=False),
    ] = None,
    method: Annotated[
        str, typer.Option(help="Attribution inside sensor intervals: overlap, intensity or auto "
                               "(intensity where the data can tell APIs apart).")
    ] = "auto",
    carbon_intensity: Annotated[
        float | None, typer.Option(help="Grid gCO2e/kWh for CO2e figures (default: the run's).")
    ] = None,
    region: Annotated[
        str | None, typer.Option(help="Or a country code (e.g. FRA) from the bundled table.")
    ] = None,
    pue: Annotated[float | None, typer.Option(help="Data-centre PUE for CO2e (default 1).")] = None,
) -> None:
    """Write the HTML report (self-contained, opens offline) with JSON and CSV beside it."""
    # Imported here so that `fecomlite --help` and the other commands do not load scipy.
    from fecomlite import carbon
    from fecomlite.report.build import build_report
    from fecomlite.report.compare import analyse_pair, compare_runs
    from fecomlite.report.render import FORMATS, write_comparison, write_report

    chosen = [f.value for f in formats] if formats else list(FORMATS)
    runs = list(runs or [])
    if len(runs) > 2:
        raise typer.BadParameter("give at most two runs (two are compared)", param_hint="RUN")
    try:
        with Store(store or default_store_path(), create=False) as db:
            if not runs:
                runs = [db.latest_run_id()]
            if len(runs) == 1:
                intensity = carbon.resolve(carbon_intensity, region, pue)
                report = build_report(db, runs[0], method, intensity=intensity)
                folder = out or Path("reports") / str(runs[0])
                written = write_report(report, folder, chosen)
            else:
                a, b, notes = analyse_pair(db, runs[0], runs[1], method)
                folder = out or Path("reports") / f"compare-{runs[0]}-{runs[1]}"
                written = write_comparison(compare_runs(a, b, notes), folder, chosen)
    except (StoreError, ValueError) as exc:  # carbon.CarbonError is a ValueError
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    for path in written:
        console.print(f"wrote [bold]{path}[/]")
