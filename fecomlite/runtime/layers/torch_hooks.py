"""PyTorch: every `nn.Module` call timed through global module hooks, and its backward through
autograd graph hooks.

Forward: a global forward pre-hook opens a frame and a global forward hook (`always_call`, so it
runs when the forward raises too) closes it and records `layer:` for every module but the
outermost one (that is the user's own call, already a probe event). On a layer's first calls,
the tensors its forward left in the autograd graph for backward are counted by walking the graph
(`saved_bytes`): the activation memory a layer adds. (`saved_tensors_hooks` would be cheaper, but
it turns off autograd's check for tensors modified in place after being saved: a program that
raises there would compute wrong gradients instead.)

Backward: on each output's gradient node a pre-hook marks when the gradient reaches the layer; on
its inputs' nodes (a first layer's: its weights' accumulators) a hook marks when it left; at the end
of the backward pass (an engine callback) the spans are made to nest (`nest`) and recorded as
`layer-backward:` on the thread that ran the forward (on CUDA autograd runs backward on a device
thread of its own; the user's `loss.backward()` call is on the forward's). No hook is put on a
tensor (so nothing changes how the user's tensors are saved or printed) and no module is wrapped
(full backward hooks would make `ReLU(inplace=True)` after a hooked module raise).

On CUDA a layer's span is the GPU's (`device_time`): the hooks mark CUDA events on the layer's
stream instead of reading the CPU clock, and its spans are resolved, made to nest and recorded
when the call that drove them ends (the outermost module's forward, the backward pass), with one
wait for the GPU there; on CPU tensors the span is the CPU's, recorded at once.

`torch.compile`d modules run as one unit: the hooks do nothing while Dynamo traces
(`torch.compiler.is_compiling()` is constant there, so no graph break).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field
from time import monotonic_ns as _now
from typing import Any

from fecomlite.runtime.layers import facts
from fecomlite.runtime.layers.device_time import DeviceClock, cuda_clock
from fecomlite.runtime.layers.facts import Record
from fecomlite.runtime.layers.spans import nest

SAMPLED_CALLS = 3  # calls of each layer whose saved-for-backward bytes are counted
MAX_NODES = 10_000  # graph nodes one count visits at most


@dataclass
class _Timed:
    """A layer call's span, made to nest with its kind's (`nest`)."""

    site: str
    parent: _Timed | None  # the enclosing layer's span of the same kind
    depth: int
    begin: int = 0
    end: int = 0
    device: Any = None  # a CUDA device: the span is timed by events on it
    marks: list[Any] = field(default_factory=lambda: [None, None])  # its start and end events
    continues: bool = False  # a later piece of a span cut apart (`nest`)


@dataclass
class _Backward(_Timed):
    """One layer call's backward span, filled in by graph hooks (a parent whose begin stays 0
    was never hooked)."""

    params: int = 0
    handles: list[Any] = field(default_factory=list)
    tid: int = 0  # the thread that ran the forward (autograd may run backward on another)


@dataclass
class _Forward(_Timed):
    """One layer call's forward span on a GPU, recorded when the driving call ends (device
    None: a CPU-timed layer inside a GPU-timed one)."""

    raised: bool = False


@dataclass
class _Frame:
    module: Any
    path: str
    model: str
    site: str
    t0: int
    inputs: list[Any]  # graph nodes of the inputs, taken before the forward (it may be in place)
    backward: _Backward | None = None
    forward: _Forward | None = None  # set when the span waits for the driving call's end
    compiled: bool = False  # a torch.compile'd module, or inside one
    silent: bool = False  # inside a compiled unit: not an event of its own


class TorchTracer:
    def __init__(
        self, torch: Any, record: Record, sync: Any, clock: DeviceClock | None = None
    ) -> None:
        self.torch = torch
        self.record = record
        self.sync = sync
        self.clock = clock  # made when a layer first runs on CUDA (CUDA is set up by then)
        self.local = threading.local()
        self.is_compiling = torch.compiler.is_compiling
        self.edge = torch.autograd.graph.get_gradient_edge
        self.tensor = torch.Tensor
        self.param_ptrs: dict[int, set[int]] = {}
        self.counts: dict[int, int] = {}
        self.sampled: dict[str, int] = {}
        self.names: dict[int, dict[int, str]] = {}
        self.begun: list[_Backward] = []  # spans of the backward pass `task` so far
        self.task: int | None = None
        self.lock = threading.Lock()
        compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
        self.compiled_type = getattr(compiled, "OptimizedModule", ())

    def install(self) -> None:
        import warnings

        from torch.nn.modules import module

        # torch.compile warns that global hooks fire for its OptimizedModule too: they are ours,
        # and the program must print what it prints without them.
        warnings.filterwarnings(
            "ignore",
            message=r"Using `torch\.compile\(module\)` when there "
            r"are global hooks",
            category=UserWarning,
        )
        module.register_module_forward_pre_hook(self.pre)
        module.register_module_forward_hook(self.post, always_call=True)

    # -- forward ------------------------------------------------------------------------------

    def pre(self, module: Any, args: tuple[Any, ...]) -> None:
        if self.is_compiling():
            return
        with contextlib.suppress(Exception):  # a probe never raises into user code
            self._open(module, args)

    def post(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        if self.is_compiling():
            return
        with contextlib.suppress(Exception):
            self._close(module, output)

    def _open(self, module: Any, args: tuple[Any, ...]) -> None:
        stack = self._stack()
        cls = type(module).__name__
        compiled = isinstance(module, self.compiled_type)
        if stack:
            parent = stack[-1]
            name = self._child_name(parent.module, module)
            path = f"{parent.path}.{name}" if parent.path else name
            model = parent.model
        else:
            path, model = "", cls
        frame = _Frame(
            module,
            path,
            model,
            facts.site_key(facts.FORWARD, model, path, cls),
            0,
            self._input_nodes(args) if self.torch.is_grad_enabled() else [],
            compiled=compiled or bool(stack and stack[-1].compiled),
            silent=bool(stack and stack[-1].compiled),
        )
        if self.torch.is_grad_enabled() and not frame.silent:
            up = stack[-1].backward if stack else None
            frame.backward = _Backward(
                facts.site_key(facts.BACKWARD, model, path, cls), up, len(stack)
            )
        device = None if frame.silent or not stack else self._device(args)  # the root: no span
        up_forward = stack[-1].forward if stack else None
        if device is not None or up_forward is not None:
            frame.forward = _Forward(frame.site, up_forward, len(stack), device=device)
        stack.append(frame)
        if frame.forward is not None and device is not None:
            frame.forward.marks[0] = self.clock.mark(device)  # type: ignore[union-attr]
        elif self.sync is not None:
            self.sync()
        frame.t0 = _now()

    def _close(self, module: Any, output: Any) -> None:
        t1 = _now()
        stack = self._stack()
        if not stack or stack[-1].module is not module:
            return
        ahead = stack[-1].forward
        if ahead is not None and ahead.device is not None:
            ahead.marks[1] = self.clock.mark(ahead.device)  # type: ignore[union-attr]
        elif self.sync is not None:
            self.sync()
            t1 = _now()
        frame = stack.pop()
        parent = stack[-1] if stack else None
        if parent is not None and not frame.silent:
            raised = output is None and sys.exc_info()[0] is not None
            if ahead is not None:
                ahead.begin, ahead.end, ahead.raised = frame.t0, t1, raised
                self._pending().append(ahead)
            else:
                self.record(frame.site, frame.t0, t1, raised)
            facts.TABLE.update(
                frame.site,
                params=self._count(module),
                compiled=frame.compiled or None,
                saved_bytes_max=self._sampled_saved_bytes(frame, output),
                output_bytes_max=_nbytes(output, self.tensor),
            )
        if output is not None and parent is not None and frame.backward is not None:
            self._watch_backward(frame, output)
        if parent is None and getattr(self.local, "pending", None):
            self._record_forward()

    def _record_forward(self) -> None:
        """The driving call ended: its GPU-timed layer spans (and the CPU-timed ones inside
        them) get their device times, are made to nest, and are recorded."""
        spans, self.local.pending = self.local.pending, []
        self._device_times(spans)
        for span in nest(spans):
            self.record(span.site, span.begin, span.end, span.raised, span.continues)

    def _device_times(self, spans: list[Any]) -> None:
        """Device times for the spans marked on a GPU (one wait per device, at most); the
        others keep their CPU times. A span whose end was not marked keeps only its begin."""
        timed = [s for s in spans if s.device is not None and s.marks[0] is not None]
        marks = [(s.device, s.marks[0], s.marks[1] or s.marks[0]) for s in timed]
        for span, times in zip(timed, self.clock.resolve(marks) if marks else (), strict=True):
            if times is None:
                continue
            span.begin = times[0]
            if span.marks[1] is not None:
                span.end = times[1]
            facts.TABLE.update(span.site, clock="cuda")

    def _pending(self) -> list[_Forward]:
        pending = getattr(self.local, "pending", None)
        if pending is None:
            pending = self.local.pending = []
        return pending

    def _device(self, args: tuple[Any, ...]) -> Any:
        """The CUDA device of the call's first tensor argument, or None."""
        for a in args:
            if isinstance(a, self.tensor):
                return self.device_of(a)
        return None

    def device_of(self, tensor: Any) -> Any:
        """The tensor's CUDA device when its work can be timed by CUDA events, else None."""
        if not tensor.is_cuda:
            return None
        if self.clock is None:
            self.clock = cuda_clock(self.torch)
        return tensor.device if self.clock is not None else None

    def _input_nodes(self, args: tuple[Any, ...]) -> list[Any]:
        return [self._node(a) for a in args if isinstance(a, self.tensor) and a.requires_grad]

    def _node(self, tensor: Any) -> Any:
        """The graph node a tensor's gradient goes to (a leaf's: its accumulator, slower)."""
        return tensor.grad_fn or self.edge(tensor).node

    def _stack(self) -> list[_Frame]:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def _child_name(self, parent: Any, child: Any) -> str:
        names = self.names.get(id(parent))
        if names is None or id(child) not in names:
            names = self.names[id(parent)] = {
                id(m): n for n, m in parent.named_modules() if m is not parent
            }
        return names.get(id(child), f"<{type(child).__name__}>")

    def _count(self, module: Any) -> int:
        n = self.counts.get(id(module))
        if n is None:
            n = self.counts[id(module)] = sum(p.numel() for p in module.parameters())
        return n

    def _sampled_saved_bytes(self, frame: _Frame, output: Any) -> int | None:
        """Bytes the layer's forward left in the autograd graph for backward, on the first
        SAMPLED_CALLS calls of each layer (walking the graph costs ~1 µs a node)."""
        if frame.backward is None or frame.compiled:
            return None
        n = self.sampled.get(frame.site, 0)
        if n >= SAMPLED_CALLS:
            return None
        self.sampled[frame.site] = n + 1
        outs = [t.grad_fn for t in _tensors(output, self.tensor) if t.grad_fn is not None]
        stop = set(frame.inputs)
        weights = self.param_ptrs.get(id(frame.module))
        if weights is None:
            weights = self.param_ptrs[id(frame.module)] = {
                p.untyped_storage().data_ptr() for p in frame.module.parameters()
            }
        return saved_bytes(outs, stop, weights, self.tensor)

    # -- backward -----------------------------------------------------------------------------

    def _watch_backward(self, frame: _Frame, output: Any) -> None:
        """Hooks on the graph nodes where the layer's gradient arrives and where it leaves."""
        outs = [t for t in _tensors(output, self.tensor) if t.requires_grad]
        if not outs:
            return
        span = frame.backward
        span.params = self._count(frame.module)
        span.device = self.device_of(outs[0])
        span.tid = threading.get_ident()
        for t in outs:
            span.handles.append(self._node(t).register_prehook(lambda *_: self._begin(span)))
        for node in frame.inputs:
            span.handles.append(node.register_prehook(lambda *_: self._mark_end(span)))
        if frame.inputs:  # the inputs' gradients come last (accumulating the weights' is cheap)
            return
        for p in frame.module.parameters(recurse=False):  # a first layer: its weights' then
            if p.requires_grad:
                span.handles.append(
                    self.edge(p).node.register_hook(lambda *_: self._mark_end(span))
                )

    def _begin(self, span: _Backward) -> None:
        try:
            if span.begin:
                return
            if span.device is not None:
                span.marks[0] = self.clock.mark(span.device)  # type: ignore[union-attr]
            elif self.sync is not None:
                self.sync()
            span.begin = _now()
            task = self.torch._C._current_graph_task_id()
            with self.lock:
                first = task != self.task
                if first:  # a new backward pass; spans of one that raised are dropped
                    self.task, stale, self.begun = task, self.begun, []
                self.begun.append(span)
            if first:
                _remove_hooks(stale)
                self.torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        except Exception:  # noqa: BLE001, S110 - a probe never raises into user code
            pass

    def _mark_end(self, span: _Backward) -> None:
        with contextlib.suppress(Exception):
            if span.begin:
                span.end = _now()
                if span.device is not None:
                    span.marks[1] = self.clock.mark(span.device)  # type: ignore[union-attr]

    def _finish(self) -> None:
        """End of a backward pass: spans contain their children's, then each is recorded."""
        try:
            if self.sync is not None:
                self.sync()
            with self.lock:
                spans, self.begun, self.task = self.begun, [], None
            if self.clock is not None:
                self._device_times(spans)
            for span in nest(spans):  # on the forward's thread: under the user's backward call
                self.record(span.site, span.begin, span.end, False, span.continues, span.tid)
                facts.TABLE.update(span.site, params=span.params)
            _remove_hooks(spans)
        except Exception:  # noqa: BLE001, S110 - a probe never raises into user code
            pass


def _remove_hooks(spans: list[_Backward]) -> None:
    for span in spans:
        for handle in span.handles:
            handle.remove()


def saved_bytes(roots: list[Any], stop: set[Any], weights: set[int], tensor_type: type) -> int:
    """Bytes of the distinct storages that the graph nodes from `roots` back to `stop` keep for
    backward (their `_saved_*` tensors), parameters' storages not counted. Reading a saved
    tensor does not change it; at most MAX_NODES nodes are visited."""
    seen: set[Any] = set()
    storages: dict[int, int] = {}
    todo = list(roots)
    while todo and len(seen) < MAX_NODES:
        node = todo.pop()
        if node is None or node in seen or node in stop:
            continue
        seen.add(node)
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            value = getattr(node, name, None)
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, tensor_type):
                    storage = t.untyped_storage()
                    if storage.data_ptr() not in weights:
                        storages[storage.data_ptr()] = storage.nbytes()
        todo.extend(next_node for next_node, _ in node.next_functions)
    return sum(storages.values())


def _tensors(value: Any, tensor_type: type) -> list[Any]:
    """The tensors of a module's output: itself, or those of a tuple/list/dict (one level)."""
    if isinstance(value, tensor_type):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, tensor_type)]
    return []


def _nbytes(value: Any, tensor_type: type) -> int:
    return sum(t.nelement() * t.element_size() for t in _tensors(value, tensor_type))
