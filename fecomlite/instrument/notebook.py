"""Notebooks stay notebooks: code cells are instrumented, IPython syntax is kept as it is.

The code cells share one namespace (``import torch`` in one cell, ``torch.ones`` in the next),
so they are resolved together, as one module made of the cells in order; each cell keeps its
own site keys (``train.ipynb[3]:2:4`` is cell 3, line 2 of that cell: lines count from the
cell's start) and, when it has sites, its own probe import, since cells run in any order.

IPython syntax is not Python: line magics (``%time``), shell escapes (``!ls``, ``x = !ls``),
help (``obj?``) and the first line of a Python cell magic (``%%time``, ``%%timeit``,
``%%capture``, ``%%prun``: their body is Python run in the notebook's namespace, and is
instrumented) are kept byte-for-byte. Before parsing, each such line becomes a ``pass``
placeholder at its indentation (so no line moves) and afterwards the original line is put back.
A candidate line inside a multi-line string is left alone. A cell that does not parse is
reported; a cell of another language (``%%bash``, ``%%writefile``) is named in a note; the other
cells are still instrumented.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from dataclasses import dataclass
from typing import Any

from fecomlite.instrument.exports import ProjectView
from fecomlite.instrument.names import Roots
from fecomlite.instrument.transform import (
    Rewrite,
    Segment,
    SourceError,
    instrument_segments,
    parse_check,
    split_lines,
)

_MAGIC = re.compile(
    r"^[ \t]*(?:[%!?]"  # %magic, !shell, ?help
    r"|[^#\n]*\?\??[ \t]*$"  # obj? / obj??
    r"|[\w.,()\[\] \t]+=[ \t]*[%!])"  # files = !ls, t = %timeit -o f()
)


# Cell magics whose body is Python run in the notebook's own namespace.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})


def other_language(source: str) -> str | None:
    """The cell magic of a cell whose body is not this notebook's Python (``bash``), else None."""
    stripped = source.lstrip()
    if not stripped.startswith("%%"):
        return None
    name = stripped[2:].split(None, 1)[0] if stripped[2:].strip() else ""
    return None if name in PYTHON_CELL_MAGICS else name or "%%"


class NotebookError(SourceError):
    """A cell that cannot be instrumented; ``cell`` is its index among all cells."""

    def __init__(self, cell: int, line: int, col: int, message: str) -> None:
        super().__init__(line, col, f"cell {cell}: {message}")
        self.cell = cell


@dataclass
class _Cell:
    index: int
    lines: list[str]  # original lines (ends included), "\n" added to a last line without one
    masked: str
    placeholders: frozenset[int]
    tree: ast.Module
    added_newline: bool


def instrument_notebook(
    text: str, relpath: str, roots: Roots, project: ProjectView | None = None
) -> tuple[Rewrite, list[NotebookError]]:
    """Instrument the code cells of a notebook given as JSON text; also the cells that failed."""
    try:
        notebook = json.loads(text)
        cells = notebook["cells"]
    except (ValueError, KeyError, TypeError) as error:
        raise SourceError(1, 1, f"not a Jupyter notebook: {error}") from error
    parts: list[_Cell] = []
    errors: list[NotebookError] = []
    notes: list[str] = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = _cell_text(cell)
        if not source.strip():
            continue
        magic = other_language(source)
        if magic is not None:
            why = ("the %%fecomlite magic instruments it when it runs" if magic == "fecomlite"
                   else f"a %%{magic} cell is not Python run in the notebook's namespace")
            notes.append(f"{relpath}[{index}]: not instrumented here: {why}")
            continue
        try:
            parts.append(_prepare(index, source, f"{relpath}[{index}]"))
        except SourceError as error:
            errors.append(NotebookError(index, error.line, error.col, error.message))
    if not parts:
        return Rewrite(None, notes=notes), errors
    segments, first_line = [], 1
    for part in parts:
        segments.append(
            Segment(
                f"{relpath}[{part.index}]", first_line, part.tree, part.placeholders, part.index
            )
        )
        first_line += len(part.lines)
    whole = "".join(part.masked for part in parts)
    tree = parse_check(whole, relpath, top_level_await=True)
    rewrite = instrument_segments(whole, tree, segments, roots, project)
    rewrite.notes[:0] = notes
    if rewrite.text is not None:
        _put_back(cells, parts, rewrite)
        rewrite.text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    return rewrite, errors


def _prepare(index: int, source: str, prefix: str) -> _Cell:
    lines = split_lines(source)
    added = not lines[-1].endswith(("\n", "\r"))
    if added:
        lines[-1] += "\n"
    candidates = _magic_lines(lines) - _string_lines(source)
    while True:
        masked = _mask(lines, candidates)
        tree = parse_check(masked, prefix, top_level_await=True)
        kept = candidates & _pass_lines(tree)
        if kept == candidates:
            return _Cell(index, lines, masked, candidates, tree, added)
        candidates = kept  # some candidates sat inside strings: leave those lines alone


def _put_back(cells: list[dict[str, Any]], parts: list[_Cell], rewrite: Rewrite) -> None:
    """Split the rewritten text into its cells, with the IPython lines restored."""
    assert rewrite.text is not None
    new_lines = split_lines(rewrite.text)
    cursor = 0
    for number, part in enumerate(parts):
        inserted = rewrite.inserted_lines.get(number)
        count = len(part.lines) + (1 if inserted is not None else 0)
        chunk = new_lines[cursor : cursor + count]
        cursor += count
        for line in part.placeholders:
            moved = line + 1 if inserted is not None and line >= inserted else line
            chunk[moved - 1] = part.lines[line - 1]
        text = "".join(chunk)
        if part.added_newline:
            text = text[:-1]
        _set_cell_text(cells[part.index], text)


def _cell_text(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _set_cell_text(cell: dict[str, Any], text: str) -> None:
    if isinstance(cell.get("source"), list):
        cell["source"] = split_lines(text)
    else:
        cell["source"] = text


def _magic_lines(lines: list[str]) -> frozenset[int]:
    """1-based numbers of lines that look like IPython syntax, continuations included."""
    found: set[int] = set()
    continued = False
    for number, line in enumerate(lines, start=1):
        if continued or _MAGIC.match(line):
            found.add(number)
            continued = line.rstrip("\r\n").endswith("\\")
    return frozenset(found)


def _string_lines(source: str) -> frozenset[int]:
    """Lines that continue a multi-line string (never IPython syntax), as far as the
    tokenizer gets through the cell; the ``pass`` check catches what it misses."""
    inside: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                inside.update(range(token.start[0] + 1, token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass
    return frozenset(inside)


def _mask(lines: list[str], numbers: frozenset[int]) -> str:
    masked = list(lines)
    for number in numbers:
        line = lines[number - 1]
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        ending = line[len(line.rstrip("\r\n")) :]
        masked[number - 1] = f"{indent}pass{ending}"
    return "".join(masked)


def _pass_lines(tree: ast.Module) -> frozenset[int]:
    return frozenset(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Pass))
