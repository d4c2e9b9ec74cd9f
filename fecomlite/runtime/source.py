"""The source of an instrumented file, as `linecache` serves it, is the user's original text.

Tracebacks, `inspect.getsource` and TorchScript (which compiles the text `inspect` returns) all
read source through `linecache`. The instrumenter keeps each rewritten file's original beside
the copy, at `<copy>/.fecomlite/original/<relpath>`, and only where no line moved, so every line
number of the running code points at the user's own line. `linecache.updatecache` (what fills a
missing entry) is wrapped to read that original instead; the entry carries no mtime, which
`linecache.checkcache` leaves alone (as for source that came from a loader), so the instrumented
text on disk is never read back. Files with no original there are served as before.

Python 3.11's own printer of uncaught exceptions reads source lines from disk, not through
`linecache`; while `sys.excepthook` is still Python's own, it is replaced by
`traceback.print_exception`, which prints the same report through `linecache`, and so is
`threading.excepthook` (a thread's uncaught exception) while it is Python's own.
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
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _print_uncaught
    if threading.excepthook is threading.__excepthook__:
        threading.excepthook = _print_uncaught_in_thread


def _print_uncaught(kind: type[BaseException], error: BaseException, tb: Any) -> None:
    traceback.print_exception(kind, error, tb)


def _print_uncaught_in_thread(args: Any) -> None:
    """What Python's own `threading.excepthook` prints, with the source through `linecache`."""
    if args.exc_type is SystemExit:
        return
    stream = sys.stderr if sys.stderr is not None else getattr(args.thread, "_stderr", None)
    if stream is None:
        return
    name = args.thread.name if args.thread is not None else threading.get_ident()
    print(f"Exception in thread {name}:", file=stream, flush=True)
    traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback, file=stream)
    stream.flush()
