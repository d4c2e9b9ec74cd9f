"""The C fast path records what the pure-Python path records, on generated call patterns, and
its TSC stamps (where the TSC is used) come out as CLOCK_MONOTONIC ns.

Generated patterns: nested calls, raising calls, several sites and threads, spans recorded with
`continues`, the calls in progress seen from inside. Each pattern runs once through the C `call`
and once through `_python_call`; the events (site, thread, status, sized or not, order) and the
calls in progress must be the same.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

import fecomlite.runtime.probe as probe

pytestmark = pytest.mark.skipif(probe._native is None, reason="the C hot path was not built")

CLOCKS = ["tsc", "monotonic"]


@pytest.fixture(params=CLOCKS)
def clock(request):
    """The fast path on each clock it can stamp with (the TSC only where it is invariant)."""
    if request.param == "tsc" and not probe._tsc_invariant():
        pytest.skip("no invariant TSC here: the fast path uses CLOCK_MONOTONIC")
    before = probe._native.clock()
    probe._native.use_tsc(request.param == "tsc")
    assert probe._native.clock() == request.param
    yield request.param
    probe._native.use_tsc(before == "tsc")


@pytest.fixture(autouse=True)
def _quiet_flusher(monkeypatch):
    """The flusher neither takes the events nor resamples the sites while a test reads them."""
    monkeypatch.setattr(probe, "flush", lambda: None)
    monkeypatch.setattr(probe, "RESAMPLE_EVERY_S", float("inf"))
    probe.drain_columns()
    yield
    probe.drain_columns()


class Failure(Exception):
    pass


def pattern(seed: int) -> list[tuple[Any, ...]]:
    """A random program of probe operations: ("call", site, depth, raises) with nested calls
    below it, ("record", site, continues, raised)."""
    rng = random.Random(seed)

    def step(depth: int) -> tuple[Any, ...]:
        if rng.random() < 0.2:
            return ("record", f"s{rng.randrange(3)}", rng.random() < 0.5, rng.random() < 0.3)
        inner = [step(depth + 1) for _ in range(rng.randrange(3))] if depth < 3 else []
        return ("call", f"s{rng.randrange(4)}", inner, rng.random() < 0.25)

    return [step(0) for _ in range(rng.randrange(5, 25))]


def run(program: list[tuple[Any, ...]], call: Any, prefix: str, seen: list[Any]) -> None:
    """Runs `program` through `call`; `seen` gets this thread's calls in progress inside each."""
    for op in program:
        if op[0] == "record":
            t = time.monotonic_ns()
            probe.record(prefix + op[1], t, t + 5, raised=op[3], continues=op[2])
            continue
        _, site, inner, raises = op

        def body(inner=inner, raises=raises):
            mine = [s for tid, _, s in probe.open_calls() if tid == threading.get_ident()]
            seen.append([name.removeprefix(prefix) for name, _ in mine[0]] if mine else None)
            run(inner, call, prefix, seen)
            if raises:
                raise Failure()
            return len(inner)

        try:
            assert call(prefix + site, body) == len(inner)
        except Failure:
            assert raises


def events(prefix: str) -> list[tuple[str, int, int, bool]]:
    """(site, thread, status, sized) of the buffered events whose site starts with `prefix`."""
    names, index, t0, t1, tids, status, in_bytes, _ = probe.drain_columns()
    sites = memoryview(index).cast("i")
    starts, ends = memoryview(t0).cast("q"), memoryview(t1).cast("q")
    assert all(s <= e for s, e in zip(starts, ends, strict=True))
    return [(names[s].removeprefix(prefix), tid, st, size >= 0)
            for s, tid, st, size in zip(sites, memoryview(tids).cast("Q"), status,
                                        memoryview(in_bytes).cast("q"), strict=True)
            if names[s].startswith(prefix)]


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_path_records_the_events_the_python_path_records(seed, clock):
    program = pattern(seed)
    recorded, in_progress = {}, {}
    for name, call in (("c", probe.call), ("py", probe._python_call)):
        prefix = f"gen{seed}{clock}{name}:"
        in_progress[name] = []
        run(program, call, prefix, in_progress[name])
        recorded[name] = events(prefix)
    assert recorded["c"] and recorded["c"] == recorded["py"]
    assert in_progress["c"] == in_progress["py"]


def test_threads_each_get_their_own_events_and_calls_in_progress(clock):
    """Three threads run patterns at once: each event carries its thread, and the calls in
    progress each thread saw were its own, outermost first."""
    results: dict[int, tuple[list[Any], list[Any]]] = {}
    barrier = threading.Barrier(3)

    def worker(seed: int) -> None:
        barrier.wait()
        seen: list[Any] = []
        run(pattern(seed), probe.call, f"thr{clock}:", seen)
        results[threading.get_ident()] = (pattern(seed), seen)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in (10, 11, 12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    recorded = events(f"thr{clock}:")
    for tid, (program, seen) in results.items():
        alone: list[Any] = []
        run(program, probe._python_call, f"ref{clock}:", alone)
        reference = events(f"ref{clock}:")
        # (the threads share their sites' sized calls: which calls were sized is not compared)
        assert [(s, st) for s, t, st, _ in recorded if t == tid] == [
            (s, st) for s, _, st, _ in reference]
        assert seen == alone


def test_calls_in_progress_start_when_the_call_did(clock):
    inside: list[Any] = []

    def body() -> None:
        inside.append((time.monotonic_ns(), probe.open_calls()))

    for _ in range(probe.SLOW_CALLS_PER_SITE + 2):  # sized, then fast
        before = time.monotonic_ns()
        probe.call("open:1", body)
        entered, calls = inside[-1]
        ((site, t0),) = next(s for tid, _, s in calls if tid == threading.get_ident())
        assert site == "open:1" and before <= t0 <= entered


def test_the_sites_past_their_sized_calls_are_the_c_paths_flags():
    """`probe._fast` reads and changes the C path's flag per site: what it holds is what the
    hot path does (sized call or timestamps only)."""
    site = "flags:1"
    for _ in range(probe.SLOW_CALLS_PER_SITE + 1):
        probe.call(site, len, b"abc")
    assert site in probe._fast and probe._native.is_fast(site) and site in list(probe._fast)
    probe._fast.discard(site)
    assert site not in probe._fast and not probe._native.is_fast(site)
    probe.call(site, len, b"abc")
    probe._fast.add(site)
    probe.call(site, len, b"abc")
    assert [sized for *_, sized in events("flags:")] == [True] * probe.SLOW_CALLS_PER_SITE + [
        False, True, False]
    assert "flags:never called" not in probe._fast


def test_a_call_in_progress_is_shown_after_more_threads_than_slots_have_called():
    """Each thread keeps the slot of its calls in progress between calls; threads that ended,
    or wait between calls, give theirs up to a new thread once every slot is taken."""
    slots = 64  # OPEN_SLOTS in _fastprobe.c
    done, go = threading.Event(), threading.Event()

    def waits_between_calls() -> None:
        probe.call("slots:idle", int)
        go.wait()

    def ends() -> None:
        probe.call("slots:ended", int)

    idle = [threading.Thread(target=waits_between_calls) for _ in range(slots // 2 + 2)]
    for thread in idle:
        thread.start()
    for _ in range(slots):
        ended = threading.Thread(target=ends)
        ended.start()
        ended.join()
    seen: list[Any] = []

    def in_a_call() -> None:
        seen.extend(s for tid, _, s in probe.open_calls() if tid == threading.get_ident())
        done.set()

    late = threading.Thread(target=probe.call, args=("slots:late", in_a_call))
    late.start()
    late.join()
    go.set()
    for thread in idle:
        thread.join()
    assert done.is_set() and [site for site, _ in seen[0]] == ["slots:late"]
    mine: list[Any] = []
    probe.call("slots:again", lambda: mine.extend(
        s for tid, _, s in probe.open_calls() if tid == threading.get_ident()))
    assert [site for site, _ in mine[0]] == ["slots:again"]


def test_tsc_stamps_convert_to_clock_monotonic_within_a_microsecond():
    """Stamps taken over ~3 s between two clock_gettime reads, converted at the end (as a drain
    converts them, across the anchors read meanwhile): each lands between its two reads, within
    1 µs."""
    if not probe._tsc_invariant():
        pytest.skip("no invariant TSC here")
    before = probe._native.clock()
    probe._native.use_tsc(True)
    try:
        samples = []
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            for _ in range(50):
                samples.append((time.monotonic_ns(), probe._native.stamp(), time.monotonic_ns()))
            if random.random() < 0.3:
                probe.drain_columns()  # an anchor now and then, as the flusher reads them
            time.sleep(0.01)
        off = [probe._native.stamp_ns(tick) - (lo + hi) // 2 for lo, tick, hi in samples]
        worst = max(abs(o) - (hi - lo) / 2 for o, (lo, _, hi) in zip(off, samples, strict=True))
    finally:
        probe._native.use_tsc(before == "tsc")
    assert len(samples) > 1000
    assert worst <= 1000, f"a converted stamp fell {worst:.0f} ns outside its clock reads"
