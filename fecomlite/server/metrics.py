"""GET /metrics: the server's state in Prometheus' text format, through prometheus-client.

A custom collector reads the monitor (`fecomlite.server.monitor`) at each scrape; nothing is
kept or sampled for it in between. A Prometheus that scrapes every node's server sees a
multi-node job whole (docs/metrics.md). Every series carries `host`; those about the active run
carry `run` too, and per-API series `node` and `rank` (a distributed job's GROUP_RANK and RANK;
empty for a process without: PromQL reads an empty label as no label), one series per rank, so
`sum by (api)` gives the job's totals. Energy is labelled with its provenance, and `model` names
the estimate where a figure is estimated (measured and estimated series are never summed here).

Counters only grow: sensor energy adds the increments the sensors saw while the server sampled
(a counter reset adds nothing); per-API energy adds each settled bin's energy above idle (never
negative) as shared by the live overlap estimate (method `live-overlap`); `fecomlite report`
attributes the whole run afterwards, and better.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from fecomlite.server.monitor import LIVE_METHOD, Monitor, Snapshot
from fecomlite.server.replies import Reply

PREFIX = "fecomlite"
MEMORY_DOMAINS = ("process-memory", "gpu-memory", "process-gpu-memory")


class MonitorCollector(Collector):
    """Every metric family, from one monitor refresh per scrape."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        snap = self.monitor.refresh()
        recording = GaugeMetricFamily(
            f"{PREFIX}_recording", "1 while a run records (sensors are sampled only then)",
            labels=["host"])
        running = snap.run is not None and snap.run["status"] == "running"
        recording.add_metric([snap.host], 1.0 if running else 0.0)
        yield recording
        yield _energy(snap)
        yield from _sensor_gauges(snap)
        if snap.run is not None:
            yield from _run_metrics(snap)


def _energy(snap: Snapshot) -> Metric:
    family = CounterMetricFamily(
        f"{PREFIX}_energy_joules",
        "Energy each sensor saw while the server sampled, since the server started",
        labels=["host", "domain", "sensor", "provenance", "model"])
    for e in snap.energy:
        family.add_metric([snap.host, e.domain, e.name, e.provenance, e.model or ""], e.joules)
    return family


def _sensor_gauges(snap: Snapshot) -> Iterator[Metric]:
    """The active run's sensors' values now (a sensor not read for a while is left out)."""
    run = str(snap.run["id"]) if snap.run else ""
    power = GaugeMetricFamily(
        f"{PREFIX}_power_watts", "Mean power over the last 0.5 s",
        labels=["host", "domain", "sensor", "provenance", "model"])
    memory = GaugeMetricFamily(
        f"{PREFIX}_memory_bytes", "Memory of the watched process tree (RSS, peak RSS) and GPUs",
        labels=["host", "run", "domain", "sensor", "provenance"])
    temperature = GaugeMetricFamily(
        f"{PREFIX}_temperature_celsius", "Temperatures", labels=["host", "sensor"])
    utilisation = GaugeMetricFamily(
        f"{PREFIX}_utilisation_percent", "CPU and GPU utilisation (machine, or the watched tree)",
        labels=["host", "run", "sensor"])
    for s in snap.sensors:
        value = s["now"]
        if value is None:
            continue
        if s["unit"] in ("J", "W"):
            power.add_metric([snap.host, s["domain"], s["name"], s["provenance"],
                              s["model"] or ""], value)
        elif s["domain"] in MEMORY_DOMAINS and s["unit"] == "B":
            memory.add_metric([snap.host, run, s["domain"], s["name"], s["provenance"]], value)
        elif s["domain"] == "temperature":
            temperature.add_metric([snap.host, s["name"]], value)
        elif s["domain"] == "utilisation":
            utilisation.add_metric([snap.host, run, s["name"]], value)
    yield from (power, memory, temperature, utilisation)


def _run_metrics(snap: Snapshot) -> Iterator[Metric]:
    assert snap.run is not None
    host, run = snap.host, str(snap.run["id"])
    info = GaugeMetricFamily(
        f"{PREFIX}_run_info", "The active run (1), or the last one when none records",
        labels=["host", "run", "kind", "program", "status"])
    info.add_metric([host, run, snap.run["kind"] or "", snap.run["program"] or "",
                     snap.run["status"] or ""], 1.0)
    reps = GaugeMetricFamily(
        f"{PREFIX}_run_repetitions", "Repetitions of the run: done, started, planned",
        labels=["host", "run", "state"])
    progress = snap.progress
    for state in ("done", "started", "total"):
        if progress.get(state) is not None:
            reps.add_metric([host, run, "planned" if state == "total" else state],
                            float(progress[state]))
    per_api = ["host", "run", "api", "node", "rank"]
    calls = CounterMetricFamily(
        f"{PREFIX}_api_calls", "Wrapped calls per API (and node and rank) so far in the run",
        labels=per_api)
    seconds = CounterMetricFamily(
        f"{PREFIX}_api_call_seconds", "Time in wrapped calls per API (and node and rank) so far "
        "(nested calls count in each)", labels=per_api)
    energy = CounterMetricFamily(
        f"{PREFIX}_api_energy_joules",
        f"Energy above idle per API (and node and rank) so far: a running estimate "
        f"({LIVE_METHOD}); `fecomlite report` attributes the run afterwards",
        labels=[*per_api, "domain", "provenance", "model", "method"])
    outside = CounterMetricFamily(
        f"{PREFIX}_outside_calls_energy_joules",
        f"Energy above idle while the program ran outside wrapped calls, so far ({LIVE_METHOD})",
        labels=["host", "run", "domain", "provenance", "model", "method"])
    chosen = {d: next(s for s in snap.sensors if s["name"] == n)
              for d, n in snap.energy_domains.items()}

    def source(domain: str) -> list[str]:
        s = chosen.get(domain) or {"provenance": "", "model": None}
        return [domain, s["provenance"], s["model"] or "", LIVE_METHOD]

    for a in snap.api_ranks:
        labels = [host, run, a.api, a.node, a.rank]
        calls.add_metric(labels, float(a.calls))
        seconds.add_metric(labels, a.seconds)
        for domain, joules in sorted(a.energy_J.items()):
            energy.add_metric([*labels, *source(domain)], joules)
    for domain, joules in sorted(snap.calls["outside_J"].items()):
        outside.add_metric([host, run, *source(domain)], joules)
    yield from (info, reps, calls, seconds, energy, outside)


def exposition(monitor: Monitor) -> Reply:
    """One scrape: the text format Prometheus reads (version 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    return Reply(generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4)
