"""DDP's bucketed all-reduce as an API of its own (`fecomlite run --trace-layers`).

DistributedDataParallel all-reduces the gradients inside `loss.backward()`: its C++ reducer
launches one collective per gradient bucket from autograd hooks, so no wrapped call sees it. Its
one Python entry is the communication hook: with the flag on, each DDP gets a timed hook at its
first forward, PyTorch's own `allreduce_hook` (documented to give the results of no hook), and
a hook the program registers itself (or DDP's mixed precision, or an optimizer in backward) is
timed in its place. A user hook registered after our default has taken the reducer's one slot
replaces it, checked and logged as DDP does, so the program sees no difference.

A bucket's event runs from the hook's call (the bucket is ready, inside `backward`) to the
collective's completion, recorded on the thread that completes it: gloo's worker, which really
does the reduction while autograd goes on computing on the calling thread. A bucket's span starts
no earlier than the previous bucket's ended (gloo runs two at once on two threads), so the
collectives' time is the time some all-reduce was in flight, never counted twice, and it lies
inside the `backward` that launched them (DDP waits for every bucket before backward returns).
With NCCL the future completes at launch: the event is the launch only, and the GPU time of the
reduction stays in `backward` (docs/distributed.md).
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


class _Slot:
    """The hook in a DDP reducer's one slot: ours, timing `inner` (PyTorch's default all-reduce
    until the program registers its own)."""

    def __init__(self, timer: CommTimer, state: Any, inner: Callable[..., Any]) -> None:
        self.timer, self.state, self.inner = timer, state, inner
        self.site = site_key(None)
        self.replaced = False

    def __call__(self, _state: Any, bucket: Any) -> Any:
        t0 = _now()
        future = self.inner(self.state, bucket)
        self.timer.watch(future, self.site, t0)
        return future


class CommTimer:
    def __init__(self, torch: Any, record: Record) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.torch = torch
        self.record = record
        self.ddp_type = DistributedDataParallel
        self.slots: weakref.WeakKeyDictionary[Any, _Slot | None] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()
        self.last_end = 0

    def install(self) -> None:
        from torch.nn.modules import module

        original = self.ddp_type.register_comm_hook
        timer = self

        @functools.wraps(original)
        def register_comm_hook(ddp: Any, state: object, hook: Callable[..., Any]) -> None:
            slot = timer.slots.get(ddp)
            if slot is None or slot.replaced:
                return original(ddp, state, timer.timed(hook))
            ddp._check_comm_hook(hook)  # what DDP would check and log, then the slot is theirs
            ddp.logger._set_comm_hook_name(hook.__qualname__)
            ddp._comm_hooks.append((hook, state))
            slot.state, slot.inner, slot.site, slot.replaced = state, hook, site_key(hook), True
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
            future = hook(state, bucket)
            self.watch(future, site, t0)
            return future

        return comm_hook

    def first_forward(self, module: Any, args: Any) -> None:
        """Our timed default in a DDP's reducer, unless it has a hook already."""
        if not isinstance(module, self.ddp_type) or module in self.slots:
            return
        self.slots[module] = None
        with contextlib.suppress(Exception):  # a built-in hook holds the slot: left untimed
            if module._comm_hooks or getattr(module, "_use_python_reducer", False):
                return
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            slot = _Slot(self, module.process_group, allreduce_hook)
            self.torch.distributed._register_comm_hook(module.reducer, None, slot)
            self.slots[module] = slot

    def watch(self, future: Any, site: str, t0: int) -> None:
        """Record the bucket's event when its collective completes."""
        with contextlib.suppress(Exception):  # a probe never raises into user code
            future.add_done_callback(lambda _: self._done(site, t0))

    def _done(self, site: str, t0: int) -> None:
        with contextlib.suppress(Exception):
            with self.lock:
                t1 = _now()
                start = min(max(t0, self.last_end), t1)
                self.last_end = t1
            self.record(site, start, t1, False)
