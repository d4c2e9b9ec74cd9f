"""Instrument a file, a notebook or a project directory into a separate copy, with a manifest.

The original is never written to. The copy holds every file of the project (so it runs from its
own folder) except virtualenvs, version-control folders and caches; Python files and notebooks
are instrumented, everything else is copied (or, for `fecomlite run`'s work copy, linked: a data
file is read where it lies). Files are independent, so a project big enough to repay the start-up
of worker processes is spread over the CPUs. Folders keep their permissions
(a private project stays private in its copy), and a symlink that leads out of the project is
kept as a link to where it points, never followed or copied (the summary says so).

The import hook (``importhook.py``) shares this module's listing, decoding and roots:
``discover_files``, ``decode_source`` and ``roots_of``.
"""

from __future__ import annotations

import ast
import errno
import gc
import io
import json
import multiprocessing
import os
import shutil
import threading
import time
import tokenize
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from fecomlite.instrument.exports import Project, ProjectTable, ProjectView, build_table
from fecomlite.instrument.names import DEFAULT_ROOTS, Roots

if TYPE_CHECKING:  # libcst comes with the rewriting, not with the checks a reused copy needs
    from fecomlite.instrument.transform import Rewrite

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

MANIFEST = Path(".fecomlite") / "manifest.json"
ORIGINALS = Path(".fecomlite") / "original"  # the user's text of each rewritten file
MANIFEST_FORMAT = 1
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
        ".ipynb_checkpoints",
        "node_modules",
        "site-packages",
        ".fecomlite",
    }
)
PYTHON_SUFFIXES = frozenset({".py", ".pyw"})
SKIP_SUFFIXES = frozenset({".pyc", ".pyo"})
# Below this much Python source (~1,200 lines), starting workers costs more than they save.
PARALLEL_MIN_BYTES = 40_000
# Up to this much source (~100k lines; its syntax trees take ~55 times as much memory), the
# first pass's parses are kept for the per-file pass (forked workers inherit them).
REUSED_TREES_MAX_CHARS = 4_000_000


class InstrumentError(Exception):
    """The whole request is refused (nothing was written)."""


@dataclass(frozen=True)
class Failure:
    """A file that could not be instrumented; ``line``/``col`` are 1-based."""

    path: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.message}"


@dataclass
class InstrumentResult:
    source: Path
    out: Path
    manifest: Path | None  # None when only listing
    api_roots: tuple[str, ...]
    sites: dict[str, dict[str, object]] = field(default_factory=dict)
    files_instrumented: int = 0  # Python files and notebooks with at least one site
    files_unchanged: int = 0  # Python files and notebooks with none (copied as they are)
    files_copied: int = 0  # other files (copied, or linked with link_others)
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lines: int = 0  # lines of Python and notebook source read
    seconds: float = 0.0
    workers: int = 1

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def sites_by_root(self) -> dict[str, int]:
        roots = (str(site["root"]) or "decided at run time" for site in self.sites.values())
        return dict(Counter(roots).most_common())


def default_out(path: Path) -> Path:
    """The default copy: a sibling ``<name>-instrumented/`` folder (outside ``path``)."""
    path = Path(os.path.abspath(path))
    name = path.stem if path.suffix in (*PYTHON_SUFFIXES, ".ipynb") else path.name
    return path.parent / f"{name}-instrumented"


def configured_roots(path: Path, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Default roots, then ``[tool.fecomlite] api`` of the project's pyproject.toml, then
    ``extra`` (``--api``)."""
    roots = list(DEFAULT_ROOTS)
    folder = Path(os.path.abspath(path))
    if not folder.is_dir():
        folder = folder.parent
    for candidate in (folder, *folder.parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            try:
                config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
                raise InstrumentError(
                    f"{pyproject}: cannot read [tool.fecomlite]: {error}"
                ) from error
            api = config.get("tool", {}).get("fecomlite", {}).get("api", [])
            if isinstance(api, str) or not all(isinstance(item, str) for item in api):
                raise InstrumentError(
                    f"{pyproject}: [tool.fecomlite] api must be a list of strings"
                )
            roots.extend(api)
            break
    roots.extend(extra)
    return Roots(roots).names


def instrument_path(
    path: Path,
    out: Path | None = None,
    api_roots: Sequence[str] = (),
    *,
    list_only: bool = False,
    workers: int | None = None,
    link_others: bool = False,
) -> InstrumentResult:
    """Instrument ``path`` (a ``.py`` file, a ``.ipynb`` notebook or a directory) into ``out``.

    ``api_roots`` adds to the default roots and the project's ``[tool.fecomlite] api``.
    ``list_only`` finds the sites without writing anything. ``workers`` caps the processes
    (default: one per CPU, for projects big enough). ``link_others`` symlinks the files that
    are neither Python nor notebooks instead of copying them. Raises ``InstrumentError`` when
    the request is refused; per-file problems are in ``InstrumentResult.failures``.
    """
    started = time.perf_counter()
    path = Path(os.path.abspath(path))
    try:
        is_dir = path.is_dir()
        exists = is_dir or path.is_file()
    except OSError as error:  # a looping symlink given as PATH
        raise InstrumentError(f"{path}: {error.strerror or error}") from error
    if not exists:
        raise InstrumentError(f"{path}: no such file or directory")
    if is_dir and (path / MANIFEST).is_file():
        raise InstrumentError(
            f"{path} is already an instrumented copy ({MANIFEST} is there); "
            "instrument the original project instead"
        )
    out = Path(os.path.abspath(out)) if out is not None else default_out(path)
    roots = configured_roots(path, api_roots)
    result = InstrumentResult(
        source=path, out=out, manifest=None if list_only else out / MANIFEST, api_roots=roots
    )
    if not list_only:
        _prepare_out(path, out)
    files = discover_files(path, out, result) if is_dir else [_entry(path, path.name, single=True)]
    work = [f for f in files if f.kind not in ("copy", "link")]
    copies = [f for f in files if f.kind in ("copy", "link")]
    place = _link if link_others else shutil.copy2
    try:
        table = _project_table(work, roots) if is_dir else ProjectTable()
        outcomes = _run(work, out, roots, list_only, workers, result, copies, table, place)
    finally:
        gc.unfreeze()
        _parsed.clear()
    for outcome in sorted(outcomes, key=lambda o: o.rel):
        result.lines += outcome.lines
        result.notes.extend(outcome.notes)
        result.failures.extend(outcome.failures)
        if outcome.failures and not outcome.sites:
            continue
        if outcome.sites:
            result.files_instrumented += 1
        else:
            result.files_unchanged += 1
        for site in outcome.sites:
            key = str(site.pop("key"))
            result.sites[key] = {"file": outcome.rel, **site}
    result.failures.sort(key=lambda f: (f.path, f.line, f.col))
    if not list_only:
        _write_manifest(result)
        if is_dir:
            _copy_folder_modes(path, out)
    result.seconds = time.perf_counter() - started
    return result


def source_state(path: Path, out: Path) -> list[tuple[str, str, int, int]]:
    """(rel, kind, size, mtime_ns) of every file the instrumented copy ``out`` of ``path`` holds:
    equal lists mean an unchanged project (``fecomlite run`` then reuses its copy)."""
    path = Path(os.path.abspath(path))
    if not path.is_dir():
        stat = path.stat()
        return [(path.name, "python", stat.st_size, stat.st_mtime_ns)]
    scratch = InstrumentResult(source=path, out=path, manifest=None, api_roots=())
    state = []
    for file in discover_files(path, Path(os.path.abspath(out)), scratch):
        try:
            stat = os.stat(file.path)
        except OSError:
            continue
        state.append((file.rel, file.kind, stat.st_size, stat.st_mtime_ns))
    return state


# ----------------------------------------------------------------------------- output folder


def _prepare_out(source: Path, out: Path) -> None:
    real_source, real_out = source.resolve(), out.resolve()
    if real_out == real_source or real_source.is_relative_to(real_out):
        raise InstrumentError(f"--out {out} would contain the original; choose a folder outside it")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise InstrumentError(f"--out {out} exists and is not a folder")
        if (out / MANIFEST).is_file():
            shutil.rmtree(out)  # an earlier instrumented copy: replaced as a whole
        elif any(out.iterdir()):
            raise InstrumentError(
                f"--out {out} exists, is not empty and is not a fecomlite copy; "
                "choose another folder or remove it"
            )
    out.mkdir(parents=True, exist_ok=True)


def _copy_folder_modes(source: Path, out: Path) -> None:
    """Give each folder of the copy its original's permission bits (deepest first, so that a
    folder closed to others is closed last)."""
    for folder, _, _ in os.walk(out, topdown=False):
        original = source / os.path.relpath(folder, out)
        try:
            if original.is_dir():
                os.chmod(folder, original.stat().st_mode & 0o7777)
        except OSError:
            continue  # best effort: the copy runs as well with its default modes


def _write_manifest(result: InstrumentResult) -> None:
    assert result.manifest is not None
    source_root = result.source if result.source.is_dir() else result.source.parent
    manifest = {
        "format": MANIFEST_FORMAT,
        "source_root": str(source_root),
        "api_roots": list(result.api_roots),
        "sites": result.sites,
    }
    result.manifest.parent.mkdir(parents=True, exist_ok=True)
    result.manifest.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class ProjectFile:
    """A file of the project as ``discover_files`` found it (the import hook lists the same)."""

    path: str  # absolute, as found (symlinks not resolved); a link's: where it points
    rel: str  # relative to the instrumented root, with "/"
    kind: str  # python | notebook | copy | link (out of the project: recreated, not followed)
    size: int


def _entry(path: Path, rel: str, *, single: bool = False) -> ProjectFile:
    """A file found in a project; a file given alone is Python (a script) unless a notebook."""
    suffix = path.suffix.lower()
    if suffix == ".ipynb":
        kind = "notebook"
    elif suffix in PYTHON_SUFFIXES or single:
        kind = "python"
    else:
        kind = "copy"
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # reported when read
    return ProjectFile(str(path), rel, kind, size)


def discover_files(root: Path, out: Path, result: InstrumentResult) -> list[ProjectFile]:
    """Every file to instrument or copy under ``root`` (``out``, instrumented copies and
    virtual environments left out), following symlinks once; loops, unreadable folders and
    links out of the project go to ``result``'s notes and failures."""
    files: list[ProjectFile] = []
    real_out = os.path.realpath(out)
    real_root = os.path.realpath(root)
    seen = {_identity(root)}

    def leaves(full: Path, rel: str) -> bool:
        """A symlink out of the project: kept as a link (and said), never followed."""
        if not full.is_symlink():
            return False
        target = os.path.realpath(full)
        if os.path.commonpath([target, real_root]) == real_root:
            return False
        files.append(ProjectFile(target, rel, "link", 0))
        result.notes.append(f"{rel}: kept as a link to {target} (outside the project, not "
                            "followed)")
        return True

    def unreadable(error: OSError) -> None:
        rel = os.path.relpath(error.filename or str(root), root)
        result.failures.append(Failure(rel, 1, 1, f"cannot read folder: {error.strerror}"))

    for folder, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=True):
        base = Path(folder)
        kept = []
        for name in sorted(dirnames):
            full = base / name
            rel = full.relative_to(root).as_posix()
            if name in SKIP_DIRS or name.endswith(".egg-info") or (full / "pyvenv.cfg").exists():
                continue
            if os.path.realpath(full) == real_out or leaves(full, rel):
                continue
            if (full / MANIFEST).is_file():
                result.notes.append(f"{rel}: skipped: an instrumented copy")
                continue
            try:
                identity = _identity(full)
            except OSError as error:
                result.notes.append(f"{rel}: skipped: {_link_problem(error)}")
                continue
            if identity in seen:
                target = os.path.realpath(full)
                result.notes.append(f"{rel}: skipped: symlink loop (points back to {target})")
                continue
            seen.add(identity)
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            full = base / name
            rel = full.relative_to(root).as_posix()
            if full.suffix in SKIP_SUFFIXES or leaves(full, rel):
                continue
            try:
                full.stat()
            except OSError as error:
                result.notes.append(f"{rel}: skipped: {_link_problem(error)}")
                continue
            files.append(_entry(full, rel))
    return files


def _identity(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_dev, stat.st_ino


def _link_problem(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "symlink loop"
    if error.errno == errno.ENOENT:
        return "broken symlink"
    return error.strerror or str(error)


# ----------------------------------------------------------------------------- per-file work


@dataclass
class _Outcome:
    rel: str
    lines: int = 0
    sites: list[dict[str, object]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _project_table(work: list[ProjectFile], roots: tuple[str, ...]) -> ProjectTable:
    """The first pass (``exports.py``) over the project's Python files, before any worker."""
    from fecomlite.instrument.transform import SourceError

    sources = {}
    for file in work:
        if file.kind != "python":
            continue
        try:
            sources[file.rel], _ = decode_source(Path(file.path).read_bytes(), notebook=False)
        except (OSError, SourceError):
            continue  # reported by the per-file pass
    small = sum(len(text) for text in sources.values()) <= REUSED_TREES_MAX_CHARS
    trees: dict[str, ast.Module] | None = {} if small else None
    with _collection_deferred():  # the kept trees would be scanned again and again
        table = build_table(sources, roots_of(roots), trees)
        gc.freeze()  # and once more when collection resumes (thawed by instrument_path)
    for rel, tree in (trees or {}).items():
        _parsed[rel] = (sources[rel], tree)
    return table


def _run(
    work: list[ProjectFile],
    out: Path,
    roots: tuple[str, ...],
    list_only: bool,
    workers: int | None,
    result: InstrumentResult,
    copies: list[ProjectFile],
    table: ProjectTable,
    place: Callable[[str, Path], object],
) -> list[_Outcome]:
    tasks = [
        (f.path, f.rel, f.kind == "notebook", None if list_only else str(out / f.rel), roots)
        for f in sorted(work, key=lambda f: -f.size)  # big files first: even finish times
    ]
    count = _worker_count(work, workers)
    result.workers = count
    # the first pass's trees (and, in forked workers, the whole parent heap) are never scanned
    # by the collections between files (nor copied by the workers' scans); thawed by the caller
    gc.freeze()
    if count == 1:
        _use_table(table)
        outcomes = [_process(task) for task in tasks]
        if not list_only:
            _copy_all(copies, out, result, place)
        return outcomes
    # imported here: every process of a measured program imports this module (the import hook)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(
        max_workers=count, mp_context=_context(), initializer=_use_table, initargs=(table,)
    ) as pool:
        futures = [pool.submit(_process, task) for task in tasks]
        if not list_only:
            _copy_all(copies, out, result, place)  # meanwhile, in this process
        return [future.result() for future in futures]


def _worker_count(work: list[ProjectFile], workers: int | None) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    limit = min(cpus, workers or cpus, len(work))
    if sum(f.size for f in work) < PARALLEL_MIN_BYTES:
        return 1
    return max(limit, 1)


def _context() -> multiprocessing.context.BaseContext:
    """Fork (instant, libcst already imported) unless threads make forking unsafe."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _link(source: str, target: Path) -> None:
    os.symlink(os.path.realpath(source), target)


def _copy_all(
    copies: list[ProjectFile],
    out: Path,
    result: InstrumentResult,
    place: Callable[[str, Path], object],
) -> None:
    made: set[Path] = set()
    for file in copies:
        target = out / file.rel
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        try:
            if file.kind == "link":
                os.symlink(file.path, target)
            else:
                place(file.path, target)
                result.files_copied += 1
        except OSError as error:
            result.failures.append(Failure(file.rel, 1, 1, f"cannot copy: {error.strerror}"))


@lru_cache(maxsize=8)
def roots_of(names: tuple[str, ...]) -> Roots:
    """The ``Roots`` of configured root names, made once per tuple (every file asks for it)."""
    return Roots(names)


_project: Project | None = None  # this process's view of the first pass, set before _process
_parsed: dict[str, tuple[str, ast.Module]] = {}  # rel → (text, its tree), from the first pass


def _use_table(table: ProjectTable) -> None:
    """Set in each worker once (not pickled with every task)."""
    global _project
    _project = Project(table) if table.exports or table.stars else None


def _process(task: tuple[str, str, bool, str | None, tuple[str, ...]]) -> _Outcome:
    """Instrument one file (in a worker process or here); never raises."""
    from fecomlite.instrument.transform import SourceError

    source, rel, notebook, target, roots = task
    outcome = _Outcome(rel)
    try:
        data = Path(source).read_bytes()
    except OSError as error:
        outcome.failures.append(Failure(rel, 1, 1, f"cannot read: {error.strerror}"))
        return outcome
    outcome.lines = data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)
    rewrite: Rewrite | None = None
    encoding = "utf-8"
    view = _project.view(rel) if _project is not None else None
    try:
        text, encoding = decode_source(data, notebook)
        with _collection_deferred():
            rewrite = _rewrite(text, rel, notebook, roots, view, outcome)
    except SourceError as error:
        outcome.failures.append(Failure(rel, error.line, error.col, error.message))
    except (RecursionError, MemoryError) as error:
        outcome.failures.append(Failure(rel, 1, 1, f"too deeply nested to analyse ({error!r})"))
    except Exception as error:  # a bug here must not stop the other files
        message = f"internal error: {type(error).__name__}: {error}"
        outcome.failures.append(Failure(rel, 1, 1, message))
    if rewrite is not None:
        outcome.sites, outcome.notes = rewrite.sites, rewrite.notes
    if target is not None:
        try:
            _write(Path(source), Path(target), rewrite, encoding)
            if not notebook and rewrite is not None and rewrite.text is not None:
                _keep_original(Path(source), Path(target), rel, rewrite)
        except OSError as error:
            outcome.failures.append(Failure(rel, 1, 1, f"cannot write copy: {error.strerror}"))
            outcome.sites = []
    return outcome


def _rewrite(
    text: str,
    rel: str,
    notebook: bool,
    roots: tuple[str, ...],
    view: ProjectView | None,
    outcome: _Outcome,
) -> Rewrite:
    from fecomlite.instrument.notebook import instrument_notebook
    from fecomlite.instrument.transform import instrument_source

    if notebook:
        rewrite, cell_errors = instrument_notebook(text, rel, roots_of(roots), view)
        outcome.failures += [Failure(rel, e.line, e.col, e.message) for e in cell_errors]
        return rewrite
    parsed = _parsed.get(rel)
    tree = parsed[1] if parsed is not None and parsed[0] == text else None
    return instrument_source(text, rel, roots_of(roots), view, tree)


@contextmanager
def _collection_deferred() -> Iterator[None]:
    """No cyclic garbage collection while one file is rewritten: libcst makes hundreds of
    thousands of objects a file, and the collections they set off re-scan the file's live tree
    again and again (~10 % of the time); the file's garbage is collected after it instead."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_source(data: bytes, notebook: bool) -> tuple[str, str]:
    """The text of a file and its encoding (PEP 263 cookie or BOM; notebooks are UTF-8); a
    file that cannot be decoded raises ``SourceError`` with the line and column of the byte."""
    from fecomlite.instrument.transform import SourceError

    if notebook:
        encoding = "utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8"
    else:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as error:
            raise SourceError(error.lineno or 1, 1, str(error.msg or error)) from error
    try:
        return data.decode(encoding), encoding
    except LookupError as error:
        raise SourceError(1, 1, f"unknown encoding {encoding!r} in the coding cookie") from error
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        col = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        hint = "" if encoding != "utf-8" else " (declare the file's encoding with a coding cookie)"
        message = f"cannot decode byte 0x{data[error.start]:02x} as {encoding}{hint}"
        raise SourceError(line, col, message) from error


def _keep_original(source: Path, target: Path, rel: str, rewrite: Rewrite) -> None:
    """The user's text beside the copy (``.fecomlite/original/<rel>``), which the probe has
    ``linecache`` serve for the copy (``fecomlite/runtime/source.py``): tracebacks, ``inspect``
    and TorchScript then read what the user wrote. Only where no line moved."""
    if rewrite.inserted_lines:
        return
    root = target.parents[len(Path(rel).parts) - 1]
    original = root / ORIGINALS / rel
    original.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, original)


def _write(source: Path, target: Path, rewrite: Rewrite | None, encoding: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if rewrite is None or rewrite.text is None:
        shutil.copy2(source, target)  # unchanged, or failed: the copy still runs as before
    else:
        target.write_bytes(rewrite.text.encode(encoding))
        shutil.copystat(source, target)
