"""DDP's bucketed all-reduce as an API of its own (`fecomlite run --trace-layers`).

DistributedDataParallel all-reduces the gradients inside `loss.backward()`: its C++ reducer
launches one collective per gradient bucket from autograd hooks, so no wrapped call sees it. Its
one Python entry is the communication hook: with the flag on, each DDP gets a timed hook at its
first forward doing what PyTorch's `allreduce_hook` does (documented to give the results of no
hook: divide the bucket by the group's size, all-reduce it), and a hook the program registers
itself (or DDP's mixed precision, or an optimizer in backward) is timed in its place. A user
hook registered after our default has taken the reducer's one slot replaces it, checked and
logged as DDP does, so the program sees no difference.

A bucket's event runs from the hook's call (the bucket is ready, inside `backward`) to the
collective's completion, recorded on the thread that completes it: gloo's worker, which really
does the reduction while autograd goes on computing on the calling thread. The end is taken in a
`then` callback whose future is the one DDP waits on, so every bucket ends before the `backward`
that launched it returns. A bucket's span starts no earlier than the previous bucket's ended
(gloo runs two at once on two threads), so the collectives' time is the time some all-reduce was
in flight, never counted twice. With NCCL the future completes at launch: the event is the
launch only, and the GPU time of the reduction stays in `backward` (docs/distributed.md).

Exit safety: a Python callback on a torch future needs the GIL on gloo's thread, to run and again
to be released (torch acquires it to drop the function) — after the future DDP waits on has
completed. A program that ends (or destroys its process group) right after `backward` then races
that thread: the interpreter's finalisation kills a thread that waits for the GIL (std::terminate,
SIGABRT), and a process group destroyed with the GIL held joins a thread that waits for it (a
hang). So each backward that ran our hook ends with a wait, GIL released, until gloo's thread has
let go of every callback of that backward (`_Pass`); the default all-reduce is ours for the same
reason (PyTorch's `allreduce_hook` leaves a lambda of its own to be dropped on that thread), and
its work object is kept, to be freed on the program's thread: it holds the context `backward`
stashes in thread-local state, a Python object (a bucket freed by DDP's C++ hook leaves gloo's
thread the same last drop, for a few microseconds).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable
from time import monotonic_ns as _now
from typing import Any

from fecomlite.runtime.layers.facts import Record

PREFIX = "collective:"
DEFAULT_API = "torch.distributed.all_reduce (DDP gradient bucket)"


def site_key(hook: Callable[..., Any] | None) -> str:
    """The site key of DDP's default all-reduce (None) or of a registered hook."""
    if hook is None:
        return PREFIX + DEFAULT_API
    name = getattr(hook, "__qualname__", type(hook).__name__)
    return f"{PREFIX}{getattr(hook, '__module__', '')}.{name} (DDP comm hook)"


def site_row(key: str) -> dict[str, Any] | None:
    """The store's site row for a collective key, None for any other key."""
    if not key.startswith(PREFIX):
        return None
    api = key[len(PREFIX) :]
    return {"api": api, "written": api, "kind": "collective"}


RELEASE_WAIT_S = 5.0  # at most, at the end of a backward: gloo's thread holds the GIL for µs


class _Pass:
    """The buckets of one backward (autograd's graph task `task`), each until gloo's thread has
    dropped its callback."""

    def __init__(self, task: int) -> None:
        self.task = task
        self.pending = 0
        self.released = threading.Condition()
        self.kept: list[Any] = []  # futures and works: freed on the program's thread, not gloo's

    def add(self) -> None:
        with self.released:
            self.pending += 1

    def drop(self) -> None:
        with self.released:
            self.pending -= 1
            self.released.notify_all()

    def wait(self) -> None:
        with self.released:
            self.released.wait_for(lambda: self.pending <= 0, timeout=RELEASE_WAIT_S)


class _Completion:
    """A bucket's `then` callback: the end of its event, and its value for DDP. Its `__del__`
    runs where torch drops it, holding the GIL: then gloo's thread needs the GIL no more."""

    __slots__ = ("timer", "site", "t0", "unwrap", "owner")

    def __init__(
        self, timer: CommTimer, owner: _Pass, site: str, t0: int, unwrap: Callable[[Any], Any]
    ) -> None:
        self.timer, self.owner, self.site, self.t0, self.unwrap = timer, owner, site, t0, unwrap
        owner.add()

    def __call__(self, future: Any) -> Any:
        raised = True
        try:
            value = self.unwrap(future)
            raised = False
            return value
        finally:
            self.timer.done(self.site, self.t0, raised)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.owner.drop()


def _value(future: Any) -> Any:
    return future.value()


def _first_value(future: Any) -> Any:
    return future.value()[0]


class _Slot:
    """The hook in a DDP reducer's one slot: ours, timing the default all-reduce until the
    program registers its own hook (`inner`)."""

    def __init__(self, timer: CommTimer, state: Any) -> None:
        self.timer, self.state = timer, state
        self.inner: Callable[..., Any] | None = None  # set: the slot is the program's
        self.site = site_key(None)

    def __call__(self, _state: Any, bucket: Any) -> Any:
        t0 = _now()
        if self.inner is not None:
            return self.timer.completed(self.inner(self.state, bucket), self.site, t0, _value)
        dist = self.timer.torch.distributed
        group = self.state if self.state is not None else dist.group.WORLD
        tensor = bucket.buffer().div_(group.size())  # first: no overflow in fp16
        work = dist.all_reduce(tensor, group=group, async_op=True)
        return self.timer.completed(work.get_future(), self.site, t0, _first_value, work)


class CommTimer:
    def __init__(self, torch: Any, record: Record) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.torch = torch
        self.record = record
        self.ddp_type = DistributedDataParallel
        self.slots: weakref.WeakKeyDictionary[Any, _Slot | None] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()
        self.last_end = 0
        self.pass_: _Pass | None = None
        self.last_kept: list[Any] = []

    def install(self) -> None:
        from torch.nn.modules import module

        original = self.ddp_type.register_comm_hook
        timer = self

        @functools.wraps(original)
        def register_comm_hook(ddp: Any, state: object, hook: Callable[..., Any]) -> None:
            slot = timer.slots.get(ddp)
            if slot is None or slot.inner is not None:
                return original(ddp, state, timer.timed(hook))
            ddp._check_comm_hook(hook)  # what DDP would check and log, then the slot is theirs
            ddp.logger._set_comm_hook_name(hook.__qualname__)
            ddp._comm_hooks.append((hook, state))
            slot.state, slot.inner, slot.site = state, hook, site_key(hook)
            return None

        self.ddp_type.register_comm_hook = register_comm_hook
        module.register_module_forward_pre_hook(self.first_forward)

    def timed(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """The program's hook, timed; its name, signature and annotations stay (DDP checks
        them: functools.wraps sets `__wrapped__`, which `inspect.signature` follows)."""
        site = site_key(hook)

        @functools.wraps(hook)
        def comm_hook(state: Any, bucket: Any) -> Any:
            t0 = _now()
            return self.completed(hook(state, bucket), site, t0, _value)

        return comm_hook

    def first_forward(self, module: Any, args: Any) -> None:
        """Our timed default in a DDP's reducer, unless it has a hook already."""
        if not isinstance(module, self.ddp_type) or module in self.slots:
            return
        self.slots[module] = None
        with contextlib.suppress(Exception):  # a built-in hook holds the slot: left untimed
            if module._comm_hooks or getattr(module, "_use_python_reducer", False):
                return
            slot = _Slot(self, module.process_group)
            self.torch.distributed._register_comm_hook(module.reducer, None, slot)
            self.slots[module] = slot

    def completed(
        self, future: Any, site: str, t0: int, unwrap: Callable[[Any], Any], work: Any = None
    ) -> Any:
        """The future DDP waits on: `future`, then the bucket's event and value. Should the
        chaining fail, `future` itself, untimed (a probe never raises into user code). The
        collective's `work` is kept too: it holds the backward's context (a Python object) and
        would otherwise be freed on gloo's thread, after DDP's wait, needing the GIL."""
        try:
            current = self.current_pass()
            chained = future.then(_Completion(self, current, site, t0, unwrap))
        except Exception:
            return future
        current.kept += [chained, work]
        return chained

    def done(self, site: str, t0: int, raised: bool) -> None:
        with contextlib.suppress(Exception):
            with self.lock:
                t1 = _now()
                start = min(max(t0, self.last_end), t1)
                self.last_end = t1
            self.record(site, start, t1, raised)

    def current_pass(self) -> _Pass:
        """This backward's buckets; the first bucket of a backward opens a new pass and asks
        autograd to run `_ending` once the backward's work is done (a backward that raised
        never runs it: the next one, another graph task, opens its own)."""
        try:
            task = self.torch._C._current_graph_task_id()
        except Exception:
            task = -1
        with self.lock:
            current = self.pass_
            opened = current is None or current.task != task
            if opened:
                current = self.pass_ = _Pass(task)
        if opened:
            try:
                self._queue(functools.partial(self._ending, current))
            except Exception:  # not inside a backward (DDP's Join): no wait for this bucket
                with self.lock:
                    if self.pass_ is current:
                        self.pass_ = None
        return current

    def _queue(self, callback: Callable[[], None]) -> None:
        self.torch.autograd.Variable._execution_engine.queue_callback(callback)

    def _ending(self, current: _Pass) -> None:
        """Runs among the backward's final callbacks, queued before DDP's own (which waits for
        the buckets): the wait is queued from here, so it runs after DDP's."""
        with contextlib.suppress(Exception):
            with self.lock:
                if self.pass_ is current:
                    self.pass_ = None
            self._queue(functools.partial(self._released, current))

    def _released(self, current: _Pass) -> None:
        """Wait, GIL released, until gloo's thread has dropped this backward's callbacks."""
        with contextlib.suppress(Exception):
            current.wait()
            self.last_kept = current.kept  # the previous pass's go: long complete
