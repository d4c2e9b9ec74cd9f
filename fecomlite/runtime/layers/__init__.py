"""Per-layer events inside the framework's own loop (`fecomlite run --trace-layers`).

With `FECOMLITE_TRACE_LAYERS=1` in the measured process, the probe calls `start` at import: each
framework layer's forward call (and, in PyTorch, its backward) becomes an event on the probe's
buffer under a site key of its own (`layer:` / `layer-backward:`, `facts.site_key`). Events nest
by time on their thread, so a layer lands under the call that drove it (`torch.nn.Module.__call__`
of the user's model, `torch.Tensor.backward`, `keras.Model.fit`) and is attributed exactly like a
call. What each framework lets us see is in docs/layers.md. Nothing here is imported, and no hook
is installed, without the flag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fecomlite.runtime.layers import facts, on_import
from fecomlite.runtime.layers.facts import Record

ENV = "FECOMLITE_TRACE_LAYERS"


def layer_env(settings: Any) -> dict[str, str]:
    """The measured process's environment for the `trace_layers` setting (method level only:
    at project level there is no call for a layer to nest under)."""
    if settings.trace_layers and settings.level == "method":
        return {ENV: "1"}
    return {}


def start(record: Record, sync: Callable[[], None] | None) -> None:
    """Install the hooks now for frameworks already imported, else when they are imported.

    record: `probe.record(site, t0, t1, raised, continues, tid)`; sync: the GPU synchronisation
    to run at layer boundaries (the run's `--sync`), or None."""
    from fecomlite.runtime.capture import safely
    from fecomlite.runtime.sender import Sender

    Sender.extra_headers["layers"] = facts.TABLE.take_changed
    if sync is not None:
        gpu_sync = sync

        def sync() -> None:
            safely(gpu_sync)

    def torch_ready(torch: Any) -> None:
        from fecomlite.runtime.comm_hooks import CommTimer
        from fecomlite.runtime.layers.torch_hooks import TorchTracer

        TorchTracer(torch, record, sync).install()
        CommTimer(torch, record).install()  # DDP's bucketed all-reduce inside backward

    def keras_ready(keras: Any) -> None:
        from fecomlite.runtime.layers.keras_hooks import KerasTracer

        KerasTracer(keras, record, sync).install()

    on_import.when_imported({"torch": torch_ready, "keras": keras_ready})
