"""Layer spans made to nest like a call stack, as the attribution expects of events on one
thread: PyTorch backward spans (marked by graph hooks) and TensorFlow graph spans (grouped from
the profiler's op events) both arrive overlapping where the framework ran work side by side."""

from __future__ import annotations

from typing import Protocol


class Span(Protocol):
    parent: Span | None  # the enclosing layer's span (its begin stays 0 if never seen)
    depth: int
    begin: int
    end: int


def nest(spans: list[Span]) -> None:
    """Make spans nest like a call stack: each layer's span holds its children's, and spans that
    overlap without nesting are separated."""
    for span in sorted(spans, key=lambda s: -s.depth):  # parents hold children
        span.end = max(span.end, span.begin)
        up = _begun_parent(span)
        if up is not None:
            up.begin = min(up.begin, span.begin)
            up.end = max(up.end, span.end)
    _as_stack(spans)
    for span in sorted(spans, key=lambda s: s.depth):  # and still do once separated
        up = _begun_parent(span)
        if up is not None:
            span.begin = min(max(span.begin, up.begin), up.end)
            span.end = max(min(span.end, up.end), span.begin)


def _as_stack(spans: list[Span]) -> None:
    """A span that starts inside another but outlasts it starts where the other ended (in
    PyTorch one graph node's pre-hooks mark both the end of the layer after it and the start of
    the layer before it, a few nanoseconds apart and in hook order)."""
    open_spans: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.begin, -s.end, s.depth)):
        while open_spans and (open_spans[-1].end <= span.begin or open_spans[-1].end < span.end):
            top = open_spans.pop()
            if top.end > span.begin:
                span.begin = top.end
        span.end = max(span.end, span.begin)
        open_spans.append(span)


def _begun_parent(span: Span) -> Span | None:
    """The nearest enclosing layer whose span was seen (in PyTorch a layer whose output needed
    no gradient has no backward span of its own)."""
    up = span.parent
    while up is not None and not up.begin:
        up = up.parent
    return up
