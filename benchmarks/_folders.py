"""A benchmark's working folder: a fresh temporary one, removed after, or the one the user
names to keep (`--keep DIR`, to look at or to measure again) or to read again (`--again DIR`,
a kept folder: nothing new is run there, so it is kept too)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def work_folder(prefix: str, keep: Path | None = None,
                again: Path | None = None) -> Iterator[Path]:
    """The folder (made if missing, resolved), removed on the way out only if it was made
    here."""
    named = again or keep
    folder = (named or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        if named is None:
            shutil.rmtree(folder, ignore_errors=True)
