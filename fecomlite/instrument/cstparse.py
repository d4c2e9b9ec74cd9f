"""libcst's parse without validating, node by node, the tree its own parser just built.

Every libcst node checks its fields when it is made (``CSTNode.__post_init__`` calls
``_validate``): the guard for trees built by hand. A tree from ``parse_module`` is valid by
construction, and the checks are a fifth of the parse (libcst's own comment there says as
much). Here they are skipped for the parses this module makes, on the thread that makes them;
every other node, in any thread, is still checked.

Nodes, scopes, accesses and assignments hash by identity, through a Python ``__hash__``
(``return id(self)``) that every dict and set of the analyses calls, hundreds of thousands of
times a file; CPython's own identity hash (``object.__hash__``, a C slot) is put in its place:
equality stays identity, only the hash's value differs, and that was an address already.
"""

from __future__ import annotations

import threading

import libcst as cst
from libcst.metadata import scope_provider

_state = threading.local()
_stock_post_init = cst.CSTNode.__post_init__
_state_of_hashes = {"installed": False}


def _post_init(node: cst.CSTNode) -> None:
    if not getattr(_state, "parsing", False):
        node._validate()


def parse_module(text: str) -> cst.Module:
    """``libcst.parse_module(text)``, its parser's output trusted."""
    if cst.CSTNode.__post_init__ is _stock_post_init:  # installed on first use, and left:
        cst.CSTNode.__post_init__ = _post_init  # type: ignore[method-assign]  # setting it
        use_identity_hashes()  # empties the type caches of every node class
    _state.parsing = True
    try:
        return cst.parse_module(text)
    finally:
        _state.parsing = False


def use_identity_hashes() -> None:
    """``object.__hash__`` in place of libcst's ``return id(self)``: in every node class (each
    gets ``CSTNode``'s copied into it) and in the scope analysis's accesses, assignments and
    scopes (which define no ``__eq__``: equality is identity there too). Installed once, for
    parsed trees and for trees built from ``ast`` (``astcst.py``) alike."""
    if _state_of_hashes["installed"]:
        return
    _state_of_hashes["installed"] = True
    stock = cst.CSTNode.__dict__["__hash__"]
    nodes: list[type] = [cst.CSTNode]
    while nodes:
        kind = nodes.pop()
        nodes.extend(kind.__subclasses__())
        if kind.__dict__.get("__hash__") is stock:
            kind.__hash__ = object.__hash__  # type: ignore[method-assign,assignment]
    for kind in (scope_provider.Access, scope_provider.BaseAssignment, scope_provider.Scope):
        if "__eq__" not in kind.__dict__:
            kind.__hash__ = object.__hash__  # type: ignore[method-assign,assignment]
