"""Is this file a whole fecomlite store? Asked before a figure is shown or a row is written.

A read opens the file read-only (`mode=ro`: nothing, not even a schema stamp, is written), checks
who made it and its schema, then runs SQLite's `quick_check` (every page and b-tree, without
cross-checking indexes against rows): a store with damaged pages would otherwise give smaller
figures silently. An older schema is upgraded only by a writer or on request, after a copy of
the file is kept beside it. Each function here returns a reason (or None); the store raises it.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path

SQLITE_PAGE_MIN = 512  # a SQLite file shorter than this holds no page at all


def connect_readonly(path: Path, timeout_s: float = 30) -> sqlite3.Connection:
    """A connection that cannot write the file (no schema stamp, no journal-mode switch).
    Reading a WAL store needs a `-shm` file beside it; where none can be made (a full disk, a
    read-only folder) and no `-wal` file holds rows, the store file alone is read as it is."""
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    db = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None)
    try:
        db.execute("PRAGMA schema_version").fetchone()
    except sqlite3.OperationalError:
        wal = Path(f"{path}-wal")
        if wal.exists() and wal.stat().st_size:
            raise
        db.close()
        db = sqlite3.connect(uri + "&immutable=1", uri=True, timeout=timeout_s,
                             isolation_level=None)
    return db


def foreign_reason(db: sqlite3.Connection, path: Path, application_id: int) -> str | None:
    """Why the file is not a fecomlite store (None: it is one, or an old one without the id)."""
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    if app_id == application_id or (app_id == 0 and {"meta", "runs"} <= tables):
        return None
    if not tables:
        return empty_reason(path)
    return (f"{path} is not a fecomlite run store (another application's SQLite file: "
            f"application_id {app_id}); fecomlite does not change files it did not create")


def empty_reason(path: Path) -> str:
    """A store file with no tables: often a copy made while its server ran, whose rows were
    still in the `-wal` file beside the original."""
    return (f"{path} holds no run store tables: if it was copied from a store in use, its rows "
            f"were in the original's -wal file (e.g. store.sqlite-wal), which a plain copy "
            f"misses; copy a live store with `fecomlite store copy SRC DST`")


def schema_version(db: sqlite3.Connection) -> str:
    row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return str(row[0]) if row else "?"


def damage_reason(db: sqlite3.Connection, path: Path) -> str | None:
    """SQLite's page-level check (`quick_check`): None when whole, else what to do."""
    try:
        rows = [r[0] for r in db.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as exc:
        rows = [str(exc)]
    if rows == ["ok"]:
        return None
    return damaged(path, "; ".join(rows))


def damaged(path: Path, detail: str) -> str:
    """The one line that says a store is damaged and what to do about it."""
    lines = [line for line in detail.splitlines() if not line.startswith("***")] or [detail]
    return (f"{path} is damaged ({lines[0][:160]}): its figures would be wrong. Restore it "
            f"from a backup (such as one made by `fecomlite store copy`); SQLite's "
            f"`sqlite3 {path} .recover` may save some of its rows")


def keep_copy(db: sqlite3.Connection, path: Path, version: str) -> Path:
    """A private copy of the store as it is (its -wal included), before an upgrade changes it."""
    copy = path.with_name(f"{path.name}.schema{version}.bak")
    try:
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return copy  # never over the copy an earlier (or concurrent) upgrade kept
    os.close(fd)
    target = sqlite3.connect(copy)
    try:
        db.backup(target)
    finally:
        target.close()
    return copy
