"""`fecomlite server`: the measurement server in the foreground (`fecomlite run` starts one in the
background by itself when none is running)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fecomlite.server.app import ServerConfigError, parse_address
from fecomlite.server.runtime import ServerRunning, run_foreground
from fecomlite.store import StoreError


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
    metrics_addr: Annotated[
        str | None,
        typer.Option(help="Also serve GET /metrics (Prometheus, read-only) on HOST:PORT, e.g. "
                     "0.0.0.0:9464; the event API stays on 127.0.0.1", show_default=False),
    ] = None,
) -> None:
    """Run the local measurement server in the foreground until Ctrl-C."""
    try:
        if metrics_addr:
            parse_address(metrics_addr)  # refuse a malformed address before finding sensors
        run_foreground(home, port, host, metrics_addr)
    except (ServerConfigError, ServerRunning, StoreError, OSError) as exc:
        typer.echo(f"fecomlite server: {exc}", err=True)
        raise typer.Exit(2) from exc
