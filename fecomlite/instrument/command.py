"""`fecomlite instrument`: rewrite a copy of a project with every framework call wrapped."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from fecomlite.instrument.project import InstrumentResult

console = Console()
errors = Console(stderr=True)


def instrument_command(
    path: Annotated[
        Path, typer.Argument(help="A .py file, a .ipynb notebook or a project folder.")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Where the copy goes (default: sibling <name>-instrumented/)."),
    ] = None,
    api: Annotated[
        list[str] | None,
        typer.Option("--api", help="Another API root to wrap (e.g. numpy, sklearn); repeatable."),
    ] = None,
    list_only: Annotated[
        bool,
        typer.Option("--list", help="Print the call sites that would be wrapped; write nothing."),
    ] = False,
) -> None:
    """Wrap every framework API call of a project in a probe, in a copy; the original is untouched.

    Roots wrapped by default: tensorflow, keras, tf_keras, torch. Add more with --api, or with
    `api = ["numpy", ...]` in the tool.fecomlite table of the project's pyproject.toml.
    """
    from fecomlite.instrument.project import InstrumentError, instrument_path

    try:
        result = instrument_path(path, out, api or (), list_only=list_only)
    except (InstrumentError, OSError) as error:
        said = str(error)
        if isinstance(error, OSError):
            said = f"cannot write {error.filename or out}: {error.strerror or error}"
        errors.print(f"[red]error:[/] {escape(said)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if list_only:
        _print_sites(result)
    for failure in result.failures:
        errors.print(escape(str(failure)), highlight=False, soft_wrap=True)
    for note in result.notes:
        errors.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    _print_summary(result)
    if result.failures:
        raise typer.Exit(1)


def _print_sites(result: InstrumentResult) -> None:
    """One site a line (greppable): key, canonical API, kind, what the user wrote, where."""
    width = max((len(key) for key in result.sites), default=0)
    for key, site in result.sites.items():
        console.print(
            f"{escape(key):<{width}}  [bold]{escape(str(site['api']))}[/]  {_how(site)}  "
            f"[dim]{escape(str(site['written']))} in {escape(str(site['function']))}[/]",
            highlight=False,
            soft_wrap=True,
        )


def _how(site: dict[str, object]) -> str:
    """The site's kind, and whether its callee is decided when the call runs."""
    if site.get("resolved") != "runtime":
        return str(site["kind"])
    return "run time" if site["kind"] == "call" else f"{site['kind']}, run time"


def _print_summary(result: InstrumentResult) -> None:
    table = Table(show_header=False, title="fecomlite instrument", title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    python_files = (
        result.files_instrumented + result.files_unchanged + len({f.path for f in result.failures})
    )
    table.add_row(
        "files",
        f"{python_files} Python/notebook ({result.files_instrumented} instrumented, "
        f"{result.files_unchanged} without framework calls), {result.files_copied} other copied",
    )
    by_root = ", ".join(f"{root} {count}" for root, count in result.sites_by_root.items())
    table.add_row("sites", f"{len(result.sites)}" + (f" ({by_root})" if by_root else ""))
    table.add_row("failed", f"[red]{len(result.failures)}[/]" if result.failures else "0")
    rate = result.lines / result.seconds if result.seconds else 0.0
    table.add_row(
        "time",
        f"{result.seconds:.2f} s for {result.lines} lines ({rate:,.0f} lines/s, "
        f"{result.workers} process{'es' if result.workers > 1 else ''})",
    )
    table.add_row("roots", ", ".join(result.api_roots))
    if result.manifest is not None:
        table.add_row("copy", escape(str(result.out)))
        table.add_row("manifest", escape(str(result.manifest)))
    console.print(table)
