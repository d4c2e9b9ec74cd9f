"""Layer spans made to nest like a call stack, as the attribution expects of events on one
thread: PyTorch backward spans (marked by graph hooks) and TensorFlow graph spans (grouped from
the profiler's op events) both arrive overlapping where the framework ran work side by side.

The attribution takes a span that lies inside another as its child, so two layers' spans may
nest only when one layer encloses the other in the model. Spans of layers that do not (siblings,
a layer's forward and backward, two steps' spans) are cut apart: each instant goes to the span
that ends first among those running then (a layer whose gradient ops ran while a long op of its
sibling's ran gets that time; the sibling's span is split around it), so no instant counts
twice and the tree stays the model's. A span cut in pieces is still one call: every piece but
its first is marked `continues` (recorded with the status bit `CONTINUES`), so the analysis
counts the call once and sums its pieces.
"""

from __future__ import annotations

import copy
import heapq
from bisect import bisect_right
from collections import defaultdict
from itertools import pairwise
from typing import Protocol, TypeVar


class Span(Protocol):
    parent: Span | None  # the enclosing layer's span; one not in the list was never seen
    depth: int
    begin: int
    end: int
    continues: bool  # set by `nest`: a later piece of a span cut in pieces


S = TypeVar("S", bound=Span)


def nest(spans: list[S]) -> list[S]:
    """The spans to record, as copies: each layer's span holds its children's (the spans given
    are widened to), and spans of layers that do not enclose one another are disjoint (a span
    cut around another comes back in pieces, all but the first marked `continues`; one left
    with no instant of its own is left out)."""
    listed = {id(s) for s in spans}

    def seen_parent(span: S) -> S | None:
        up = span.parent
        while up is not None and id(up) not in listed:  # PyTorch: a layer whose output needed
            up = up.parent  # no gradient has no backward span of its own
        return up  # type: ignore[return-value]

    ups = {id(s): seen_parent(s) for s in spans}
    for span in sorted(spans, key=lambda s: -s.depth):  # parents hold children
        span.end = max(span.end, span.begin)
        up = ups[id(span)]
        if up is not None:
            up.begin = min(up.begin, span.begin)
            up.end = max(up.end, span.end)
    children: dict[int | None, list[S]] = defaultdict(list)
    for span in spans:
        up = ups[id(span)]
        children[None if up is None else id(up)].append(span)
    out: list[S] = []
    origin: dict[int, int] = {}  # id(piece) -> id(the span it is a piece of)
    todo: list[tuple[list[S], int | None, int | None, S | None]] = [
        (children[None], None, None, None)
    ]
    while todo:
        group, lo, hi, parent = todo.pop()
        for original, piece in _share(group, lo, hi):
            piece.parent = parent
            origin[id(piece)] = id(original)
            out.append(piece)
            kids = children.get(id(original))
            if kids:
                todo.append((kids, piece.begin, piece.end, piece))
    out.sort(key=lambda s: (s.begin, -s.end, s.depth))
    seen: set[int] = set()
    for piece in out:
        piece.continues = origin[id(piece)] in seen
        seen.add(origin[id(piece)])
    return out


def _share(group: list[S], lo: int | None, hi: int | None) -> list[tuple[S, S]]:
    """(span, piece) for the pieces of sibling spans clipped to [lo, hi]: each instant goes to
    the span running then that ends first (then the one that began last); a zero-length span
    is kept where no other piece holds its instant."""
    timed: list[tuple[int, int, int, S]] = []
    points: dict[int, S] = {}  # one zero-length span an instant: a second would nest in it
    for i, span in enumerate(group):
        b = span.begin if lo is None else max(span.begin, lo)
        e = span.end if hi is None else min(span.end, hi)
        if e > b:
            timed.append((b, e, i, span))
        elif span.end == span.begin and b == span.begin and (hi is None or b < hi):
            points.setdefault(b, span)  # at the parent's end it would fall outside it
    timed.sort()
    edges = sorted({t for b, e, _, _ in timed for t in (b, e)})
    owned: list[list] = []  # [begin, end, span], disjoint, in time order
    running: list[tuple[int, int, int, S]] = []
    k = 0
    for a, b in pairwise(edges):
        while k < len(timed) and timed[k][0] <= a:
            begin, end, i, span = timed[k]
            heapq.heappush(running, (end, -begin, i, span))
            k += 1
        while running and running[0][0] <= a:
            heapq.heappop(running)
        if not running:
            continue
        owner = running[0][3]
        if owned and owned[-1][2] is owner and owned[-1][1] == a:
            owned[-1][1] = b
        else:
            owned.append([a, b, owner])
    starts = [p[0] for p in owned]
    for t, span in points.items():
        j = bisect_right(starts, t) - 1
        if (j < 0 or owned[j][1] <= t) and (j + 1 >= len(owned) or owned[j + 1][0] != t):
            owned.append([t, t, span])
    pieces: list[tuple[S, S]] = []
    for begin, end, span in owned:
        piece = copy.copy(span)
        piece.begin, piece.end = begin, end
        pieces.append((span, piece))
    return pieces
