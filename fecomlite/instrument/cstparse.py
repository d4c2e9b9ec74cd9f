"""libcst's parse without validating, node by node, the tree its own parser just built.

Every libcst node checks its fields when it is made (``CSTNode.__post_init__`` calls
``_validate``): the guard for trees built by hand. A tree from ``parse_module`` is valid by
construction, and the checks are a fifth of the parse (libcst's own comment there says as
much). Here they are skipped for the parses this module makes, on the thread that makes them;
every other node, in any thread, is still checked.
"""

from __future__ import annotations

import threading

import libcst as cst

_state = threading.local()
_stock_post_init = cst.CSTNode.__post_init__


def _post_init(node: cst.CSTNode) -> None:
    if not getattr(_state, "parsing", False):
        node._validate()


def parse_module(text: str) -> cst.Module:
    """``libcst.parse_module(text)``, its parser's output trusted."""
    if cst.CSTNode.__post_init__ is _stock_post_init:  # installed on first use, and left:
        cst.CSTNode.__post_init__ = _post_init  # type: ignore[method-assign]  # setting it
    _state.parsing = True  # empties the type caches of every node class
    try:
        return cst.parse_module(text)
    finally:
        _state.parsing = False
