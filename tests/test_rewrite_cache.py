"""The rewrite cache is trimmed: entries unused for 30 days go, then the least recently used
beyond the size cap, never one used within the last day (a run in progress may load it), and
the walk happens at most once a day."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fecomlite.instrument import rewrite_cache
from fecomlite.instrument.rewrite_cache import evict, evict_daily

DAY = 86400.0


def entry(cache: Path, name: str, size: int, days_ago: float, now: float) -> Path:
    path = cache / "rewrites" / name[:2] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (now - days_ago * DAY, now - days_ago * DAY))
    return path


def test_old_entries_go_then_the_least_recently_used_beyond_the_cap(tmp_path: Path):
    now = time.time()
    old = entry(tmp_path, "aa-old", 10, 40, now)
    lru = entry(tmp_path, "bb-lru", 100, 5, now)
    newer = entry(tmp_path, "cc-newer", 100, 3, now)
    fresh = entry(tmp_path, "dd-fresh", 100, 0.1, now)
    done = evict(tmp_path, max_bytes=250, now=now)
    assert [p.exists() for p in (old, lru, newer, fresh)] == [False, False, True, True]
    assert (done.removed, done.freed_bytes, done.kept_bytes) == (2, 110, 200)


def test_an_entry_used_within_a_day_stays_even_over_the_cap(tmp_path: Path):
    now = time.time()
    kept = [entry(tmp_path, f"e{i}", 100, 0.5, now) for i in range(3)]
    done = evict(tmp_path, max_bytes=50, now=now)
    assert all(p.exists() for p in kept) and done.removed == 0 and done.kept_bytes == 300


def test_the_cache_is_walked_at_most_once_a_day(tmp_path: Path, monkeypatch):
    now = time.time()
    old = entry(tmp_path, "aa-old", 10, 40, now)
    assert evict_daily(tmp_path).removed == 1 and not old.exists()
    again = entry(tmp_path, "bb-old", 10, 40, now)
    assert evict_daily(tmp_path) is None and again.exists()  # trimmed today already
    monkeypatch.setattr(rewrite_cache, "EVERY_S", 0.0)
    assert evict_daily(tmp_path).removed == 1 and not again.exists()
