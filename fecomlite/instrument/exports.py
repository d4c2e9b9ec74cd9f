"""Project-wide first pass: which module-level names of the project stand for framework things.

A class defined in ``model.py`` as ``class Net(nn.Module)`` and imported into ``train.py`` must
resolve there as it does in ``model.py``. Before the per-file workers start, this pass reads the
top level of every Python file of the project with CPython's ``ast`` (an order of magnitude
cheaper than libcst's parse and scope analysis, and only the top level matters here) and builds
a small table, ``{module: {name: Export}}``, of:

* classes deriving from a framework class, directly or through other project classes (in the
  same module or imported), with the framework base's canonical name and the members the user's
  classes define (those are the user's code, never wrapped);
* module-level names bound to what a framework call returns (``encoder = keras.Sequential()``),
  named as ``resolve.py`` names such objects, and instances of the classes above;
* the project's functions that a module hands to a tracing compiler (``tf.function(step)`` in
  ``train.py`` of ``step`` from ``ops.py``), and the project's functions those call, module to
  module: their bodies are left alone like those of a ``@tf.function`` in their own module
  (``names.TRACING_COMPILERS``);
* for every module, what ``from module import *`` binds (``StarNames``): the names it binds,
  its literal ``__all__``, the framework names its imports bind (``import torch``), and the
  modules it star-imports itself.

Module names come from paths relative to the project root (``pkg/model.py`` → ``pkg.model``,
``pkg/__init__.py`` → ``pkg``; a ``src/`` layout also under the name without ``src.``). An
absolute import is looked up as written, then beside the importing file (a script's folder is
on ``sys.path``); relative imports are resolved against the importing module's package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fecomlite.instrument.names import (
    COMPILERS,
    TRACING_COMPILERS,
    Roots,
    canonical,
    factory_class,
    is_class_name,
)


@dataclass(frozen=True, slots=True)
class Export:
    """A module-level name that stands for a framework class or object."""

    kind: str  # "class" | "instance" (of such a class) | "object" (a framework call's result)
    # | "api" (a framework name a module's import binds; only for star imports of it)
    # | "code" (the user's own undecorated function or class of no framework base: calling it
    # runs the project's code, never a framework API by itself)
    api: str  # canonical framework base (class, instance) or the object's type name
    name: str = ""  # the user's class name (class, instance)
    members: frozenset[str] = frozenset()  # defined by the user's class or its project bases
    # (class, instance) `self.x = framework_call(...)` attributes: (x, the object's type name)
    attributes: tuple[tuple[str, str], ...] = ()

    def attribute_type(self, attr: str) -> str | None:
        """The framework type of a `self.<attr>` the class always sets from one framework call."""
        return dict(self.attributes).get(attr)


@dataclass(frozen=True, slots=True)
class StarNames:
    """What ``from MODULE import *`` binds, MODULE being one of the project's: its own public
    names (those its literal ``__all__`` lists, where it has one), then through the modules it
    star-imports itself."""

    bound: frozenset[str]  # every name the module binds at top level
    declared: frozenset[str] | None  # its literal __all__, or None
    apis: tuple[tuple[str, str], ...]  # (name, framework name) its imports bind
    star_imports: tuple[str, ...]  # absolute, in order

    def passes(self, name: str) -> bool:
        """Whether a star import of the module can bring `name` at all."""
        return name in self.declared if self.declared is not None else not name.startswith("_")


@dataclass
class ProjectTable:
    """The first pass's result: framework names per module, and every module's star names."""

    exports: dict[str, dict[str, Export]] = field(default_factory=dict)
    stars: dict[str, StarNames] = field(default_factory=dict)
    traced: dict[str, set[str]] = field(default_factory=dict)  # module → functions compiled


def module_identities(rel: str) -> list[tuple[str, str]]:
    """(dotted module name, package its relative imports start from) of a project file;
    ``src/pkg/a.py`` has two: ``src.pkg.a`` and ``pkg.a``."""
    parts = rel.rsplit(".", 1)[0].split("/")
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    spellings = [parts]
    if parts[:1] == ["src"] and len(parts) > 1:
        spellings.append(parts[1:])
    return [(".".join(p), ".".join(p if is_package else p[:-1])) for p in spellings if p]


# ----------------------------------------------------------------------------- reading a module


@dataclass(frozen=True)
class _ClassText:
    """What a class statement shows without resolving anything."""

    bases: list[str]  # dotted
    members: frozenset[str]
    # `self.x = callee(...)`: x → its dotted callee, or None where x is set otherwise too or
    # from several callees
    attribute_calls: dict[str, str | None]


@dataclass
class _Module:
    name: str
    package: str
    imports: dict[str, str] = field(default_factory=dict)  # local name → qualified name
    classes: dict[str, _ClassText] = field(default_factory=dict)
    calls: dict[str, str] = field(default_factory=dict)  # name → callee, for `name = callee()`
    bound: set[str] = field(default_factory=set)  # every top-level name
    declared: list[str] | None = None  # a literal __all__
    stars: list[str] = field(default_factory=list)  # star-imported modules, absolute
    # (compiler, function) as written in `compiler(function, ...)` and `compiler(...)(function)`
    compiles: list[tuple[str, str]] = field(default_factory=list)
    code: set[str] = field(default_factory=set)  # undecorated top-level functions and classes

    def bind(self, name: str, imported: str | None = None) -> None:
        """A top-level binding: it replaces whatever the name was bound to before; `imported`
        is the qualified name an import binds it to."""
        self.bound.add(name)
        self.classes.pop(name, None)
        self.calls.pop(name, None)
        self.code.discard(name)
        if imported is None:
            self.imports.pop(name, None)
        else:
            self.imports[name] = imported


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _absolute(package: str, level: int, module: str | None) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _literal_names(node: ast.expr) -> list[str] | None:
    """The strings of a list or tuple literal of strings, else None."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return names if len(names) == len(node.elts) else None


def _class_text(node: ast.ClassDef) -> _ClassText:
    """The bases, the names the class body defines and the ``self.x`` attributes its methods
    assign, and which of those every assignment sets from a call of one dotted callee."""
    names: set[str] = set()
    callees: dict[str, str | None] = {}
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
            args = getattr(stmt, "args", None)
            first = (args.posonlyargs + args.args)[:1] if args else []
            if first:
                _self_attributes(stmt, first[0].arg, names, callees)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    bases = [b for b in map(_dotted, node.bases) if b]
    return _ClassText(bases, frozenset(names), callees)


def _self_attributes(method: ast.AST, receiver: str, names: set[str],
                     callees: dict[str, str | None]) -> None:
    """Every ``receiver.x`` a method stores: its name, and its callee while all agree."""
    called: dict[int, str | None] = {}  # id(target) → callee, for `receiver.x = callee(...)`
    for inner in ast.walk(method):  # breadth first: an assignment comes before its target
        if isinstance(inner, ast.Assign) and len(inner.targets) == 1:
            value = inner.value
            called[id(inner.targets[0])] = (
                _dotted(value.func) if isinstance(value, ast.Call) else None)
        elif (isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store)
                and isinstance(inner.value, ast.Name) and inner.value.id == receiver):
            names.add(inner.attr)
            callee = called.get(id(inner))
            agrees = callee is not None and callees.get(inner.attr, callee) == callee
            callees[inner.attr] = callee if agrees else None


def _read(module: _Module, body: Iterable[ast.stmt]) -> None:
    """Top-level statements, including those under ``if``/``try``/``with`` (later ones win)."""
    for stmt in body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                local = alias.asname or alias.name.split(".", 1)[0]
                module.bind(local, alias.name if alias.asname else local)
        elif isinstance(stmt, ast.ImportFrom):
            source = _absolute(module.package, stmt.level, stmt.module)
            for alias in stmt.names:
                if alias.name == "*":
                    if source is not None:
                        module.stars.append(source)
                    continue
                module.bind(alias.asname or alias.name,
                            None if source is None else f"{source}.{alias.name}")
        elif isinstance(stmt, ast.ClassDef):
            module.bind(stmt.name)
            module.classes[stmt.name] = _class_text(stmt)
            if not stmt.decorator_list:
                module.code.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            callee = _dotted(stmt.value.func) if isinstance(stmt.value, ast.Call) else None
            for target in targets:
                if isinstance(target, ast.Name):
                    module.bind(target.id)
                    if callee:
                        module.calls[target.id] = callee
                    if target.id == "__all__":
                        module.declared = _literal_names(stmt.value)
        elif isinstance(stmt, ast.AugAssign) and _dotted(stmt.target) == "__all__":
            module.declared = None  # extended: what it lists is not known here
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.bind(stmt.name)
            if not stmt.decorator_list:
                module.code.add(stmt.name)
        elif isinstance(stmt, ast.If):
            _read(module, stmt.body)
            _read(module, stmt.orelse)
        elif isinstance(stmt, ast.Try):
            _read(module, stmt.body)
            for handler in stmt.handlers:
                _read(module, handler.body)
            _read(module, stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            _read(module, stmt.body)


_COMPILER_WORDS = re.compile(r"\b(?:function|jit)\s*\(")  # a call, not the word in prose


def _compile_calls(tree: ast.Module) -> list[tuple[str, str]]:
    """Every call that may hand a function to a compiler, anywhere in the module."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        callee = node.func.func if isinstance(node.func, ast.Call) else node.func
        compiler, target = _dotted(callee), _dotted(node.args[0])
        if compiler and target and compiler.rpartition(".")[2] in ("function", "jit"):
            found.append((compiler, target))
    return found


def _function_calls(text: str) -> dict[str, list[str]]:
    """Each top-level function of a module, with the dotted callees its body calls."""
    tree = ast.parse(text)
    return {
        stmt.name: [
            dotted
            for node in ast.walk(stmt)
            if isinstance(node, ast.Call) and (dotted := _dotted(node.func))
        ]
        for stmt in tree.body
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _traced(
    modules: dict[str, _Module], builder: _Builder, texts: dict[str, str]
) -> dict[str, set[str]]:
    """module → its functions a tracing compiler compiles, and the project's functions these
    call, from module to module: a graph traces whatever its body calls."""
    functions: dict[str, dict[str, list[str]]] = {}

    def defs(name: str) -> dict[str, list[str]]:
        if name not in functions:
            functions[name] = _function_calls(texts[name])
        return functions[name]

    def locate(module: _Module, dotted: str) -> tuple[str, str] | None:
        if dotted in defs(module.name):
            return module.name, dotted
        where = builder.qualify(module, dotted)
        return where if isinstance(where, tuple) else None

    pending = []
    for module in modules.values():
        for compiler, target in module.compiles:
            api = builder.qualify(module, compiler)
            if isinstance(api, str) and canonical(api) in TRACING_COMPILERS:
                pending.append(locate(module, target))
    traced: dict[str, set[str]] = {}
    while pending:
        where = pending.pop()
        if where is None or where[1] in traced.get(where[0], ()):
            continue
        name, function = where
        traced.setdefault(name, set()).add(function)
        module = modules[name]
        pending.extend(locate(module, callee) for callee in defs(name).get(function, ()))
    return traced


# ----------------------------------------------------------------------------- the table


class _Builder:
    """Resolves class bases and bound calls across modules, memoised, cycles → unknown."""

    def __init__(self, modules: dict[str, _Module], roots: Roots) -> None:
        self.modules = modules
        self.roots = roots
        self.done: dict[tuple[str, str], Export | None] = {}

    def qualify(self, module: _Module, dotted: str) -> tuple[str, str] | str | None:
        """A framework name (str), a project (module, name) pair, or unknown."""
        first, _, rest = dotted.partition(".")
        if first in module.classes or first in module.calls:
            return (module.name, first) if not rest else None
        qualified = module.imports.get(first)
        if qualified is None:
            return None
        full = f"{qualified}.{rest}" if rest else qualified
        if self.roots.covers(full):
            return full
        owner, _, name = full.rpartition(".")
        for candidate in (owner, f"{module.package}.{owner}" if module.package else None):
            if candidate in self.modules:
                return candidate, name
        return None

    def export(self, module_name: str, name: str) -> Export | None:
        key = (module_name, name)
        if key in self.done:
            return self.done[key]
        self.done[key] = None
        module = self.modules[module_name]
        found = None
        if name in module.classes:
            found = self._class(module, name)
        elif name in module.calls:
            found = self._object(module, module.calls[name])
        self.done[key] = found
        return found

    def _class(self, module: _Module, name: str) -> Export | None:
        text = module.classes[name]
        api = None
        inherited: set[str] = set(text.members)
        attributes: dict[str, str] = {}
        for base in text.bases:
            target = self.qualify(module, base)
            if isinstance(target, str):
                api = api or canonical(target)
            elif target is not None:
                found = self.export(*target)
                if found is not None and found.kind == "class":
                    api = api or found.api
                    inherited |= found.members
                    attributes = {**dict(found.attributes), **attributes}
        for attr, callee in text.attribute_calls.items():
            if callee is None:
                attributes.pop(attr, None)
                continue
            found = self._object(module, callee)
            if found is not None and found.kind == "object":
                attributes[attr] = found.api
        if api is None:
            return None
        return Export("class", api, name, frozenset(inherited), tuple(sorted(attributes.items())))

    def _object(self, module: _Module, callee: str) -> Export | None:
        target = self.qualify(module, callee)
        if isinstance(target, str):
            api = canonical(target)
            if api in COMPILERS:
                return None
            if is_class_name(api):
                return Export("object", api)
            return Export("object", factory_class(api) or f"{api}()")
        if target is not None:
            found = self.export(*target)
            if found is not None and found.kind == "class":
                return Export("instance", found.api, found.name, found.members,
                              found.attributes)
        return None


def build_table(
    sources: Mapping[str, str], roots: Roots, trees: dict[str, ast.Module] | None = None
) -> ProjectTable:
    """The table for a project given as ``{relpath: source}`` (unparsable files are skipped);
    ``trees``, where given, receives each file's parse for the per-file pass to reuse."""
    modules: dict[str, _Module] = {}
    texts: dict[str, str] = {}
    for rel, text in sources.items():
        try:
            tree = compile(text, rel, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if trees is not None:
            trees[rel] = tree
        compiles = _compile_calls(tree) if _COMPILER_WORDS.search(text) else []
        for name, package in module_identities(rel):
            module = _Module(name, package, compiles=compiles)
            _read(module, tree.body)
            modules[name] = module
            texts[name] = text
    builder = _Builder(modules, roots)
    table = ProjectTable(traced=_traced(modules, builder, texts))
    for name, module in modules.items():
        exports = {}
        for local in (*module.classes, *module.calls):
            found = builder.export(name, local)
            if found is not None:
                exports[local] = found
        for local in module.code - exports.keys() - table.traced.get(name, set()):
            exports[local] = Export("code", f"{name}.{local}", local)
        if exports:
            table.exports[name] = exports
        apis = tuple(sorted((local, qualified) for local, qualified in module.imports.items()
                            if roots.covers(qualified)))
        declared = None if module.declared is None else frozenset(module.declared)
        table.stars[name] = StarNames(frozenset(module.bound), declared, apis,
                                      tuple(module.stars))
    return table


class Project:
    """The table as the per-file resolution uses it; built once per process."""

    def __init__(self, table: ProjectTable) -> None:
        self.table = table.exports
        self.stars = table.stars
        self.traced = table.traced
        modules = set()
        for name in table.exports:
            parts = name.split(".")
            modules.update(".".join(parts[:cut]) for cut in range(1, len(parts) + 1))
        self.modules = frozenset(modules)
        # top-level packages of the project's modules (an import of one may be the project's)
        self.packages = frozenset(name.split(".", 1)[0] for name in self.stars)

    def view(self, rel: str) -> ProjectView:
        identities = module_identities(rel)
        traced = frozenset().union(*(self.traced.get(name, ()) for name, _ in identities))
        return ProjectView(self, identities[0][1] if identities else "", traced)


@dataclass(frozen=True, slots=True)
class ProjectView:
    """What one file sees of the project: lookups relative to its own package."""

    project: Project
    package: str
    traced: frozenset[str] = frozenset()  # its functions another module compiles (tracing)

    def lookup(self, qualified: str) -> Export | str | None:
        """An exported name, a project module (its dotted name), or ``None``."""
        for candidate in self._candidates(qualified):
            if candidate in self.project.modules:
                return candidate
            owner, _, name = candidate.rpartition(".")
            found = self.project.table.get(owner, {}).get(name)
            if found is not None:
                return found
        return None

    def star_module(self, module: str) -> tuple[str, StarNames] | None:
        """The project module a star import names (written as in the file), with its names."""
        for candidate in self._candidates(module):
            found = self.project.stars.get(candidate)
            if found is not None:
                return candidate, found
        return None

    def star_export(self, module: str, name: str) -> Export | None:
        """What a name a project module binds is: a framework name its imports bind (an "api"
        export), one of its exports, or None (the user's)."""
        api = dict(self.project.stars[module].apis).get(name)
        if api is not None:
            return Export("api", api)
        return self.project.table.get(module, {}).get(name)

    def _candidates(self, qualified: str) -> list[str]:
        """The absolute names a dotted name may stand for, from this file's package."""
        stripped = qualified.lstrip(".")
        level = len(qualified) - len(stripped)
        if level:
            parts = self.package.split(".") if self.package else []
            if level - 1 > len(parts):
                return []
            base = parts[: len(parts) - (level - 1)]
            return [".".join([*base, stripped] if stripped else base)]
        return [stripped, f"{self.package}.{stripped}"] if self.package else [stripped]
