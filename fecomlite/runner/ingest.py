"""`fecomlite ingest`: add spooled probe events (written while no server answered) to the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from fecomlite.server.client import ServerClient, ServerError, ensure_server
from fecomlite.server.spool import SPOOL_GLOB
from fecomlite.store import default_home
from fecomlite.terminal import plain

console = Console()


def ingest_command(
    spools: Annotated[
        list[Path], typer.Argument(help="Spool files (.spool), or folders holding them.")
    ],
    home: Annotated[
        Path | None, typer.Option(help="fecomlite's folder: store, server state (./.fecomlite).")
    ] = None,
) -> None:
    """Store the events of spool files in the run they name (or a new run), then delete them.

    Each batch is stored once: a spool ingested again, or holding batches the server had
    already stored, adds nothing twice. A file is deleted only when every record in it is
    stored (now or before); one with torn or bad records is kept, and the events they hold are
    counted. A spool of another store (another home), or a file that is no spool, is refused
    untouched."""
    files, missing = _spool_files(spools)
    for line in missing:
        console.print(f"[red]error:[/] {plain(line)}", highlight=False)
    if not files:
        raise typer.Exit(1)
    try:
        client = ensure_server((home or default_home()).resolve())
    except ServerError as exc:
        console.print(f"[red]error:[/] {plain(exc)}")
        raise typer.Exit(1) from None
    results = [_ingest_one(client, spool) for spool in files]
    if missing or not all(results):
        raise typer.Exit(1)


def _spool_files(paths: list[Path]) -> tuple[list[Path], list[str]]:
    """The files to ingest (a folder's *.spool files), and a line for each path that holds
    none."""
    files, missing = [], []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.glob(SPOOL_GLOB) if p.is_file())
            files += found
            if not found:
                missing.append(f"{path} holds no {SPOOL_GLOB} files")
        elif path.is_file():
            files.append(path)
        else:
            missing.append(f"no spool file or folder at {path}")
    return files, missing


def _ingest_one(client: ServerClient, spool: Path) -> bool:
    """Ingest one file, say what was stored and kept, and delete it when whole (True)."""
    try:
        report: dict[str, Any] = client.ingest_report(spool.resolve())
    except ServerError as exc:
        console.print(f"[red]{plain(spool)}[/]: {plain(exc)}", highlight=False)
        return False
    console.print(
        f"{plain(spool)}: {report['events']:,} events stored in {plain(client.store_path)}"
        + (f"; {report['duplicate_batches']} batches were stored already"
           if report.get("duplicate_batches") else ""),
        highlight=False,
    )
    for reason in report.get("bad_reasons", []):
        console.print(f"  [yellow]skipped[/] {plain(reason)}", highlight=False)
    for line in report.get("kept", []):
        console.print(f"  [yellow]{plain(line)}[/]", highlight=False)
    if not report.get("whole", False):
        return False
    try:
        spool.unlink()
    except OSError as exc:
        console.print(f"  [yellow]stored, but cannot delete {plain(spool)}[/]: "
                      f"{plain(exc.strerror or exc)}", highlight=False)
    return True
