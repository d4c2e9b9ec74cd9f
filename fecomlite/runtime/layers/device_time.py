"""A PyTorch layer's span on the GPU, from CUDA events rather than from its CPU launches.

GPU work is asynchronous: the hooks around a layer on CUDA return long before its kernels run.
So the hooks record a CUDA event on the layer's stream where its span begins and ends (no
synchronisation: recording an event only queues it), and the spans are resolved in one go at
the end of the call that drove them (the user's `model(x)`, a backward pass): one reference
event is recorded then and waited for, its time read on the CPU clock right after the wait, and
every other event placed by its elapsed time to the reference. That one wait is the only
synchronisation; no layer waits for the GPU. Events whose times cannot be read (two devices,
a failed record) leave the span's CPU times in place.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic_ns as _now
from typing import Any

NS_PER_MS = 1_000_000


class DeviceClock:
    """CUDA events (or a test's fake of them) marked on a device's current stream."""

    def __init__(
        self,
        event_type: Any,
        stream_of: Callable[[Any], Any],
        now: Callable[[], int] = _now,
    ) -> None:
        self.event_type = event_type
        self.stream_of = stream_of
        self.now = now  # the probe's clock

    def mark(self, device: Any) -> Any:
        """An event recorded now on `device`'s current stream: queued, not waited for."""
        event = self.event_type(enable_timing=True)
        event.record(self.stream_of(device))
        return event

    def resolve(self, marks: list[tuple[Any, Any, Any]]) -> list[tuple[int, int] | None]:
        """(begin, end) on the monotonic clock, in ns, of each (device, start, end) marked, or
        None where the events cannot be read; waits once per device for a reference event."""
        refs: dict[Any, tuple[Any, int] | None] = {}
        out: list[tuple[int, int] | None] = []
        for device, start, end in marks:
            if device not in refs:
                refs[device] = self._reference(device)
            ref = refs[device]
            try:
                if ref is None or start is None or end is None:
                    raise ValueError("no event")
                event, t_ref = ref
                t1 = t_ref - round(end.elapsed_time(event) * NS_PER_MS)
                t0 = t1 - round(start.elapsed_time(end) * NS_PER_MS)
                out.append((t0, max(t1, t0)))
            except Exception:  # noqa: BLE001 - a span keeps its CPU times
                out.append(None)
        return out

    def _reference(self, device: Any) -> tuple[Any, int] | None:
        try:
            event = self.mark(device)
            event.synchronize()  # every event marked earlier on this stream has run
            return event, self.now()
        except Exception:  # noqa: BLE001 - no device times this time
            return None


def cuda_clock(torch: Any) -> DeviceClock | None:
    """The clock for a machine with CUDA; None without one (CPU spans only)."""
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available():
            return None
    except Exception:  # noqa: BLE001
        return None
    return DeviceClock(cuda.Event, cuda.current_stream)
