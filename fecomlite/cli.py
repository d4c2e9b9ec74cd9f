"""The `fecomlite` command line: one subcommand per capability, each defined beside its code."""

from __future__ import annotations

import typer

from fecomlite.attribute_command import attribute_command
from fecomlite.distributed.merge_command import merge_command  # typer only: the rest on use
from fecomlite.ingest_command import ingest_command
from fecomlite.instrument.command import instrument_command
from fecomlite.model.command import model_app, sweep_command
from fecomlite.report.command import report_command
from fecomlite.run_command import run_command
from fecomlite.server.command import server_command
from fecomlite.watch_command import watch_command

app = typer.Typer(
    name="fecomlite",
    help="What each framework API call of a deep-learning project costs in energy and memory.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("instrument")(instrument_command)
app.command("run")(run_command)
app.command("report")(report_command)
app.command("attribute")(attribute_command)
app.command("server")(server_command)
app.command("ingest")(ingest_command)
app.command("watch")(watch_command)
app.command("sweep")(sweep_command)
app.add_typer(model_app, name="model")
app.command("merge")(merge_command)


if __name__ == "__main__":
    app()
