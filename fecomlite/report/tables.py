"""The per-API and per-site tables: which columns, in what order, from which analysis figure.

A column names the path of its figure in an analysis row (`RunAnalysis.apis` / `.sites`, as in
`report.json`) and the column of `apis.csv` / `sites.csv` (`RunAnalysis.tables_csv`) that holds
the same figure, so the HTML, the JSON and the CSV show one number three ways.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fecomlite.analysis import noise_floor, units
from fecomlite.report.palette import domain_name

HTML_ROW_LIMIT = 1000  # rows beyond this stay in the CSV and JSON only


@dataclass(frozen=True)
class Group:
    """A header over several columns: an energy domain (with its provenance) or memory."""

    label: str
    provenance: str | None = None
    model: str | None = None
    sensor: str | None = None


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    unit: str  # J, s, B, % (a share 0..1), "" (a count) or "text"
    path: tuple[str, ...]
    csv: str
    group: Group | None = None
    ci: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # paths of the 95 % CI bounds
    signed: bool = False
    title: str = ""
    shown: bool = True  # shown at first; the table's column chooser shows the others
    noise: tuple[str, ...] | None = None  # path of the figure's 1σ: negative within it is ≈ 0
    below: tuple[str, ...] | None = None  # path of the row's `below_zero` (analysis.noise_floor)
    # path of the share of the row's calls a memory gauge cannot resolve: missing reads "below res."
    unresolved: tuple[str, ...] | None = None

    @property
    def numeric(self) -> bool:
        return self.unit != "text"


@dataclass(frozen=True)
class Cell:
    value: Any  # the raw figure (float, int, str) or None when missing
    text: str  # as displayed
    ci: str = ""  # "± 1.2 mJ" when the column has a CI
    data: str = ""  # the raw figure for sorting and for tests: repr of a float

    @property
    def missing(self) -> bool:
        return self.value is None


def lookup(row: dict[str, Any], path: Sequence[str]) -> Any:
    value: Any = row
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def domain_group(domain: dict[str, Any]) -> Group:
    """A domain's header; one that load distorted says by how much (`analysis.contention`)."""
    label = domain_name(domain["domain"])
    if domain.get("load_distortion"):
        label += f" (load: up to +{domain['load_distortion']:.0%})"
    return Group(label, domain["provenance"], domain.get("model"), domain["sensor"])


def _energy_columns(domain: dict[str, Any], *, with_total: bool) -> list[Column]:
    d = domain["domain"]
    g = domain_group(domain)
    below = ("energy", d, "below_zero")
    cols = []
    if with_total:
        cols.append(Column(f"{d}:total", "total", "J", ("energy", d, "total_J"), f"{d} total_J",
                           g, title="energy in these calls including their share of idle power",
                           shown=False))
    cols += [
        Column(f"{d}:self", "self", "J", ("energy", d, "self_J"), f"{d} self_J", g,
               noise=("energy", d, "uncertainty_J"), below=below,
               title="self energy above idle: the calls' own work, the wrapped calls nested in "
                     "them not counted (what the % of program and the bars add)"),
        Column(f"{d}:above", "inclusive", "J", ("energy", d, "above_idle_J"),
               f"{d} above_idle_J", g, noise=("energy", d, "uncertainty_J"), below=below,
               title="inclusive energy above idle: the calls with the wrapped calls nested in "
                     "them (those are counted in their callers too: never add this column)"),
        Column(f"{d}:per_call", "inclusive per call ± 95 % CI", "J",
               ("energy", d, "per_call", "mean"), f"{d} per_call_mean_J", g,
               ci=(("energy", d, "per_call", "ci95_low"), ("energy", d, "per_call", "ci95_high")),
               noise=("energy", d, "per_call", "noise_J"), below=below,
               title="mean inclusive above-idle energy per call, with the 95 % t-interval of "
                     "the mean"),
        Column(f"{d}:share", "self % of program", "%", ("energy", d, "share"), f"{d} share", g,
               noise=("energy", d, "share_sigma"), below=below,
               title="self energy of the program's above-idle energy in this domain (the "
                     "repetitions, start to end): with the program outside calls, 100 %"),
        Column(f"{d}:inclusive_share", "inclusive % of program", "%",
               ("energy", d, "inclusive_share"), f"{d} inclusive_share", g,
               noise=("energy", d, "share_sigma"), below=below, shown=False,
               title="inclusive energy of the program's above-idle energy: nested calls are "
                     "counted in their callers too, so this column sums to more than 100 %"),
    ]
    return cols


def _common_tail(domains: list[dict[str, Any]], gpu_memory: bool) -> list[Column]:
    cols: list[Column] = []
    additive = [d for d in domains if d["domain"] in ("cpu-package", "dram")
                or d["domain"].startswith("gpu:")]
    if len(additive) > 1:
        estimated = any(d["provenance"] != "measured" for d in additive)
        g = Group("all domains", "estimated" if estimated else "measured",
                  sensor=", ".join(d["domain"] for d in additive))
        cols.append(Column("all:above", "above idle", "J", ("all_domains", "above_idle_J"),
                           "all_domains_above_idle_J", g, noise=("all_domains", "uncertainty_J"),
                           below=("all_domains", "below_zero"),
                           title="sum over " + ", ".join(d["domain"] for d in additive)))
    mem = Group("memory")
    for key, name in (("rss", "RSS"), ("gpu_mem", "GPU mem")):
        if key == "gpu_mem" and not gpu_memory:
            continue
        res = ("memory", f"{key}_below_resolution_share")
        cols += [
            Column(f"{key}_delta", f"{name} retained / call", "B",
                   ("memory", f"{key}_delta_mean_B"), f"{key}_delta_mean_B", mem, signed=True,
                   unresolved=res,
                   title="mean memory a call leaves behind (its level at the end less at start), "
                         "over the calls longer than the memory sampler's period, each site's "
                         "first call left out when later ones exist (first use is beside); "
                         "\"below res.\": every call was shorter"),
            Column(f"{key}_first", f"{name} retained, first call", "B",
                   ("memory", f"{key}_first_call_delta_mean_B"),
                   f"{key}_first_call_delta_mean_B", mem, signed=True, unresolved=res,
                   shown=False,
                   title="what each site's first call in a process left behind (mean): "
                         "first-use work lands here (modules imported on first use, caches, "
                         "lazy initialisation), not in the later calls' figure"),
            Column(f"{key}_above", f"{name} peak above start", "B",
                   ("memory", f"{key}_peak_above_start_max_B"), f"{key}_peak_above_start_max_B",
                   mem, unresolved=res,
                   title="the most any call rose above the level it started at, while it ran "
                         "(not the whole process's peak)"),
            Column(f"{key}_transient", f"{name} transient / call", "B",
                   ("memory", f"{key}_transient_mean_B"), f"{key}_transient_mean_B", mem,
                   shown=False, unresolved=res,
                   title="mean peak above both the start and the end level: memory a call used "
                         "and released"),
            Column(f"{key}_peak", f"{name} process peak", "B", ("memory", f"{key}_peak_max_B"),
                   f"{key}_peak_max_B", mem, shown=False,
                   title="the whole process's highest level during any of the calls"),
        ]
    return cols


def bucket_width(rows: list[dict[str, Any]]) -> float | None:
    """The width of the buckets some rows' calls come from (`--keep`), None without."""
    return next((r["bucket_s"] for r in rows if r.get("bucketed_calls")), None)


def _bucket_column(bucket_s: float | None) -> list[Column]:
    """`--keep`: how many of a row's calls come from buckets (their figures are bucketed)."""
    if bucket_s is None:
        return []
    width = units.scaled(bucket_s, "s")
    return [Column("bucketed", "from buckets", "", ("bucketed_calls",), "bucketed_calls",
                   title=f"calls past the detail window (--keep), kept as per-site buckets of "
                   f"{width}: their counts and times are exact, their energy is spread evenly "
                   f"over each {width} bucket; memory per call leaves them out")]


def api_columns(domains: list[dict[str, Any]], gpu_memory: bool,
                bucket_s: float | None = None) -> list[Column]:
    cols = [
        Column("api", "API", "text", ("api",), "api", title="canonical name (what was written)"),
        Column("calls", "calls", "", ("calls",), "calls"),
        *_bucket_column(bucket_s),
        Column("time", "total time", "s", ("total_time_s",), "total_time_s"),
    ]
    for d in domains:
        cols += _energy_columns(d, with_total=True)
    return cols + _common_tail(domains, gpu_memory)


def site_columns(domains: list[dict[str, Any]], gpu_memory: bool,
                 bucket_s: float | None = None) -> list[Column]:
    cols = [
        Column("site", "site", "text", ("key",), "key", title="file:line:column of the call"),
        Column("source", "source line", "text", ("source",), "source", shown=False,
               title="the call as written (also in the site's tooltip)"),
        Column("api", "API", "text", ("api",), "api"),
        Column("calls", "calls", "", ("calls",), "calls"),
        *_bucket_column(bucket_s),
        Column("time", "total time", "s", ("total_time_s",), "total_time_s"),
    ]
    for d in domains:
        cols += _energy_columns(d, with_total=False)
    return cols + _common_tail(domains, gpu_memory)


def cell(column: Column, row: dict[str, Any]) -> Cell:
    value = lookup(row, column.path)
    below = lookup(row, column.below) if column.below else None
    if value is None:
        # an estimate below the idle baseline beyond its noise is not shown (its domain says why)
        if below == noise_floor.BEYOND_NOISE:
            return Cell(None, "below idle")
        unresolved = lookup(row, column.unresolved) if column.unresolved else None
        return Cell(None, "below res." if unresolved else "–")
    if not column.numeric:
        return Cell(value, str(value), data=str(value))
    data = repr(float(value)) if isinstance(value, float) else str(value)
    if column.unit == "%":
        text = units.percent(value)
    elif column.unit == "":
        text = f"{value:,}" if isinstance(value, int) else units.sig3(value)
    else:
        text = units.scaled(value, column.unit, signed=column.signed)
    ci = ""
    spread = 0.0  # the CI's half-width (95 %), or the figure's noise (noise_floor.NOISE_SIGMAS σ)
    if column.ci:
        low, high = lookup(row, column.ci[0]), lookup(row, column.ci[1])
        if low is not None and high is not None:
            spread = (high - low) / 2
            ci = "± " + units.scaled(spread, column.unit)
    sigma = lookup(row, column.noise) if column.noise else None
    if sigma is not None:
        spread = max(spread, noise_floor.NOISE_SIGMAS * sigma)
    if isinstance(value, (int, float)) and value < 0 and -value <= spread:
        text = "≈ 0"  # below idle only by noise: never shown as negative energy
    if below and value == 0:  # zero within noise (analysis.noise_floor)
        text = "≈ 0"
        noise = units.percent(sigma) if column.unit == "%" else units.scaled(sigma, column.unit)
        ci = f"(noise ± {noise})" if sigma else ""
    return Cell(value, text, ci, data)


def groups(columns: list[Column]) -> list[tuple[Group | None, int, int]]:
    """(group, span, index of the first column) for the header row above the columns."""
    out: list[tuple[Group | None, int, int]] = []
    for i, col in enumerate(columns):
        if out and out[-1][0] == col.group:
            g, span, first = out[-1]
            out[-1] = (g, span + 1, first)
        else:
            out.append((col.group, 1, i))
    return out


def has_gpu_memory(rows: list[dict[str, Any]]) -> bool:
    return any(lookup(r, ("memory", "gpu_mem_peak_max_B")) is not None for r in rows)
