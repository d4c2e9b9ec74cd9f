"""`fecomlite ingest`: add spooled probe events (written while no server answered) to the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from fecomlite.server.client import ServerError, ensure_server
from fecomlite.store import default_home

console = Console()


def ingest_command(
    spools: Annotated[list[Path], typer.Argument(help="Spool files (.spool) to ingest.")],
    home: Annotated[
        Path | None, typer.Option(help="fecomlite's folder: store, server state (./.fecomlite).")
    ] = None,
) -> None:
    """Store the events of spool files in the run they name (or a new run), then delete them."""
    client = ensure_server((home or default_home()).resolve())
    failed = False
    for spool in spools:
        try:
            events = client.ingest(spool.resolve())
        except ServerError as exc:
            console.print(f"[red]{spool}[/]: {exc}")
            failed = True
            continue
        spool.unlink()
        console.print(f"{spool}: {events} events stored in {client.store_path}")
    if failed:
        raise typer.Exit(1)
