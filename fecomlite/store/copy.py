"""A consistent copy of a store, even while its server writes to it.

A plain `cp` of a live store misses the rows still in its `-wal` file; SQLite's backup API copies
every committed page (the -wal's included) as of one moment into a new file, which is left in
rollback-journal mode: one self-contained file, to be mailed, merged or archived.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from fecomlite.store import Store, StoreError, private_dir


def copy_store(source: Path, target: Path) -> int:
    """Copy the store at `source` (checked whole first) into the new file `target`; returns
    the number of runs copied."""
    if target.exists():
        raise StoreError(f"{target} exists: copy into a new file")
    with Store(source, readonly=True) as store:
        runs = len(store.runs())
        private_dir(target.parent)
        try:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            copy = sqlite3.connect(target)
            try:
                store.db.backup(copy)
                copy.execute("PRAGMA journal_mode=DELETE")
            finally:
                copy.close()
        except (OSError, sqlite3.Error) as exc:
            target.unlink(missing_ok=True)
            raise StoreError(f"cannot copy {source} to {target}: {exc}") from exc
    return runs
