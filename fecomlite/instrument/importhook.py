"""Instrument a project as Python imports it, and run its script in place (`fecomlite run`).

A `sys.meta_path` finder (like pytest's assertion rewriting) hands every module whose file lies
under the project root to a loader that executes the *rewritten* source (the same libcst
transform as `fecomlite instrument`, `instrument/transform.py`), compiled under the user's own
filename: tracebacks, `inspect`, `linecache`, pickling and `warnings` see the user's files, and
`__file__`, `__spec__`, `sys.path` are what Python gives them. Line numbers are the user's (the
probe import never takes a line of its own here: the loader puts `__fecomlite__` in the module's
globals and drops such a line); columns of a wrapped call differ, and `runtime/positions.py` maps
them back through `runtime/source.py`'s registry of rewritten texts.

Rewrites are cached by content under `cache_dir` (by default `<home>/cache/rewrite`, never beside
the user's files), each written once to a temporary name and renamed into place, so concurrent
runs share nothing mutable and a warm run of an unchanged project rewrites nothing. A file's key
is its bytes, its path in the project, the API roots, the instrumenter's own files and the
project-wide first pass (`exports.py`) in canonical form: editing a function body rewrites that
file alone, a changed export rewrites them all.

Child processes are instrumented too: `child_environment` puts `hookboot/` (a `sitecustomize`)
on PYTHONPATH with the hook's settings in `FECOMLITE_HOOK`; every Python the program starts
(multiprocessing spawn/forkserver, DataLoader workers, `subprocess` of `python`) installs the
same hook before its first project import.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import hashlib
import importlib.abc
import importlib.machinery
import json
import marshal
import os
import pickle
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

from fecomlite.instrument import project as _project
from fecomlite.instrument.exports import Project, ProjectTable, build_table
from fecomlite.runtime.names import set_roots

HOOK_ENV = "FECOMLITE_HOOK"  # JSON: {"root", "api", "cache", "known", "table"} for children
SITES_ENV = "FECOMLITE_SITES"  # a run's folder where each process logs its modules' sites
BOOT_DIR = Path(__file__).resolve().with_name("hookboot")  # holds the children's sitecustomize
_PACKAGE = Path(__file__).resolve().parents[1]  # fecomlite itself is never rewritten
_INSTRUMENTER = Path(__file__).resolve().parent
_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
_FORMAT = 1  # of the cache entries
_UNREADABLE = (OSError, pickle.PickleError, EOFError, ValueError, TypeError, AttributeError)
PROBE = "__fecomlite__"  # the name rewritten calls use (`transform.PROBE`, without libcst)


def default_cache() -> Path:
    home = Path(os.environ.get("FECOMLITE_HOME", ".fecomlite"))
    return Path(os.path.abspath(home)) / "cache" / "rewrite"


def project_root(script: Path, cwd: Path | None = None) -> Path:
    """The folder whose modules are rewritten: the nearest folder above the script that is the
    working directory or holds `.git`, `pyproject.toml`, `setup.py` or `setup.cfg`; else the
    script's own folder. Never the user's home folder, the temporary folder nor `/` (a
    dotfiles repository in the home, or a shell left in /tmp, would make every file there
    "the project")."""
    folder = Path(os.path.realpath(script)).parent
    here = Path(os.path.realpath(cwd or os.getcwd()))
    stop = {Path(os.path.realpath(p)) for p in (Path.home(), tempfile.gettempdir(), folder.anchor)}
    for candidate in (folder, *folder.parents):
        if candidate in stop:
            break
        if candidate == here or any((candidate / m).exists() for m in _MARKERS):
            return candidate
    return folder


def instrumenter_state() -> list[tuple[str, int, int]]:
    """The instrumenter's files (name, size, mtime): an upgrade or an edit rewrites anew."""
    found = []
    for name in sorted(os.listdir(_INSTRUMENTER)):
        if name.endswith(".py"):
            stat = os.stat(_INSTRUMENTER / name)
            found.append((name, stat.st_size, stat.st_mtime_ns))
    return found


@functools.lru_cache(maxsize=4096)
def _real_path(folder: str) -> str:
    return os.path.realpath(folder)


def _canonical(value: Any) -> Any:
    """A JSON-able form of the first pass's table that does not depend on set order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__name__, *(_canonical(getattr(value, f.name))
                                        for f in dataclasses.fields(value))]
    if isinstance(value, dict):
        return sorted([str(k), _canonical(v)] for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def write_atomic(path: Path, data: bytes) -> None:
    """Written whole under a temporary name, then renamed: a reader never sees half a file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class Rewriter:
    """The project's rewritten modules, from the cache or made (and cached) on first need."""

    def __init__(
        self, root: Path, api_roots: list[str] | None, cache_dir: Path | None,
        table_key: str | None = None,
    ) -> None:
        """`table_key`: the first pass a parent process made for the run (`table_key()`), read
        from the cache instead of listing the project again in every process of the run."""
        self.root = Path(os.path.realpath(root))
        self.roots = _project.configured_roots(self.root, api_roots or [])
        self.cache = Path(os.path.abspath(cache_dir or default_cache()))
        self._lock = threading.RLock()
        self._table: tuple[Project | None, str] | None = None
        self._state_key = table_key or ""  # the project's files as found (names, sizes, mtimes)
        self._files: list[Path] | None = None
        base = json.dumps([_FORMAT, instrumenter_state(), list(self.roots)])
        self._base = hashlib.sha256(base.encode()).hexdigest()

    def covers(self, filename: str) -> bool:
        """A Python file of the project (not a virtualenv's, not fecomlite's)."""
        folder, name = os.path.split(os.path.abspath(filename))
        path = os.path.join(_real_path(folder), name)  # the folder's symlinks, once per folder
        inside = path.startswith(str(self.root) + os.sep)
        if not inside or not path.endswith(tuple(_project.PYTHON_SUFFIXES)):
            return False
        if path.startswith(str(_PACKAGE) + os.sep):
            return False
        parts = Path(path).relative_to(self.root).parts[:-1]
        return not any(p in _project.SKIP_DIRS or p.endswith(".egg-info") for p in parts)

    def inside(self, folder: str) -> bool:
        """Whether a folder (a package's `__path__` entry) lies in the project."""
        real = _real_path(folder)
        return real == str(self.root) or real.startswith(str(self.root) + os.sep)

    def rel(self, filename: str) -> str:
        return Path(os.path.realpath(filename)).relative_to(self.root).as_posix()

    def python_files(self) -> list[Path]:
        """The project's Python files (listed once per Rewriter)."""
        if self._files is None:
            scratch = _project.InstrumentResult(self.root, self.root, None, ())
            found = _project.discover_files(self.root, self.cache, scratch)
            self._files = [Path(f.path) for f in found
                           if f.kind == "python" and self.covers(f.path)]
        return self._files

    # --------------------------------------------------------------------- the first pass

    def _project_table(self) -> tuple[Project | None, str]:
        """The first pass over every Python file of the project, cached by their sizes and
        mtimes; with the digest of its content that every file's key includes."""
        with self._lock:
            if self._table is None:
                self._table = self._load_table()
            return self._table

    def table_key(self) -> str:
        """The key of the first pass this Rewriter uses (its project's files as found)."""
        self._project_table()
        return self._state_key

    def _load_table(self) -> tuple[Project | None, str]:
        if self._state_key:  # the run's, made by the parent: every process uses the same one
            with contextlib.suppress(*_UNREADABLE):
                return self._unpickled(self._cached_table(self._state_key).read_bytes())
        files = self.python_files()
        state = []
        for path in files:
            with contextlib.suppress(OSError):
                stat = path.stat()
                state.append((str(path), stat.st_size, stat.st_mtime_ns))
        key = hashlib.sha256(json.dumps([self._base, state]).encode()).hexdigest()
        self._state_key = key
        cached = self._cached_table(key)
        try:
            return self._unpickled(cached.read_bytes())
        except _UNREADABLE:
            table = self._build_table(files)
            digest = hashlib.sha256(json.dumps(_canonical(table)).encode()).hexdigest()
            data = pickle.dumps((table, digest))
            with contextlib.suppress(OSError):
                write_atomic(cached, data)
            return self._unpickled(data)

    def _cached_table(self, key: str) -> Path:
        return self.cache / "tables" / f"{key}.pickle"

    @staticmethod
    def _unpickled(data: bytes) -> tuple[Project | None, str]:
        table, digest = pickle.loads(data)
        return (Project(table) if table.exports or table.stars else None), digest

    def _build_table(self, files: list[Path]) -> ProjectTable:
        from fecomlite.instrument.transform import SourceError

        sources = {}
        for path in files:
            try:
                sources[self.rel(str(path))], _ = _project.decode_source(path.read_bytes(), False)
            except (OSError, SourceError):
                continue
        return build_table(sources, _project.roots_of(self.roots))

    # --------------------------------------------------------------------- one file

    def entry(self, filename: str, data: bytes) -> dict[str, Any]:
        """The rewrite of one project file: {"text": str | None (unchanged), "sites": {key:
        manifest entry}, "failures": [...], "notes": [...]}."""
        project, digest = self._project_table()
        rel = self.rel(filename)
        key = hashlib.sha256(
            b"\0".join([self._base.encode(), digest.encode(), rel.encode(), data])
        ).hexdigest()
        path = self.cache / "rewrites" / key[:2] / f"{key}.json"
        try:
            return json.loads(path.read_bytes())
        except (OSError, ValueError):
            pass
        made = self._rewrite(rel, data, project)
        with contextlib.suppress(OSError):
            write_atomic(path, json.dumps(made).encode())
        return made

    def _rewrite(self, rel: str, data: bytes, project: Project | None) -> dict[str, Any]:
        from fecomlite.instrument.transform import SourceError, instrument_source, split_lines

        made: dict[str, Any] = {"text": None, "sites": {}, "failures": [], "notes": []}
        try:
            text, _ = _project.decode_source(data, False)
            view = project.view(rel) if project is not None else None
            rewrite = instrument_source(text, rel, _project.roots_of(self.roots), view)
        except SourceError as error:
            made["failures"].append([rel, error.line, error.col, error.message])
            return made
        except (RecursionError, MemoryError) as error:
            made["failures"].append([rel, 1, 1, f"too deeply nested to analyse ({error!r})"])
            return made
        except Exception as error:  # a bug here must not stop the program: it runs as written
            made["failures"].append([rel, 1, 1, f"internal error: {type(error).__name__}: "
                                                 f"{error}"])
            return made
        if rewrite.text is not None and rewrite.inserted_lines:
            lines = split_lines(rewrite.text)
            del lines[rewrite.inserted_lines[0] - 1]  # the loader provides `__fecomlite__`
            rewrite.text = "".join(lines)
        made["text"] = rewrite.text
        made["notes"] = rewrite.notes
        for site in rewrite.sites:
            site = dict(site)
            made["sites"][str(site.pop("key"))] = {"file": rel, **site}
        return made

    def code(self, filename: str, data: bytes, made: dict[str, Any]) -> types.CodeType:
        """The rewritten module's code under the user's filename, cached (marshal) per file."""
        tag = sys.implementation.cache_tag or "python"
        key = hashlib.sha256(
            "\0".join([tag, filename, made["text"]]).encode("utf-8", "surrogatepass")
        ).hexdigest()
        path = self.cache / "code" / key[:2] / f"{key}.{tag}.code"
        try:
            return marshal.loads(path.read_bytes())
        except (OSError, ValueError, EOFError, TypeError):
            pass
        code = compile(made["text"], filename, "exec", dont_inherit=True)
        with contextlib.suppress(OSError):
            write_atomic(path, marshal.dumps(code))
        return code

    def rewrite_all(
        self, script: Path | None = None
    ) -> tuple[dict[str, dict[str, Any]], list[list[Any]]]:
        """The project's Python files rewritten (or found in the cache): their sites, and the
        files that could not be (they run as written). With `script`, only the modules it
        imports, directly or not, as far as the source says (`import_closure`): a script in a
        big repository does not wait for every test file of it to be rewritten. A module
        imported otherwise (`importlib.import_module(name)`) is rewritten when imported."""
        self._project_table()
        real = os.path.realpath(script) if script is not None else ""
        named = hashlib.sha256(real.encode()).hexdigest()[:16]
        whole = self.cache / "projects" / f"{self._state_key}-{named}.json"
        try:
            sites, failures = json.loads(whole.read_bytes())  # an unchanged project: one read
            return sites, failures
        except (OSError, ValueError):
            pass
        files = self.python_files() if not real else [
            path for path in import_closure(Path(real), self.python_files(), self.root)
            if self.covers(str(path))]
        sites, failures = {}, []
        for path in files:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            made = self.entry(str(path), data)
            sites.update(made["sites"])
            failures.extend(made["failures"])
        with contextlib.suppress(OSError):
            write_atomic(whole, json.dumps([sites, failures]).encode())
        return sites, failures


def import_closure(script: Path, files: list[Path], root: Path) -> list[Path]:
    """`script` and the project files it imports, directly or through each other, by the names
    they can be imported under: from the script's folder (`sys.path[0]`), the root (the working
    directory, usually) and `root/src`. Every import statement counts, conditional or not."""
    import ast

    by_name: dict[str, Path] = {}
    bases = [script.parent, root, root / "src"]
    for path in files:
        for base in bases:
            if base in path.parents:
                parts = list(path.relative_to(base).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                if parts:
                    by_name.setdefault(".".join(parts), path)
    package_of = {path: name.rpartition(".")[0] if path.name != "__init__.py" else name
                  for name, path in by_name.items()}
    found = {script}
    todo = [script]
    while todo:
        path = todo.pop()
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for name in _imported_names(tree, package_of.get(path, "")):
            parts = name.split(".")
            for cut in range(1, len(parts) + 1):  # a.b.c imports a and a.b first
                module = by_name.get(".".join(parts[:cut]))
                if module is not None and module not in found:
                    found.add(module)
                    todo.append(module)
    return sorted(found)


def _imported_names(tree: Any, package: str) -> list[str]:
    """Every dotted name an import statement of `tree` may load (`from a import b`: a, a.b)."""
    import ast

    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level - 1 <= len(parts) \
                    else []
                base = ".".join([*parts, base] if base else parts)
            if base:
                names.append(base)
            names.extend(f"{base}.{a.name}" if base else a.name for a in node.names)
    return names


class _RewrittenLoader(importlib.machinery.SourceFileLoader):
    """A project module: the rewritten code, the user's path and source."""

    def __init__(
        self, fullname: str, path: str, hook: ImportHook, code: types.CodeType
    ) -> None:
        super().__init__(fullname, path)
        self.hook = hook
        self._found: types.CodeType | None = code  # what find_spec made: not made twice

    def get_code(self, fullname: str) -> types.CodeType | None:  # type: ignore[override]
        code, self._found = self._found, None
        if code is None:  # a reload: the file as it is now
            code = self.hook.code_for(self.path)
        return code if code is not None else super().get_code(fullname)

    def exec_module(self, module: types.ModuleType) -> None:
        code = self.get_code(module.__name__)
        if code is None:
            raise ImportError(f"cannot load {self.path}", name=module.__name__)
        _provide_probe(module.__dict__)
        exec(code, module.__dict__)


def _provide_probe(namespace: dict[str, Any]) -> None:
    """The probe, under the name the rewritten calls use (its import line may be dropped)."""
    import fecomlite.runtime.probe as probe

    namespace.setdefault(PROBE, probe)


class SiteLog:
    """The sites of modules a process rewrote that the run's manifest does not hold (a module
    loaded by `importlib.import_module(name)`, `__import__`, a spec, a plugin found at run time):
    one JSON line per module, appended to `<folder>/<pid>.jsonl`, which the runner merges into
    the run's manifest (`runner.inplace.logged_sites`). `known` names the manifest's files (a
    JSON list of project-relative paths): their sites are the run's already."""

    def __init__(self, folder: Path, known: Path | None) -> None:
        self.folder, self.known_path = folder, known
        self._known: set[str] | None = None
        self._logged: set[str] = set()

    def add(self, rel: str, sites: dict[str, Any]) -> None:
        """Never raises: a site named by key only is better than a program stopped."""
        if not sites or rel in self._logged or rel in self.known():
            return
        self._logged.add(rel)
        line = json.dumps({"file": rel, "sites": sites}).encode() + b"\n"
        with contextlib.suppress(OSError):
            fd = os.open(self.folder / f"{os.getpid()}.jsonl",
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line)  # one write: lines of threads never interleave
            finally:
                os.close(fd)

    def known(self) -> set[str]:
        if self._known is None:
            self._known = set()
            if self.known_path is not None:
                with contextlib.suppress(OSError, ValueError, TypeError):
                    self._known = set(json.loads(self.known_path.read_bytes()))
        return self._known


class ImportHook(importlib.abc.MetaPathFinder):
    """Installed by `install`: rewrites the project's modules as they are imported."""

    def __init__(self, rewriter: Rewriter, site_log: SiteLog | None = None) -> None:
        self.rewriter = rewriter
        self.site_log = site_log
        set_roots(list(rewriter.roots))  # the probe decides run-time sites by these same roots
        self.sites: dict[str, dict[str, Any]] = {}  # manifest entries of modules rewritten
        self.failures: list[list[Any]] = []  # [rel, line, col, message]: run as written
        self._runpy_code: Any = None

    @property
    def root(self) -> Path:
        return self.rewriter.root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        """A project module's spec with the rewriting loader; None for anything else, which
        the finders after this one then find as they would without it."""
        if path is not None and not any(self.rewriter.inside(str(p)) for p in path):
            return None  # a submodule of a package outside the project (torch's thousand)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        origin = spec.origin or ""
        if not self.rewriter.covers(origin):
            return None
        code = self.code_for(origin)
        if code is None:
            return None
        spec.loader = _RewrittenLoader(fullname, origin, self, code)
        return spec

    def code_for(self, filename: str) -> types.CodeType | None:
        """The rewritten code of a project file, or None where it has no site (or cannot be
        read or rewritten: Python then loads it as usual)."""
        from fecomlite.runtime import source

        if not self.rewriter.covers(filename):
            return None
        try:
            data = Path(filename).read_bytes()
        except OSError:
            return None
        made = self.rewriter.entry(filename, data)
        self.sites.update(made["sites"])
        if self.site_log is not None:
            self.site_log.add(self.rewriter.rel(filename), made["sites"])
        self.failures.extend(f for f in made["failures"] if f not in self.failures)
        if made["text"] is None:
            return None
        code = self.rewriter.code(filename, data, made)
        source.register_rewritten(filename, made["text"])
        return code

    def uninstall(self) -> None:
        with contextlib.suppress(OSError):
            sys.meta_path.remove(self)
        import runpy

        if self._runpy_code is not None:
            runpy._get_code_from_file = self._runpy_code  # type: ignore[attr-defined]
            self._runpy_code = None
        importlib.invalidate_caches()

    def _serve_runpy(self) -> None:
        """`runpy.run_path` of a project file (multiprocessing's spawn re-runs the main script
        in each child that way) runs its rewritten code too."""
        import runpy

        stdlib = getattr(runpy, "_get_code_from_file", None)
        if stdlib is None or getattr(stdlib, "__fecomlite__", False):
            return

        def get_code_from_file(*args: Any) -> Any:
            fname = args[-1]
            if isinstance(fname, str) and self.rewriter.covers(fname):
                code = self.code_for(os.path.abspath(fname))
                if code is not None:
                    return code if len(args) == 1 else (code, fname)
            return stdlib(*args)

        get_code_from_file.__fecomlite__ = True  # type: ignore[attr-defined]
        self._runpy_code = stdlib
        runpy._get_code_from_file = get_code_from_file  # type: ignore[attr-defined]


def install(
    root: Path, *, api_roots: list[str] | None = None, cache_dir: Path | None = None,
    site_log: SiteLog | None = None, table_key: str | None = None,
) -> ImportHook:
    """Rewrite every module whose file lies under `root` (not a virtualenv's or site-packages',
    not fecomlite's) as it is imported, from now on in this process. Modules imported before
    stay as they are. `table_key`: the run's first pass (`Rewriter`)."""
    hook = ImportHook(Rewriter(root, api_roots, cache_dir, table_key), site_log)
    sys.meta_path.insert(0, hook)
    hook._serve_runpy()
    importlib.invalidate_caches()
    return hook


def child_environment(
    hook: ImportHook, env: dict[str, str], known: Path | None = None
) -> dict[str, str]:
    """`env` for a process that must run the project rewritten: Pythons started from it (and
    their children) install the same hook at start-up. `known`: the manifest's files (SiteLog)."""
    settings = {
        "root": str(hook.rewriter.root),
        "api": list(hook.rewriter.roots),
        "cache": str(hook.rewriter.cache),
        "known": str(known) if known is not None else None,
        "table": hook.rewriter.table_key(),  # no process of the run lists the project again
    }
    paths = [str(BOOT_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, HOOK_ENV: json.dumps(settings), "PYTHONPATH": os.pathsep.join(paths)}


def install_from_environment() -> ImportHook | None:
    """In a child process: the hook its parent's `child_environment` asked for, if any."""
    for installed in sys.meta_path:  # (the bootstrap's, whose `hookview` hid HOOK_ENV)
        if isinstance(installed, ImportHook):
            return installed
    raw = os.environ.get(HOOK_ENV)
    if not raw:
        return None
    try:
        settings = json.loads(raw)
        known, folder = settings.get("known"), os.environ.get(SITES_ENV)
        log = SiteLog(Path(folder), Path(known) if known else None) if folder else None
        return install(Path(settings["root"]), api_roots=list(settings["api"]),
                       cache_dir=Path(settings["cache"]), site_log=log,
                       table_key=settings.get("table"))
    except (ValueError, KeyError, TypeError, OSError):
        return None


def run_script(script: Path | str, argv: list[str], hook: ImportHook) -> None:
    """Run `script` as `__main__`, rewritten, as `python script ARGV...` would: `sys.argv` is
    `[script as given, *argv]`, `sys.path[0]` its folder (symlinks resolved), `__file__` its
    absolute path, `__spec__` None. Exceptions propagate from the script's own frames."""
    given = os.fspath(script)
    filename = given if os.path.isabs(given) else os.path.join(os.getcwd(), given)  # unnormalised,
    # as Python makes it: `./x.py` -> `/cwd/./x.py`
    code = hook.code_for(filename)
    rewritten = code is not None
    if code is None:
        with open(filename, "rb") as f:
            code = compile(f.read(), filename, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=filename,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", filename),
        __spec__=None,
        __package__=None,
    )
    sys.argv[:] = [given, *argv]
    folder = os.path.dirname(os.path.realpath(filename))
    if sys.path and sys.path[0] in ("", os.getcwd(), os.path.realpath(os.getcwd())):
        sys.path[0] = folder  # `python -m` put the working directory there
    else:
        sys.path.insert(0, folder)
    sys.modules["__main__"] = main
    if rewritten:
        _provide_probe(main.__dict__)
    exec(code, main.__dict__)
