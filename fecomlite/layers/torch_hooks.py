"""PyTorch: every `nn.Module` call timed through global module hooks, and its backward through
autograd graph hooks.

Forward: a global forward pre-hook opens a frame and a global forward hook (`always_call`, so it
runs when the forward raises too) closes it and records `layer:` for every module but the
outermost one (that is the user's own call, already a probe event). Tensors the forward saves
for backward are counted through `saved_tensors_hooks` (identity pack/unpack): the activation
memory a layer adds. Backward: on each output's gradient node a pre-hook marks when the
gradient reaches the layer; on its inputs' nodes and its own parameters' accumulators a hook
marks when it left; at the end of the backward pass (an engine callback) each layer's span is
widened to contain its children's and recorded as `layer-backward:`. No hook is put on a tensor
(so nothing changes how the user's tensors are saved or printed) and no module is wrapped (full
backward hooks would make `ReLU(inplace=True)` after a hooked module raise).

`torch.compile`d modules run as one unit: the hooks do nothing while Dynamo traces
(`torch.compiler.is_compiling()` is constant there, so no graph break), and no saved-tensor hook
is pushed inside a compiled module.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field
from time import monotonic_ns as _now
from typing import Any

from fecomlite.layers import Record, facts


@dataclass
class _Backward:
    """One layer call's backward span, filled in by graph hooks."""

    site: str
    parent: _Backward | None  # the enclosing layer's span (its begin stays 0 if never hooked)
    depth: int
    params: int = 0
    begin: int = 0
    end: int = 0
    handles: list[Any] = field(default_factory=list)


@dataclass
class _Frame:
    module: Any
    path: str
    model: str
    site: str
    t0: int
    inputs: list[Any]
    saved: dict[int, int] = field(default_factory=dict)  # storage pointer -> bytes
    hooks: Any = None  # the saved_tensors_hooks context pushed for this frame
    backward: _Backward | None = None
    compiled: bool = False  # a torch.compile'd module, or inside one
    silent: bool = False  # inside a compiled unit: not an event of its own


class TorchTracer:
    def __init__(self, torch: Any, record: Record, sync: Any) -> None:
        self.torch = torch
        self.record = record
        self.sync = sync
        self.local = threading.local()
        self.is_compiling = torch.compiler.is_compiling
        self.edge = torch.autograd.graph.get_gradient_edge
        self.tensor = torch.Tensor
        self.param_ptrs: dict[int, set[int]] = {}
        self.counts: dict[int, int] = {}
        self.names: dict[int, dict[int, str]] = {}
        self.begun: list[_Backward] = []
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
            [a for a in args if isinstance(a, self.tensor) and a.requires_grad],
            compiled=compiled or bool(stack and stack[-1].compiled),
            silent=bool(stack and stack[-1].compiled),
        )
        if self.torch.is_grad_enabled() and not frame.silent:
            up = stack[-1].backward if stack else None
            frame.backward = _Backward(
                facts.site_key(facts.BACKWARD, model, path, cls), up, len(stack)
            )
            if not frame.compiled:
                frame.hooks = self.torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
                frame.hooks.__enter__()
        stack.append(frame)
        if self.sync is not None:
            self.sync()
        frame.t0 = _now()

    def _close(self, module: Any, output: Any) -> None:
        t1 = _now()
        stack = self._stack()
        if not stack or stack[-1].module is not module:
            return
        if self.sync is not None:
            self.sync()
            t1 = _now()
        frame = stack.pop()
        if frame.hooks is not None:
            frame.hooks.__exit__(None, None, None)
        parent = stack[-1] if stack else None
        if parent is not None and not frame.silent:
            raised = output is None and sys.exc_info()[0] is not None
            self.record(frame.site, frame.t0, t1, raised)
            for ptr, size in frame.saved.items():
                parent.saved.setdefault(ptr, size)
            facts.TABLE.update(
                frame.site,
                params=self._count(module),
                compiled=frame.compiled or None,
                saved_bytes_max=sum(frame.saved.values()),
                output_bytes_max=_nbytes(output, self.tensor),
            )
        if output is not None and parent is not None and frame.backward is not None:
            self._watch_backward(frame, output)

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

    def _pack(self, tensor: Any) -> Any:
        stack = self._stack()
        if stack:
            frame = stack[-1]
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._weights(frame.module) and ptr not in frame.saved:
                frame.saved[ptr] = storage.nbytes()
        return tensor

    def _weights(self, module: Any) -> set[int]:
        ptrs = self.param_ptrs.get(id(module))
        if ptrs is None:
            ptrs = self.param_ptrs[id(module)] = {
                p.untyped_storage().data_ptr() for p in module.parameters()
            }
        return ptrs

    # -- backward -----------------------------------------------------------------------------

    def _watch_backward(self, frame: _Frame, output: Any) -> None:
        """Hooks on the graph nodes where the layer's gradient arrives and where it leaves."""
        outs = [t for t in _tensors(output, self.tensor) if t.requires_grad]
        if not outs:
            return
        span = frame.backward
        span.params = self._count(frame.module)
        for t in outs:
            span.handles.append(self.edge(t).node.register_prehook(lambda *_: self._begin(span)))
        for t in frame.inputs:
            span.handles.append(self.edge(t).node.register_prehook(lambda *_: _mark_end(span)))
        for p in frame.module.parameters(recurse=False):
            if p.requires_grad:
                span.handles.append(self.edge(p).node.register_hook(lambda *_: _mark_end(span)))

    def _begin(self, span: _Backward) -> None:
        try:
            if span.begin:
                return
            if self.sync is not None:
                self.sync()
            span.begin = _now()
            with self.lock:
                first = not self.begun
                self.begun.append(span)
            if first:
                self.torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        except Exception:  # noqa: BLE001, S110 - a probe never raises into user code
            pass

    def _finish(self) -> None:
        """End of a backward pass: spans contain their children's, then each is recorded."""
        try:
            if self.sync is not None:
                self.sync()
            with self.lock:
                spans, self.begun = self.begun, []
            nest(spans)
            for span in spans:
                self.record(span.site, span.begin, span.end, False)
                facts.TABLE.update(span.site, params=span.params)
                for handle in span.handles:
                    handle.remove()
        except Exception:  # noqa: BLE001, S110 - a probe never raises into user code
            pass


def nest(spans: list[_Backward]) -> None:
    """Make one backward pass's spans nest like a call stack, as the attribution expects: each
    layer's span holds its children's, and spans that overlap without nesting are separated."""
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


def _as_stack(spans: list[_Backward]) -> None:
    """Make the spans nest like a call stack. One graph node's pre-hooks mark both the end of
    the layer after it and the start of the layer before it, a few nanoseconds apart and in hook
    order: a span that starts inside another but outlasts it starts where the other ended."""
    open_spans: list[_Backward] = []
    for span in sorted(spans, key=lambda s: (s.begin, -s.end)):
        while open_spans and (open_spans[-1].end <= span.begin or open_spans[-1].end < span.end):
            top = open_spans.pop()
            if top.end > span.begin:
                span.begin = top.end
        span.end = max(span.end, span.begin)
        open_spans.append(span)


def _begun_parent(span: _Backward) -> _Backward | None:
    """The nearest enclosing layer whose backward was seen (a layer whose output needed no
    gradient has no span of its own)."""
    up = span.parent
    while up is not None and not up.begin:
        up = up.parent
    return up


def _mark_end(span: _Backward) -> None:
    if span.begin:
        span.end = _now()


def _unpack(tensor: Any) -> Any:
    return tensor


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
