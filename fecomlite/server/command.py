"""`fecomlite server`: the measurement server in the foreground, and `server status` / `server
stop` for the ones running (`fecomlite run` starts one in the background by itself when none
serves its home; that one exits after `IDLE_EXIT_S` unused).

One server per home (the folder of the store: `$FECOMLITE_HOME`, else `./.fecomlite`); status
lists every server of this user on this machine (`fecomlite.server.registry`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from fecomlite.server.idle import IDLE_EXIT_S

HomeOption = Annotated[
    Path | None,
    typer.Option(
        help="Where the store and state file live (default: $FECOMLITE_HOME, else ./.fecomlite)",
        file_okay=False,
    ),
]


server_app = typer.Typer(
    help="The local measurement server: run it, see it (status), stop it.",
    add_completion=False,
    pretty_exceptions_enable=False,
)


@server_app.callback(invoke_without_command=True)
def server_command(
    ctx: typer.Context,
    home: HomeOption = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port; 0 picks a free one")] = 0,
    host: Annotated[
        str, typer.Option(help="Listen address: loopback only (anything else is refused)")
    ] = "127.0.0.1",
    metrics_addr: Annotated[
        str | None,
        typer.Option(
            help="Also serve GET /metrics (Prometheus, read-only) on HOST:PORT, e.g. "
            "0.0.0.0:9464; the event API stays on 127.0.0.1",
            show_default=False,
        ),
    ] = None,
    idle_exit: Annotated[
        float,
        typer.Option(
            help="Exit after this many seconds unused (0: never; a server "
            f"`fecomlite run` starts uses {IDLE_EXIT_S:g})",
            min=0,
        ),
    ] = 0.0,
) -> None:
    """Run the local measurement server in the foreground until Ctrl-C (or see or stop one)."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = {"home": home}  # `server --home H stop` means H's server, as `stop --home H`
        return
    from fecomlite.server.app import ServerConfigError, parse_address
    from fecomlite.server.runtime import ServerRunning, run_foreground
    from fecomlite.store import StoreError

    try:
        if metrics_addr:
            parse_address(metrics_addr)  # refuse a malformed address before finding sensors
        run_foreground(home, port, host, metrics_addr, idle_exit)
    except (ServerConfigError, ServerRunning, StoreError, OSError) as exc:
        typer.echo(f"fecomlite server: {exc}", err=True)
        raise typer.Exit(2) from exc


@server_app.command("status")
def status_command(ctx: typer.Context, home: HomeOption = None) -> None:
    """List this user's running servers; exit status 1 when none serves HOME."""
    from fecomlite.server.client import live_client
    from fecomlite.server.registry import registered_homes
    from fecomlite.store import default_home

    mine = (home or _group_home(ctx) or default_home()).resolve()
    homes = registered_homes()
    if mine not in homes:
        homes.insert(0, mine)  # a server started before the registry existed is still found
    serving = False
    for folder in homes:
        client = live_client(folder)
        if client is None:
            continue
        serving = serving or folder == mine
        status = client.status()
        recording = status.get("recording") or []
        doing = f"recording run {', '.join(map(str, recording))}" if recording else "idle"
        marker = "this home" if folder == mine else "other home"
        typer.echo(
            f"pid {client.pid}  {client.url}  up {_duration(status['uptime_s'])}  "
            f"{doing}  {marker}: {folder}"
        )
    if not serving:
        typer.echo(f"no server serves {mine}")
        raise typer.Exit(1)


@server_app.command("stop")
def stop_command(
    ctx: typer.Context,
    home: HomeOption = None,
    all_homes: Annotated[
        bool, typer.Option("--all", help="Stop every server of this user, whatever its home.")
    ] = False,
) -> None:
    """Stop the server of HOME (open runs are closed as interrupted); exit 1 when none runs."""
    from fecomlite.server.client import ServerError, live_client
    from fecomlite.server.registry import registered_homes
    from fecomlite.store import default_home

    home = home or _group_home(ctx)
    homes = registered_homes() if all_homes else [(home or default_home()).resolve()]
    stopped = 0
    for folder in homes:
        client = live_client(folder)
        if client is None:
            continue
        try:
            client.shutdown()
        except ServerError as exc:
            typer.echo(f"server pid {client.pid} ({folder}): {exc}", err=True)
            continue
        typer.echo(f"stopped the server of {folder} (pid {client.pid})")
        stopped += 1
    if not stopped:
        typer.echo("no server was running" + ("" if all_homes else f" for {homes[0]}"))
        raise typer.Exit(1)


def _group_home(ctx: typer.Context) -> Path | None:
    """The --home given to `server` itself, before the subcommand."""
    return (ctx.obj or {}).get("home") if isinstance(ctx.obj, dict) else None


def _duration(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds))
