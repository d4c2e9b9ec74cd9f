"""The probe runtime that instrumented code calls: `call(site, fn, *args, **kwargs)`
(`acall` for an awaited call).

A probe never reads a sensor (DESIGN.md rule 1): it takes two clock stamps and appends one record
to a buffer. The hot path is C (`_fastprobe.c`: the TSC where it is invariant, converted to
CLOCK_MONOTONIC ns when drained; inside a run its buffer is a ring file that outlives the process,
`event_ring`) when it was built, else the pure-Python `_python_call` below, with the same
behaviour. A daemon thread sends the buffer to the
measurement server every 200 ms, and at exit and on SIGTERM; with no server reachable the events
go to a spool file. The first calls of each site (and a few again every few seconds) take a slower
path that also names the callee that ran (`runtime.names`), records argument and result sizes and
the hyperparameters some APIs carry.
Nothing here raises into user code, and nothing changes what a call returns or raises.
Compilers see only the wrapped call (`probe_compilers.py`), and the source of an instrumented
file, as `linecache` and so tracebacks, `inspect` and TorchScript read it, is the user's own
(`probe_source.py`), with carets under the user's columns (`probe_positions.py`). A traceback
through a wrapped call shows no probe frame.

Configuration comes from the environment (docs/internals.md §2), read once at import.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import types
from array import array
from collections.abc import Iterator
from threading import get_ident as _thread_id
from time import monotonic_ns as _now
from typing import Any

from fecomlite.runtime import capture as _capture
from fecomlite.runtime import compilers as _compilers
from fecomlite.runtime import event_ring as _event_ring
from fecomlite.runtime import names as _names
from fecomlite.runtime import positions as _positions
from fecomlite.runtime import site_handlers as _site_handlers
from fecomlite.runtime import source as _source
from fecomlite.runtime.batch_codec import CONTINUES, RAISED
from fecomlite.runtime.identity import rank_fields
from fecomlite.runtime.sender import Sender

SLOW_CALLS_PER_SITE = 3  # sized calls per site, again after each resample
RESAMPLE_EVERY_S = 5.0
FLUSH_EVERY_S = 0.2
FLUSH_EVENTS = 65_536  # flushed sooner past this many buffered events (45 B each in the buffer)
CHECK_EVERY_S = 0.05  # how often the flusher looks at the buffer's size



try:
    from fecomlite.runtime import _fastprobe as _native
except ImportError:  # no compiler when installed: the pure-Python path
    _native = None


class _NativeFastSites:
    """The sites past their sized calls (timestamps only) when the C probe is built: its flag
    byte per site id, read by its hot path, is the only record of them (the pure-Python probe
    keeps a set). The set operations the probe uses, on those flags."""

    def add(self, site: str) -> None:
        _native.set_fast(site, True)

    def discard(self, site: str) -> None:
        _native.set_fast(site, False)

    def clear(self) -> None:
        _native.clear_fast()

    def __contains__(self, site: object) -> bool:
        return bool(_native.is_fast(site))

    def __iter__(self) -> Iterator[str]:
        return iter(_native.fast_sites())


_fast: set[str] | _NativeFastSites = set() if _native is None else _NativeFastSites()
_slow_counts: dict[str, int] = {}
_special: dict[str, Any] = {}  # site -> handler (hyperparameters, data-size cuts): always slow


class _PythonBuffer:
    """The pure-Python event buffer, drained into the same columns as the C one."""

    STRIDE = 7

    def __init__(self) -> None:
        self.flat: list[Any] = []
        self.counter: _event_ring.EventRing | None = None  # counts what is recorded

    def record(
        self,
        site: str,
        t0: int,
        t1: int,
        status: int = 0,
        in_bytes: int = -1,
        out_bytes: int = -1,
        tid: int = 0,
    ) -> None:
        """tid: the thread the span belongs to; 0, this one."""
        self.flat.extend((site, t0, t1, tid or _thread_id(), status, in_bytes, out_bytes))
        if self.counter is not None:
            self.counter.recorded()

    def drain(self) -> tuple[Any, ...]:
        n = len(self.flat) // self.STRIDE * self.STRIDE
        taken = self.flat[:n]
        del self.flat[:n]  # appends only ever land after n, so nothing is lost
        sites = taken[0::7]
        names = list(dict.fromkeys(sites))
        index = {name: i for i, name in enumerate(names)}
        return (
            names,
            array("i", map(index.__getitem__, sites)).tobytes(),
            array("q", taken[1::7]).tobytes(),
            array("q", taken[2::7]).tobytes(),
            array("Q", taken[3::7]).tobytes(),
            bytes(taken[4::7]),
            array("q", taken[5::7]).tobytes(),
            array("q", taken[6::7]).tobytes(),
        )

    def discard(self) -> None:
        self.flat.clear()

    def pending(self) -> int:
        return len(self.flat) // self.STRIDE


# The Python paths' calls in progress, per thread (the C path keeps its own: `open_calls`).
_open_py: dict[int, list[tuple[str, int]]] = {}


def _opened(site: str) -> tuple[str, int]:
    entry = (site, _now())
    stack = _open_py.get(_thread_id())
    if stack is None:
        stack = _open_py[_thread_id()] = []
    stack.append(entry)
    return entry


def _closed(entry: tuple[str, int]) -> None:
    stack = _open_py.get(_thread_id())
    if stack and stack[-1] is entry:
        stack.pop()
    elif stack and entry in stack:  # ended out of order (a greenlet switched stacks)
        stack.remove(entry)


def open_calls() -> list[tuple[int, int, list[tuple[str, int]]]]:
    """The calls in progress now: (thread, depth, [(site, start ns), ...] outermost first)."""
    native = _native.open_calls() if _native is not None else []
    return native + [(tid, len(stack), list(stack)) for tid, stack in list(_open_py.items())
                     if stack]


def _forget_open() -> None:
    _open_py.clear()
    if _native is not None:
        _native.forget_open()


if _native is not None:
    _record = _native.record
    drain_columns = _native.drain
    _discard = _native.discard
    pending = _native.pending
else:
    _buffer = _PythonBuffer()
    _record = _buffer.record
    drain_columns = _buffer.drain
    _discard = _buffer.discard
    pending = _buffer.pending


def _hide_own_frame(error: BaseException) -> None:
    """Drop the caller's (a probe function's) entry from the traceback of the exception it is
    handling. A bare `raise` then re-raises with the traceback as it is now and adds no entry
    for that frame: the user's line is followed directly by the callee's frames, as without
    the probe. Exception, cause, context and groups are left as they are."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame is sys._getframe(1):
        error.__traceback__ = tb.tb_next


def _python_call(site: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Call `fn(*args, **kwargs)` exactly as the original code did, and record when. Without the
    C extension this frame stands between the user's and the callee's (docs/internals.md §1);
    it is taken out of tracebacks."""
    entry = _opened(site)
    try:
        prepared = None if site in _fast else _capture.safely(_before, site, fn, args, kwargs)
        if prepared is not None:
            args, kwargs, state = prepared
        elif _config.sync:
            _capture.safely(_capture.gpu_sync)
        t0 = _now()
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:
            _python_after(site, fn, prepared, None, True, t0)
            _hide_own_frame(error)
            raise
        _python_after(site, fn, prepared, result, False, t0)
        return result
    finally:
        _closed(entry)


def _python_after(
    site: str, fn: Any, prepared: Any, result: Any, raised: bool, t0: int
) -> None:
    """The event of a pure-Python call: with sizes (`_after`) when it took the sized path
    (`prepared`, what `_before` returned), else the fast path's."""
    t1 = _now()
    if prepared is not None:
        args, kwargs, state = prepared
        _capture.safely(_after, site, fn, args, kwargs, result, raised, t0, t1, state)
        return
    if _config.sync:
        _capture.safely(_capture.gpu_sync)
        t1 = _now()
    _record(site, t0, t1, 1 if raised else 0)


def _before(
    site: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], tuple[int, Any]] | None:
    """The sized path before the call: the callee's public name, argument sizes, a handler's
    adjusted arguments, the GPU wait. None while a tracer records the call (FX proxies, dynamo's
    fake tensors, the JIT tracer): nothing is read from what it would record."""
    if _compilers.tracing() or _capture.safely(_compilers.traced_values, fn, args, kwargs,
                                               default=True):
        return None
    if site not in _slow_counts:  # the first sized call since the last resample
        _capture.record_name(_sender, site, fn)
    handler = _special.get(site)
    if handler is not None:
        args, kwargs = _capture.safely(handler.before, fn, args, kwargs, default=(args, kwargs))
    in_bytes = _capture.safely(_capture.nbytes_of, args, kwargs, default=-1)
    if _config.sync:
        _capture.safely(_capture.gpu_sync)
    # modules loaded so far: a call that imports more is a first use (`_after`)
    return args, kwargs, (in_bytes, handler, len(sys.modules))


def _after(
    site: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
    raised: bool, t0: int, t1: int, state: tuple[int, Any],
) -> None:
    """The sized path after the call: the event with sizes, shapes, the handler's look at the
    result. Never raises (the C caller clears what it would)."""
    in_bytes, handler, modules = state
    if _config.sync:
        _capture.safely(_capture.gpu_sync)
        t1 = _now()
    if raised:
        _record(site, t0, t1, 1, in_bytes, -1)
        _count_slow(site)
        return
    out_bytes = _capture.safely(_capture.nbytes_of, (result,), {}, default=-1)
    _record(site, t0, t1, 0, in_bytes, out_bytes)
    if site not in _slow_counts:  # the first sized call since the last resample: shapes too
        _capture.record_shapes(_sender, site, fn, args, kwargs, result,
                               imported=len(sys.modules) - modules)
    if handler is not None:
        _capture.safely(handler.after, fn, args, kwargs, result)
        if handler.finished:  # it read what it reads once: the site may take the fast path
            _special.pop(site, None)
    _count_slow(site)


# dcall sites' decisions (pure-Python path; the C one keeps its own): site -> (key, framework?)
_decisions: dict[str, tuple[Any, bool]] = {}


def _callee_key(fn: Any) -> Any:
    """What a site's decision holds for (as `callee_key` in `_fastprobe.c`)."""
    if isinstance(fn, types.MethodType):
        return fn.__func__
    if isinstance(fn, types.BuiltinFunctionType):
        owner = fn.__self__
        return fn if owner is None or isinstance(owner, types.ModuleType) else type(owner)
    if isinstance(fn, (types.FunctionType, type)):
        return fn
    return type(fn)


def _python_dcall(site: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """`call` when `fn` is a framework API, else `fn(*args, **kwargs)` as it is."""
    key = _callee_key(fn)
    known = _decisions.get(site)
    if known is None or known[0] is not key:
        known = _decisions[site] = (key, bool(_capture.safely(_names.is_framework, fn)))
    try:
        return call(site, fn, *args, **kwargs) if known[1] else fn(*args, **kwargs)
    except BaseException as error:
        _hide_own_frame(error)
        raise


def forget_decisions() -> None:
    """Look at every dcall site's callee again on its next call (and size it again: tests)."""
    _decisions.clear()
    _slow_counts.clear()
    _fast.clear()
    if _native is not None:
        _native.forget_decisions()


async def acall(site: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """`await fn(*args, **kwargs)` as the original code did, timed from the call to the end of
    the await: time suspended in it counts (other tasks may run then). No sizes are taken."""
    sync = _capture.gpu_sync if _config.sync else None
    if sync is not None:
        _capture.safely(sync)
    t0 = _now()
    try:
        result = await fn(*args, **kwargs)
    except BaseException as error:
        if sync is not None:
            _capture.safely(sync)
        _record(site, t0, _now(), 1)
        _hide_own_frame(error)
        raise
    if sync is not None:
        _capture.safely(sync)
    _record(site, t0, _now(), 0)
    return result


def _count_slow(site: str) -> None:
    n = _slow_counts.get(site, 0) + 1
    _slow_counts[site] = n
    if n >= SLOW_CALLS_PER_SITE and site not in _special:
        _fast.add(site)


def record(
    site: str,
    t_start_ns: int,
    t_end_ns: int,
    raised: bool = False,
    continues: bool = False,
    tid: int = 0,
) -> None:
    """Record a span measured elsewhere (regions of the user's own code, layers). continues:
    a later piece of the span recorded before it at this site on this thread (one call cut
    apart); tid: the thread it belongs to when not this one (0)."""
    status = (RAISED if raised else 0) | (CONTINUES if continues else 0)
    _record(site, t_start_ns, t_end_ns, status, -1, -1, tid)  # tid 0: this thread (both buffers)


_sending: set[int] = set()  # threads inside a send (a signal there must not send again)
_signals_held: list[int] = []  # a signal that came during this thread's send, raised after it


def flush() -> None:
    """Send what is buffered now; called by the flusher thread, at exit and on signals."""
    _send(False)


def final_flush() -> None:
    """The process's last batch: posted even while the server is backed off (its `total` is
    the only word the server gets of events lost before it), then spooled if need be."""
    _send(True)


def _send(final: bool) -> None:
    me = threading.get_ident()
    _sending.add(me)
    try:
        _capture.safely(_sender.send, drain_columns, final)
    finally:
        _sending.discard(me)
    if _signals_held and me == threading.main_thread().ident:
        _die_of(_signals_held.pop())


def _flusher_loop(stop: threading.Event) -> None:
    """Flush every FLUSH_EVERY_S, or sooner once FLUSH_EVENTS are buffered (a busy loop's buffer
    stays a few MB, and the server gets batches of a bounded size)."""
    _capture.safely(_sender.prepare)
    last_resample = last_flush = _now()
    while not stop.wait(CHECK_EVERY_S):
        if pending() < FLUSH_EVENTS and (_now() - last_flush) / 1e9 < FLUSH_EVERY_S:
            continue
        last_flush = _now()
        flush()
        if (_now() - last_resample) / 1e9 >= RESAMPLE_EVERY_S:
            last_resample = _now()
            _slow_counts.clear()
            _fast.clear()


def _start_flusher() -> None:
    stop = threading.Event()
    threading.Thread(
        target=_flusher_loop, args=(stop,), name="fecomlite-probe", daemon=True
    ).start()


def _keep_events() -> None:
    """Inside a run, the C probe keeps this process's records in a ring file the runner reads
    if the process dies before sending them (`event_ring`); the pure-Python probe only counts
    them there, so the run learns exactly what a sudden death lost."""
    ring = None
    if _config.run:
        meta = {"rep": _config.rep, "pid": os.getpid(), "run": _config.run, **rank_fields()}
        if _sender.store:
            meta["store"] = _sender.store
        ring = _event_ring.open_ring(_config.spool, _sender.proc, meta)
    if _native is not None:
        _native.set_ring(*((ring.map, ring.sites_fd) if ring is not None else (None,)))
        _sender.on_sending, _sender.on_sent = _native.sending, _native.sent
    else:
        _buffer.counter = ring


def _after_fork_in_child() -> None:
    """A forked worker (e.g. a DataLoader worker) gets its own buffer, counter, sender and
    flusher."""
    global _sender
    _discard()
    _forget_open()
    _sender = Sender(_config, open_calls)
    _keep_events()
    _start_flusher()


class _WorkerExit:
    """Flushes a multiprocessing child (a DataLoader worker): it ends in `os._exit`, past atexit,
    after running multiprocessing's finalizers. Its after-fork hooks run once the child has
    cleared the finalizers it inherited, so the finalizer is registered from there."""

    registered = False

    def before_fork(self) -> None:
        util = sys.modules.get("multiprocessing.util")
        if util is not None and not self.registered:
            util.register_after_fork(self, _WorkerExit.in_child)
            self.registered = True

    def in_child(self) -> None:
        sys.modules["multiprocessing.util"].Finalize(None, final_flush, exitpriority=0)


_worker_exit = _WorkerExit()


def _on_signal(signum: int, frame: Any) -> None:
    """SIGTERM: the last batch, then the death the signal asked for. Come in the middle of a
    send of this thread (e.g. multiprocessing's exit flush, when a Pool terminates its worker),
    it waits for that send to end: sending again would wait for the send's own lock forever."""
    if threading.get_ident() in _sending:
        _signals_held.append(signum)
        return
    final_flush()
    _die_of(signum)


def _die_of(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    """Flush on SIGTERM; SIGINT raises KeyboardInterrupt as usual and atexit flushes then."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_signal)
    except (ValueError, OSError):
        pass


class _Config:
    """The probe's settings, from the environment of the measured process."""

    def __init__(self, env: os._Environ[str] | dict[str, str]) -> None:
        self.url = env.get("FECOMLITE_URL", "")
        self.run = env.get("FECOMLITE_RUN", "")
        self.rep = int(env.get("FECOMLITE_REP", "0") or 0)
        self.token = env.get("FECOMLITE_TOKEN", "")
        self.manifest = env.get("FECOMLITE_MANIFEST", "")
        self.spool = env.get("FECOMLITE_SPOOL", "")
        self.sync = env.get("FECOMLITE_SYNC", "") == "1"
        self.datasize = env.get("FECOMLITE_DATASIZE", "")
        self.calibrate = env.get("FECOMLITE_CALIBRATE", "")  # sites to replay at exit (JSON)
        self.clock = env.get("FECOMLITE_CLOCK", "")  # "monotonic": never the TSC


def _tsc_invariant(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the TSC ticks at one rate in every power state (`constant_tsc` and
    `nonstop_tsc`), so that the C path may stamp calls with it (~10 ns a read against ~22 ns
    for clock_gettime) and convert to CLOCK_MONOTONIC when it drains."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as info:
            flags = next((line for line in info if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "constant_tsc" in flags and "nonstop_tsc" in flags


_config = _Config(os.environ)
_sender = Sender(_config, open_calls)
_keep_events()
_special.update(
    _site_handlers.special_handlers(
        _config.manifest, _config.datasize, _sender, record, _config.calibrate)
)

if _native is not None:
    _native.configure(_before, _after, _capture.gpu_sync if _config.sync else None,
                      _names.is_framework)
    _native.use_tsc(_config.clock != "monotonic" and _tsc_invariant())
    call, dcall = _native.call, _native.dcall
else:
    call, dcall = _python_call, _python_dcall

_compilers.register_with_dynamo(
    (call, dcall, _python_call, _python_dcall),
    (_before, _after, _names.is_framework, _capture.gpu_sync),
)
_source.serve_original_sources()
_positions.serve_original_positions()

# `run --trace-layers` (fecomlite.runtime.layers)
if os.environ.get("FECOMLITE_TRACE_LAYERS") == "1":
    from fecomlite.runtime import layers as _layers

    _layers.start(record, _capture.gpu_sync if _config.sync else None)

_start_flusher()
atexit.register(final_flush)
os.register_at_fork(before=_worker_exit.before_fork, after_in_child=_after_fork_in_child)
_install_signal_handlers()
