"""A fast, read-only walk over libcst trees: the child fields of each node type, in source order.

libcst's own traversal (``node.visit``) rebuilds every node it passes, which costs more than the
analyses built on it; reading the dataclass fields directly is several times faster. Fields that
only ever hold whitespace, punctuation or plain strings are skipped.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence

import libcst as cst

_TRIVIA = frozenset(
    [
        "lpar",
        "rpar",
        "comma",
        "leading_lines",
        "lines_after_decorators",
        "header",
        "footer",
        "semicolon",
        "colon",
        "equal",
        "star",
        "operator",
        "asynchronous",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "dot",
        "newline",
        "indent",
        "conversion",
        "start",
        "end",
        "whitespace",
        "prefix",
        "quote",
        "value_str",
        "trailing_whitespace",
    ]
)
# Field orders that differ from source order (calls must be met in source order).
_ORDER: dict[type, tuple[str, ...]] = {
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
    cst.MatchCase: ("pattern", "guard", "body"),
    cst.Parameters: (
        "posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"
    ),
    cst.Arg: ("keyword", "value"),
}  # fmt: skip
_FIELDS: dict[type, tuple[str, ...]] = {}


def fields(tp: type) -> tuple[str, ...]:
    """Names of the fields of node type ``tp`` that may hold nodes, in source order."""
    names = _FIELDS.get(tp)
    if names is None:
        declared = [f.name for f in dataclasses.fields(tp)]
        order = _ORDER.get(tp, ())
        names = tuple(n for n in order if n in declared) + tuple(
            n
            for n in declared
            if n not in order and n not in _TRIVIA and not n.startswith("whitespace")
        )
        _FIELDS[tp] = names
    return names


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of ``node`` (trivia excluded), in source order."""
    kind = type(node)
    getter = _GETTERS.get(kind) or _getter(kind)
    found: list[cst.CSTNode] = []
    is_node = _IS_NODE
    for value in getter(node):
        cls = value.__class__
        if cls is tuple or cls is list:
            found.extend([item for item in value if is_node[item.__class__]])
        elif is_node[cls]:
            found.append(value)
    return found


class _NodeClasses(dict[type, bool]):
    """``issubclass(cls, CSTNode)`` by class, remembered (an ABC's subclass check is slow):
    a plain dict lookup once a class is known."""

    def __missing__(self, cls: type) -> bool:
        known = self[cls] = issubclass(cls, cst.CSTNode)
        return known


_GETTERS: dict[type, Callable[[cst.CSTNode], tuple[object, ...]]] = {}
_IS_NODE = _NodeClasses()


def _getter(kind: type) -> Callable[[cst.CSTNode], tuple[object, ...]]:
    """A C-level reader of the node fields of ``kind``, always giving a tuple."""
    getter = tuple_getter(fields(kind))
    _GETTERS[kind] = getter
    return getter


def tuple_getter(names: Sequence[str]) -> Callable[[object], tuple[object, ...]]:
    """A reader of the attributes `names` of an object as a tuple, at C level where it can be
    (`operator.attrgetter` gives a bare value for one name, and cannot take none)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        one = operator.attrgetter(names[0])
        return lambda node: (one(node),)
    return lambda node: ()

