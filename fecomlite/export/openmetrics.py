"""A run's summary as OpenMetrics text (prometheus-client writes it), for a Pushgateway, a
textfile collector or any tool that reads the format.

Families (every series labelled `run`; energy also `domain` and `provenance`, measured and
estimated never summed): the run's energy per domain over its repetitions (idle included) and
above idle; per API its calls, time and energy above idle per domain, labelled `node` and `rank`
(one series per rank of a distributed job, so `sum by (api)` is the job's total; both empty for
a process without rank), and its peak host RSS (the process tree's: no rank); each rank's
`local_rank` and `device` (an info family); the run's CO2e in grams (labelled with the
intensity) when one is known.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from fecomlite.analysis.carbon import Intensity
from fecomlite.analysis.ranks import UNRANKED, add_rank_figures
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.report.co2e import run_energy_J

PREFIX = "fecomlite"


class RunCollector(Collector):
    """The families of one analysed run."""

    def __init__(
        self, a: RunAnalysis, intensity: Intensity | None, ranks: list[dict[str, Any]]
    ) -> None:
        """ranks: `add_rank_figures`' table (empty for a run without ranks)."""
        self.a = a
        self.intensity = intensity
        self.ranks = ranks
        self.node_of = {str(r["rank"]): str(r["node"]) for r in ranks}

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
        per_api = ["run", "api", "node", "rank"]
        calls = _family("api_calls", "", "calls of each API (per rank)", per_api)
        time_s = _family("api_time", "seconds", "time inside each API's calls (per rank)", per_api)
        api_energy = _family(
            "api_energy_above_idle",
            "joules",
            "energy above idle attributed to each API's calls (per rank)",
            [*per_api, "domain", "provenance"],
        )
        rss = _family(
            "api_rss_peak", "bytes", "largest host RSS during a call of each API", ["run", "api"]
        )
        for row in a.apis:
            for rank, labels in self._rank_labels(run, row):
                _add(calls, labels, _by(row, "calls_by_rank", rank, row["calls"]))
                _add(time_s, labels, _by(row, "time_by_rank", rank, row["total_time_s"]))
                for domain, e in row["energy"].items():
                    split = (row.get("energy_by_rank") or {}).get(domain, {})
                    value = e["above_idle_J"] if rank is None else split.get(rank, 0.0)
                    _add(api_energy, [*labels, domain, e["provenance"]], value)
            _add(rss, [run, row["api"]], (row.get("memory") or {}).get("rss_peak_max_B"))
        yield from (calls, time_s, api_energy, rss)
        if self.ranks:
            info = InfoMetricFamily(
                f"{PREFIX}_rank",
                "each rank of the job: its node, local rank and device",
                labels=["run", "node", "rank"],
            )
            for r in self.ranks:
                info.add_metric(
                    [run, str(r["node"]), str(r["rank"])],
                    {"local_rank": str(r["local_rank"]), "device": str(r["device"])},
                )
            yield info
        if self.intensity is not None:
            co2e = _family(
                "run_co2e",
                "grams",
                "estimated CO2e of the run's energy over every repetition",
                ["run", "intensity"],
            )
            _add(co2e, [run, self.intensity.label()], self.intensity.grams(run_energy_J(a)))
            yield co2e

    def _rank_labels(self, run: str, row: dict[str, Any]) -> list[tuple[str | None, list[str]]]:
        """(rank key or None for the whole row, labels) of each series of an API row."""
        if "calls_by_rank" not in row:
            return [(None, [run, row["api"], "", ""])]
        return [
            (r, [run, row["api"], self.node_of.get(r, ""), "" if r == UNRANKED else r])
            for r in row["calls_by_rank"]
        ]


def _by(row: dict[str, Any], field: str, rank: str | None, total: Any) -> Any:
    return total if rank is None else row[field].get(rank, 0)


def _family(name: str, unit: str, text: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=labels, unit=unit)


def _add(family: GaugeMetricFamily, labels: list[str], value: Any) -> None:
    """A sample, unless the figure is missing (None or NaN: no series rather than a fake 0)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        family.add_metric(labels, float(value))


def text(
    a: RunAnalysis,
    intensity: Intensity | None = None,
    processes: list[dict[str, Any]] | None = None,
) -> str:
    """The OpenMetrics exposition, `# EOF` included; processes: the store's ranks of the run."""
    ranks = add_rank_figures(a, processes or [])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(a, intensity, ranks))
    return generate_latest(registry).decode("utf-8")
