"""What `from MODULE import *` brings into a file: the public names MODULE defines, read from its
installed source without importing it.

A name a file never binds comes from one of its star imports, and with several (`from torch.nn
import *` and `from tensorflow.keras.layers import *`) Python takes the last one that defines it.
Importing a framework to ask would cost seconds per instrumentation, so the module's source is
parsed instead (found through its top-level package's spec, which imports nothing): its
`__all__` when it is one literal, else the public names it binds at top level, following its own
star imports. A module is *unknown* — and the caller keeps Python's last-wins order for it — when
its source is not found (TensorFlow builds `tensorflow.keras` lazily at import time) or when it
makes names at run time (`__all__` extended, `globals()`, `exec`, `setattr`, a module
`__getattr__`), as `torch` and `numpy` do.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path

MAX_DEPTH = 8  # star imports followed within one package (torch.nn → torch.nn.modules → ...)


def star_names(module: str) -> frozenset[str] | None:
    """The names `from module import *` binds, or None when the module's source is not found."""
    return _names(module, 0)


@lru_cache(maxsize=256)
def _names(module: str, depth: int) -> frozenset[str] | None:
    source = module_source(module)
    if source is None or depth > MAX_DEPTH:
        return None
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    if _makes_names_at_run_time(tree):
        return None
    declared = _literal_all(tree)
    if declared is not None:
        return frozenset(declared)
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            target = _absolute(node, package)
            found = None if target is None else _names(target, depth + 1)
            if found is None:
                return None  # part of what it binds is unknown: all of it is
            names |= found
        else:
            names |= _bound(node)
    return frozenset(n for n in names if not n.startswith("_"))


_DYNAMIC_CALLS = frozenset({"globals", "exec", "setattr", "vars", "__import__"})


def _makes_names_at_run_time(tree: ast.Module) -> bool:
    """Whether the module may bind or export names its text does not show."""
    alls = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _DYNAMIC_CALLS:
            return True
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" \
                and node in tree.body:
            return True
        if isinstance(node, ast.Name) and node.id == "__all__" \
                and isinstance(node.ctx, (ast.Store, ast.Del)):
            alls += 1
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "__all__":  # __all__.extend(...), .append(...)
            return True
    return alls > 1  # assigned, then added to (`__all__ += ...`) or assigned again


def module_source(module: str) -> Path | None:
    """The .py file of an installed module, found from its top-level package alone."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for folder in spec.submodule_search_locations or ():
        base = Path(folder, *rest.split("."))
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return candidate
    return None


def _literal_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == "__all__":
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return [v for v in value if isinstance(v, str)]
    return None


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    if not node.level:
        return node.module
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _bound(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds (imports, definitions, assignments, and both arms of a
    top-level `if`/`try`, which is how packages pick implementations)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Import):
        return {(a.asname or a.name).split(".", 1)[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.If, ast.Try)):
        inner = [*node.body, *node.orelse]
        if isinstance(node, ast.Try):
            inner += [*node.finalbody, *(s for h in node.handlers for s in h.body)]
        return {name for stmt in inner for name in _bound(stmt)}
    return set()
