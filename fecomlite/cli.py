"""The `fecomlite` command line: one subcommand per capability, each defined beside its code.

A subcommand's module (and what it imports: libcst, scipy, the server, a framework) is loaded
only when that subcommand runs or shows its help, so `fecomlite --help` answers at once. The
one-line summaries below are what `fecomlite --help` lists without importing anything; a test
checks that each is the first line of its command's docstring.
"""

from __future__ import annotations

import importlib
from typing import Any

from typer.core import TyperGroup

# name: (module, attribute: a command function or a Typer app, one-line summary)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "instrument": (
        "fecomlite.instrument.command",
        "instrument_command",
        "Wrap every framework API call of a project in a probe, in a copy; the original is "
        "untouched.",
    ),
    "run": (
        "fecomlite.runner.command",
        "run_command",
        "Run SCRIPT under the measurement server and store per-call energy and memory.",
    ),
    "report": (
        "fecomlite.report.command",
        "report_command",
        "Write the HTML report (self-contained, opens offline) with JSON and CSV beside it.",
    ),
    "attribute": (
        "fecomlite.analysis.command",
        "attribute_command",
        "Attribute the energy of your own meter's trace to your own call timings.",
    ),
    "server": (
        "fecomlite.server.command",
        "server_app",
        "The local measurement server: run it, see it (status), stop it.",
    ),
    "ingest": (
        "fecomlite.runner.ingest",
        "ingest_command",
        "Store the events of spool files in the run they name (or a new run), then delete them.",
    ),
    "watch": (
        "fecomlite.server.watch",
        "watch_command",
        "Measure any process, uninstrumented: memory and power over time, live and in the store.",
    ),
    "sweep": (
        "fecomlite.model.command",
        "sweep_command",
        "Train a grid of small fully connected networks, each as a measured run, into one table.",
    ),
    "model": (
        "fecomlite.model.command",
        "model_app",
        "Fit and use the energy model: energy from FLOPs, bytes by cache level and time.",
    ),
    "export": (
        "fecomlite.export.command",
        "export_command",
        "Write a run as a Perfetto/Chrome trace or as OpenMetrics text.",
    ),
    "store": (
        "fecomlite.store.command",
        "store_app",
        "Check, copy (even while its server runs) or upgrade a run store.",
    ),
    "merge": (
        "fecomlite.report.merge_command",
        "merge_command",
        "Merge the stores of a job's nodes (clocks aligned) into one store, and write its report.",
    ),
}


def load_command(name: str) -> Any:
    """The click command of subcommand `name`, importing its module now."""
    import typer
    import typer.main

    module, attribute, _ = COMMANDS[name]
    target: Any = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)
    else:
        single = typer.Typer(
            add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None
        )
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    if name == "run":  # everything after the script is the script's, as with `python SCRIPT ARGS`
        command.allow_interspersed_args = False
    _plain_help(command)
    return command


def _plain_help(command: Any) -> None:
    """Help as plain text (rich's panels cost a fifth of a second to import); a group's own
    `--help`, when absent, read as False (see `LazyGroup.get_help_option`)."""
    command.rich_markup_mode = None
    subcommands = getattr(command, "commands", {})
    if subcommands:
        original = command.get_help_option
        command.get_help_option = lambda ctx: _false_when_absent(original(ctx))
        command.parse_args = _subcommand_help_first(command, command.parse_args)
    for sub in subcommands.values():
        _plain_help(sub)


def _subcommand_help_first(group: Any, parse_args: Any) -> Any:
    """`GROUP SUB --help` answers before the group's own options are processed: typer coerces
    every option value through pydantic, which `fecomlite server status --help` would otherwise
    import (a quarter of a second) for the server's `--port` and `--host` it does not use."""

    def parse(ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] in group.commands and "--help" in args[1:]:
            group.commands[args[0]].make_context(args[0], args[1:], parent=ctx)  # exits
        return parse_args(ctx, args)

    return parse


def _false_when_absent(option: Any) -> Any:
    if option is not None:
        option.default = False
    return option


class LazyGroup(TyperGroup):
    """A group whose subcommands are imported when used, listed from `COMMANDS` meanwhile."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def get_help_option(self, ctx: Any) -> Any:
        """`--help` absent reads False, not None: typer then coerces nothing (its coercion
        imports pydantic, a quarter of the start-up)."""
        return _false_when_absent(super().get_help_option(ctx))

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, _, summary) in COMMANDS.items()])


app = LazyGroup(
    name="fecomlite",
    help="What each framework API call of a deep-learning project costs in energy and memory.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


if __name__ == "__main__":
    app()
