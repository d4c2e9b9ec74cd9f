"""The PyTorch layer hooks leave the program's behaviour alone (in a child process: the hooks are
global to the process that installs them)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

PROGRAM = """
    import json, sys
    from fecomlite.runtime import layers

    events = []
    if sys.argv[1] == "on":
        layers.start(lambda site, t0, t1, raised=False, *_: events.append([site, raised]), None)
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    out = {}
    net = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    try:  # autograd's check of a saved tensor modified in place must still fire
        h = net(torch.randn(2, 4))
        h.mul_(2)
        h.sum().backward()
        out["inplace"] = "no error"
    except RuntimeError as exc:
        out["inplace"] = str(exc).split(":")[0]
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 1))
    x = torch.randn(3, 4, requires_grad=True)
    net(x).sum().backward()
    out["grad"] = [round(v, 6) for v in x.grad.flatten().tolist()]
    bad = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 1))
    try:
        bad(torch.randn(2, 4))
    except RuntimeError as exc:
        out["raised"] = type(exc).__name__
    out["events"] = events
    print(json.dumps(out))
"""


def run(tmp_path, flag: str) -> dict:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    done = subprocess.run(
        [sys.executable, str(script), flag],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert done.stderr == ""
    return json.loads(done.stdout)


@pytest.mark.slow
def test_hooks_change_no_result_no_error_and_record_the_failing_layer(tmp_path):
    off, on = run(tmp_path, "off"), run(tmp_path, "on")
    assert on["inplace"] == off["inplace"] != "no error"
    assert on["grad"] == off["grad"] and on["raised"] == off["raised"] == "RuntimeError"
    assert off["events"] == []
    sites = [site for site, _ in on["events"]]
    assert "layer:Sequential/1 (ReLU)" in sites and "layer-backward:Sequential/1 (ReLU)" in sites
    assert ["layer:Sequential/1 (Linear)", True] in on["events"]  # the forward that raised


class FakeGpuForTests:
    """A GPU timeline for tests: each event recorded runs 1 µs after the one before it."""

    def __init__(self) -> None:
        self.t = 0
        self.waits = 0

    def now(self) -> int:
        return self.t  # after a wait, the GPU has reached its last event


class FakeCudaEventForTests:
    """Stands in for `torch.cuda.Event` on a machine without CUDA (`gpu` set by the test)."""

    gpu: FakeGpuForTests

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t: int | None = None

    def record(self, stream=None) -> None:
        assert stream == "fake-stream"
        self.gpu.t += 1000
        self.t = self.gpu.t

    def synchronize(self) -> None:
        self.gpu.waits += 1

    def elapsed_time(self, end: FakeCudaEventForTests) -> float:
        assert self.t is not None and end.t is not None
        return (end.t - self.t) / 1e6  # ms



@contextlib.contextmanager
def global_hooks(tracer: Any) -> Iterator[None]:
    """The tracer's global forward hooks, as `--trace-layers` adds them, removed after."""
    from torch.nn.modules import module

    handles = [
        module.register_module_forward_pre_hook(tracer.pre),
        module.register_module_forward_hook(tracer.post, always_call=True),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()

def test_layers_on_cuda_are_timed_by_device_events_with_one_wait_per_driving_call():
    """The hooks' path for CUDA tensors, with fake CUDA events: spans come from the events'
    times (not the CPU clock) and the GPU is waited for once per forward call and once per
    backward pass, never per layer."""
    import torch
    import torch.nn as nn

    from fecomlite.runtime.layers.device_time import DeviceClock
    from fecomlite.runtime.layers.torch_hooks import TorchTracer

    gpu = FakeGpuForTests()
    FakeCudaEventForTests.gpu = gpu
    clock = DeviceClock(FakeCudaEventForTests, lambda device: "fake-stream", now=gpu.now)
    recorded = []

    class TracerOnFakeCudaForTests(TorchTracer):
        def device_of(self, tensor):
            return "cuda:0"

    tracer = TracerOnFakeCudaForTests(
        torch, lambda *event: recorded.append(event), sync=None, clock=clock
    )
    with global_hooks(tracer):
        net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        out = net(torch.randn(2, 4, requires_grad=True))
        assert recorded == [
            ("layer:Sequential/0 (Linear)", 1000, 2000, False, False),
            ("layer:Sequential/1 (ReLU)", 3000, 4000, False, False),
            ("layer:Sequential/2 (Linear)", 5000, 6000, False, False),
        ]
        assert gpu.waits == 1
        recorded.clear()
        out.sum().backward()
    assert gpu.waits == 2
    assert [site for site, *_ in recorded] == [
        "layer-backward:Sequential/2 (Linear)",
        "layer-backward:Sequential/1 (ReLU)",
        "layer-backward:Sequential/0 (Linear)",
    ]
    for site, t0, t1, *_ in recorded:  # GPU times: multiples of the fake's 1 µs steps
        assert 6000 < t0 < t1 <= gpu.t and t0 % 1000 == 0 and t1 % 1000 == 0, site
    assert all(a[2] <= b[1] for a, b in zip(recorded, recorded[1:], strict=False))


def test_backward_spans_run_on_autograd_s_device_thread_are_recorded_on_the_forward_s():
    """On CUDA autograd runs backward on a device thread of its own: the spans its end records
    carry the thread that ran the forward (the user's `loss.backward()` call), so they nest under
    that call."""
    import threading

    import torch
    import torch.nn as nn

    from fecomlite.runtime.layers.device_time import DeviceClock
    from fecomlite.runtime.layers.torch_hooks import TorchTracer

    gpu = FakeGpuForTests()
    FakeCudaEventForTests.gpu = gpu
    clock = DeviceClock(FakeCudaEventForTests, lambda device: "fake-stream", now=gpu.now)
    recorded = []
    device_threads = []

    def record(site, t0, t1, raised=False, continues=False, tid=0):  # as `probe.record` does
        recorded.append((site, tid or threading.get_ident()))

    class TracerOnFakeCudaDeviceThreadForTests(TorchTracer):
        def device_of(self, tensor):
            return "cuda:0"

        def _finish(self):  # the end of the backward pass, on autograd's device thread
            thread = threading.Thread(target=super()._finish)
            thread.start()
            device_threads.append(thread.ident)
            thread.join()

    tracer = TracerOnFakeCudaDeviceThreadForTests(torch, record, sync=None, clock=clock)
    with global_hooks(tracer):
        net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        out = net(torch.randn(2, 4, requires_grad=True))
        recorded.clear()
        out.sum().backward()
    assert len(device_threads) == 1 and device_threads[0] != threading.get_ident()
    assert [site for site, _ in recorded] == [
        "layer-backward:Sequential/2 (Linear)",
        "layer-backward:Sequential/1 (ReLU)",
        "layer-backward:Sequential/0 (Linear)",
    ]
    assert {tid for _, tid in recorded} == {threading.get_ident()}
