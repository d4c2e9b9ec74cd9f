"""Rewrite one module's source: every resolved call ``f(a)`` becomes
``__fecomlite__.call("SITE", f, a)``, and ``await f(a)`` becomes
``await __fecomlite__.acall("SITE", f, a)`` so that the await is timed (docs/internals.md §1).

The rewrite splices text at a few offsets instead of regenerating the module from the tree, so
everything outside the inserted text stays byte-for-byte, no line moves, and no second codegen
pass is paid for. Call positions come from CPython's own ``ast`` (fast, and the positions
tracebacks use), paired one-to-one with libcst's calls in source order; when the pairing does
not check out, libcst's ``PositionProvider`` supplies them instead. The libcst tree analysed is
rebuilt from that same ``ast`` tree (``astcst.py``) wherever it can be, and parsed by libcst
otherwise.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from fecomlite.instrument.astcst import module_from_ast
from fecomlite.instrument.cstparse import parse_module
from fecomlite.instrument.cstwalk import tuple_getter
from fecomlite.instrument.exports import ProjectView
from fecomlite.instrument.names import Roots
from fecomlite.instrument.resolve import (
    CallRecord,
    Collected,
    Site,
    epochs_name,
    find_sites,
    iterated_names,
)
from fecomlite.instrument.scopes import resolve_scopes
from fecomlite.runtime.hyperparams import TRAINING_STEPS

PROBE = "__fecomlite__"
IMPORT = f"import fecomlite.runtime.probe as {PROBE}"

_NEWLINE = re.compile(r"\r\n|\r|\n")
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")
_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.Match,
    getattr(ast, "TryStar", ast.Try),
)


class SourceError(Exception):
    """A source that cannot be instrumented, with a 1-based line and column."""

    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line, self.col, self.message = line, col, message


@dataclass
class Rewrite:
    """The outcome for one source: ``text`` is ``None`` when nothing had to change."""

    text: str | None
    sites: list[dict[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # segment index → local line before which the probe import got a line of its own
    inserted_lines: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Segment:
    """A part of the text with its own site keys and its own probe import: the whole file, or
    one notebook cell (cells run in any order, so each that has sites imports the probe)."""

    prefix: str  # site keys start with it: "train.py", "nb.ipynb[3]"
    first_line: int  # 1-based line where the segment starts in the whole text
    tree: ast.Module  # the segment parsed alone
    placeholders: frozenset[int] = frozenset()  # local lines standing in for IPython syntax
    cell: int | None = None


@dataclass(frozen=True, slots=True)
class _Span:
    start: int  # offset of the call's first character
    lparen: int  # offset of the "(" that opens the arguments
    rparen: int  # offset of the ")" that closes them
    line: int
    col: int


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split where Python's tokenizer splits (not ``splitlines``)."""
    starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]
    if starts[-1] == len(text) and len(starts) > 1:
        starts.pop()
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def parse_check(text: str, filename: str, *, top_level_await: bool = False) -> ast.Module:
    """CPython's parse (fast, exact messages); a failure becomes a ``SourceError``."""
    flags = ast.PyCF_ONLY_AST | (ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if top_level_await else 0)
    try:
        return compile(text, filename, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as error:
        raise SourceError(error.lineno or 1, error.offset or 1, error.msg) from error
    except (ValueError, RecursionError, MemoryError) as error:  # NUL bytes, absurd nesting
        raise SourceError(1, 1, str(error)) from error


def instrument_source(
    text: str,
    key_prefix: str,
    roots: Roots,
    project: ProjectView | None = None,
    tree: ast.Module | None = None,
) -> Rewrite:
    """Instrument one module given as text; ``key_prefix`` (its relative path) starts every
    site key; ``project`` resolves names imported from the project's other modules; ``tree``
    is ``text`` already parsed by ``parse_check`` (or as it does), where it was."""
    if tree is None:
        tree = parse_check(text, key_prefix)
    return instrument_segments(text, tree, [Segment(key_prefix, 1, tree)], roots, project)


def instrument_segments(
    text: str,
    tree: ast.Module,
    segments: list[Segment],
    roots: Roots,
    project: ProjectView | None = None,
) -> Rewrite:
    """Instrument ``text`` (parsed as ``tree``), resolved as one module, keyed by segment."""
    if PROBE in text:
        raise SourceError(1, 1, f"already instrumented (it uses {PROBE}); refusing to wrap twice")
    lines = _Lines(text)
    try:  # on libcst's tree rebuilt from `tree` (``astcst``): no libcst parse
        collected, sites = _sites(module_from_ast(tree, text), text, roots, project)
        spans = _spans_from_ast(tree, collected.calls, lines) if sites else {}
    except Exception:  # what it does not rebuild, or fails on: libcst's own parse decides
        spans = None
    if spans is None:
        try:
            module = parse_module(text)
        except cst.ParserSyntaxError as error:
            raise SourceError(error.raw_line, error.raw_column + 1, error.message) from error
        collected, sites = _sites(module, text, roots, project)
        if sites:
            spans = _spans_from_ast(tree, collected.calls, lines)
            if spans is None:
                spans = _spans_from_libcst(module, collected.calls, lines, text)
    if not sites:
        return Rewrite(None)
    return _splice(text, segments, sites, spans, lines)


def _sites(
    module: cst.Module, text: str, roots: Roots, project: ProjectView | None
) -> tuple[Collected, list[Site]]:
    return find_sites(module, resolve_scopes(module, text), roots, project)


class _Lines:
    """Line starts of a text, and CPython's byte columns converted to characters."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]

    def line_text(self, line: int) -> str:
        start = self.starts[line - 1]
        end = self.starts[line] if line < len(self.starts) else len(self.text)
        return self.text[start:end]

    def offset_of_bytes(self, line: int, byte_col: int) -> int:
        start = self.starts[line - 1]
        chunk = self.text[start : start + byte_col]
        if chunk.isascii():
            return start + byte_col
        raw = self.line_text(line).encode("utf-8")[:byte_col]
        return start + len(raw.decode("utf-8", errors="replace"))

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col


def _ast_calls(tree: ast.Module) -> list[ast.Call]:
    """Every call of ``tree``, in source order (a plain stack walk over the fields that may hold
    a call, read per node type by one ``attrgetter``: ``ast.walk`` costs several times as much)."""
    calls = []
    stack: list[object] = [tree]
    getters = _AST_GETTERS
    while stack:
        node = stack.pop()
        kind = node.__class__
        if kind is ast.Call:
            calls.append(node)
        for value in (getters.get(kind) or _ast_getter(kind))(node):
            if value.__class__ is list:  # lists may hold names (global) and None: no fields
                stack.extend(value)
            elif value is not None:
                stack.append(value)
    calls.sort(key=lambda c: (c.lineno, c.col_offset, -c.end_lineno, -c.end_col_offset))
    return calls


# Fields that never hold a call: names, operators, contexts, flags, a constant's value.
_NO_CALLS = frozenset(
    {"id", "ctx", "op", "ops", "arg", "attr", "name", "names", "asname", "module", "level",
     "kind", "type_comment", "conversion", "is_async", "simple", "tag"}
)  # fmt: skip
_AST_GETTERS: dict[type, Callable[[object], tuple[object, ...]]] = {ast.Constant: lambda _: ()}


def _ast_getter(kind: type) -> Callable[[object], tuple[object, ...]]:
    """The fields of ``kind`` that may hold a call, as a tuple (none for a non-node value)."""
    getter = tuple_getter([name for name in getattr(kind, "_fields", ()) if name not in _NO_CALLS])
    _AST_GETTERS[kind] = getter
    return getter


def _same_shape(node: cst.Call, call: ast.Call) -> bool:
    if len(node.args) != len(call.args) + len(call.keywords):
        return False
    func, other = node.func, call.func
    if isinstance(func, cst.Name):
        return isinstance(other, ast.Name) and other.id == func.value
    if isinstance(func, cst.Attribute):
        return isinstance(other, ast.Attribute) and other.attr == func.attr.value
    return type(other).__name__ == type(func).__name__


def _spans_from_ast(
    tree: ast.Module, records: list[CallRecord], lines: _Lines
) -> dict[cst.Call, _Span] | None:
    calls = _ast_calls(tree)
    if len(calls) != len(records):
        return None
    spans = {}
    text = lines.text
    for record, call in zip(records, calls, strict=True):
        if not _same_shape(record.node, call):
            return None
        start = lines.offset_of_bytes(call.lineno, call.col_offset)
        func_end = lines.offset_of_bytes(call.func.end_lineno, call.func.end_col_offset)
        end = lines.offset_of_bytes(call.end_lineno, call.end_col_offset)
        lparen = _find_lparen(text, func_end)
        if lparen < 0 or text[end - 1] != ")":
            return None
        spans[record.node] = _Span(
            start, lparen, end - 1, call.lineno, start - lines.starts[call.lineno - 1]
        )
    return spans


def _spans_from_libcst(
    module: cst.Module, records: list[CallRecord], lines: _Lines, text: str
) -> dict[cst.Call, _Span]:
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    spans = {}
    for record in records:
        where, func = positions[record.node], positions[record.node.func]
        start = lines.offset(where.start.line, where.start.column)
        end = lines.offset(where.end.line, where.end.column)
        lparen = _find_lparen(text, lines.offset(func.end.line, func.end.column))
        spans[record.node] = _Span(start, lparen, end - 1, where.start.line, where.start.column)
    return spans


def _find_lparen(text: str, pos: int) -> int:
    """The "(" after a callee: only whitespace, ")" of the callee, comments may come first."""
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch == "(":
            return pos
        if ch == "#":
            while pos < n and text[pos] not in "\r\n":
                pos += 1
        elif ch in " \t\f\r\n\\)":
            pos += 1
        else:
            return -1
    return -1


def _splice(
    text: str,
    segments: list[Segment],
    sites: list[Site],
    spans: dict[cst.Call, _Span],
    lines: _Lines,
) -> Rewrite:
    result = Rewrite(None)
    starts = [segment.first_line for segment in segments]
    keys = _site_keys(segments, starts, sites, spans)
    edits: list[tuple[int, int, str]] = []  # (offset, characters replaced, new text)
    first_site: dict[int, int] = {}  # segment → local line of its first wrapped site
    for site in sites:
        record = site.record
        span = spans[record.node]
        index = bisect.bisect_right(starts, span.line) - 1
        segment = segments[index]
        key = keys[record.node]
        literal = _key_literal(key, record.quotes)
        if literal is None:
            result.notes.append(
                f"{key}: not wrapped: the call sits in an f-string whose quotes leave no way "
                "to write the site key"
            )
            continue
        local_line = span.line - segment.first_line + 1
        first_site[index] = min(first_site.get(index, local_line), local_line)
        wrapper = "acall" if record.awaited else "dcall" if site.resolved == "runtime" else "call"
        edits.append((span.start, 0, f"{PROBE}.{wrapper}({literal}, "))
        args = record.node.args
        genexp = (
            len(args) == 1
            and isinstance(args[0].value, cst.GeneratorExp)
            and not args[0].value.lpar
        )
        if genexp:  # f(x for x in y): the generator needs its own parentheses now
            edits.append((span.lparen, 1, ", ("))
            edits.append((span.rparen, 0, ")"))
        else:
            at_line_end = text[span.lparen + 1 : span.lparen + 2] in ("\n", "\r")
            edits.append((span.lparen, 1, ("," if at_line_end else ", ") if args else ""))
        callee = " ".join(text[span.start : span.lparen].split())
        first_line = text[span.start : span.rparen + 1].splitlines()[0].rstrip()
        entry: dict[str, object] = {
            "key": key,
            "line": local_line,
            "col": span.col,
            "api": site.api,
            "written": callee[:200],
            "kind": site.kind,
            "root": site.root,
            "function": record.function,
            "source": first_line[:200],
        }
        if site.resolved == "runtime":  # the probe decides when it runs (`probe.dcall`)
            entry["resolved"] = "runtime"
        if segment.cell is not None:
            entry["cell"] = segment.cell
        if site.compiled is not None:  # shown as `train_step (tf.function)` per site
            entry["compiler"] = site.compiled.compiler
            if site.compiled.unit:
                entry["unit"] = site.compiled.unit
        trains = site.compiled is not None and site.compiled.trains
        if trains or callee.rpartition(".")[2] in TRAINING_STEPS:  # where batch, epochs are read
            loop, epochs = iterated_names(record.loops), epochs_name(record.loops)
            if trains:
                entry["trains"] = True
                if site.compiled and site.compiled.optimizer:  # read where the unit is called
                    entry["optimizer"] = site.compiled.optimizer
            if loop:
                entry["loop"] = loop
            if epochs:
                entry["epochs"] = epochs
            elif loop and site.outer_epochs:  # the epoch loop is around a call of this function
                entry["epochs"], entry["epochs_in"] = site.outer_epochs
        result.sites.append(entry)
    if not result.sites:
        return result
    for index, site_line in sorted(first_site.items()):
        segment = segments[index]
        edit, note = _import_edit(segment, lines, site_line)
        if note:
            result.notes.append(f"{segment.prefix}: {note}")
            if edit[2].endswith(("\n", "\r")):
                result.inserted_lines[index] = lines.line_of(edit[0]) - segment.first_line + 1
        edits.insert(0, edit)  # first among edits at one offset: the import precedes the call
    edits.sort(key=lambda edit: edit[0])  # stable: outer calls keep their prefix first
    pieces, cursor = [], 0
    for offset, replaced, new in edits:
        pieces.append(text[cursor:offset])
        pieces.append(new)
        cursor = offset + replaced
    pieces.append(text[cursor:])
    result.text = "".join(pieces)
    return result


def _site_keys(
    segments: list[Segment], starts: list[int], sites: list[Site], spans: dict[cst.Call, _Span]
) -> dict[cst.Call, str]:
    """``prefix:line:col``; calls starting at one position (``f(x)(y)``) get ``#2``, ``#3``
    from the innermost (evaluated first) outwards, so an inner call keeps its key."""
    groups: dict[str, list[cst.Call]] = {}
    for site in sites:
        span = spans[site.record.node]
        segment = segments[bisect.bisect_right(starts, span.line) - 1]
        local = span.line - segment.first_line + 1
        groups.setdefault(f"{segment.prefix}:{local}:{span.col}", []).append(site.record.node)
    keys = {}
    for base, nodes in groups.items():
        nodes.sort(key=lambda node: spans[node].rparen)
        for index, node in enumerate(nodes):
            keys[node] = base if index == 0 else f"{base}#{index + 1}"
    return keys


def _key_literal(key: str, quotes: frozenset[str]) -> str | None:
    if not quotes:
        return json.dumps(key)
    if '"' in quotes and "'" in quotes:
        return None  # Python < 3.12 allows neither quote inside such an f-string
    plain = key.isascii() and key.isprintable() and not any(c in key for c in "\"'\\")
    if not plain:
        return None
    quote = "'" if '"' in quotes else '"'
    return f"{quote}{key}{quote}"


def _import_edit(
    segment: Segment, lines: _Lines, first_site: int
) -> tuple[tuple[int, int, str], str | None]:
    """Where the probe import goes so that no line moves (docs/internals.md §1).

    After the docstring or the last ``from __future__`` import; else before the first simple
    statement of the module when no wrapped call comes before it (compound statements without
    sites may precede it); else on a comment line, then a blank line, above the first
    statement; else, as a last resort, on a line of its own.
    """
    shift = segment.first_line - 1
    placeholders = segment.placeholders
    body = [stmt for stmt in segment.tree.body if stmt.lineno not in placeholders]
    anchor = None
    index = 0
    if body and _is_docstring(body[0]):
        anchor, index = body[0], 1
    while index < len(body) and _is_future(body[index]):
        anchor, index = body[index], index + 1
    if anchor is not None:
        end = lines.offset_of_bytes(anchor.end_lineno + shift, anchor.end_col_offset)
        return (end, 0, f"; {IMPORT}"), None
    simple = next((stmt for stmt in body if not isinstance(stmt, _COMPOUND)), None)
    if simple is not None and simple.lineno <= first_site:
        start = lines.offset_of_bytes(simple.lineno + shift, simple.col_offset)
        return (start, 0, f"{IMPORT}; "), None
    first = body[0]
    first_line = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", ()))])
    for line in range(first_line - 1, 0, -1):  # a comment line above the first statement
        content = lines.line_text(line + shift)
        stripped = content.strip()
        if line in placeholders or not stripped.startswith("#"):
            continue
        if (line == 1 and stripped.startswith("#!")) or (line <= 2 and _COOKIE.match(content)):
            continue
        return (lines.starts[line + shift - 1], 0, f"{IMPORT}  "), None
    for line in range(first_line - 1, 0, -1):
        content = lines.line_text(line + shift)
        if line not in placeholders and not content.strip():
            start = lines.starts[line + shift - 1]
            width = len(content.rstrip("\r\n"))
            return (start, width, IMPORT), f"blank line {line} now holds the probe import"
    newline = _NEWLINE.search(lines.text)
    return (
        (lines.starts[first_line + shift - 1], 0, IMPORT + (newline.group() if newline else "\n")),
        "line numbers shift by one: it starts with a compound statement and has no comment "
        "or blank line above it to hold the probe import",
    )


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _is_future(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__" and not stmt.level
