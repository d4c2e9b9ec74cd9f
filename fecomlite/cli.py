"""The `fecomlite` command line: one subcommand per capability, each defined beside its code.

A subcommand's module (and what it imports: libcst, scipy, the server, a framework) is loaded
only when that subcommand runs or shows its help, so `fecomlite --help` answers at once. The
one-line summaries below are what `fecomlite --help` lists without importing anything; a test
checks that each is the first line of its command's docstring. Option values of plain types are
converted without pydantic (`plain_conversion`), which typer would import for them.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import os
import re
import typing
from collections.abc import Callable
from pathlib import Path
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
    _without_pydantic(command)
    return command


def _without_pydantic(command: Any) -> None:
    """Plain option values converted without importing pydantic (`plain_conversion`); an
    absent `--help` read as False (typer converts a None, not a bool)."""
    plain_conversion(command)
    subcommands = getattr(command, "commands", {})
    if not subcommands:  # (a group's own is `_plain_help`'s)
        original = command.get_help_option
        command.get_help_option = lambda ctx: _false_when_absent(original(ctx))
    for sub in subcommands.values():
        _without_pydantic(sub)


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


# ------------------------------------------------------------------ option values, without pydantic
# typer (0.2x) converts every option value through a pydantic `TypeAdapter`, and importing pydantic
# is ~0.12 s of CPU: a third of `fecomlite run`'s own imports, paid by every run. The values our
# commands take are mostly of plain types; `plain_conversion` converts those (a str, a bool, an
# int or a float as Python reads it, a Path without checks asked for, a choice of an Enum, a list
# of any of these) and hands anything else, and every value it cannot convert, to typer's own
# conversion, so an error reads exactly as typer words it. With a typer that has no such
# conversion, nothing changes.

INTEGER = re.compile(r"[+-]?[0-9]+")
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
PATH_FLAGS = {"exists": False, "file_okay": True, "dir_okay": True, "writable": False,
              "readable": True, "resolve_path": False, "allow_dash": False, "path_type": None}


class Unconverted(ValueError):
    """A value the plain conversion leaves to typer's (which then words the error)."""


def plain_conversion(command: Any) -> None:
    """Give each parameter of `command` whose type is plain a conversion without pydantic."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
    except ImportError:  # a typer that converts through click's types: nothing to do
        return

    @dataclasses.dataclass(frozen=True)
    class Plain(RuntimeParam):  # type: ignore[misc]
        convert: Callable[[Any], Any]
        descriptor: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                return self.convert(value)
            except Unconverted:
                typer_own = build_runtime_param(self.descriptor)
                return typer_own._coerce_value(value, param=param, ctx=ctx)

    for param in command.params:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", False) is not None:
            continue
        convert = converter(descriptor.annotation, descriptor.parameter_info)
        if convert is not None:
            param._runtime_param = Plain(descriptor.parameter_info, descriptor.annotation,
                                         convert, descriptor)


def converter(annotation: Any, info: Any) -> Callable[[Any], Any] | None:
    """How a value of `annotation` is converted without pydantic; None: by typer."""
    if getattr(info, "parser", None) is not None or getattr(info, "min", None) is not None \
            or getattr(info, "max", None) is not None:
        return None
    if typing.get_origin(annotation) is list and len(typing.get_args(annotation)) == 1:
        convert_one = converter(typing.get_args(annotation)[0], info)
        return None if convert_one is None else functools.partial(_each, convert_one)
    if annotation is str:
        return _string
    if annotation is bool:  # an absent `--x/--no-x` (None) still builds typer's conversion
        return _boolean
    if annotation is int:
        return _integer
    if annotation is float:
        return _number
    if annotation is Path and all(getattr(info, k, v) == v for k, v in PATH_FLAGS.items()):
        return _path
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum) \
            and getattr(info, "case_sensitive", True):
        return lambda value: _choice(annotation, value)
    return None


def _string(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise Unconverted(value)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise Unconverted(value)


def _each(convert_one: Callable[[Any], Any], value: Any) -> list[Any]:
    """A repeatable option's or argument's values, each converted as one would be."""
    if isinstance(value, (list, tuple)):
        return [convert_one(v) for v in value]
    raise Unconverted(value)


def _integer(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and INTEGER.fullmatch(value):
        return int(value)
    raise Unconverted(value)


def _number(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and NUMBER.fullmatch(value):
        return float(value)
    raise Unconverted(value)


def _path(value: Any) -> Path:
    """A Path as typer makes one with no check asked for; one that exists must be readable."""
    if isinstance(value, (str, Path)) and value not in ("", "-"):
        path = Path(value)
        if not os.path.exists(path) or os.access(path, os.R_OK):
            return path
    raise Unconverted(value)


def _choice(choices: type[enum.Enum], value: Any) -> enum.Enum:
    if isinstance(value, choices):
        return value
    for choice in choices:
        if isinstance(value, str) and str(choice.value) == value:
            return choice
    raise Unconverted(value)


app = LazyGroup(
    name="fecomlite",
    help="What each framework API call of a deep-learning project costs in energy and memory.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


if __name__ == "__main__":
    app()
