"""`fecomlite.measure()`: what a block or a function cost, handed back to the user's own code.

    with fecomlite.measure("epoch") as m:
        train_one_epoch()
    print(m.duration_s, m.energy_J, m.memory_peak_B, m.co2e_g)

    @fecomlite.measure("step")
    def step(batch): ...
    step(b); step.last.energy_J          # every call measured; the latest on `.last`

No server is needed: the server's sensor code runs in this process (`measure_sampler`), on one
daemon thread that reads only while a measurement is open. Inside `fecomlite run` the block is
also recorded as the region `region:<name>`, attributed in the report like a call. Measurements
nest and may run on several threads: each has its own window, and energy is the domain's (the
machine's, for CPU package and DRAM) over that window, idle included.

Leaving the block costs microseconds; the figures come once the sensors have been read past its
end (about one update period, 0.1 s for estimated CPU power): reading `energy_J` or memory
waits for them, `duration_s` does not.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from time import monotonic_ns
from typing import Any, TypeVar

from fecomlite.runtime import regions

F = TypeVar("F", bound=Callable[..., Any])

NS = 1_000_000_000


class Measurement:
    """The figures of one measured block; energy and memory wait for the reads that cover it."""

    def __init__(self, name: str, intensity: Any = None) -> None:
        self.name = name
        self.start_ns = 0
        self.end_ns = 0
        self._pending: Any = None
        self._intensity = intensity  # fecomlite.analysis.carbon.Intensity or None
        self._figures: dict[str, Any] | None = None

    @property
    def duration_s(self) -> float:
        """Seconds from entering to leaving the block (CLOCK_MONOTONIC)."""
        return (self.end_ns - self.start_ns) / NS

    def _resolved(self) -> dict[str, Any]:
        if self._figures is None:
            if self._pending is None:
                raise RuntimeError("the measured block has not ended yet")
            window = self._pending.result()
            self._figures = {"domains": window.energy(), "memory": window.memory()}
        return self._figures

    @property
    def domains(self) -> dict[str, Any]:
        """Domain → `DomainEnergy` (joules, provenance, sensor, model, resolution_s)."""
        return dict(self._resolved()["domains"])

    @property
    def energy_J(self) -> dict[str, float]:
        """Domain → joules in the block, idle included (cpu-core, uncore and cpu-process are
        parts of cpu-package, not additions to it)."""
        return {d: e.joules for d, e in self._resolved()["domains"].items()}

    @property
    def provenance(self) -> dict[str, str]:
        """Domain → "measured" or "estimated"."""
        return {d: e.provenance for d, e in self._resolved()["domains"].items()}

    @property
    def resolution_s(self) -> dict[str, float]:
        """Domain → its sensor's update period: a block shorter than that is below resolution."""
        return {d: e.resolution_s for d, e in self._resolved()["domains"].items()}

    @property
    def below_resolution(self) -> list[str]:
        """The domains whose sensor updates less often than the block lasted."""
        return [d for d, s in self.resolution_s.items() if self.duration_s < s]

    @property
    def total_J(self) -> float:
        """CPU package + DRAM + every GPU: the domains that do not overlap."""
        from fecomlite.analysis.run_analysis import ADDITIVE_DOMAINS

        return sum(
            j for d, j in self.energy_J.items() if d in ADDITIVE_DOMAINS or d.startswith("gpu:")
        )

    def _memory(self, key: str, index: int) -> float | None:
        values = self._resolved()["memory"].get(key)
        return None if values is None else values[index]

    @property
    def memory_peak_B(self) -> float | None:
        """Peak host RSS of this process (and its children) in the block, bytes."""
        return self._memory("host", 2)

    @property
    def memory_added_B(self) -> float | None:
        """Host RSS at the end minus at the start, bytes (negative when memory was freed)."""
        start, end = self._memory("host", 0), self._memory("host", 1)
        return None if start is None or end is None else end - start

    @property
    def gpu_memory_peak_B(self) -> float | None:
        """Peak GPU memory of this process (or the whole device where per-process use is not
        shown), bytes; None without an NVIDIA GPU."""
        key = self._gpu_key()
        return None if key is None else self._memory(key, 2)

    @property
    def gpu_memory_added_B(self) -> float | None:
        key = self._gpu_key()
        if key is None:
            return None
        return self._memory(key, 1) - self._memory(key, 0)  # type: ignore[operator]

    def _gpu_key(self) -> str | None:
        memory = self._resolved()["memory"]
        return next((k for k in ("process-gpu-memory", "gpu-memory") if k in memory), None)

    @property
    def co2e_g(self) -> float | None:
        """Grams CO2e of `total_J` at the carbon intensity given (estimated); None without one."""
        if self._intensity is None:
            return None
        return self._intensity.grams(self.total_J)

    @property
    def carbon_intensity(self) -> Any:
        """The `fecomlite.analysis.carbon.Intensity` used for `co2e_g`, or None."""
        return self._intensity

    def as_dict(self) -> dict[str, Any]:
        """Every figure, for logging or JSON."""
        return {
            "name": self.name,
            "duration_s": self.duration_s,
            "energy_J": self.energy_J,
            "provenance": self.provenance,
            "resolution_s": self.resolution_s,
            "below_resolution": self.below_resolution,
            "total_J": self.total_J,
            "memory_peak_B": self.memory_peak_B,
            "memory_added_B": self.memory_added_B,
            "gpu_memory_peak_B": self.gpu_memory_peak_B,
            "gpu_memory_added_B": self.gpu_memory_added_B,
            "co2e_g": self.co2e_g,
            "carbon_intensity": None if self._intensity is None else self._intensity.label(),
        }

    def __repr__(self) -> str:
        if self._pending is None:
            return f"<Measurement {self.name!r} open>"
        energy = ", ".join(f"{d}={j:.3g} J" for d, j in self.energy_J.items())
        return f"<Measurement {self.name!r} {self.duration_s:.4g} s {energy}>"


class measure:  # noqa: N801 - used like a function, as contextlib's helpers are
    """Measure a block (`with measure() as m`) or every call of a function (`@measure()`).

    carbon_intensity: grid gCO2e/kWh; region: a code from the bundled table
    (`fecomlite.analysis.carbon`); pue: the data centre's power usage effectiveness (default 1).
    Without
    either, the intensity a `fecomlite run` was given (FECOMLITE_CARBON_* in the environment)
    is used, if any.
    """

    def __init__(
        self,
        name: str = "measure",
        *,
        carbon_intensity: float | None = None,
        region: str | None = None,
        pue: float | None = None,
    ) -> None:
        if callable(name):  # used bare: @fecomlite.measure
            raise TypeError('use @fecomlite.measure() or @fecomlite.measure("name")')
        self.name = name
        self._region = regions.region(name)
        self._intensity = _intensity(carbon_intensity, region, pue)
        self._open: list[tuple[int, Measurement, int]] = []  # (thread, measurement, token)
        self._lock = threading.Lock()

    def __enter__(self) -> Measurement:
        from fecomlite.api.sampler import monitor

        m = Measurement(self.name, self._intensity)
        token, m.start_ns = monitor().open()
        with self._lock:
            self._open.append((threading.get_ident(), m, token))
        self._region.__enter__()
        return m

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        end = monotonic_ns()
        self._region.__exit__(exc_type, exc, tb)
        from fecomlite.api.sampler import monitor

        tid = threading.get_ident()
        with self._lock:
            i = max(i for i, (t, _, _) in enumerate(self._open) if t == tid)
            _, m, token = self._open.pop(i)
        m.end_ns = end
        m._pending = monitor().close(token, m.start_ns, end)

    def __call__(self, func: F) -> F:
        """Measure every call of `func`; the latest measurement is `func.last`."""

        @functools.wraps(func)
        def measured(*args: Any, **kwargs: Any) -> Any:
            with self as m:
                measured.last = m  # type: ignore[attr-defined]
                return func(*args, **kwargs)

        measured.last = None  # type: ignore[attr-defined]
        return measured  # type: ignore[return-value]


def _intensity(value: float | None, code: str | None, pue: float | None) -> Any:
    from fecomlite.analysis import carbon

    return carbon.resolve(value, code, pue, carbon.from_environment())
