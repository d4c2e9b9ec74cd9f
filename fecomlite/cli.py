"""The `fecomlite` command line: one subcommand per capability, each defined beside its code."""

from __future__ import annotations

import typer

from fecomlite.instrument.command import instrument_command

app = typer.Typer(
    name="fecomlite",
    help="Measure what each framework API call of a deep-learning project costs in energy and memory.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("instrument")(instrument_command)


if __name__ == "__main__":
    app()
