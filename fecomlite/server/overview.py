"""A sensor's whole run for the live view's chart, in a bounded number of points.

Why: the monitor keeps 0.5 s bins for the last few minutes only, and a chart of every bin of an
hour (7,200 per sensor) would be resent and redrawn on every push. Here the run's bins are
folded into at most MAX_BUCKETS buckets from the run's start: when they would be more, the
bucket width doubles and neighbours merge (level of detail by the run's length: a chart's width
in pixels holds about that many). A bucket's value is what a bin's is, over its span: the mean
power (energy over seconds covered, so the area under the chart stays the energy), the peak for
memory, the mean for other gauges; a power bucket also carries its highest 0.5 s step, so that
a short spike the mean flattens still shows. A viewer is sent the buckets closed since its last
message and the one still filling; all of them again only when the width doubled
(`generation`), which happens about log2(run / (MAX_BUCKETS * 0.5 s)) times in a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_BUCKETS = 512  # about a chart's width in pixels

ENERGY, PEAK, MEAN = "energy", "peak", "mean"  # how a bucket's parts add up


@dataclass
class Bucket:
    index: int  # from the origin, in widths
    a: float  # energy (J), the peak, or the sum of values
    b: float  # seconds covered, or the number of values (1 for a peak)
    top: float  # the highest bin's value in it (a power bucket's highest 0.5 s step)


@dataclass
class Overview:
    """The buckets of one sensor from `origin_ns` (a run's start)."""

    origin_ns: int
    how: str  # ENERGY, PEAK or MEAN
    width_ns: int
    closed: list[Bucket] = field(default_factory=list)
    filling: Bucket | None = None
    generation: int = 0  # changes when the buckets do (the width doubled)

    def add(self, start_ns: int, a: float, b: float) -> None:
        """One closed bin (`Track`'s parts) starting at `start_ns`; bins before the origin, or
        older than the bucket filling, are not the run's chart."""
        if start_ns < self.origin_ns or b <= 0:
            return
        index = (start_ns - self.origin_ns) // self.width_ns
        if self.filling is not None and index != self.filling.index:
            if index < self.filling.index:
                return
            self.closed.append(self.filling)
            self.filling = None
            if len(self.closed) >= MAX_BUCKETS:
                self._coarsen()
                index = (start_ns - self.origin_ns) // self.width_ns
        if self.filling is None and self.closed and self.closed[-1].index == index:
            self.filling = self.closed.pop()  # the width doubled: it joins the last one
        part = Bucket(index, a, b, self._value(a, b))
        if self.filling is not None and self.filling.index == index:
            self._merge(self.filling, part)
        else:
            self.filling = part

    def _value(self, a: float, b: float) -> float:
        return a if self.how == PEAK else a / b

    def _merge(self, bucket: Bucket, other: Bucket) -> None:
        if self.how == PEAK:
            bucket.a = max(bucket.a, other.a)
        else:
            bucket.a, bucket.b = bucket.a + other.a, bucket.b + other.b
        bucket.top = max(bucket.top, other.top)

    def _coarsen(self) -> None:
        """Double the width: neighbouring buckets merge."""
        self.width_ns *= 2
        self.generation += 1
        merged: list[Bucket] = []
        for bucket in self.closed:
            index = bucket.index // 2
            if merged and merged[-1].index == index:
                self._merge(merged[-1], bucket)
            else:
                merged.append(Bucket(index, bucket.a, bucket.b, bucket.top))
        self.closed = merged
        if self.filling is not None:
            self.filling.index //= 2

    def point(self, bucket: Bucket) -> list[float]:
        """(seconds from the origin, value) of a bucket, and for power its highest step."""
        point = [round(bucket.index * self.width_ns / 1e9, 3), self._value(bucket.a, bucket.b)]
        return point + [bucket.top] if self.how == ENERGY else point

    def since(self, seen: tuple[int, int] | None) -> tuple[dict[str, Any], tuple[int, int]]:
        """What a viewer that has seen (generation, closed buckets) `seen` lacks: {width_s,
        reset (drop what you have), points (closed buckets), filling (the bucket filling
        now, or None)}; and what it will then have seen."""
        reset = seen is None or seen[0] != self.generation
        start = 0 if reset or seen is None else min(seen[1], len(self.closed))
        return ({"width_s": self.width_ns / 1e9, "reset": reset,
                 "points": [self.point(b) for b in self.closed[start:]],
                 "filling": None if self.filling is None else self.point(self.filling)},
                (self.generation, len(self.closed)))
