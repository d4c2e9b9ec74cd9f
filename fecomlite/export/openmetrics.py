"""A run's summary as OpenMetrics text (prometheus-client writes it), for a Pushgateway, a
textfile collector or any tool that reads the format.

Families (every series labelled `run`; energy also `domain` and `provenance`, measured and
estimated never summed): the run's energy per domain over its repetitions (idle included) and
above idle; per API its calls, time, energy above idle per domain and peak host RSS; the run's
CO2e in grams (labelled with the intensity) when one is known.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from fecomlite.analysis.carbon import Intensity
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.report.co2e import run_energy_J

PREFIX = "fecomlite"


class RunCollector(Collector):
    """The families of one analysed run."""

    def __init__(self, a: RunAnalysis, intensity: Intensity | None) -> None:
        self.a = a
        self.intensity = intensity

    def collect(self) -> Iterator[Metric]:
        a, run = self.a, str(self.a.run["id"])
        energy = _family(
            "run_energy",
            "joules",
            "energy per domain over every repetition, program start to end, idle included",
            ["run", "domain", "provenance"],
        )
        above = _family(
            "run_energy_above_idle",
            "joules",
            "energy above idle per domain over every repetition",
            ["run", "domain", "provenance"],
        )
        for d in a.domains:
            total = sum(
                r["energy"].get(d["domain"], {}).get("total_J", math.nan) for r in a.per_rep
            )
            _add(energy, [run, d["domain"], d["provenance"]], total)
            _add(above, [run, d["domain"], d["provenance"]], d["above_idle_in_reps_J"])
        yield energy
        yield above
        calls = _family("api_calls", "", "calls of each API", ["run", "api"])
        time_s = _family("api_time", "seconds", "time inside each API's calls", ["run", "api"])
        api_energy = _family(
            "api_energy_above_idle",
            "joules",
            "energy above idle attributed to each API's calls",
            ["run", "api", "domain", "provenance"],
        )
        rss = _family(
            "api_rss_peak", "bytes", "largest host RSS during a call of each API", ["run", "api"]
        )
        for row in a.apis:
            _add(calls, [run, row["api"]], row["calls"])
            _add(time_s, [run, row["api"]], row["total_time_s"])
            for domain, e in row["energy"].items():
                _add(api_energy, [run, row["api"], domain, e["provenance"]], e["above_idle_J"])
            _add(rss, [run, row["api"]], (row.get("memory") or {}).get("rss_peak_max_B"))
        yield from (calls, time_s, api_energy, rss)
        if self.intensity is not None:
            co2e = _family(
                "run_co2e",
                "grams",
                "estimated CO2e of the run's energy over every repetition",
                ["run", "intensity"],
            )
            _add(co2e, [run, self.intensity.label()], self.intensity.grams(run_energy_J(a)))
            yield co2e


def _family(name: str, unit: str, text: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=labels, unit=unit)


def _add(family: GaugeMetricFamily, labels: list[str], value: Any) -> None:
    """A sample, unless the figure is missing (None or NaN: no series rather than a fake 0)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        family.add_metric(labels, float(value))


def text(a: RunAnalysis, intensity: Intensity | None = None) -> str:
    """The OpenMetrics exposition, `# EOF` included."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(a, intensity))
    return generate_latest(registry).decode("utf-8")
