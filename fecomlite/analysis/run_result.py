"""`RunAnalysis`: everything the report shows about one run, as `analyse_run` computes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fecomlite.analysis.run_tables import plain, table_csv


@dataclass
class RunAnalysis:
    """Everything the report shows about one run.

    run, repetitions: the store's rows. sensors: every sensor with its metadata and whether it
    was attributed. domains: one row per energy domain: the sensor used, provenance, model,
    role/of/addable/meaning (`domain_role`: only `disjoint` domains are ever summed), idle_W
    (where it came from, idle_sigma_W), total_J and above_idle_J (the whole recording), the
    program's figures (`program_figures`: program_J = in_calls_J + outside_calls_J; tail_J and
    other_J apart), their noise (noise_J, tail_noise_J, resolution_J, outside_calls_noise_J),
    reliable (false for machine-level domains on a busy machine), method. calls: one numpy array
    per column, one row per event, in (rep, start) order: rep, site (index into site_keys), api
    (index into api_names), site_id, pid, tid, t_start_ns, t_end_ns, duration_s, status,
    in/out_bytes, parent (row index, −1), depth, call (the row of the call's first piece:
    `pieces.call_heads`); per-domain dicts {domain: array} of energy_J
    (inclusive, above idle), energy_total_J (with the idle share), self_energy_J, uncertainty_J
    (1σ), below_resolution; memory: rss_start_B, rss_end_B, rss_peak_B, gpu_mem_start_B,
    gpu_mem_end_B, gpu_mem_peak_B (NaN without a sensor), rss_below_resolution,
    gpu_mem_below_resolution (`below_gauge_resolution`). sites, apis: rows from `aggregate`,
    most costly first; their `share` is of the domain's program_J (NaN when that is within
    noise). per_rep: per repetition totals. share_in_calls: per domain, in_calls_J / program_J.
    load: `machine_load`, whether other processes used the machine. mode: `run_mode`, whether
    the figures are a quick run's rough ones. intensities: per domain, the
    fitted API intensities and the method used (also stored as the run's "intensities" result).
    levels: method-level calls against the project-level total, when both runs exist.
    detail_calls: a bounded-storage run's (`--keep`, analysed streamed, `calls` empty) calls
    kept in detail, in `calls`' columns, from a whole-run analysis of those calls alone: the
    calls' timeline and layer contexts of its detail window (`call_columns`).
    """

    run: dict[str, Any]
    repetitions: list[dict[str, Any]]
    sensors: list[dict[str, Any]]
    domains: list[dict[str, Any]]
    calls: dict[str, Any]
    sites: list[dict[str, Any]]
    apis: list[dict[str, Any]]
    per_rep: list[dict[str, Any]]
    share_in_calls: dict[str, float]
    intensities: dict[str, Any]
    method: str
    site_keys: list[str] = field(default_factory=list)
    api_names: list[str] = field(default_factory=list)
    levels: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    mode: dict[str, Any] = field(default_factory=dict)
    detail_calls: dict[str, Any] | None = None

    def call_columns(self) -> dict[str, Any]:
        """The per-call columns there are: every call's, else the detail window's."""
        if self.detail_calls is not None and not len(self.calls.get("call", ())):
            return self.detail_calls
        return self.calls

    def to_json(self, include_calls: bool = False) -> dict[str, Any]:
        """Plain dicts, lists, floats and strings (NaN → None); per-call rows only when asked."""
        out = {
            "run": self.run, "repetitions": self.repetitions, "sensors": self.sensors,
            "domains": self.domains, "sites": self.sites, "apis": self.apis,
            "per_rep": self.per_rep, "share_in_calls": self.share_in_calls,
            "intensities": self.intensities, "method": self.method, "levels": self.levels,
            "notes": self.notes, "site_keys": self.site_keys, "api_names": self.api_names,
            "load": self.load, "mode": self.mode,
        }
        if include_calls:
            out["calls"] = self.calls
        return plain(out)

    def tables_csv(self) -> dict[str, str]:
        """{"apis": csv, "sites": csv}: one row per API / site, one column group per domain."""
        mode = self.mode.get("mode", "")
        return {"apis": table_csv(self.apis, "api", mode),
                "sites": table_csv(self.sites, "site", mode)}
