"""`fecomlite ingest`: add spooled probe events (written while no server answered) to the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fecomlite.server.client import ServerError, ensure_server
from fecomlite.store import default_home
from fecomlite.terminal import plain

console = Console()


def ingest_command(
    spools: Annotated[list[Path], typer.Argument(help="Spool files (.spool) to ingest.")],
    home: Annotated[
        Path | None, typer.Option(help="fecomlite's folder: store, server state (./.fecomlite).")
    ] = None,
) -> None:
    """Store the events of spool files in the run they name (or a new run), then delete them.

    Each batch is stored once: a spool ingested again, or holding batches the server had
    already stored, adds nothing twice. A spool of another store (another home) is refused."""
    try:
        client = ensure_server((home or default_home()).resolve())
    except ServerError as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(1) from None
    failed = False
    for spool in spools:
        try:
            report = client.ingest_report(spool.resolve())
        except ServerError as exc:
            console.print(f"[red]{plain(spool)}[/]: {plain(exc)}")
            failed = True
            continue
        spool.unlink()
        console.print(
            f"{plain(spool)}: {report['events']} events stored in {plain(client.store_path)}"
            + (f"; {report['duplicate_batches']} batches were stored already"
               if report.get("duplicate_batches") else "")
        )
        for reason in report.get("bad_reasons", []):
            console.print(f"  [yellow]skipped[/] {plain(reason)}")
    if failed:
        raise typer.Exit(1)
