"""Traceback carets (`^^^^`, `~~~^^^`, Python 3.11+) of an instrumented file under the user's
own columns.

The running code is the copy's, whose columns differ from the original line's wherever a call
became `__fecomlite__.call("site", f, x)`, while `linecache` serves the original text
(`probe_source.py`): the copy's columns would mark the wrong characters. `traceback` and
`inspect` read an instruction's position through `_get_code_position(code, index)`; wrapped,
it returns the position of the same expression in the original. The map is built on first use
for each file, from CPython's `ast` of the copy and of the original walked side by side (a
wrapped call pairs with the original call, its callee and arguments with theirs), so it costs
nothing until a traceback of that file is formatted. A column that maps to nothing known gives
no caret at all rather than a wrong one. Lines the instrumenter left alone keep their columns.

Why at display and not by rewriting the code objects' line tables at import: the first
instrumented module (the script, `__main__`) is compiled before the probe is imported, and its
code cannot be replaced while it runs.
"""

from __future__ import annotations

import sys
import tokenize
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from fecomlite.runtime import source as probe_source

PROBE = "__fecomlite__"

Point = tuple[int, int]  # (line, UTF-8 byte column), as code objects count them
Positions = tuple[Any, Any, Any, Any]  # (line, end line, column, end column)


class _Mismatch(Exception):
    """The copy is not the original with wrapped calls: no column is trusted."""


class _FileMap:
    """Columns of one copy mapped onto its original."""

    def __init__(self, same_lines: frozenset[int], points: dict[Point, Point | None]) -> None:
        self.same_lines = same_lines  # lines whose text the instrumenter left alone
        self.points = points  # copy point -> original point (None: ambiguous)

    def point(self, line: int, col: int) -> Point | None:
        if line in self.same_lines:
            return line, col
        return self.points.get((line, col))

    def positions(self, positions: Positions) -> Positions:
        line, end_line, col, end_col = positions
        if line is None or end_line is None or col is None or end_col is None:
            return positions
        start, end = self.point(line, col), self.point(end_line, end_col)
        if start is None or end is None:
            return line, end_line, None, None
        return start[0], end[0], start[1], end[1]


def _read(path: str) -> str:
    with tokenize.open(path) as file:
        return file.read()


def _is_wrapper(node: Any) -> bool:
    import ast

    func = getattr(node, "func", None)
    return (
        isinstance(node, ast.Call)
        and isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == PROBE
    )


def _is_probe_import(node: Any) -> bool:
    import ast

    return isinstance(node, ast.Import) and any(alias.asname == PROBE for alias in node.names)


def _pair_points(copy: Any, original: Any) -> dict[Point, Point | None]:
    """Start and end of every node of the copy, paired with its node in the original."""
    import ast

    points: dict[Point, Point | None] = {}

    def add(copy_point: Point, original_point: Point) -> None:
        if points.get(copy_point, original_point) != original_point:
            points[copy_point] = None  # two places in the original: ambiguous
        else:
            points[copy_point] = original_point

    def span(node: Any, like: Any) -> None:
        if getattr(node, "end_lineno", None) is not None:
            add((node.lineno, node.col_offset), (like.lineno, like.col_offset))
            add((node.end_lineno, node.end_col_offset), (like.end_lineno, like.end_col_offset))

    stack: list[tuple[Any, Any]] = [(copy, original)]
    while stack:
        a, b = stack.pop()
        if isinstance(a, list):
            a = [item for item in a if not _is_probe_import(item)]
            if not isinstance(b, list) or len(a) != len(b):
                raise _Mismatch
            stack.extend(zip(a, b, strict=True))
        elif isinstance(a, ast.AST):
            if _is_wrapper(a) and not _is_wrapper(b):  # call(site, f, *args) <- f(*args)
                if not isinstance(b, ast.Call) or len(a.args) < 2:
                    raise _Mismatch
                span(a, b)
                stack.append((a.args[1], b.func))
                stack.append((a.args[2:], b.args))
                stack.append((a.keywords, b.keywords))
                continue
            if type(a) is not type(b):
                raise _Mismatch
            span(a, b)
            stack.extend((getattr(a, f, None), getattr(b, f, None)) for f in a._fields)
    return points


@lru_cache(maxsize=256)
def file_map(filename: str) -> _FileMap | None:
    """How the columns of an instrumented file map onto the user's text (None: not a copy)."""
    original = probe_source.original_of(filename)
    in_place = probe_source.rewritten_text(filename) if original is None else None
    if original is None and in_place is None:
        return None
    import ast

    try:
        if in_place is not None:  # run in place: the user's file, code from a rewrite of it
            copy_text, original_text = in_place, _read(filename)
        else:
            copy_text, original_text = _read(filename), _read(str(original))
        pairs = zip(copy_text.split("\n"), original_text.split("\n"), strict=False)
        same = frozenset(number for number, (a, b) in enumerate(pairs, start=1) if a == b)
        points = _pair_points(ast.parse(copy_text), ast.parse(original_text))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError, _Mismatch):
        return _FileMap(frozenset(), {})  # no column of it is trusted: no carets
    return _FileMap(same, points)


def original_positions(code: Any, positions: Positions) -> Positions:
    """An instruction's positions in the user's text (unchanged for files not instrumented)."""
    mapping = file_map(code.co_filename)
    return positions if mapping is None else mapping.positions(positions)


def _mapped(stdlib: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
    def get_code_position(code: Any, instruction_index: int) -> Any:
        positions = stdlib(code, instruction_index)
        try:
            return original_positions(code, tuple(positions))
        except Exception:  # never fail a traceback: the copy's positions, as before
            return positions

    get_code_position.__fecomlite__ = True  # type: ignore[attr-defined]
    get_code_position.__wrapped__ = stdlib  # type: ignore[attr-defined]
    return get_code_position


def serve_original_positions() -> None:
    """Wrap `_get_code_position` of `traceback` and `inspect` once per process."""
    if sys.version_info < (3, 11):
        return  # no columns in code objects, no carets
    import inspect
    import traceback

    for module in (traceback, inspect):
        stdlib = getattr(module, "_get_code_position", None)
        if stdlib is not None and not getattr(stdlib, "__fecomlite__", False):
            module._get_code_position = _mapped(stdlib)  # type: ignore[attr-defined]
