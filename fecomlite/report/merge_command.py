"""`fecomlite merge STORE...`: one report of a job recorded on several nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def merge_command(
    stores: Annotated[
        list[Path], typer.Argument(help="Each node's store.sqlite.", metavar="STORE")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Folder for the merged store and its report (default reports/job-<JOB>/).",
        ),
    ] = None,
    job: Annotated[
        str | None, typer.Option(help="The launcher's run id (default: the latest job).")
    ] = None,
) -> None:
    """Merge the stores of a job's nodes (clocks aligned) into one store, and write its report."""
    from fecomlite.report.build import build_report
    from fecomlite.report.render import write_report
    from fecomlite.store import Store, StoreError
    from fecomlite.store.merge import MergeError, describe, job_run, merge_stores

    try:
        if job is None:
            with Store(stores[0], readonly=True) as first:
                job = job_run(first, None)[1]
        folder = out or Path("reports") / f"job-{job}"
        merged = folder / "store.sqlite"
        run_id = merge_stores(stores, merged, job)
    except (MergeError, StoreError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"merged {len(stores)} stores into {merged}, {describe(merged, run_id)}")
    with Store(merged, readonly=True) as store:
        for path in write_report(build_report(store, run_id), folder):
            typer.echo(f"wrote {path}")
