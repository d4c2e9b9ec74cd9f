"""`fecomlite report`: one run's per-API energy and memory report, two runs compared, or more
runs side by side (`fecomlite.report.runs`)."""

from __future__ import annotations

import enum
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
    html = "html"
    json = "json"
    csv = "csv"


def report_command(
    runs: Annotated[
        list[int] | None,
        typer.Argument(help="Run id. None: the latest run. Two: compare RUN_A (before) with "
                            "RUN_B (after). Three or more: the runs side by side.",
                       metavar="RUN", show_default=False),
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every finished run side by side.")
    ] = False,
    where: Annotated[
        list[str] | None,
        typer.Option(help="Only runs where KEY=VALUE (a hyperparameter, setting or run field); "
                          "repeatable. Lists the runs side by side.", show_default=False),
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
                                            "sites.csv, memory.csv). Default: all three.",
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
    from fecomlite.analysis import carbon
    from fecomlite.report.build import build_report
    from fecomlite.report.heap import keep_freed_memory
    from fecomlite.report.render import FORMATS, write_comparison, write_report

    keep_freed_memory()  # a short process through large arrays: reuse pages, fault fewer
    chosen = [f.value for f in formats] if formats else list(FORMATS)
    try:
        runs = run_ids_in_range(runs or [])
        with Store(store or default_store_path(), readonly=True) as db:
            if len(runs) > 2 or every or where:
                from fecomlite.report.runs import runs_report, select_runs, write_runs

                ids = select_runs(db, runs, every=every, where=where or ())
                folder = out or Path("reports") / f"runs-{ids[0]}-{ids[-1]}"
                fixed = "overlap" if method == "auto" else method  # one method for every run
                written = write_runs(runs_report(db, ids, fixed), folder, chosen)
            elif len(runs) < 2:
                run_id = runs[0] if runs else db.latest_run_id(("instrumented", "watch", "sweep"))
                intensity = carbon.resolve(carbon_intensity, region, pue)
                report = build_report(db, run_id, method, intensity=intensity)
                folder = out or Path("reports") / str(run_id)
                written = write_report(report, folder, chosen)
            else:
                from fecomlite.report.compare import analyse_pair, compare_runs, terminal_lines

                a, b, notes = analyse_pair(db, runs[0], runs[1], method)
                folder = out or Path("reports") / f"compare-{runs[0]}-{runs[1]}"
                comparison = compare_runs(a, b, notes, db)
                written = write_comparison(comparison, folder, chosen)
                for line in terminal_lines(comparison):  # the verdicts, or why there is none
                    console.print(plain(line), highlight=False)
    except (StoreError, ValueError, OSError) as exc:  # carbon.CarbonError is a ValueError
        said = write_error(exc) if isinstance(exc, OSError) else str(exc)
        console.print(f"[red]error:[/] {plain(said)}", highlight=False)
        raise typer.Exit(1) from None
    for path in written:
        console.print(f"wrote [bold]{plain(path)}[/]")
