"""`fecomlite server`: the measurement server in the foreground (`fecomlite run` starts one in the
background by itself when none is running)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fecomlite.server.app import ServerConfigError
from fecomlite.server.runtime import ServerRunning, run_foreground


def server_command(
    home: Annotated[
        Path | None,
        typer.Option(help="Where the store and state file live (default: $FECOMLITE_HOME, "
                     "else ./.fecomlite)", file_okay=False),
    ] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port; 0 picks a free one")] = 0,
    host: Annotated[
        str, typer.Option(help="Listen address: loopback only (anything else is refused)")
    ] = "127.0.0.1",
) -> None:
    """Run the local measurement server in the foreground until Ctrl-C."""
    try:
        run_foreground(home, port, host)
    except (ServerConfigError, ServerRunning) as exc:
        typer.echo(f"fecomlite server: {exc}", err=True)
        raise typer.Exit(2) from exc
