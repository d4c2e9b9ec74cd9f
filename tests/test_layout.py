"""The package's layout (docs/internals.md, "Layers"): no import cycles, lazy imports included;
each module imports only its own layer or the layers below it; only the store speaks SQL.

The graph is read from the source with `ast`: every `import`/`from … import` of a fecomlite module
anywhere in a module (function bodies included) is an edge; imports under `if TYPE_CHECKING:`
never run and are not; nor is `__version__`, a constant of the package. A layer is a list of
module-name prefixes; the most specific prefix wins.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fecomlite"  # read, not imported
C_MODULES = ("fecomlite.runtime._fastprobe", "fecomlite.server._ticker",
             "fecomlite.analysis._sweep")

# Lowest first. A module may import its own layer and those before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("runtime: inside the measured program", ("fecomlite.runtime", "fecomlite.terminal")),
    ("sensors", ("fecomlite.sensors",)),
    ("store", ("fecomlite.store",)),
    ("instrument", ("fecomlite.instrument",)),
    ("analysis", ("fecomlite.analysis", "fecomlite.model")),
    ("report", ("fecomlite.report", "fecomlite.export")),
    ("server", ("fecomlite.server",)),
    ("runner", ("fecomlite.runner",)),
    ("api: the user's Python API", ("fecomlite.api",)),
    ("commands: the CLI, and programs fecomlite runs", (
        "fecomlite.cli", "fecomlite.server.__main__", "fecomlite.model.fc_program",
        "fecomlite.analysis.command", "fecomlite.export.command", "fecomlite.instrument.command",
        "fecomlite.model.command", "fecomlite.report.command", "fecomlite.report.merge_command",
        "fecomlite.runner.command", "fecomlite.runner.ingest", "fecomlite.server.command",
        "fecomlite.server.watch", "fecomlite.store.command", "fecomlite.pytest_plugin")),
]


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names | {c: PACKAGE for c in C_MODULES}


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the fecomlite modules it imports (a name imported from a package is the package
    unless it is a submodule)."""
    names = module_names()

    def known(name: str) -> str:
        while name not in names:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        if path == PACKAGE and module in C_MODULES:
            graph[module] = set()
            continue
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {known(a.name) for a in node.names if a.name.startswith("fecomlite")}
                continue
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            if base == "fecomlite" or base.startswith("fecomlite."):
                for alias in node.names:
                    if base == "fecomlite" and alias.name == "__version__":
                        continue  # a constant of the package itself, which every import loads
                    full = f"{base}.{alias.name}"
                    edges.add(full if full in names else known(base))
        edges.discard(module)
        graph[module] = edges
    return graph


def layer_of(module: str) -> int:
    best, level = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    return level if module != "fecomlite" else len(LAYERS) - 1


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_package():
    graph = import_graph()
    assert "fecomlite.runtime.probe" in graph["fecomlite.runtime.regions"]  # a lazy import
    assert "fecomlite.analysis.attribution" in graph["fecomlite.analysis.run_analysis"]
    assert len(graph) > 100


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_every_module_has_a_layer():
    assert [m for m in import_graph() if layer_of(m) < 0] == []


def test_modules_import_only_their_layer_or_below():
    graph = import_graph()
    upward = sorted(
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m)
    )
    assert upward == []


def test_the_runtime_imports_nothing_else_of_fecomlite():
    """What the measured program loads: the probe and what it needs, nothing of the analysis,
    server or report."""
    graph = import_graph()
    outside = {f"{m} -> {t}" for m, targets in graph.items() if m.startswith("fecomlite.runtime")
               for t in targets if not t.startswith("fecomlite.runtime")}
    assert outside == set()


SQL_CALLS = {"execute", "executemany", "executescript"}


def sql_outside_the_store() -> list[str]:
    """`….execute(…)` calls and `….db` (the store's connection) outside fecomlite/store/."""
    found = []
    for module, path in module_names().items():
        if module.startswith("fecomlite.store") or path == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and (
                node.attr in SQL_CALLS or (node.attr == "db" and isinstance(node.ctx, ast.Load))
            ):
                found.append(f"{module}:{node.lineno} .{node.attr}")
    return found


def test_only_the_store_speaks_sql():
    assert sql_outside_the_store() == []


def test_top_level_modules_are_a_handful():
    """The CLI, the terminal helpers, and the package's public API; the rest lives in packages
    that say where it runs."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "cli.py", "terminal.py"]


def test_every_module_imports():
    """A moved module leaves no import behind that names where it was (in a fresh interpreter:
    importing the probe starts its sender)."""
    import subprocess
    import sys

    names = [m for m in module_names() if m not in C_MODULES
             and not m.endswith(("__main__", "fc_program"))]  # these run a program at import
    code = ("import importlib, sys\nbad = []\nfor name in sys.argv[1:]:\n"
            "    try:\n        importlib.import_module(name)\n"
            "    except Exception as exc:\n        bad.append(f'{name}: {exc!r}')\n"
            "print('\\n'.join(bad))\nsys.exit(1 if bad else 0)\n")
    done = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stdout + done.stderr
