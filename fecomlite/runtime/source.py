"""The source of an instrumented file, as `linecache` serves it, is the user's original text.

Tracebacks, `inspect.getsource` and TorchScript (which compiles the text `inspect` returns) all
read source through `linecache`. The instrumenter keeps each rewritten file's original beside
the copy, at `<copy>/.fecomlite/original/<relpath>`, and only where no line moved, so every line
number of the running code points at the user's own line. `linecache.updatecache` (what fills a
missing entry) is wrapped to read that original instead; the entry carries no mtime, which
`linecache.checkcache` leaves alone (as for source that came from a loader), so the instrumented
text on disk is never read back. Files with no original there are served as before.

Python 3.11's own printer of uncaught exceptions reads source lines from disk, not through
`linecache`: from an instrumented copy it would print the rewritten lines. Only when the program
itself runs from such a copy (its `__main__` has an original), and while `sys.excepthook` is still
Python's own, is it replaced by a printer that reads through `linecache` and otherwise prints what
Python's would: the line each traceback entry recorded (`tb_lineno`, not the line of
`tb_lasti`, which differs where a library rebuilt the traceback from live frames, as TensorFlow
does), with carets only where the two agree (Python's own printer draws another line's columns
under it there); `threading.excepthook` alike. A program run in place
(the source on disk is the user's) keeps its hooks as they are.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import tokenize
import traceback
from functools import lru_cache
from typing import Any

ORIGINALS = os.path.join(".fecomlite", "original")
MANIFEST = os.path.join(".fecomlite", "manifest.json")
_rewritten: dict[str, str] = {}  # user's file -> the text its running code was compiled from


def register_rewritten(filename: str, text: str) -> None:
    """A module run in place (`fecomlite.instrument.importhook`): its code carries the user's
    filename, so `linecache` reads the user's text already; its columns are the rewritten
    text's (`positions.py` maps them back)."""
    _rewritten[os.path.abspath(filename)] = text


def rewritten_text(filename: str) -> str | None:
    if not filename or filename.startswith("<"):
        return None
    return _rewritten.get(os.path.abspath(filename))


@lru_cache(maxsize=1024)
def _is_copy_root(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, MANIFEST))


def original_of(filename: str) -> str | None:
    """The path of the user's original text of an instrumented file, if there is one."""
    if not filename or filename.startswith("<"):
        return None
    path = os.path.abspath(filename)
    folder = os.path.dirname(path)
    while True:
        if _is_copy_root(folder):
            original = os.path.join(folder, ORIGINALS, os.path.relpath(path, folder))
            return original if os.path.isfile(original) else None
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _read_lines(path: str) -> list[str]:
    with tokenize.open(path) as file:  # the file's own encoding, as linecache reads it
        lines = file.readlines()
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def serve_original_sources() -> None:
    """Wrap `linecache.updatecache` once per process (importing the probe twice changes nothing)."""
    stdlib = linecache.updatecache
    if getattr(stdlib, "__fecomlite__", False):
        return

    def updatecache(filename: str, module_globals: Any = None) -> list[str]:
        original = original_of(filename)
        if original is None:
            return stdlib(filename, module_globals)
        try:
            lines = _read_lines(original)
        except (OSError, UnicodeDecodeError, SyntaxError):
            return stdlib(filename, module_globals)
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
        return lines

    updatecache.__fecomlite__ = True  # type: ignore[attr-defined]
    updatecache.__wrapped__ = stdlib  # type: ignore[attr-defined]
    linecache.updatecache = updatecache
    for filename in [f for f in linecache.cache if original_of(f) is not None]:
        linecache.cache.pop(filename, None)  # read before the probe was imported: served anew
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(main_file, str) or original_of(main_file) is None:
        return  # the source on disk is the user's: Python's own printers read it right
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _print_uncaught
    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _print_uncaught_in_thread


def _print_uncaught(
    kind: type[BaseException], error: BaseException, tb: Any, file: Any = None
) -> None:
    """What Python's own `sys.excepthook` prints, with the source through `linecache`."""
    report = traceback.TracebackException(kind, error, tb, compact=True)
    _recorded_lines(report, tb, error, set())
    report.print(file=sys.stderr if file is None else file)


def _recorded_lines(
    report: traceback.TracebackException, tb: Any, error: BaseException | None, seen: set[int]
) -> None:
    """Each entry at the line its traceback recorded, as Python's printer shows it, through
    the chain (cause, context, groups)."""
    if id(report) in seen:
        return
    seen.add(id(report))
    for summary, (_, lineno) in zip(report.stack, traceback.walk_tb(tb), strict=False):
        if summary.lineno != lineno:  # the columns are another line's: no carets
            summary.lineno, summary._line = lineno, None  # type: ignore[attr-defined]
            summary.end_lineno = summary.colno = summary.end_colno = None
    pairs = [(report.__cause__, getattr(error, "__cause__", None)),
             (report.__context__, getattr(error, "__context__", None))]
    pairs += zip(getattr(report, "exceptions", None) or (),
                 getattr(error, "exceptions", ()), strict=False)
    for inner, inner_error in pairs:
        if inner is not None and inner_error is not None:
            _recorded_lines(inner, inner_error.__traceback__, inner_error, seen)


def _print_uncaught_in_thread(args: Any) -> None:
    """What Python's own `threading.excepthook` prints, with the source through `linecache`."""
    if args.exc_type is SystemExit:
        return
    stream = sys.stderr if sys.stderr is not None else getattr(args.thread, "_stderr", None)
    if stream is None:
        return
    name = args.thread.name if args.thread is not None else threading.get_ident()
    print(f"Exception in thread {name}:", file=stream, flush=True)
    _print_uncaught(args.exc_type, args.exc_value, args.exc_traceback, stream)
    stream.flush()
