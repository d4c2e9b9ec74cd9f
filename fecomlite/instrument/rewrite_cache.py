"""Eviction of the import hook's rewrite cache (`<home>/work/rewrite/`, `importhook.Rewriter`).

The cache only grows as projects change, so it is trimmed, at most once a day (`evict_daily`,
called as a run prepares its program):
- an entry unused for `MAX_AGE_S` (30 days) goes;
- beyond `MAX_BYTES` (256 MiB) in all, the least recently used go first (LRU);
- an entry used within `KEEP_RECENT_S` (one day) never goes, whatever the size: a run in
  progress may still load it (a DataLoader worker started late, a manifest read by a child).

"Used" is the later of the file's access and modification times. Under the `relatime` mount
option (Linux's default) the access time is kept to within a day, which is this cache's
granularity; under `noatime` an entry counts as used when it was written, so an entry used
daily may be rewritten once a month: the cost of a cache miss, never a wrong result.

Removal is safe under concurrent runs: every entry is written whole under a temporary name and
renamed into place (`importhook.write_atomic`), a reader that has opened a file keeps reading it
after it is unlinked, and a reader that finds it gone makes the entry again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

MAX_AGE_S = 30 * 86400.0
MAX_BYTES = 256 * 1024 * 1024
KEEP_RECENT_S = 86400.0
EVERY_S = 86400.0  # how often `evict_daily` looks
STAMP = ".evicted"  # its mtime: when the cache was last trimmed


@dataclasses.dataclass
class Evicted:
    removed: int = 0
    freed_bytes: int = 0
    kept_bytes: int = 0


def evict(
    cache: Path, *, max_bytes: int = MAX_BYTES, max_age_s: float = MAX_AGE_S,
    keep_recent_s: float = KEEP_RECENT_S, now: float | None = None,
) -> Evicted:
    """Trim `cache` as the module says; returns what went and what is left."""
    now = time.time() if now is None else now
    entries = sorted(_entries(cache))  # (last use, size, path), least recent first
    result = Evicted(kept_bytes=sum(size for _, size, _ in entries))
    for used, size, path in entries:
        if now - used < keep_recent_s:
            break  # sorted: every later entry is as recent
        if now - used < max_age_s and result.kept_bytes <= max_bytes:
            break
        with contextlib.suppress(FileNotFoundError):  # another run's trim took it first
            path.unlink()
            result.removed += 1
            result.freed_bytes += size
        result.kept_bytes -= size
    return result


def evict_daily(cache: Path) -> Evicted | None:
    """`evict`, unless the cache was trimmed within `EVERY_S` (a run must not pay for a walk of
    the whole cache); None then, or when the cache cannot be read."""
    stamp = cache / STAMP
    try:
        if time.time() - stamp.stat().st_mtime < EVERY_S:
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        stamp.touch()
        return evict(cache)
    except OSError:
        return None


def _entries(cache: Path) -> list[tuple[float, int, Path]]:
    """Every file below `cache` but the stamp (a crashed writer's temporary file included)."""
    found = []
    for folder, _dirs, files in os.walk(cache):
        for name in files:
            if name == STAMP:
                continue
            path = Path(folder, name)
            with contextlib.suppress(OSError):
                st = path.stat()
                found.append((max(st.st_atime, st.st_mtime), st.st_size, path))
    return found
