"""libcst's tree of a module, built from the CPython ``ast`` tree the instrumenter already has.

libcst's parse is two thirds of instrumenting a file, most of it making the whitespace,
punctuation and parentheses nodes that the analysis never reads: it only needs the tree's
names, expressions, statements and their nesting. This builds the same nodes, with the same
fields in the same order, from ``ast`` and leaves the trivia at their defaults, so libcst's own
scope analysis (``scopes.py``) and the resolution (``resolve.py``) run on it unchanged: the
scope rules stay libcst's. Nodes are made without running their constructors (no checks: the
source already parsed).

What cannot be rebuilt exactly raises ``Unsupported`` and the caller parses with libcst: a
``match`` statement, names that Python normalises (NFKC), a starred subscript, an f-string
inside an f-string, type parameters (Python 3.12). A test pins the rewrite on rebuilt trees to
the rewrite on parsed ones.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
import unicodedata
from collections.abc import Callable
from typing import Any

import libcst as cst

from fecomlite.instrument.cstparse import use_identity_hashes

_new = object.__new__
_set = object.__setattr__


class Unsupported(Exception):
    """A construct this module does not rebuild exactly."""


def _defaults(kind: type) -> tuple[tuple[str, Any], ...]:
    """Each field of ``kind`` that has a default, with it (made once, shared: never changed)."""
    found = []
    for field in dataclasses.fields(kind):
        if field.default is not dataclasses.MISSING:
            found.append((field.name, field.default))
        elif field.default_factory is not dataclasses.MISSING:
            found.append((field.name, field.default_factory()))
    return tuple(found)


_DEFAULTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _node(kind: type, **values: Any) -> Any:
    obj = _new(kind)
    defaults = _DEFAULTS.get(kind)
    if defaults is None:
        defaults = _DEFAULTS[kind] = _defaults(kind)
    for name, value in defaults:
        _set(obj, name, value)
    for name, value in values.items():
        _set(obj, name, value)
    return obj


def _name(value: str) -> cst.Name:
    obj = _new(cst.Name)
    _set(obj, "value", value)
    _set(obj, "lpar", ())
    _set(obj, "rpar", ())
    return obj


def _dotted(name: str) -> cst.Name | cst.Attribute:
    parts = name.split(".")
    node: cst.Name | cst.Attribute = _name(parts[0])
    for part in parts[1:]:
        node = _node(cst.Attribute, value=node, attr=_name(part))
    return node


_OPERATORS: dict[type, cst.CSTNode] = {
    ast.Add: cst.Add(), ast.Sub: cst.Subtract(), ast.Mult: cst.Multiply(),
    ast.MatMult: cst.MatrixMultiply(), ast.Div: cst.Divide(), ast.Mod: cst.Modulo(),
    ast.Pow: cst.Power(), ast.LShift: cst.LeftShift(), ast.RShift: cst.RightShift(),
    ast.BitOr: cst.BitOr(), ast.BitXor: cst.BitXor(), ast.BitAnd: cst.BitAnd(),
    ast.FloorDiv: cst.FloorDivide(), ast.And: cst.And(), ast.Or: cst.Or(),
    ast.Invert: cst.BitInvert(), ast.Not: cst.Not(), ast.UAdd: cst.Plus(),
    ast.USub: cst.Minus(), ast.Eq: cst.Equal(), ast.NotEq: cst.NotEqual(),
    ast.Lt: cst.LessThan(), ast.LtE: cst.LessThanEqual(), ast.Gt: cst.GreaterThan(),
    ast.GtE: cst.GreaterThanEqual(), ast.Is: cst.Is(), ast.IsNot: cst.IsNot(),
    ast.In: cst.In(), ast.NotIn: cst.NotIn(),
}  # fmt: skip
_AUG = cst.AddAssign()
_LPAR, _RPAR = (
    (cst.LeftParen(),),
    (cst.RightParen(),),
)  # (an augmented assignment's operator is never read)


class _Builder:
    """One module's conversion; ``text`` gives number literals their written form."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines: list[bytes] | None = None

    # -- source text

    def segment(self, node: ast.expr) -> str:
        if self.lines is None:
            self.lines = self.text.encode("utf-8").splitlines(keepends=True)
        first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[operator]
        if first == last:
            data = self.lines[first][node.col_offset : node.end_col_offset]
        else:
            data = b"".join(
                [self.lines[first][node.col_offset :], *self.lines[first + 1 : last],
                 self.lines[last][: node.end_col_offset]]
            )  # fmt: skip
        return data.decode("utf-8")

    # -- statements

    def block(self, body: list[ast.stmt]) -> cst.IndentedBlock:
        return _node(cst.IndentedBlock, body=[self.stmt(s) for s in body])

    def orelse(self, body: list[ast.stmt]) -> cst.Else | None:
        return _node(cst.Else, body=self.block(body)) if body else None

    def stmt(self, node: ast.stmt) -> cst.CSTNode:
        handler = _STATEMENTS.get(type(node))
        if handler is None:
            raise Unsupported(type(node).__name__)
        return handler(self, node)

    def function_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> cst.FunctionDef:
        _no_type_parameters(node)
        return _node(
            cst.FunctionDef,
            name=_name(node.name),
            params=self.parameters(node.args, annotated=True),
            body=self.block(node.body),
            decorators=[_node(cst.Decorator, decorator=self.expr(d)) for d in node.decorator_list],
            returns=None if node.returns is None else self.annotation(node.returns),
            asynchronous=cst.Asynchronous() if isinstance(node, ast.AsyncFunctionDef) else None,
            type_parameters=None,
        )

    def class_def(self, node: ast.ClassDef) -> cst.ClassDef:
        _no_type_parameters(node)
        bases = [self.arg(b) for b in node.bases]
        return _node(
            cst.ClassDef,
            name=_name(node.name),
            body=self.block(node.body),
            bases=bases,
            keywords=[self.keyword(k) for k in node.keywords],
            decorators=[_node(cst.Decorator, decorator=self.expr(d)) for d in node.decorator_list],
            type_parameters=None,
        )

    def return_(self, node: ast.Return) -> cst.Return:
        return _node(cst.Return, value=None if node.value is None else self.expr(node.value))

    def delete(self, node: ast.Delete) -> cst.Del:
        targets = [self.expr(t) for t in node.targets]
        if len(targets) == 1:
            return _node(cst.Del, target=targets[0])
        return _node(cst.Del, target=_node(cst.Tuple, elements=[self.element(t) for t in targets]))

    def assign(self, node: ast.Assign) -> cst.Assign:
        return _node(
            cst.Assign,
            targets=[_node(cst.AssignTarget, target=self.expr(t)) for t in node.targets],
            value=self.expr(node.value),
        )

    def aug_assign(self, node: ast.AugAssign) -> cst.AugAssign:
        return _node(
            cst.AugAssign, target=self.expr(node.target), operator=_AUG, value=self.expr(node.value)
        )

    def ann_assign(self, node: ast.AnnAssign) -> cst.AnnAssign:
        return _node(
            cst.AnnAssign,
            target=self.expr(node.target),
            annotation=self.annotation(node.annotation),
            value=None if node.value is None else self.expr(node.value),
        )

    def for_(self, node: ast.For | ast.AsyncFor) -> cst.For:
        return _node(
            cst.For,
            target=self.expr(node.target),
            iter=self.expr(node.iter),
            body=self.block(node.body),
            orelse=self.orelse(node.orelse),
            asynchronous=cst.Asynchronous() if isinstance(node, ast.AsyncFor) else None,
        )

    def while_(self, node: ast.While) -> cst.While:
        return _node(
            cst.While, test=self.expr(node.test), body=self.block(node.body),
            orelse=self.orelse(node.orelse),
        )  # fmt: skip

    def if_(self, node: ast.If) -> cst.If:
        orelse: cst.If | cst.Else | None = None
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            orelse = self.if_(node.orelse[0])  # `elif` (or an `if` alone under `else`)
        elif node.orelse:
            orelse = _node(cst.Else, body=self.block(node.orelse))
        return _node(cst.If, test=self.expr(node.test), body=self.block(node.body), orelse=orelse)

    def with_(self, node: ast.With | ast.AsyncWith) -> cst.With:
        items = [
            _node(
                cst.WithItem,
                item=self.expr(item.context_expr),
                asname=None if item.optional_vars is None
                else _node(cst.AsName, name=self.expr(item.optional_vars)),
            )
            for item in node.items
        ]  # fmt: skip
        return _node(
            cst.With, items=items, body=self.block(node.body),
            asynchronous=cst.Asynchronous() if isinstance(node, ast.AsyncWith) else None,
        )  # fmt: skip

    def raise_(self, node: ast.Raise) -> cst.Raise:
        return _node(
            cst.Raise,
            exc=None if node.exc is None else self.expr(node.exc),
            cause=None if node.cause is None else _node(cst.From, item=self.expr(node.cause)),
        )

    def try_(self, node: ast.Try) -> cst.Try | cst.TryStar:
        star = type(node).__name__ == "TryStar"
        handler_kind = cst.ExceptStarHandler if star else cst.ExceptHandler
        handlers = [
            _node(
                handler_kind,
                body=self.block(h.body),
                type=None if h.type is None else self.expr(h.type),
                name=None if h.name is None else _node(cst.AsName, name=_name(h.name)),
            )
            for h in node.handlers
        ]
        return _node(
            cst.TryStar if star else cst.Try,
            body=self.block(node.body),
            handlers=handlers,
            orelse=self.orelse(node.orelse),
            finalbody=_node(cst.Finally, body=self.block(node.finalbody))
            if node.finalbody else None,
        )  # fmt: skip

    def assert_(self, node: ast.Assert) -> cst.Assert:
        return _node(
            cst.Assert, test=self.expr(node.test),
            msg=None if node.msg is None else self.expr(node.msg),
        )  # fmt: skip

    def import_(self, node: ast.Import) -> cst.Import:
        return _node(cst.Import, names=[self.alias(a, dotted=True) for a in node.names])

    def import_from(self, node: ast.ImportFrom) -> cst.ImportFrom:
        if len(node.names) == 1 and node.names[0].name == "*":
            names: Any = cst.ImportStar()
        else:
            names = [self.alias(a, dotted=False) for a in node.names]
        return _node(
            cst.ImportFrom,
            module=None if node.module is None else _dotted(node.module),
            names=names,
            relative=[cst.Dot()] * (node.level or 0),
        )

    def alias(self, node: ast.alias, *, dotted: bool) -> cst.ImportAlias:
        return _node(
            cst.ImportAlias,
            name=_dotted(node.name) if dotted else _name(node.name),
            asname=None if node.asname is None else _node(cst.AsName, name=_name(node.asname)),
        )

    def global_(self, node: ast.Global | ast.Nonlocal) -> cst.Global | cst.Nonlocal:
        kind = cst.Global if isinstance(node, ast.Global) else cst.Nonlocal
        return _node(kind, names=[_node(cst.NameItem, name=_name(n)) for n in node.names])

    def expr_stmt(self, node: ast.Expr) -> cst.Expr:
        return _node(cst.Expr, value=self.expr(node.value))

    def simple(self, node: ast.stmt) -> cst.CSTNode:
        return {ast.Pass: cst.Pass, ast.Break: cst.Break, ast.Continue: cst.Continue}[type(node)]()

    # -- parameters and arguments

    def annotation(self, node: ast.expr) -> cst.Annotation:
        return _node(cst.Annotation, annotation=self.expr(node))

    def param(self, node: ast.arg, default: ast.expr | None, star: str, annotated: bool) -> Any:
        return _node(
            cst.Param,
            name=_name(node.arg),
            annotation=self.annotation(node.annotation)
            if annotated and node.annotation is not None else None,
            default=None if default is None else self.expr(default),
            star=star,
        )  # fmt: skip

    def parameters(self, node: ast.arguments, *, annotated: bool = False) -> cst.Parameters:
        positional = [*node.posonlyargs, *node.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(node.defaults))
        defaults += node.defaults
        made = [self.param(a, d, "", annotated) for a, d in zip(positional, defaults, strict=True)]
        cut = len(node.posonlyargs)
        star_arg: Any = cst.MaybeSentinel.DEFAULT
        if node.vararg is not None:
            star_arg = self.param(node.vararg, None, "*", annotated)
        elif node.kwonlyargs:
            star_arg = cst.ParamStar()
        return _node(
            cst.Parameters,
            params=made[cut:],
            star_arg=star_arg,
            kwonly_params=[self.param(a, d, "", annotated)
                           for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True)],
            star_kwarg=None if node.kwarg is None
            else self.param(node.kwarg, None, "**", annotated),
            posonly_params=made[:cut],
            posonly_ind=cst.ParamSlash() if cut else cst.MaybeSentinel.DEFAULT,
        )  # fmt: skip

    def arg(self, node: ast.expr) -> cst.Arg:
        if isinstance(node, ast.Starred):
            return _node(cst.Arg, value=self.expr(node.value), keyword=None, star="*")
        return _node(cst.Arg, value=self.expr(node), keyword=None, star="")

    def keyword(self, node: ast.keyword) -> cst.Arg:
        if node.arg is None:
            return _node(cst.Arg, value=self.expr(node.value), keyword=None, star="**")
        return _node(cst.Arg, value=self.expr(node.value), keyword=_name(node.arg), star="")

    # -- expressions

    def expr(self, node: ast.expr) -> Any:
        handler = _EXPRESSIONS.get(type(node))
        if handler is None:
            raise Unsupported(type(node).__name__)
        return handler(self, node)

    def element(self, node: Any) -> Any:
        if isinstance(node, ast.Starred):
            return _node(cst.StarredElement, value=self.expr(node.value))
        if isinstance(node, cst.CSTNode):
            return _node(cst.Element, value=node)
        return _node(cst.Element, value=self.expr(node))

    def call(self, node: ast.Call) -> cst.Call:
        args = [self.arg(a) for a in node.args]
        if node.keywords:
            keywords = [self.keyword(k) for k in node.keywords]
            if any(isinstance(a, ast.Starred) for a in node.args):  # interleaved: source order
                written = [*node.args, *node.keywords]
                placed = sorted(zip(written, [*args, *keywords], strict=True),
                                key=lambda p: (p[0].lineno, p[0].col_offset))  # fmt: skip
                args = [made for _, made in placed]
            else:
                args += keywords
        if len(args) == 1 and isinstance(node.args[0] if node.args else None, ast.GeneratorExp):
            inner = node.args[0]
            if (inner.end_lineno, inner.end_col_offset) == (node.end_lineno, node.end_col_offset):
                _set(args[0].value, "lpar", ())  # `f(x for x in y)`: the call's parentheses
                _set(args[0].value, "rpar", ())
        return _node(cst.Call, func=self.expr(node.func), args=args)

    def name(self, node: ast.Name) -> cst.Name:
        return _name(node.id)

    def attribute(self, node: ast.Attribute) -> cst.Attribute:
        return _node(cst.Attribute, value=self.expr(node.value), attr=_name(node.attr))

    def constant(self, node: ast.Constant) -> Any:
        value = node.value
        if value is None or value is True or value is False:
            return _name(str(value))
        if value is Ellipsis:
            return cst.Ellipsis()
        kind = type(value)
        if kind is str or kind is bytes:
            return _node(cst.SimpleString, value=repr(value))
        if kind is int:
            return _node(cst.Integer, value=self.segment(node) if self.positions else repr(value))
        if kind is float:
            return _node(cst.Float, value=repr(value))
        return _node(cst.Imaginary, value=repr(value))

    def bin_op(self, node: ast.BinOp) -> cst.BinaryOperation:
        return _node(
            cst.BinaryOperation, left=self.expr(node.left), operator=_OPERATORS[type(node.op)],
            right=self.expr(node.right),
        )  # fmt: skip

    def bool_op(self, node: ast.BoolOp) -> cst.BooleanOperation:
        operator = _OPERATORS[type(node.op)]
        made = self.expr(node.values[0])
        for value in node.values[1:]:
            made = _node(cst.BooleanOperation, left=made, operator=operator, right=self.expr(value))
        return made

    def unary_op(self, node: ast.UnaryOp) -> cst.UnaryOperation:
        return _node(
            cst.UnaryOperation, operator=_OPERATORS[type(node.op)],
            expression=self.expr(node.operand),
        )  # fmt: skip

    def compare(self, node: ast.Compare) -> cst.Comparison:
        targets = [
            _node(cst.ComparisonTarget, operator=_OPERATORS[type(op)], comparator=self.expr(c))
            for op, c in zip(node.ops, node.comparators, strict=True)
        ]
        return _node(cst.Comparison, left=self.expr(node.left), comparisons=targets)

    def lambda_(self, node: ast.Lambda) -> cst.Lambda:
        return _node(cst.Lambda, params=self.parameters(node.args), body=self.expr(node.body))

    def if_exp(self, node: ast.IfExp) -> cst.IfExp:
        return _node(
            cst.IfExp, test=self.expr(node.test), body=self.expr(node.body),
            orelse=self.expr(node.orelse),
        )  # fmt: skip

    def named_expr(self, node: ast.NamedExpr) -> cst.NamedExpr:
        return _node(cst.NamedExpr, target=self.expr(node.target), value=self.expr(node.value))

    def await_(self, node: ast.Await) -> cst.Await:
        return _node(cst.Await, expression=self.expr(node.value))

    def yield_(self, node: ast.Yield) -> cst.Yield:
        return _node(cst.Yield, value=None if node.value is None else self.expr(node.value))

    def yield_from(self, node: ast.YieldFrom) -> cst.Yield:
        return _node(cst.Yield, value=_node(cst.From, item=self.expr(node.value)))

    def sequence(self, node: ast.List | ast.Tuple | ast.Set) -> Any:
        kind = {ast.List: cst.List, ast.Tuple: cst.Tuple, ast.Set: cst.Set}[type(node)]
        return _node(kind, elements=[self.element(e) for e in node.elts])

    def dict_(self, node: ast.Dict) -> cst.Dict:
        elements = [
            _node(cst.StarredDictElement, value=self.expr(v)) if k is None
            else _node(cst.DictElement, key=self.expr(k), value=self.expr(v))
            for k, v in zip(node.keys, node.values, strict=True)
        ]  # fmt: skip
        return _node(cst.Dict, elements=elements)

    def comp_for(self, generators: list[ast.comprehension]) -> cst.CompFor:
        made = None
        for generator in reversed(generators):
            made = _node(
                cst.CompFor,
                target=self.expr(generator.target),
                iter=self.expr(generator.iter),
                ifs=[_node(cst.CompIf, test=self.expr(test)) for test in generator.ifs],
                inner_for_in=made,
                asynchronous=cst.Asynchronous() if generator.is_async else None,
            )
        assert made is not None
        return made

    def list_comp(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp) -> Any:
        kind = {ast.ListComp: cst.ListComp, ast.SetComp: cst.SetComp,
                ast.GeneratorExp: cst.GeneratorExp}[type(node)]  # fmt: skip
        made = _node(kind, elt=self.expr(node.elt), for_in=self.comp_for(node.generators))
        if kind is cst.GeneratorExp:  # parenthesised, but as a call's only argument
            _set(made, "lpar", _LPAR)
            _set(made, "rpar", _RPAR)
        return made

    def dict_comp(self, node: ast.DictComp) -> cst.DictComp:
        return _node(
            cst.DictComp, key=self.expr(node.key), value=self.expr(node.value),
            for_in=self.comp_for(node.generators),
        )  # fmt: skip

    def subscript(self, node: ast.Subscript) -> cst.Subscript:
        inner = node.slice
        # `a[1, 2]`: one element each, as libcst has them (`a[(1, 2)]` holds the same names)
        items = inner.elts if isinstance(inner, ast.Tuple) and inner.elts else [inner]
        slices = [_node(cst.SubscriptElement, slice=self.slice_(i)) for i in items]
        return _node(cst.Subscript, value=self.expr(node.value), slice=slices)

    def slice_(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Slice):
            return _node(
                cst.Slice,
                lower=None if node.lower is None else self.expr(node.lower),
                upper=None if node.upper is None else self.expr(node.upper),
                step=None if node.step is None else self.expr(node.step),
            )
        if isinstance(node, ast.Starred):
            raise Unsupported("starred subscript")
        return _node(cst.Index, value=self.expr(node))

    def joined_str(self, node: ast.JoinedStr) -> Any:
        """One f-string, or several strings written side by side (``f"a{x}" "b"``), which
        libcst keeps apart (each f-string's own quotes matter): each is parsed alone."""
        if not self.positions:
            raise Unsupported("f-string inside an f-string")
        tokens = _string_parts(self.segment(node))
        if len(tokens) == 1:
            return self.formatted_string(node, tokens[0])
        parts = []
        for token in tokens:
            alone = ast.parse(f"({token})", mode="eval").body
            if isinstance(alone, ast.JoinedStr):
                parts.append(self.formatted_string(alone, token))
            else:
                parts.append(_node(cst.SimpleString, value=token))
        made = parts[-1]
        for left in reversed(parts[:-1]):
            made = _node(cst.ConcatenatedString, left=left, right=made)
        return made

    def formatted_string(self, node: ast.JoinedStr, token: str) -> cst.FormattedString:
        start = _string_start(token)
        self.positions = False  # positions inside an f-string are not reliable
        try:
            parts = self.fstring_parts(node.values)
        finally:
            self.positions = True
        return _node(cst.FormattedString, parts=parts, start=start, end=start.lstrip("rRfFbBuU"))

    def fstring_parts(self, values: list[ast.expr]) -> list[Any]:
        parts = []
        for value in values:
            if isinstance(value, ast.Constant):
                parts.append(_node(cst.FormattedStringText, value=value.value))
            elif isinstance(value, ast.FormattedValue):
                spec = value.format_spec
                parts.append(
                    _node(
                        cst.FormattedStringExpression,
                        expression=self.expr(value.value),
                        format_spec=None if spec is None else self.fstring_parts(spec.values),
                    )
                )
            else:
                raise Unsupported(type(value).__name__)
        return parts

    positions = True


_BETWEEN_STRINGS = frozenset(
    [tokenize.OP, tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER]
)
# Python 3.12 tokenizes an f-string in parts, from its start token to its end token
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _no_type_parameters(node: ast.AST) -> None:
    if getattr(node, "type_params", None):  # Python 3.12's `def f[T]()`: a scope of its own
        raise Unsupported("type parameters")


def _string_start(token: str) -> str:
    """The prefix and opening quote of a string token: ``f"``, ``rf'''``."""
    index = 0
    while token[index] not in "'\"":
        index += 1
    quote = token[index : index + 3]
    if quote not in ('"""', "'''"):
        quote = token[index]
    return token[:index] + quote


def _string_parts(written: str) -> list[str]:
    """The strings written side by side in ``written`` (an expression's source), each as
    written: one token each, or an f-string's tokens from its start to its end (3.12)."""
    wrapped = f"({written})"
    starts = [0]
    for line in io.StringIO(wrapped).readlines():  # the lines the tokenizer counts
        starts.append(starts[-1] + len(line))
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(wrapped).readline))
    except (tokenize.TokenError, SyntaxError) as error:
        raise Unsupported("strings not tokenized alone") from error
    parts: list[str] = []
    depth = begin = 0
    for token in tokens:
        kind = token.type
        if kind == _FSTRING_START:
            if depth == 0:
                begin = starts[token.start[0] - 1] + token.start[1]
            depth += 1
        elif kind == _FSTRING_END:
            depth -= 1
            if depth == 0:
                parts.append(wrapped[begin : starts[token.end[0] - 1] + token.end[1]])
        elif depth == 0 and kind == tokenize.STRING:
            parts.append(token.string)
        elif depth == 0 and kind not in _BETWEEN_STRINGS:
            raise Unsupported("not strings alone")
    return parts


_STATEMENTS: dict[type, Callable[[_Builder, Any], Any]] = {
    ast.FunctionDef: _Builder.function_def,
    ast.AsyncFunctionDef: _Builder.function_def,
    ast.ClassDef: _Builder.class_def,
    ast.Return: _Builder.return_,
    ast.Delete: _Builder.delete,
    ast.Assign: _Builder.assign,
    ast.AugAssign: _Builder.aug_assign,
    ast.AnnAssign: _Builder.ann_assign,
    ast.For: _Builder.for_,
    ast.AsyncFor: _Builder.for_,
    ast.While: _Builder.while_,
    ast.If: _Builder.if_,
    ast.With: _Builder.with_,
    ast.AsyncWith: _Builder.with_,
    ast.Raise: _Builder.raise_,
    ast.Try: _Builder.try_,
    ast.Assert: _Builder.assert_,
    ast.Import: _Builder.import_,
    ast.ImportFrom: _Builder.import_from,
    ast.Global: _Builder.global_,
    ast.Nonlocal: _Builder.global_,
    ast.Expr: _Builder.expr_stmt,
    ast.Pass: _Builder.simple,
    ast.Break: _Builder.simple,
    ast.Continue: _Builder.simple,
}
if hasattr(ast, "TryStar"):
    _STATEMENTS[ast.TryStar] = _Builder.try_

_EXPRESSIONS: dict[type, Callable[[_Builder, Any], Any]] = {
    ast.Call: _Builder.call,
    ast.Name: _Builder.name,
    ast.Attribute: _Builder.attribute,
    ast.Constant: _Builder.constant,
    ast.BinOp: _Builder.bin_op,
    ast.BoolOp: _Builder.bool_op,
    ast.UnaryOp: _Builder.unary_op,
    ast.Compare: _Builder.compare,
    ast.Lambda: _Builder.lambda_,
    ast.IfExp: _Builder.if_exp,
    ast.NamedExpr: _Builder.named_expr,
    ast.Await: _Builder.await_,
    ast.Yield: _Builder.yield_,
    ast.YieldFrom: _Builder.yield_from,
    ast.List: _Builder.sequence,
    ast.Tuple: _Builder.sequence,
    ast.Set: _Builder.sequence,
    ast.Dict: _Builder.dict_,
    ast.ListComp: _Builder.list_comp,
    ast.SetComp: _Builder.list_comp,
    ast.GeneratorExp: _Builder.list_comp,
    ast.DictComp: _Builder.dict_comp,
    ast.Subscript: _Builder.subscript,
    ast.JoinedStr: _Builder.joined_str,
}


_WORDS = re.compile(r"\w+")
_IDENTIFIER_FIELDS = ("id", "attr", "arg", "name", "asname", "module", "names")


def _check_names_as_written(tree: ast.Module, text: str) -> None:
    """Python reads identifiers NFKC-normalised (``ﬁle`` is ``file``), libcst as written: a
    module that writes a name in a form Python changes is not rebuilt (a comment or a string
    that does is no matter)."""
    changed = {unicodedata.normalize("NFKC", word) for word in _WORDS.findall(text)
               if not unicodedata.is_normalized("NFKC", word)}  # fmt: skip
    for node in ast.walk(tree):
        for field in _IDENTIFIER_FIELDS:
            value = getattr(node, field, None)
            names = value if isinstance(value, list) else [value]
            if any(isinstance(n, str) and not changed.isdisjoint(n.split(".")) for n in names):
                raise Unsupported("names Python normalises")


def module_from_ast(tree: ast.Module, text: str) -> cst.Module:
    """libcst's tree of ``text`` (parsed as ``tree``) for the analysis; raises ``Unsupported``
    where it would not be libcst's own."""
    if not text.isascii() and not unicodedata.is_normalized("NFKC", text):
        _check_names_as_written(tree, text)
    use_identity_hashes()
    builder = _Builder(text)
    return _node(cst.Module, body=[builder.stmt(s) for s in tree.body])
