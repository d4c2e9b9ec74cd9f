"""libcst's scope analysis, without its idle traversals.

``MetadataWrapper.resolve(ScopeProvider)`` walks the tree five times: ``ExpressionContextProvider``
and ``ScopeProvider`` each do their work in a visitor of their own from ``visit_Module``, the
batching machinery then walks every node again for each of them doing nothing, and the resolver
ends with one more batched walk with no visitor at all. Here libcst's ``ScopeVisitor`` runs once,
through the provider hook libcst documents for custom providers (``_gen_impl`` filling
``set_metadata``), and the expression contexts it needs (is a name stored, loaded or deleted?)
come from the fast field walk of ``cstwalk``, following libcst's ``ExpressionContextVisitor``
rule for rule; tests pin both to libcst's own providers. Should a libcst release move
``ScopeVisitor``, the stock ``ScopeProvider`` is used instead.
"""

from __future__ import annotations

from collections.abc import Mapping
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

LOAD, STORE, DEL = ExpressionContext.LOAD, ExpressionContext.STORE, ExpressionContext.DEL


def expression_contexts(module: cst.Module) -> dict[cst.CSTNode, ExpressionContext]:
    """What libcst's ``ExpressionContextProvider`` gives, from one fast walk.

    Targets of assignments, loops, ``as`` clauses, walrus, definitions and parameters are
    stored, ``del`` targets deleted, everything else loaded; an attribute's base and a
    subscript's base and index are always loaded, and ``Attribute.attr`` gets no context.
    """
    out: dict[cst.CSTNode, ExpressionContext] = {}

    def parts(node: cst.CSTNode, names: tuple[str, ...], context: ExpressionContext) -> None:
        for name in names:
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                walk(value, context)
            elif value is not None:
                for item in value:
                    walk(item, context)

    def walk(node: cst.CSTNode, context: ExpressionContext) -> None:
        kind = type(node)
        if kind is cst.Name:
            out[node] = context
        elif kind is cst.Attribute:
            out[node] = context
            walk(node.value, LOAD)
        elif kind is cst.Subscript:
            out[node] = context
            walk(node.value, LOAD)
            for element in node.slice:
                walk(element, LOAD)
        elif kind in _TARGET_FIRST:
            walk(node.target, STORE)
            parts(node, _TARGET_FIRST[kind], context)
        elif kind is cst.Assign:
            for target in node.targets:
                walk(target, STORE)
            walk(node.value, context)
        elif kind is cst.AsName:
            walk(node.name, STORE)
        elif kind is cst.Del:
            walk(node.target, DEL)
        elif kind is cst.ClassDef or kind is cst.FunctionDef or kind is cst.Param:
            walk(node.name, STORE)
            parts(node, _DEFINITION_PARTS[kind], context)
        else:
            if kind is cst.Tuple or kind is cst.List or kind is cst.StarredElement:
                out[node] = context
            for child in children(node):
                walk(child, context)

    walk(module, LOAD)
    return out


# Nodes whose `target` is stored, then the other parts visited as they are.
_TARGET_FIRST: dict[type, tuple[str, ...]] = {
    cst.AnnAssign: ("annotation", "value"),
    cst.AugAssign: ("value",),
    cst.NamedExpr: ("value",),
    cst.CompFor: ("iter", "ifs", "inner_for_in"),
    cst.For: ("iter", "body", "orelse"),
}
_DEFINITION_PARTS: dict[type, tuple[str, ...]] = {
    cst.ClassDef: ("body", "bases", "keywords", "decorators"),
    cst.FunctionDef: ("params", "body", "decorators", "returns"),
    cst.Param: ("annotation", "default"),
}


class _Scopes(BaseMetadataProvider["Scope | None"]):
    """libcst's scopes, computed in one traversal from already computed contexts."""

    def __init__(self, contexts: Mapping[cst.CSTNode, ExpressionContext]) -> None:
        super().__init__()
        self._contexts = contexts
        self.typing_calls = True  # whether the module may call typing.NewType/TypeVar/cast

    def _gen_impl(self, module: cst.Module) -> None:
        _install_read_only_visits()
        visitor = _ReadOnlyScopeVisitor(self)
        visitor.walk(module)
        visitor.infer_accesses()

    def get_metadata(self, key: Any, node: cst.CSTNode, default: Any = None) -> Any:
        if key is ExpressionContextProvider:  # all ScopeVisitor ever asks for
            return self._contexts.get(node, default)
        return super().get_metadata(key, node, default)


def resolve_scopes(
    module: cst.Module, source: str | None = None
) -> Mapping[cst.CSTNode, Scope | None]:
    """The scope of every node of ``module``, as ``ScopeProvider`` gives it; ``source``, the
    module's text where known, lets calls skip a check only ``typing`` calls need."""
    if ScopeVisitor is None:
        return MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    scopes = _Scopes(expression_contexts(module))
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
