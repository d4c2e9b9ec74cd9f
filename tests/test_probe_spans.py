"""A recorded span covers the call it wraps, on every path that records one.

The callee stamps the clock on entry and on exit; each event must start at or before the first
stamp and end at or after the second, and last at least the sleep inside. A probe that took its
end stamp before the call ran (a 0 ms span) fails here. No wall-clock thresholds: the only bound
is the callee's own sleep, which a loaded machine can lengthen but never shorten.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import fecomlite.runtime.probe as probe
from fecomlite.runtime import batch_codec, names, regions

NAP_NS = 10_000_000  # 10 ms
CALLS = [probe.call, probe._python_call]
IDS = ["native" if probe._native is not None else "native-missing", "python"]


class Callee:
    """A 10 ms sleep that notes when it started and ended, by the probe's clock."""

    def __init__(self) -> None:
        self.stamps: list[tuple[int, int]] = []

    def __call__(self, value: Any = None) -> Any:
        started = time.monotonic_ns()
        time.sleep(NAP_NS / 1e9)
        self.stamps.append((started, time.monotonic_ns()))
        return value

    async def awaited(self, value: Any = None) -> Any:
        started = time.monotonic_ns()
        await asyncio.sleep(NAP_NS / 1e9)
        self.stamps.append((started, time.monotonic_ns()))
        return value


def events(site: str) -> list[tuple[int, int, int]]:
    """(t_start_ns, t_end_ns, in_bytes) of the buffered events of `site`, in order."""
    names, *columns = probe.drain_columns()
    header, cols = batch_codec.decode(batch_codec.encode({"rep": 0, "pid": 0}, names,
                                                         tuple(columns)))
    index = header["sites"].index(site)
    return [(int(t0), int(t1), int(size)) for s, t0, t1, size in
            zip(cols["site"], cols["t_start_ns"], cols["t_end_ns"], cols["in_bytes"], strict=True)
            if s == index]


def assert_covers(spans: list[tuple[int, int, int]], stamps: list[tuple[int, int]]) -> None:
    assert len(spans) == len(stamps) > 0
    for (t0, t1, _), (entered, left) in zip(spans, stamps, strict=True):
        assert t0 <= entered, "the span starts after the call began"
        assert t1 >= left, "the span ends before the call returned"
        assert t1 - t0 >= NAP_NS


@pytest.fixture(autouse=True, params=["tsc", "monotonic"])
def _clock(request):
    """Every test on each clock the C path stamps with (the TSC only where it is invariant),
    each site's first calls sized again."""
    probe.forget_decisions()
    if probe._native is None or request.param == "tsc" and not probe._tsc_invariant():
        if request.param == "tsc":
            pytest.skip("the C path stamps with CLOCK_MONOTONIC here")
        yield
        return
    before = probe._native.clock()
    probe._native.use_tsc(request.param == "tsc")
    yield
    probe._native.use_tsc(before == "tsc")


@pytest.fixture(autouse=True)
def _empty_buffer(monkeypatch):
    """The probe's flusher thread neither takes the events (every 200 ms) nor sends sites back
    to their sized calls (every 5 s) while a test reads them."""
    monkeypatch.setattr(probe, "flush", lambda: None)
    monkeypatch.setattr(probe, "RESAMPLE_EVERY_S", float("inf"))
    probe.drain_columns()
    yield
    probe.drain_columns()


@pytest.mark.parametrize("call", CALLS, ids=IDS)
def test_sized_calls_then_fast_calls_each_cover_the_call(call):
    site = f"spans.py:1:{IDS[CALLS.index(call)]}"
    callee = Callee()
    n = probe.SLOW_CALLS_PER_SITE + 2
    for i in range(n):
        assert call(site, callee, value=i) == i
    spans = events(site)
    assert_covers(spans, callee.stamps)
    sized = [size for _, _, size in spans]
    # the first calls of a site take the sized path (argument sizes), the rest the fast one
    assert all(size >= 0 for size in sized[: probe.SLOW_CALLS_PER_SITE])
    assert sized[probe.SLOW_CALLS_PER_SITE:] == [-1, -1]


DCALLS = [probe.dcall, probe._python_dcall]


@pytest.mark.parametrize("dcall", DCALLS, ids=IDS)
def test_a_call_decided_at_run_time_covers_a_framework_call_and_passes_others(dcall):
    """A framework callee (here: one whose class is defined under a root) is timed like `call`;
    any other callee runs untimed."""
    site = f"spans.py:2:{IDS[DCALLS.index(dcall)]}"
    before = names._roots
    names.set_roots([__name__.split(".", 1)[0]])
    probe.forget_decisions()
    try:
        assert dcall(site + "#other", time.sleep, 0.001) is None
        assert site + "#other" not in probe.drain_columns()[0]  # passed through: no event
        callee = Callee()
        for i in range(probe.SLOW_CALLS_PER_SITE + 1):
            assert dcall(site, callee, i) == i
    finally:
        names._roots = before
        probe.forget_decisions()
    assert_covers(events(site), callee.stamps)


@pytest.mark.parametrize("call", CALLS, ids=IDS)
def test_a_call_that_raises_is_covered_too(call):
    site = f"spans.py:3:{IDS[CALLS.index(call)]}"
    callee = Callee()

    def fail() -> None:
        callee()
        raise KeyError("late")

    for _ in range(probe.SLOW_CALLS_PER_SITE + 1):
        with pytest.raises(KeyError):
            call(site, fail)
    assert_covers(events(site), callee.stamps)


def test_an_awaited_call_covers_the_whole_await():
    callee = Callee()

    async def main() -> list[Any]:
        return [await probe.acall("spans.py:4:0", callee.awaited, value=i) for i in range(2)]

    assert asyncio.run(main()) == [0, 1]
    assert_covers(events("spans.py:4:0"), callee.stamps)


SPANS: dict[str, Callable[[str], Any]] = {"python": regions._PythonSpan}
if probe._native is not None:
    SPANS["native"] = probe._native.Region


@pytest.mark.parametrize("span_type", SPANS.values(), ids=SPANS.keys())
def test_a_region_covers_its_body_entered_as_a_block_and_nested(span_type):
    callee = Callee()
    span = span_type("region:spans")
    with span:
        callee()
        with span:  # the inner span ends first, so its event comes first
            callee()
    inner, outer = events("region:spans")
    assert_covers([inner], [callee.stamps[1]])
    assert_covers([outer], [(callee.stamps[0][0], callee.stamps[1][1])])
