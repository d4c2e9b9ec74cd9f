"""libcst's scope analysis, without its idle traversals.

``MetadataWrapper.resolve(ScopeProvider)`` walks the tree five times: ``ExpressionContextProvider``
and ``ScopeProvider`` each do their work in a visitor of their own from ``visit_Module``, the
batching machinery then walks every node again for each of them doing nothing, and the resolver
ends with one more batched walk with no visitor at all. Here libcst's ``ScopeVisitor`` runs once,
through the provider hook libcst documents for custom providers (``_gen_impl`` filling
``set_metadata``). The one expression context it asks for (is a name stored? loaded and deleted
names are both accesses) is marked in the same walk: entering a binding node marks the names its
target stores, by libcst's ``ExpressionContextVisitor`` rules; a test pins the scopes to libcst's
own provider. Should a libcst release move ``ScopeVisitor``, the stock ``ScopeProvider`` is used
instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import libcst as cst
from libcst.metadata import (
    BaseMetadataProvider,
    ExpressionContext,
    ExpressionContextProvider,
    MetadataWrapper,
    ScopeProvider,
)
from libcst.metadata.scope_provider import Scope

from fecomlite.instrument.cstwalk import children

try:
    from libcst.metadata.scope_provider import _ASSIGNMENT_LIKE_NODES, ScopeVisitor
except ImportError:  # pragma: no cover - a libcst that reorganised its internals
    ScopeVisitor = None

STORE = ExpressionContext.STORE


def _store(target: cst.CSTNode, stored: set[cst.CSTNode]) -> None:
    """The names a binding target stores: through tuples, lists and starred elements, not
    into an attribute's base or a subscript (those are loaded)."""
    kind = type(target)
    if kind is cst.Name:
        stored.add(target)
    elif kind is not cst.Attribute and kind is not cst.Subscript:
        for child in children(target):
            _store(child, stored)


def _store_targets(node: cst.Assign, stored: set[cst.CSTNode]) -> None:
    for target in node.targets:
        _store(target.target, stored)


# What each binding node stores, marked when the walk enters it (before its names are met).
_BINDERS: dict[type, Callable[[Any, set[cst.CSTNode]], None]] = {
    cst.Assign: _store_targets,
    cst.AnnAssign: lambda node, stored: _store(node.target, stored),
    cst.AugAssign: lambda node, stored: _store(node.target, stored),
    cst.NamedExpr: lambda node, stored: _store(node.target, stored),
    cst.For: lambda node, stored: _store(node.target, stored),
    cst.CompFor: lambda node, stored: _store(node.target, stored),
    # (libcst's visitor enters a comprehension's first `for` without walking it)
    cst.ListComp: lambda node, stored: _store(node.for_in.target, stored),
    cst.SetComp: lambda node, stored: _store(node.for_in.target, stored),
    cst.DictComp: lambda node, stored: _store(node.for_in.target, stored),
    cst.GeneratorExp: lambda node, stored: _store(node.for_in.target, stored),
    cst.AsName: lambda node, stored: _store(node.name, stored),
    cst.ClassDef: lambda node, stored: stored.add(node.name),
    cst.FunctionDef: lambda node, stored: stored.add(node.name),
    cst.Param: lambda node, stored: stored.add(node.name),
}


class _Scopes(BaseMetadataProvider["Scope | None"]):
    """libcst's scopes, computed in one traversal from already computed contexts."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: set[cst.CSTNode] = set()  # the names bound (all others are loaded)
        self.typing_calls = True  # whether the module may call typing.NewType/TypeVar/cast

    def _gen_impl(self, module: cst.Module) -> None:
        _install_read_only_visits()
        visitor = _ReadOnlyScopeVisitor(self)
        visitor.walk(module)
        visitor.infer_accesses()

    def get_metadata(self, key: Any, node: cst.CSTNode, default: Any = None) -> Any:
        if key is ExpressionContextProvider:  # all ScopeVisitor ever asks for, of a name:
            return STORE if node in self.stored else default  # stored, or else an access
        return super().get_metadata(key, node, default)


def resolve_scopes(
    module: cst.Module, source: str | None = None
) -> Mapping[cst.CSTNode, Scope | None]:
    """The scope of every node of ``module``, as ``ScopeProvider`` gives it; ``source``, the
    module's text where known, lets calls skip a check only ``typing`` calls need."""
    if ScopeVisitor is None:
        return MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    scopes = _Scopes()
    scopes.typing_calls = source is None or any(word in source for word in _TYPING_CALLS)
    scopes._gen_impl(module)
    return scopes._computed


# ``ScopeVisitor`` looks up the qualified name of every call, for these alone (a call of
# ``typing.cast`` is written with the word, whatever the import).
_TYPING_CALLS = ("NewType", "TypeVar", "cast")


if ScopeVisitor is not None:

    class _ReadOnlyScopeVisitor(ScopeVisitor):
        """libcst's ``ScopeVisitor`` walked without rebuilding the tree.

        ``CSTNode.visit`` rebuilds every node it passes (a visitor cannot change the tree, but
        the copies are made and validated all the same): most of the scope analysis's time.
        Here the visitor's own hooks run in the same order over the same nodes, trivia (which
        holds no names) left out, and the nested ``child.visit(self)`` calls the visitor makes
        come back to this walk (``_read_only_visits``).
        """

        def walk(self, node: cst.CSTNode) -> None:
            kind = type(node)
            hooks = _HOOKS.get(kind) or _hooks(kind)
            visit, leave, assigns = hooks
            binds = _BINDERS.get(kind)
            # (a string annotation's own parse is not in the tree: libcst gives it no contexts)
            if binds is not None and self._ScopeVisitor__last_string_annotation is None:
                binds(node, self.provider.stored)
            if visit is None or visit(self, node) is not False:
                for child in children(node):
                    self.walk(child)
            # libcst's ``ScopeVisitor.on_leave``, its isinstance over a tuple of ABCs made once
            # per node type
            self.provider._computed[node] = self.scope
            if assigns:
                self.scope._assignment_count += 1
            if leave is not None:
                leave(self, node)

        def visit_Call(self, node: cst.Call) -> bool | None:
            if self.provider.typing_calls:
                return super().visit_Call(node)
            # what libcst's visit_Call does for every other call
            self._ScopeVisitor__top_level_attribute_stack.append(None)
            self._ScopeVisitor__in_type_hint_stack.append(False)
            return True

    _HOOKS: dict[type, tuple[Any, Any, bool]] = {}

    def _hooks(kind: type) -> tuple[Any, Any, bool]:
        """The visitor's ``visit_X`` and ``leave_X`` for node type X, and whether leaving one
        counts as an assignment (the order libcst's accesses are resolved by)."""
        name = kind.__name__
        assigns = issubclass(kind, _ASSIGNMENT_LIKE_NODES)
        found = (getattr(_ReadOnlyScopeVisitor, f"visit_{name}", None),
                 getattr(_ReadOnlyScopeVisitor, f"leave_{name}", None), assigns)  # fmt: skip
        _HOOKS[kind] = found
        return found

    _stock_visit = cst.CSTNode.visit

    def _visit(node: cst.CSTNode, visitor: Any) -> Any:
        if type(visitor) is _ReadOnlyScopeVisitor:
            visitor.walk(node)
            return node
        return _stock_visit(node, visitor)

    def _install_read_only_visits() -> None:
        """``CSTNode.visit`` sends this module's visitor to its read-only walk (any other
        visitor, in any thread, gets libcst's own). Installed on first use and left there:
        setting a class attribute empties the type caches of every node class."""
        if cst.CSTNode.visit is not _visit:
            cst.CSTNode.visit = _visit  # type: ignore[method-assign]
