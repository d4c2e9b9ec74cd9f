"""Keras layers inside a graph-compiled step (what `fit`, `evaluate` and `predict` compile by
default), timed from the TensorFlow profiler's op events grouped by the layers' name scopes.

While a compiled step is traced, every layer call runs once under its name scope; the Keras
tracer notes each scope (`Scopes.add`: `functional_1/block_1/dense_1` is the model's `block`'s
`dense`). While `fit`/`evaluate`/`predict` run, a profiler session (host tracer, and on a GPU
its device tracer) records every executed op with its full name: `…/functional_1/dense_1/MatMul`
is forward work of `dense`, `…/gradient_tape/functional_1/dense_1/MatMul_1` its backward. Ops
are taken in time order and each layer's consecutive ops form a span, nested under its enclosing
layer's (`spans.nest`), recorded on the calling thread after the call, so they nest under
`keras.Model.fit` and are attributed like calls. A layer runs once a step, but its ops are not
contiguous (other layers' ops and inter-op threads interleave): all its spans inside one run of
the step function (the profiler's `tf_function_call` event) are one call, the first recorded as
the call and the rest as its continuations (`steps`). Sessions are cut into windows (`WINDOW_S`)
so a long `fit` never holds more than a window's events; a cut waits for a moment between two
steps (`StepGate`: the Keras tracer runs each step through it), so no step loses its ops between
two sessions. The profiler logs its start and stop on stderr: those lines are dropped, so the
program prints what it prints without `--trace-layers`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from bisect import bisect_right
from dataclasses import dataclass
from time import monotonic_ns as _now
from typing import Any

from fecomlite.runtime.layers import facts
from fecomlite.runtime.layers.spans import nest

WINDOW_S = 2.0  # one profiler session's length at most; its events are parsed when it ends
CUT_WAIT_S = 5.0  # how long a cut waits for a moment between steps, at most (then cuts anyway)
CLOCK_MARK = "fecomlite.clock"  # a trace event at a known monotonic time: the clock offset
STEP_ARG = "tf_function_call"  # the argument of the event of one run of a `tf.function`
PROFILER_LOG = re.compile(rb"^[IWE]\d{4} [^\]]*\b(profiler_session|session_manager)\.cc:\d+\] ")
GRADIENT = "gradient_tape"
# Variable bookkeeping, scheduled wherever the executor likes (reads of every layer's weights
# come first in a step): timed in the driving call, so it does not cut a layer's span in pieces.
BOOKKEEPING = frozenset(
    {
        "ReadVariableOp",
        "AssignVariableOp",
        "AssignAddVariableOp",
        "AssignSubVariableOp",
        "VarHandleOp",
        "Const",
        "NoOp",
        "Identity",
    }
)


@dataclass
class _Span:
    site: str
    parent: _Span | None
    depth: int
    begin: int
    end: int
    continues: bool = False


class Scopes:
    """Name scope (its components) → layer site keys, filled while steps are traced."""

    def __init__(self) -> None:
        self.forward: dict[tuple[str, ...], str] = {}
        self.roots: set[str] = set()  # the models' own scopes (`functional_1`)
        self.params: dict[str, int | None] = {}
        self.chains: dict[str, tuple[str, ...]] = {}  # op name -> `chain`, until a scope is added

    def add(self, scope: str, model: str, path: str, cls: str, params: int | None) -> None:
        parts = tuple(scope.split("/"))
        self.chains.clear()
        if not path:
            self.roots.add(parts[-1])
            return
        self.forward[parts] = facts.site_key(facts.FORWARD, model, path, cls)
        self.params[self.forward[parts]] = params

    def chain(self, op_name: str) -> tuple[str, ...]:
        found = self.chains.get(op_name)
        if found is None:
            found = self.chains[op_name] = self._chain(op_name)
        return found

    def _chain(self, op_name: str) -> tuple[str, ...]:
        """Site keys of the layers an op ran in, outermost first (backward sites for the ops of
        the layer's gradient); () for ops of no layer (the optimizer, the loss, data)."""
        parts = op_name.rpartition(":")[0].split("/") if ":" in op_name else op_name.split("/")
        i = next((k for k, part in enumerate(parts) if part in self.roots), None)
        if i is None:
            return ()
        backward = i > 0 and parts[i - 1] == GRADIENT
        chain = []
        for j in range(i + 2, len(parts)):
            site = self.forward.get(tuple(parts[i:j]))
            if site is not None:
                chain.append(site.replace(facts.FORWARD, facts.BACKWARD, 1) if backward else site)
        return tuple(chain)


class StepGate:
    """Steps pass through it; a cut waits until no step runs (CUT_WAIT_S at most) and steps
    that begin meanwhile wait for the cut, so a window's edge falls between two steps."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.running = 0
        self.cutting = False

    def step(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` as one step."""
        with self.cond:
            self.cond.wait_for(lambda: not self.cutting)
            self.running += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

    def cut(self, fn: Any) -> Any:
        """`fn()` while no step runs (or once CUT_WAIT_S have passed)."""
        with self.cond:
            self.cutting = True
            try:
                self.cond.wait_for(lambda: self.running == 0, CUT_WAIT_S)
                return fn()
            finally:
                self.cutting = False
                self.cond.notify_all()


class GraphProfiler:
    """One profiler session at a time, cut into windows by a thread, its layer spans kept."""

    def __init__(self, scopes: Scopes) -> None:
        self.scopes = scopes
        self.gate = StepGate()
        self.lock = threading.Lock()
        self.session: Any = None
        self.mark = 0  # monotonic ns of the session's clock mark
        self.spans: list[tuple[str, int, int, bool]] = []
        self.stop = threading.Event()
        self.roller: threading.Thread | None = None

    def begin(self) -> bool:
        """Start profiling; False when a session is already running (the program's own, or one
        of ours on another thread)."""
        with self.lock:
            if self.session is not None or not self._start():
                return False
        self.stop.clear()
        self.roller = threading.Thread(target=self._roll, name="fecomlite-layers", daemon=True)
        self.roller.start()
        return True

    def end(self) -> list[tuple[str, int, int, bool]]:
        """Stop profiling; the layer spans (site, t0, t1, continues) seen since `begin`."""
        self.stop.set()
        if self.roller is not None:
            self.roller.join()
        with self.lock:
            data, mark = self._stop()
            spans, self.spans = self.spans, []
        return spans + self._spans(data, mark)

    def _roll(self) -> None:
        while not self.stop.wait(WINDOW_S):
            with contextlib.suppress(Exception):  # a probe thread never prints a traceback
                data, mark = self.gate.cut(self._cut)
                found = self._spans(data, mark)
                with self.lock:
                    self.spans.extend(found)

    def _cut(self) -> tuple[bytes, int]:
        with self.lock:
            data, mark = self._stop()
            self._start()
        return data, mark

    def _start(self) -> bool:
        from tensorflow.python.profiler.internal import _pywrap_profiler
        from tensorflow.python.profiler.trace import Trace

        session = _pywrap_profiler.ProfilerSession()
        try:
            with profiler_logs_dropped():
                session.start("", {})
        except Exception:  # noqa: BLE001 - another session runs: not ours to stop
            return False
        self.session = session
        t0 = _now()
        with Trace(CLOCK_MARK):
            t1 = _now()
        self.mark = (t0 + t1) // 2
        return True

    def _stop(self) -> tuple[bytes, int]:
        session, self.session = self.session, None
        if session is None:
            return b"", 0
        with profiler_logs_dropped():
            return session.stop(), self.mark

    def _spans(self, data: bytes, mark: int) -> list[tuple[str, int, int, bool]]:
        if not data:
            return []
        from tensorflow.tsl.profiler.protobuf import trace_events_pb2

        trace = trace_events_pb2.Trace()
        trace.ParseFromString(data)
        offset = None
        ops = []
        runs = []
        for event in trace.trace_events:
            if event.name == CLOCK_MARK:
                offset = mark - event.timestamp_ps // 1000
                continue
            args = event.args
            if STEP_ARG in args:
                t0 = event.timestamp_ps // 1000
                runs.append((t0, t0 + event.duration_ps // 1000))
                continue
            name = args.get("long_name") or args.get("tf_op")
            if not name or event.name in BOOKKEEPING:
                continue
            chain = self.scopes.chain(name)
            if chain:
                ops.append((event.timestamp_ps // 1000, event.duration_ps // 1000, chain))
        if offset is None:
            return []
        timed = [(t0 + offset, t0 + offset + dt, chain) for t0, dt, chain in ops]
        shifted = [(t0 + offset, t1 + offset) for t0, t1 in runs]
        return [(s.site, s.begin, s.end, s.continues) for s in steps(op_spans(timed), shifted)]


def op_spans(ops: list[tuple[int, int, tuple[str, ...]]]) -> list[_Span]:
    """Each layer's consecutive ops (in start order) as one span inside its enclosing layer's
    span; ops of no layer (optimizer, loss) neither end nor join a span; spans nest, and those
    of layers that do not enclose one another never overlap (`nest`)."""
    spans: list[_Span] = []
    open_: list[_Span] = []
    for t0, t1, chain in sorted(ops, key=lambda op: op[0]):
        for depth, site in enumerate(chain):
            if depth < len(open_) and open_[depth].site == site:
                open_[depth].end = max(open_[depth].end, t1)
                continue
            del open_[depth:]
            span = _Span(site, open_[-1] if open_ else None, depth, t0, t1)
            spans.append(span)
            open_.append(span)
    return nest(spans)


def steps(spans: list[_Span], runs: list[tuple[int, int]]) -> list[_Span]:
    """The spans, each marked `continues` unless it is its layer's first in its step: the
    outermost function run (t0, t1) it begins in, or for a span in none (a run whose event was
    lost where two profiler windows meet) the gap between two runs it begins in."""
    outer: list[list[int]] = []
    for t0, t1 in sorted(runs):
        if outer and t0 < outer[-1][1]:  # inside a run (`one_step_on_data` in its iterator's)
            outer[-1][1] = max(outer[-1][1], t1)
        else:
            outer.append([t0, t1])
    starts = [t0 for t0, _ in outer]
    seen: set[tuple[str, int, bool]] = set()
    for span in sorted(spans, key=lambda s: s.begin):
        i = bisect_right(starts, span.begin) - 1
        step = (span.site, i, i >= 0 and span.begin < outer[i][1])
        span.continues = step in seen
        seen.add(step)
    return spans


@contextlib.contextmanager
def profiler_logs_dropped() -> Any:
    """Run the body with fd 2 on a pipe, then pass on all it got but the profiler's own log
    lines ("Profiler session started." …), which the program would not print."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)  # first: with no fd 2 (closed by the program) nothing is redirected
    read, write = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(read, chunks), daemon=True)
    reader.start()  # drained meanwhile: a writer never waits on a full pipe
    os.dup2(write, 2)
    os.close(write)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        reader.join()
        lines = b"".join(chunks).splitlines(keepends=True)
        kept = b"".join(line for line in lines if not PROFILER_LOG.match(line))
        if kept:
            os.write(2, kept)


def _read_all(fd: int, chunks: list[bytes]) -> None:
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
