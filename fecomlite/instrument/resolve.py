"""Which calls of a module reach a framework API, and under which canonical name.

Two passes over one libcst tree:

1. ``collect`` walks the tree once (``cstwalk``: libcst's own traversal costs more than the
   analysis) and records every call, binding, function and class.
2. ``Resolver`` gives each expression an abstract value. Names go through libcst's scope
   analysis (``scopes.py``: which assignments an access sees, import qualified names); values
   then follow attributes, calls, assignments, ``self.x = ...`` attributes, function returns,
   parameter annotations and the arguments of calls within the module.

Values: ``Api`` (a module/class/function under a root), ``Obj`` (something a framework call
returned), ``Compiled`` (a graph-compiled unit), and the user's own classes, instances,
functions and ``super()``, and what the project's other modules export (``exports.py``:
framework subclasses, their instances, framework objects bound at module level). Naming rules
are documented in ``names.py``.

Bodies that frameworks compile into graphs (``@tf.function``, ``torch.jit.script``,
``torch.compile``, Keras ``call``/``train_step``, and user code they call) are not
instrumented inside; calling them is one ``compiled`` site.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import BuiltinAssignment, ImportAssignment
from libcst.metadata.scope_provider import Scope

from fecomlite.instrument.cstwalk import children
from fecomlite.instrument.exports import Export, ProjectView, StarNames
from fecomlite.instrument.names import (
    COMPILER_GUARDS,
    COMPILERS,
    KERAS_GRAPH_METHODS,
    RESULT,
    Roots,
    canonical,
    compiled_api,
    compiled_type,
    factory_class,
    is_class_name,
)
from fecomlite.instrument.star import star_names
from fecomlite.runtime.hyperparams import TRAINING_STEPS

# ----------------------------------------------------------------------------- pass 1: collect

_DefNode = cst.FunctionDef | cst.Lambda | cst.ClassDef


@dataclass(eq=False)
class ClassInfo:
    node: cst.ClassDef
    qualname: str
    methods: dict[str, FuncInfo] = field(default_factory=dict)
    attrs: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)


@dataclass(eq=False)
class FuncInfo:
    node: cst.FunctionDef
    qualname: str
    cls: ClassInfo | None  # set for methods defined directly in a class body
    returns: list[cst.BaseExpression] = field(default_factory=list)
    params: list[cst.Param] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.node.name.value

    def decorator_names(self) -> set[str]:
        return {get_full_name_for_node(d.decorator) or "" for d in self.node.decorators}


@dataclass(eq=False)
class CallRecord:
    node: cst.Call
    function: str  # enclosing def qualname, "<module>" at top level
    cls: ClassInfo | None  # innermost enclosing class (what super() refers to)
    chain: tuple[_DefNode, ...]  # enclosing defs, lambdas and classes, outermost first
    quotes: frozenset[str]  # quote characters of enclosing f-strings
    in_annotation: bool
    awaited: bool = False  # `await f(x)`: the probe must time the await, not the call
    loops: tuple[cst.BaseExpression, ...] = ()  # what enclosing `for`s iterate, innermost first


@dataclass(eq=False)
class Collected:
    calls: list[CallRecord] = field(default_factory=list)
    bindings: dict[cst.Name, cst.BaseExpression] = field(default_factory=dict)
    order: dict[cst.CSTNode, int] = field(default_factory=dict)
    functions: dict[cst.FunctionDef, FuncInfo] = field(default_factory=dict)
    classes: dict[cst.ClassDef, ClassInfo] = field(default_factory=dict)
    params: dict[cst.Param, tuple[FuncInfo, int]] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)


class _Collector:
    """The single walk of pass 1; keeps the enclosing context on explicit stacks."""

    def __init__(self) -> None:
        self.out = Collected()
        self.func: FuncInfo | None = None
        self.cls: ClassInfo | None = None  # class whose body we are directly in
        self.owner: ClassInfo | None = None  # innermost enclosing class (for super())
        self.qual: list[str] = []
        self.chain: tuple[_DefNode, ...] = ()
        self.quotes: frozenset[str] = frozenset()
        self.in_annotation = False
        self.awaiting: cst.BaseExpression | None = None  # the operand of the innermost await
        self.loops: tuple[cst.BaseExpression, ...] = ()  # in the innermost def, innermost first
        self.counter = 0

    def walk(self, node: cst.CSTNode) -> None:
        handler = _HANDLERS.get(type(node))
        if handler is not None:
            handler(self, node)
        else:
            self.children(node)

    def children(self, node: cst.CSTNode) -> None:
        for child in children(node):
            self.walk(child)

    def mark(self, node: cst.CSTNode) -> None:
        self.counter += 1
        self.out.order[node] = self.counter

    # -- handlers

    def call(self, node: cst.Call) -> None:
        self.out.calls.append(
            CallRecord(
                node=node,
                function=".".join(self.qual) or "<module>",
                cls=self.owner,
                chain=self.chain,
                quotes=self.quotes,
                in_annotation=self.in_annotation,
                awaited=node is self.awaiting,
                loops=self.loops,
            )
        )
        self.children(node)

    def await_(self, node: cst.Await) -> None:
        saved = self.awaiting
        self.awaiting = node.expression
        self.children(node)
        self.awaiting = saved

    def function_def(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            self.walk(decorator)
        qualname = ".".join([*self.qual, node.name.value])
        info = FuncInfo(node=node, qualname=qualname, cls=self.cls)
        self.out.functions[node] = info
        if self.cls is not None:
            self.cls.methods[node.name.value] = info
        self.mark(node)
        params = node.params
        every = (*params.posonly_params, *params.params)
        for index, param in enumerate(every):
            self.out.params[param] = (info, index)
        info.params = [*every, *params.kwonly_params]
        for param in info.params:
            self.out.params.setdefault(param, (info, -1))
        self.walk(params)  # defaults run in the enclosing scope, at definition time
        if node.returns is not None:
            self.walk(node.returns)
        saved = (self.func, self.cls, self.chain, self.loops)
        self.func, self.cls, self.chain, self.loops = info, None, (*self.chain, node), ()
        self.qual.append(node.name.value)
        self.walk(node.body)
        self.qual.pop()
        self.func, self.cls, self.chain, self.loops = saved

    def class_def(self, node: cst.ClassDef) -> None:
        for decorator in node.decorators:
            self.walk(decorator)
        for arg in (*node.bases, *node.keywords):
            self.walk(arg)
        info = ClassInfo(node=node, qualname=".".join([*self.qual, node.name.value]))
        self.out.classes[node] = info
        self.mark(node)
        saved = (self.func, self.cls, self.owner, self.chain)
        self.func, self.cls, self.owner, self.chain = None, info, info, (*self.chain, node)
        self.qual.append(node.name.value)
        self.walk(node.body)
        self.qual.pop()
        self.func, self.cls, self.owner, self.chain = saved

    def lambda_(self, node: cst.Lambda) -> None:
        self.walk(node.params)
        saved = self.chain
        self.chain = (*self.chain, node)
        self.walk(node.body)
        self.chain = saved

    def param(self, node: cst.Param) -> None:
        self.mark(node)
        self.children(node)

    def annotation(self, node: cst.Annotation) -> None:
        saved = self.in_annotation
        self.in_annotation = True
        self.children(node)
        self.in_annotation = saved

    def formatted_string(self, node: cst.FormattedString) -> None:
        saved = self.quotes
        self.quotes = self.quotes | {node.start[-1]}
        self.children(node)
        self.quotes = saved

    def assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self.bind(target.target, node.value)
        self.children(node)

    def ann_assign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.bind(node.target, node.value)
        self.children(node)

    def named_expr(self, node: cst.NamedExpr) -> None:
        self.bind(node.target, node.value)
        self.children(node)

    def with_item(self, node: cst.WithItem) -> None:
        if node.asname is not None:  # context managers of frameworks enter as themselves
            self.bind(node.asname.name, node.item)
        self.children(node)

    def return_(self, node: cst.Return) -> None:
        if self.func is not None and node.value is not None:
            self.func.returns.append(node.value)
        self.children(node)

    def import_from(self, node: cst.ImportFrom) -> None:
        self.mark(node)
        if isinstance(node.names, cst.ImportStar):
            dots = "." * len(node.relative)
            module = get_full_name_for_node(node.module) if node.module else ""
            self.out.star_imports.append(dots + (module or ""))

    def import_(self, node: cst.Import) -> None:
        self.mark(node)

    def for_(self, node: cst.For | cst.CompFor) -> None:
        self.mark_targets(node.target)
        if isinstance(node, cst.CompFor):
            self.children(node)
            return
        self.walk(node.target)
        self.walk(node.iter)
        saved = self.loops
        self.loops = (node.iter, *saved)
        self.walk(node.body)
        self.loops = saved
        if node.orelse is not None:
            self.walk(node.orelse)

    def aug_assign(self, node: cst.AugAssign) -> None:
        self.mark_targets(node.target)
        self.children(node)

    def except_handler(self, node: cst.ExceptHandler | cst.ExceptStarHandler) -> None:
        if node.name is not None:
            self.mark_targets(node.name.name)
        self.children(node)

    def mark_targets(self, target: cst.BaseExpression) -> None:
        """Bindings whose value is unknown still count as the latest assignment of a name."""
        if isinstance(target, cst.Name):
            self.mark(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self.mark_targets(element.value)
        elif isinstance(target, cst.StarredElement):
            self.mark_targets(target.value)

    def bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self.out.bindings[target] = value
            self.mark(target)
        elif isinstance(target, cst.Attribute):
            self.bind_attribute(target, value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else ()
            if len(target.elements) == len(values) and not any(
                isinstance(e, cst.StarredElement) for e in (*target.elements, *values)
            ):
                for t, v in zip(target.elements, values, strict=True):
                    self.bind(t.value, v.value)
            else:
                self.mark_targets(target)

    def bind_attribute(self, target: cst.Attribute, value: cst.BaseExpression) -> None:
        """``self.x = value`` in a method: an attribute of the method's class."""
        func = self.func
        if func is None or func.cls is None or not func.params:
            return
        receiver = target.value
        if isinstance(receiver, cst.Name) and receiver.value == func.params[0].name.value:
            func.cls.attrs.setdefault(target.attr.value, []).append(value)


def _class_body_binding(
    collector: _Collector, target: cst.BaseExpression, value: cst.BaseExpression
) -> None:
    if collector.cls is not None and isinstance(target, cst.Name):
        collector.cls.attrs.setdefault(target.value, []).append(value)


def _assign_in_class(collector: _Collector, node: cst.Assign) -> None:
    for target in node.targets:
        _class_body_binding(collector, target.target, node.value)
    collector.assign(node)


def _ann_assign_in_class(collector: _Collector, node: cst.AnnAssign) -> None:
    if node.value is not None:
        _class_body_binding(collector, node.target, node.value)
    collector.ann_assign(node)


_HANDLERS: dict[type, Any] = {
    cst.Call: _Collector.call,
    cst.Await: _Collector.await_,
    cst.FunctionDef: _Collector.function_def,
    cst.ClassDef: _Collector.class_def,
    cst.Lambda: _Collector.lambda_,
    cst.Param: _Collector.param,
    cst.Annotation: _Collector.annotation,
    cst.FormattedString: _Collector.formatted_string,
    cst.Assign: _assign_in_class,
    cst.AnnAssign: _ann_assign_in_class,
    cst.NamedExpr: _Collector.named_expr,
    cst.WithItem: _Collector.with_item,
    cst.Return: _Collector.return_,
    cst.For: _Collector.for_,
    cst.CompFor: _Collector.for_,
    cst.AugAssign: _Collector.aug_assign,
    cst.ExceptHandler: _Collector.except_handler,
    cst.ExceptStarHandler: _Collector.except_handler,
    cst.Name: lambda self, node: None,
    cst.FormattedStringText: lambda self, node: None,
    cst.ImportFrom: _Collector.import_from,
    cst.Import: _Collector.import_,
    cst.SimpleString: lambda self, node: None,
    cst.Integer: lambda self, node: None,
    cst.Float: lambda self, node: None,
}


def iterated_names(iterables: Iterable[cst.BaseExpression]) -> list[str]:
    """The names loops iterate, innermost loop first: ``train_loader`` in ``for i, (x, y) in
    enumerate(train_loader)``; a called name (``enumerate``) is not one."""
    found: list[str] = []

    def add(expr: cst.BaseExpression) -> None:
        if isinstance(expr, (cst.Name, cst.Attribute)):
            name = get_full_name_for_node(expr)
            if name and name not in found:
                found.append(name)
        elif isinstance(expr, cst.Call):
            for arg in expr.args:
                add(arg.value)
        elif isinstance(expr, (cst.Tuple, cst.List)):
            for element in expr.elements:
                add(element.value)

    for iterable in iterables:
        add(iterable)
    return found


def epochs_name(loops: tuple[cst.BaseExpression, ...]) -> str | None:
    """``EPOCHS`` when the loop around the innermost one iterates ``range(EPOCHS)`` (or
    ``range(0, EPOCHS)``, ``range(1, EPOCHS + 1)``): the passes it makes over that loop."""
    return range_bound(loops[1]) if len(loops) >= 2 else None


def range_bound(outer: cst.BaseExpression) -> str | None:
    """``N`` for ``range(N)``, ``range(0, N)`` and ``range(1, N + 1)`` with ``N`` a plain or
    dotted name (read by the probe, never evaluated): the number of passes."""
    if not isinstance(outer, cst.Call):
        return None
    keyworded = any(a.keyword or a.star for a in outer.args)
    if keyworded or get_full_name_for_node(outer.func) != "range":
        return None
    args = [a.value for a in outer.args]
    if len(args) == 2 and _integer(args[0]) == 0:
        args = args[1:]
    elif (
        len(args) == 2
        and _integer(args[0]) == 1
        and isinstance(args[1], cst.BinaryOperation)
        and isinstance(args[1].operator, cst.Add)
        and _integer(args[1].right) == 1
    ):
        args = [args[1].left]
    if len(args) != 1 or not isinstance(args[0], (cst.Name, cst.Attribute)):
        return None
    return get_full_name_for_node(args[0])


def _integer(node: cst.BaseExpression) -> int | None:
    return int(node.value) if isinstance(node, cst.Integer) and node.value.isdigit() else None


def collect(module: cst.Module) -> Collected:
    """Pass 1: every call (in source order), binding, function and class of ``module``."""
    collector = _Collector()
    collector.walk(module)
    return collector.out


# ----------------------------------------------------------------------------- pass 2: values


@dataclass(frozen=True, slots=True)
class Api:
    """A module, class or function reached through an import of (or towards) a root."""

    raw: str  # qualified name as imported, before canonicalisation


@dataclass(frozen=True, slots=True)
class Obj:
    """An object a framework call returned; ``member``: reached as an attribute of one;
    ``returned``: of unknown type, ``type`` then names the call that returned it."""

    type: str
    member: bool = False
    returned: bool = False


@dataclass(frozen=True, slots=True)
class Compiled:
    """What a graph compiler returned for the user's function or class ``unit``."""

    compiler: str  # "tensorflow.function"
    type: str | None  # its public type ("tensorflow.types.experimental.PolymorphicFunction")
    unit: str  # "train_step", "Net"; "" when unknown
    trains: bool = False  # the unit's body steps an optimizer or calls backward
    optimizer: str = ""  # the name it steps (`optimizer.apply_gradients`), if one plain name

    @property
    def api(self) -> str:
        return compiled_api(self.compiler, self.type)


@dataclass(frozen=True, slots=True)
class UserClass:
    cls: ClassInfo


@dataclass(frozen=True, slots=True)
class Instance:
    cls: ClassInfo


@dataclass(frozen=True, slots=True)
class UserFunc:
    func: FuncInfo
    bound: bool = False  # reached through an instance: the first parameter is taken


@dataclass(frozen=True, slots=True)
class SuperOf:
    cls: ClassInfo


@dataclass(frozen=True, slots=True)
class ProjectModule:
    """Another module of the project (``import model``)."""

    name: str


@dataclass(frozen=True, slots=True)
class ImportedClass:
    """A framework subclass defined in another module of the project (``exports.py``)."""

    export: Export


@dataclass(frozen=True, slots=True)
class ImportedInstance:
    export: Export


class _Super:
    """The builtin ``super``."""


class _Plain:
    """A value the program builds itself (a literal, a comprehension, a builtin's result, a
    module outside the roots and the project), and whatever is reached from it: never a
    framework object, so its calls are neither wrapped nor resolved at run time."""


SUPER = _Super()
PLAIN = _Plain()
_LITERALS = (
    cst.List, cst.Dict, cst.Set, cst.Tuple, cst.ListComp, cst.DictComp, cst.SetComp,
    cst.GeneratorExp, cst.SimpleString, cst.ConcatenatedString, cst.FormattedString,
    cst.Integer, cst.Float, cst.Imaginary,
)
Value = (
    Api
    | Obj
    | Compiled
    | UserClass
    | Instance
    | UserFunc
    | SuperOf
    | _Super
    | _Plain
    | ProjectModule
    | ImportedClass
    | ImportedInstance
    | None
)


@dataclass(frozen=True, slots=True)
class Resolution:
    api: str  # canonical name
    kind: str  # function | constructor | method | compiled
    compiled: Compiled | None = None  # for a compiled unit: its compiler and the user's target


@dataclass(frozen=True, slots=True)
class Site:
    """A call that will be wrapped."""

    record: CallRecord
    api: str
    kind: str
    root: str
    compiled: Compiled | None = None
    # "runtime": the callee is looked at when the call runs (`probe.dcall`): of unknown origin,
    # or a member of a framework call's result of unknown type (`f/method`)
    resolved: str = "static"
    # (N, function) for a call inside a function the module calls in `for _ in range(N)` loops
    # of that one function: the epochs around a training step written in another function
    outer_epochs: tuple[str, str] | None = None


_PENDING = object()


class Resolver:
    """Pass 2: abstract values of expressions, memoised per node."""

    def __init__(
        self,
        collected: Collected,
        scopes: Mapping[cst.CSTNode, Scope | None],
        roots: Roots,
        project: ProjectView | None = None,
    ) -> None:
        self.col = collected
        self.roots = roots
        self.project = project
        self.referents: dict[cst.CSTNode, Iterable[Any]] = {}
        for scope in dict.fromkeys(scopes.values()):  # each scope once, as first met
            if scope is None:
                continue
            for access in scope.accesses:
                self.referents[access.node] = access.referents
        self.records = {record.node: record for record in collected.calls}
        self._values: dict[cst.CSTNode, Any] = {}
        self._calls: dict[cst.Call, tuple[Resolution | None, Value]] = {}
        self._returns: dict[FuncInfo, Any] = {}
        self._stars: list[tuple[str, StarNames | None, tuple[StarNames, ...]]] | None = None
        self._params: dict[cst.Param, Any] = {}
        self._bases: dict[ClassInfo, Any] = {}
        self._compilers: dict[FuncInfo, str | None] = {}
        self._trains: dict[FuncInfo, tuple[bool, str]] = {}
        self._by_callee_name: dict[str, list[CallRecord]] | None = None
        self._project_packages = project.project.packages if project is not None else frozenset()

    # -- expressions

    def value(self, node: cst.CSTNode) -> Value:
        known = self._values.get(node, _PENDING)
        if known is not _PENDING:
            return known
        self._values[node] = None  # cycles resolve to "unknown"
        result = self._compute(node)
        self._values[node] = result
        return result

    def _compute(self, node: cst.CSTNode) -> Value:
        if isinstance(node, cst.Name):
            return self._name(node, node.value)
        if isinstance(node, cst.Attribute):
            if node in self.referents:  # `a.b.c` after `import a.b.c` is one access
                return self._name(node, get_full_name_for_node(node) or "")
            return self.attribute(self.value(node.value), node.attr.value)
        if isinstance(node, cst.Call):
            return self.call(node)[1]
        if isinstance(node, cst.NamedExpr):
            return self.value(node.value)
        if isinstance(node, cst.IfExp):
            body = self.value(node.body)
            return body if body == self.value(node.orelse) else None
        if isinstance(node, _LITERALS):
            return PLAIN
        return None

    def _name(self, node: cst.Name | cst.Attribute, name: str) -> Value:
        """The value of the latest assignment this access may see whose value is known.

        libcst's scope analysis already drops assignments that come later in the same scope;
        of the rest (branches, ``try: import x / except ImportError: x = None``, globals set
        anywhere) the latest with a known framework or project value wins; a plain value
        (``PLAIN``) only where all of them are plain.
        """
        referents = self.referents.get(node)
        if referents is None:
            return None
        if not referents:
            return self._star_import(name)
        ordered = sorted(
            referents, key=lambda a: self.col.order.get(getattr(a, "node", None), 0), reverse=True
        )
        found = [self._binding(assignment, name) for assignment in ordered]
        known = [value for value in found if value is not None and value is not PLAIN]
        if known:
            return known[0]
        # the program's own value only where every assignment it may see gives one
        return PLAIN if found and all(value is PLAIN for value in found) else None

    def _binding(self, assignment: Any, name: str) -> Value:
        if isinstance(assignment, ImportAssignment):
            foreign = True
            for qualified in assignment.get_qualified_names_for(name):
                q = qualified.name
                if not q.startswith(".") and self.roots.leads_to(q):
                    return Api(q)
                if self.project is not None:
                    found = self._imported(self.project.lookup(q))
                    if found is not None:
                        return found
                foreign = foreign and not self._in_project(q)
            return PLAIN if foreign else None
        if isinstance(assignment, BuiltinAssignment):
            return SUPER if name == "super" else PLAIN
        node = assignment.node
        if isinstance(node, cst.Name):
            bound = self.col.bindings.get(node)
            return None if bound is None else self.value(bound)
        if isinstance(node, cst.FunctionDef):
            info = self.col.functions.get(node)
            return None if info is None else UserFunc(info)
        if isinstance(node, cst.ClassDef):
            cls = self.col.classes.get(node)
            return None if cls is None else UserClass(cls)
        if isinstance(node, cst.Param):
            return self.param(node)
        return None

    def _in_project(self, qualified: str) -> bool:
        """Whether an imported name may come from the project itself (a relative import, or a
        module of the project): its functions may return framework objects."""
        if qualified.startswith("."):
            return True
        return qualified.split(".", 1)[0] in self._project_packages

    @staticmethod
    def _imported(found: Export | str | None) -> Value:
        if isinstance(found, str):
            return ProjectModule(found)
        if found is None:
            return None
        if found.kind == "api":
            return Api(found.api)
        if found.kind == "class":
            return ImportedClass(found)
        if found.kind == "instance":
            return ImportedInstance(found)
        if found.kind == "code":
            return PLAIN
        return Obj(found.api)

    def _star_import(self, name: str) -> Value:
        """A name the file never binds: from its last star import that may define it. A project
        module's star import brings its own names after those of its own star imports
        (``exports.StarNames``); of several framework modules, those known not to define the
        name are passed over (``star.py``)."""
        sources = [(m, info) for m, info, gates in self._star_sources()
                   if all(g.passes(name) for g in gates)]
        framework = [m for m, info in sources
                     if info is None and not m.startswith(".") and self.roots.covers(f"{m}.{name}")]
        for module, info in reversed(sources):
            if info is not None:
                if name in info.bound and info.passes(name):
                    assert self.project is not None
                    return self._imported(self.project.star_export(module, name))
            elif module in framework:
                # a private name comes only where a literal __all__ lists it
                private = name.startswith("_")
                exported = star_names(module) if len(framework) > 1 or private else None
                if (exported is None and not private) or (exported and name in exported):
                    return Api(f"{module}.{name}")
        return None

    def _star_sources(self) -> list[tuple[str, StarNames | None, tuple[StarNames, ...]]]:
        """Every module the file's star imports reach, in the order Python binds their names:
        (module, its star names where it is the project's, the project modules it is reached
        through, whose ``__all__`` each name must pass)."""
        if self._stars is None:
            found: list[tuple[str, StarNames | None, tuple[StarNames, ...]]] = []

            def reach(module: str, gates: tuple[StarNames, ...], seen: frozenset[str]) -> None:
                mine = self.project.star_module(module) if self.project is not None else None
                if mine is None:
                    found.append((module, None, gates))
                    return
                absolute, info = mine
                if absolute in seen:
                    return
                for inner in info.star_imports:
                    reach(inner, (*gates, info), seen | {absolute})
                found.append((absolute, info, gates))

            for module in self.col.star_imports:
                reach(module, (), frozenset())
            self._stars = found
        return self._stars

    def attribute(self, base: Value, attr: str) -> Value:
        if base is PLAIN:
            return PLAIN
        if isinstance(base, Api):
            qualified = f"{base.raw}.{attr}"
            return Api(qualified) if self.roots.leads_to(qualified) else None
        if isinstance(base, Obj):
            return Obj(f"{base.type}{RESULT if base.returned else '.'}{attr}", member=True)
        if isinstance(base, Compiled):
            if base.type is None:
                return Obj(f"{base.compiler}{RESULT}{attr}", member=True)
            return Obj(f"{base.type}.{attr}", member=True)
        if isinstance(base, ProjectModule):
            assert self.project is not None
            return self._imported(self.project.lookup(f"{base.name}.{attr}"))
        if isinstance(base, (ImportedClass, ImportedInstance)):
            export = base.export
            if attr in export.members:  # the user's: a framework object only where it is one
                typed = export.attribute_type(attr) if isinstance(base, ImportedInstance) else None
                return None if typed is None else Obj(typed)
            return Obj(f"{export.api}.{attr}", member=True)
        if isinstance(base, (Instance, UserClass)):
            defined, found = self._lookup(base.cls, attr, bound=isinstance(base, Instance))
        elif isinstance(base, SuperOf):
            defined, found = self._lookup(base.cls, attr, bound=True, skip=True)
        else:
            return None
        if defined or attr in self._imported_members(base.cls):
            return found
        api_base = self.api_base(base.cls)
        return None if api_base is None else Obj(f"{api_base}.{attr}", member=True)

    def _imported_members(self, cls: ClassInfo) -> frozenset[str]:
        """What classes imported from the project, among ``cls``'s bases, define (user code)."""
        if self.project is None:
            return frozenset()
        members: frozenset[str] = frozenset()
        for info in self._mro(cls):
            for base in info.node.bases:
                value = self.value(base.value)
                if isinstance(value, ImportedClass):
                    members |= value.export.members
        return members

    def _lookup(
        self, cls: ClassInfo, attr: str, *, bound: bool, skip: bool = False
    ) -> tuple[bool, Value]:
        """Whether the user's class (or a user-defined base) defines ``attr``, and its value."""
        for info in self._mro(cls)[1 if skip else 0 :]:
            method = info.methods.get(attr)
            if method is not None:
                return True, UserFunc(method, bound=bound)
            if attr in info.attrs:
                for expr in reversed(info.attrs[attr]):
                    found = self.value(expr)
                    if found is not None:
                        return True, found
                return True, None
        return False, None

    def _mro(self, cls: ClassInfo) -> list[ClassInfo]:
        seen: list[ClassInfo] = []
        todo = [cls]
        while todo:
            current = todo.pop(0)
            if current in seen:
                continue
            seen.append(current)
            for base in current.node.bases:
                value = self.value(base.value)
                if isinstance(value, UserClass):
                    todo.append(value.cls)
        return seen

    def api_base(self, cls: ClassInfo) -> str | None:
        """The canonical framework class a user class derives from, if any."""
        if cls in self._bases:
            return self._bases[cls]
        self._bases[cls] = None
        found = None
        for base in cls.node.bases:
            if base.keyword is not None:
                continue
            value = self.value(base.value)
            if isinstance(value, Api) and self.roots.covers(value.raw):
                found = canonical(value.raw)
            elif isinstance(value, UserClass):
                found = self.api_base(value.cls)
            elif isinstance(value, ImportedClass):
                found = value.export.api
            if found is not None:
                break
        self._bases[cls] = found
        return found

    # -- calls

    def call(self, node: cst.Call) -> tuple[Resolution | None, Value]:
        """What a call resolves to (``None`` when not wrapped) and the value it returns."""
        known = self._calls.get(node)
        if known is not None:
            return known
        self._calls[node] = (None, None)
        result = self._call(node)
        self._calls[node] = result
        return result

    def _call(self, node: cst.Call) -> tuple[Resolution | None, Value]:
        callee = self.value(node.func)
        if isinstance(callee, Api):
            if not self.roots.covers(callee.raw):
                return None, None
            name = canonical(callee.raw)
            if name in COMPILER_GUARDS:
                return None, None
            if name in COMPILERS:
                return Resolution(name, "function"), self._compiled(name, node)
            if is_class_name(name):
                return Resolution(name, "constructor"), Obj(name)
            owner = factory_class(name)
            return Resolution(name, "function"), Obj(owner) if owner else _result(name)
        if isinstance(callee, Obj):
            if callee.member:
                api = callee.type
            else:
                api = f"{callee.type}{RESULT if callee.returned else '.'}__call__"
            return Resolution(api, "method"), _result(api)
        if isinstance(callee, Compiled):
            return Resolution(callee.api, "compiled", callee), _result(callee.api)
        if isinstance(callee, UserClass):
            return None, Instance(callee.cls)
        if isinstance(callee, ImportedClass):
            return None, ImportedInstance(callee.export)
        if isinstance(callee, ImportedInstance):
            if "__call__" in callee.export.members:
                return None, None
            api = f"{callee.export.api}.__call__"
            return Resolution(api, "method"), _result(api)
        if isinstance(callee, Instance):
            defined, user_call = self._lookup(callee.cls, "__call__", bound=True)
            if defined:
                return (
                    self._call_user(user_call.func)
                    if isinstance(user_call, UserFunc)
                    else (None, None)
                )
            api_base = self.api_base(callee.cls)
            if api_base is None or "__call__" in self._imported_members(callee.cls):
                return None, None
            api = f"{api_base}.__call__"
            return Resolution(api, "method"), _result(api)
        if isinstance(callee, UserFunc):
            return self._call_user(callee.func)
        if callee is SUPER:
            record = self.records.get(node)
            return None, (SuperOf(record.cls) if record and record.cls else None)
        return None, None

    def _call_user(self, func: FuncInfo) -> tuple[Resolution | None, Value]:
        compiler = self.compiler_of(func)
        if compiler is not None:
            public_type = compiled_type(compiler, "function")
            unit = Compiled(compiler, public_type, func.qualname, *self.trains(func))
            return Resolution(unit.api, "compiled", unit), _result(unit.api)
        return None, self.returns(func)

    def _compiled(self, compiler: str, node: cst.Call) -> Compiled:
        """What ``compiler(target)`` returns, typed by what the target is."""
        target = _first_positional(node)
        value = None if target is None else self.value(target)
        if isinstance(value, UserFunc):
            func = value.func
            public_type = compiled_type(compiler, "function")
            return Compiled(compiler, public_type, func.qualname, *self.trains(func))
        if isinstance(value, (UserClass, Instance)):
            return Compiled(compiler, compiled_type(compiler, "module"), value.cls.qualname)
        if isinstance(value, (ImportedClass, ImportedInstance)):
            return Compiled(compiler, compiled_type(compiler, "module"), value.export.name)
        if isinstance(value, Obj) and not (value.member or value.returned):
            return Compiled(compiler, compiled_type(compiler, "module"), "")  # a framework object
        return Compiled(compiler, compiled_type(compiler, ""), "")

    def trains(self, func: FuncInfo) -> tuple[bool, str]:
        """Whether ``func``'s own body steps an optimizer or calls ``backward`` (a training step:
        compiled, its calls are where the probe reads the epochs and batches around it), and
        the name of the optimizer it steps where that is one name (``optimizer``)."""
        known = self._trains.get(func)
        if known is None:
            steps = [
                record.node.func
                for record in self.col.calls
                if func.node in record.chain
                and isinstance(record.node.func, cst.Attribute)
                and record.node.func.attr.value in TRAINING_STEPS
            ]
            stepped = {
                get_full_name_for_node(f.value) or "" for f in steps if f.attr.value != "backward"
            }
            known = (bool(steps), stepped.pop() if len(stepped) == 1 else "")
            self._trains[func] = known
        return known

    def compiler_of(self, func: FuncInfo) -> str | None:
        """The compiler a decorator applies to ``func`` (``tensorflow.function``...), if any."""
        if func in self._compilers:
            return self._compilers[func]
        self._compilers[func] = None
        found = None
        for decorator in func.node.decorators:
            expr = decorator.decorator
            if isinstance(expr, cst.Call):
                expr = expr.func
            name = self.api_name(expr)
            if name in COMPILERS:
                found = name
                break
        self._compilers[func] = found
        return found

    def api_name(self, expr: cst.CSTNode) -> str | None:
        value = self.value(expr)
        if isinstance(value, Api) and self.roots.covers(value.raw):
            return canonical(value.raw)
        return None

    def returns(self, func: FuncInfo) -> Value:
        """What a user function returns, when every known return agrees."""
        if func in self._returns:
            return self._returns[func]
        self._returns[func] = None
        values = {self.value(expr) for expr in func.returns} - {None}
        found = values.pop() if len(values) == 1 else None
        self._returns[func] = found
        return found

    def param(self, node: cst.Param) -> Value:
        if node in self._params:
            return self._params[node]
        self._params[node] = None
        found = self._param(node)
        self._params[node] = found
        return found

    def _param(self, node: cst.Param) -> Value:
        owner = self.col.params.get(node)
        if owner is None:
            return None
        func, index = owner
        if node.annotation is not None:
            hinted = self.value(node.annotation.annotation)
            if isinstance(hinted, Api) and self.roots.covers(hinted.raw):
                name = canonical(hinted.raw)
                if is_class_name(name):
                    return Obj(name)
            if isinstance(hinted, UserClass):
                return Instance(hinted.cls)
            if isinstance(hinted, ImportedClass):
                return ImportedInstance(hinted.export)
        if index == 0 and func.cls is not None:
            decorators = func.decorator_names()
            if "staticmethod" not in decorators:
                return UserClass(func.cls) if "classmethod" in decorators else Instance(func.cls)
        if node.default is not None:
            default = self.value(node.default)
            if default is not None:
                return default
        return self._from_call_sites(func, node, index)

    def _from_call_sites(self, func: FuncInfo, param: cst.Param, index: int) -> Value:
        """The value every call of ``func`` in this module passes for ``param``, if they agree."""
        if self._by_callee_name is None:
            self._by_callee_name = {}
            for record in self.col.calls:
                callee_node = record.node.func
                if isinstance(callee_node, cst.Attribute):
                    callee_node = callee_node.attr
                if isinstance(callee_node, cst.Name):
                    self._by_callee_name.setdefault(callee_node.value, []).append(record)
        values: set[Any] = set()
        for record in self._by_callee_name.get(func.name, ()):
            callee = self.value(record.node.func)
            if not isinstance(callee, UserFunc) or callee.func is not func:
                continue
            arg = _argument_for(record.node, param, index - (1 if callee.bound else 0))
            if arg is not None:
                values.add(self.value(arg))
        values.discard(None)
        return values.pop() if len(values) == 1 else None


def _result(call: str) -> Obj:
    """What a call whose result type is unknown statically returns: named by the call."""
    return Obj(call, returned=True)


def _first_positional(node: cst.Call) -> cst.BaseExpression | None:
    for arg in node.args:
        if arg.keyword is None and not arg.star:
            return arg.value
        break
    return None


def _argument_for(call: cst.Call, param: cst.Param, index: int) -> cst.BaseExpression | None:
    position = 0
    for arg in call.args:
        if arg.star:
            return None  # positions after *args are unknown
        if arg.keyword is None:
            if position == index:
                return arg.value
            position += 1
        elif arg.keyword.value == param.name.value:
            return arg.value
    return None


# ----------------------------------------------------------------------------- graph bodies


def compiled_bodies(resolver: Resolver) -> set[_DefNode]:
    """Defs, lambdas and classes whose bodies run inside a compiled graph (never instrumented)."""
    col = resolver.col
    compiled: set[_DefNode] = set()

    def add_class(cls: ClassInfo) -> None:
        for method in cls.methods.values():
            compiled.add(method.node)

    def add_value(value: Value, node: cst.CSTNode | None = None) -> None:
        if isinstance(node, cst.Lambda):
            compiled.add(node)
        elif isinstance(value, UserFunc):
            compiled.add(value.func.node)
        elif isinstance(value, (UserClass, Instance)):
            add_class(value.cls)

    elsewhere = resolver.project.traced if resolver.project is not None else frozenset()
    for func in col.functions.values():  # compiled here, or by another module (tf.function)
        traced = func.cls is None and func.qualname in elsewhere
        if traced or resolver.compiler_of(func) is not None:
            compiled.add(func.node)
    for cls in col.classes.values():
        for decorator in cls.node.decorators:
            expr = decorator.decorator
            if resolver.api_name(expr.func if isinstance(expr, cst.Call) else expr) in COMPILERS:
                add_class(cls)
        base = resolver.api_base(cls)
        if base is not None and base.startswith("keras."):
            for name in KERAS_GRAPH_METHODS & cls.methods.keys():
                compiled.add(cls.methods[name].node)
    for record in col.calls:
        resolution, _ = resolver.call(record.node)
        if resolution is not None and resolution.api in COMPILERS:
            target = _first_positional(record.node)
            if target is not None:
                add_value(resolver.value(target), target)
    # Whatever a graph body calls of the user's own code is traced into the graph too.
    changed = bool(compiled)
    while changed:
        size = len(compiled)
        for record in col.calls:
            if not compiled.isdisjoint(record.chain):
                add_value(resolver.value(record.node.func))
        changed = len(compiled) != size
    return compiled


def find_sites(
    module: cst.Module,
    scopes: Mapping[cst.CSTNode, Scope | None],
    roots: Roots,
    project: ProjectView | None = None,
) -> tuple[Collected, list[Site]]:
    """All calls of ``module`` (source order) and, among them, the sites to wrap; ``project``
    resolves names imported from the project's other modules."""
    collected = collect(module)
    resolver = Resolver(collected, scopes, roots, project)
    compiled = compiled_bodies(resolver)
    epochs = epoch_loops(resolver)
    sites = []
    for record in collected.calls:
        if record.in_annotation or (compiled and not compiled.isdisjoint(record.chain)):
            continue
        resolution, _ = resolver.call(record.node)
        inner = record.chain[-1] if record.chain else None
        outer = epochs.get(inner) if len(record.loops) == 1 else None
        if resolution is not None:
            # a member of a result of unknown type may be no framework's (`probs.argmax()` on
            # a NumPy array): looked at when it runs, named statically only as a fallback
            resolved = "runtime" if RESULT in resolution.api else "static"
            root = roots.root_of(resolution.api)
            sites.append(Site(record, resolution.api, resolution.kind, root,
                              resolution.compiled, resolved, outer))
        elif not record.awaited and resolver.value(record.node.func) is None:
            written = get_full_name_for_node(record.node.func) or "<call>"
            sites.append(Site(record, written, "call", "", None, "runtime", outer))
    return collected, sites


def epoch_loops(resolver: Resolver) -> dict[_DefNode, tuple[str, str] | None]:
    """(N, caller) for each function of the module called directly inside ``for _ in range(N)``
    loops of one function, ``caller`` (``for epoch in range(1, args.epochs + 1): train(...)``);
    None where two such loops disagree (unsure)."""
    found: dict[_DefNode, tuple[str, str] | None] = {}
    for record in resolver.col.calls:
        bound = range_bound(record.loops[0]) if record.loops else None
        value = resolver.value(record.node.func) if bound else None
        if isinstance(value, UserFunc):
            place = (bound, record.function)
            found[value.func.node] = place if found.get(value.func.node, place) == place else None
    return found
