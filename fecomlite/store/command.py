"""`fecomlite store`: check, copy and upgrade a run store file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fecomlite.store import SCHEMA_VERSION, Store, StoreError, default_store_path
from fecomlite.terminal import plain

store_app = typer.Typer(
    help="Check, copy (even while its server runs) or upgrade a run store.",
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
)

StorePath = Annotated[
    Path | None, typer.Argument(help="The store (default .fecomlite/store.sqlite).")
]


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"error: {plain(exc)}", err=True)
    return typer.Exit(1)


@store_app.command("check")
def check_command(path: StorePath = None) -> None:
    """Read the store without writing to it and say whether SQLite finds it whole."""
    path = path or default_store_path()
    try:
        with Store(path, readonly=True) as store:
            runs = len(store.runs())
    except StoreError as exc:
        raise _fail(exc) from None
    typer.echo(f"{plain(path)}: whole (SQLite quick_check), schema {SCHEMA_VERSION}, {runs} runs")


@store_app.command("copy")
def copy_command(
    source: Annotated[Path, typer.Argument(help="The store to copy (its server may be running).")],
    target: Annotated[Path, typer.Argument(help="A new file for the copy.")],
) -> None:
    """Copy a store, its -wal file's rows included, into one new file (SQLite's backup API)."""
    from fecomlite.store.copy import copy_store

    try:
        runs = copy_store(source, target)
    except StoreError as exc:
        raise _fail(exc) from None
    typer.echo(f"copied {runs} runs from {plain(source)} to {plain(target)}")


@store_app.command("upgrade")
def upgrade_command(path: StorePath = None) -> None:
    """Upgrade a store of an older schema to this fecomlite's, keeping a copy of the old file."""
    path = path or default_store_path()
    try:
        with Store(path, create=False) as store:
            note = store.upgrade_note
    except StoreError as exc:
        raise _fail(exc) from None
    typer.echo(plain(note) if note else f"{plain(path)} is already of schema {SCHEMA_VERSION}")
