"""`fecomlite sweep`'s engine: a grid of small networks, each trained as one measured run.

Every configuration runs `fc_program.py` as a fecomlite run (kind `sweep-config`, gated and
repeated, at project level) under one parent run of kind `sweep`. A configuration's energy is
its training region's (`region:train`, per domain, above idle, mean over repetitions), so
interpreter start-up, imports and the warm-up step are not counted; its features come from the
configuration (features.py), exactly. The table (one row per configuration) is stored as the
sweep's result "sweep" and written as CSV (Parquet would need pyarrow, which fecomlite does not
depend on).

The default grid (24 configurations × 2 repetitions, Keras) took 441 s on the 2-CPU machine
fecomlite is built on (shared with other work); `--tiny` (2 configurations) is for CI.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fecomlite.model.cache import MemoryHierarchy, hierarchy_for
from fecomlite.model.features import training_step
from fecomlite.model.network import ConfigError, NetworkConfig

if TYPE_CHECKING:
    from fecomlite.store import Store

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SWEEP_FORMAT = "fecomlite-sweep/1"
FRAMEWORKS = ("keras", "torch")
FC_PROGRAM = Path(__file__).with_name("fc_program.py")
REGION_SITE = "region:train"
SWEEP_KIND = "sweep"
CONFIG_KIND = "sweep-config"
MODEL_RESULT = "model"  # the fitted models, a result of the sweep run
PROCESS_DOMAIN = "cpu-process"
PROCESS_CPU_SENSOR = "util:process"  # the program's share of all CPUs, %
# one attribution method for every configuration: a training region is one long call that
# covers the sensor's intervals, which overlap attribution charges whole
SWEEP_METHOD = "overlap"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - no affinity outside Linux
        return os.cpu_count() or 1


def default_threads(cpus: int | None = None) -> int:
    """The framework threads a configuration trains with unless told: every usable CPU but one,
    at least one. The spare CPU is the measurement server's and the machine's other work's: a
    pool of one thread per CPU fights them, and its threads spin at barriers waiting for a
    descheduled sibling. On the 2-CPU machine fecomlite is built on, at load 1.4, PyTorch with 2
    threads took 0.105 s a step of a 64-wide network that takes 0.0004 s with 1."""
    return max(1, (cpus or usable_cpus()) - 1)


@dataclass(frozen=True)
class SweepGrid:
    """The cross product of these lists; configurations with the same layers are run once."""

    widths: tuple[int, ...] = (16, 64, 256, 1024)
    depths: tuple[int, ...] = (1, 3)
    shapes: tuple[str, ...] = ("rectangle", "funnel")
    batch_sizes: tuple[int, ...] = (32, 256)
    dataset_sizes: tuple[int, ...] = (8192,)
    epochs: int = 1
    inputs: int = 32
    outputs: int = 10
    optimizer: str = "adam"

    def configurations(self) -> list[NetworkConfig]:
        """Every configuration, checked (ConfigError names the one that is wrong)."""
        for name in ("widths", "depths", "shapes", "batch_sizes", "dataset_sizes"):
            if not getattr(self, name):
                raise ConfigError(f"the grid's {name} list is empty")
        seen: set[tuple[Any, ...]] = set()
        configs = []
        for width, depth, shape, batch, size in itertools.product(
            self.widths, self.depths, self.shapes, self.batch_sizes, self.dataset_sizes
        ):
            config = NetworkConfig(width, depth, shape, batch, size, self.epochs, self.inputs,
                                   self.outputs, self.optimizer)
            same = (tuple(config.layer_sizes()), batch, size)
            if same not in seen:
                seen.add(same)
                configs.append(config)
        return configs

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


DEFAULT_GRID = SweepGrid()  # 24 configurations, under 10 minutes on 2 CPUs (module docstring)
TINY_GRID = SweepGrid(widths=(8, 256), depths=(1,), shapes=("rectangle",), batch_sizes=(32,),
                      dataset_sizes=(512,))
_LISTS = {"widths": int, "depths": int, "shapes": str, "batch_sizes": int, "dataset_sizes": int}


def grid_from_mapping(data: dict[str, Any], base: SweepGrid = DEFAULT_GRID) -> SweepGrid:
    """A grid from a file's or the command line's keys (unknown keys and bad values are errors)."""
    known = {f.name for f in fields(SweepGrid)}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown grid key {key!r}; known: {', '.join(sorted(known))}")
        if name in _LISTS:
            items = value if isinstance(value, list) else [value]
            changes[name] = tuple(_item(name, v, _LISTS[name]) for v in items)
        else:
            default = getattr(base, name)
            changes[name] = _item(name, value, type(default))
    grid = replace(base, **changes)
    grid.configurations()  # check every configuration now, before anything runs
    return grid


def _item(name: str, value: Any, kind: type) -> Any:
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise ConfigError(f"grid {name}: {value!r} is not a whole number")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"grid {name}: {value!r} is not a name")
    return value.strip() if isinstance(value, str) else value


def load_grid(path: Path, base: SweepGrid = DEFAULT_GRID) -> SweepGrid:
    """A grid from a TOML or JSON file whose top-level keys are SweepGrid's fields."""
    return grid_from_mapping(read_grid_file(path), base)


def read_grid_file(path: Path) -> dict[str, Any]:
    """A TOML or JSON grid file's keys, unchecked (ConfigError: unreadable or not a table)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read grid file {path}: {exc}") from exc
    try:
        if Path(path).suffix == ".json":
            data = json.loads(raw)
        else:
            data = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not a valid grid file: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a grid file holds a table of lists, not {type(data).__name__}")
    return data


def parse_list(text: str) -> list[str]:
    """A command-line list: "16,64,256" (spaces allowed)."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise ConfigError(f"{text!r} is not a comma-separated list")
    return items


# -- rows -------------------------------------------------------------------------------------


def feature_columns(config: NetworkConfig, hierarchy: MemoryHierarchy) -> dict[str, Any]:
    """A configuration's columns that need no measurement."""
    step = training_step(config.layers(), hierarchy, config.optimizer)
    row: dict[str, Any] = {
        "key": config.key, **config.to_json(),
        "hidden_widths": "/".join(str(w) for w in config.hidden_widths()),
        "params": step.params, "steps": config.steps, "flops_per_step": step.flops,
        "weight_bytes": step.weight_bytes, "activation_bytes_per_step": step.activation_bytes,
        "bytes_per_step": step.bytes_moved,
        **{f"bytes_per_step_{lv}": b for lv, b in step.bytes_by_level.items()},
        "max_working_set_bytes": step.max_working_set,
        "working_set_level": hierarchy.level_of(step.max_working_set),
    }
    return row


def measured_columns(
    store: Store, run_id: int, method: str = SWEEP_METHOD
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(columns, domains) of a finished configuration run: the training region's time and
    energy per domain (mean and σ over repetitions), and each domain's provenance and model;
    the region's CPU seconds (`cpu_s`, `reps_cpu_s`) where the program's CPU share was sampled.

    Every configuration of a sweep is attributed with the same `method` (named in the column
    `attribution_method`): `auto` may pick intensity for one configuration and overlap for the
    next, and energies of the two are not comparable. An energy not above its uncertainty
    (2σ: attribution and repetitions) is not a number: `energy_J_<d>` is empty and
    `energy_J_<d>_below` holds the bound it is below. `power_W_<d>` (energy ÷ time) is checked
    against the mean of the domain's own samples over the region (`sampled_W_<d>`, above idle):
    `power_check_<d>` is "ok" or says by how much they differ.

    Where CPU power is estimated the run also has the domain `cpu-process` (the server's
    est:cpu-process sensor, model process-cpu-share): machine-wide utilisation counts every
    process of a shared machine, the program's own CPU time only its own work. It is above idle
    by construction and never summed with cpu-package.
    """
    from fecomlite.analysis.run_analysis import ADDITIVE_DOMAINS, analyse_run

    analysis = analyse_run(store, run_id, method, compare_levels=False)
    spans = store.site_spans(run_id, REGION_SITE)
    site = next((s for s in analysis.sites if s["key"] == REGION_SITE), None)
    if site is None or not spans:
        return {"status": "no training region measured"}, {}
    sensors = {s["name"]: s for s in store.sensors(run_id)}
    columns = _time_columns(store, run_id, analysis, spans, sensors, method)
    domains: dict[str, Any] = {}
    raw: dict[str, tuple[float, float]] = {}
    for info in analysis.domains:
        d = info["domain"]
        energy = site["energy"].get(d)
        found = None if energy is None else _domain_columns(
            store, info, energy, sensors.get(info["sensor"]), spans, columns["time_s"])
        if found is None:
            continue
        domain_columns, raw[d] = found
        columns.update(domain_columns)
        domains[d] = {
            "provenance": info["provenance"], "model": info["model"], "sensor": info["sensor"],
            "additive": d in ADDITIVE_DOMAINS or d.startswith("gpu:"),
        }
    additive = [d for d, meta in domains.items() if meta["additive"]]
    if additive:
        columns.update(_energy_columns(
            "all", sum(raw[d][0] for d in additive),
            math.sqrt(sum(raw[d][1] ** 2 for d in additive))))
    else:
        columns["energy_J_all"] = None
    columns["provenance"] = "; ".join(
        f"{d}: {m['provenance']}" + (f" ({m['model']})" if m["model"] else "")
        for d, m in sorted(domains.items())
    )
    return columns, domains


def _time_columns(
    store: Store, run_id: int, analysis: Any, spans: Sequence[tuple[int, int]],
    sensors: dict[str, dict[str, Any]], method: str,
) -> dict[str, Any]:
    """The region's time over the repetitions, its CPU seconds where the program's CPU share
    resolved them, what load did to each repetition, and the method each domain was
    attributed with."""
    durations = [(b - a) / 1e9 for a, b in spans]
    columns: dict[str, Any] = {
        "repetitions": len(spans), "time_s": _mean(durations), "time_s_std": _std(durations),
        "reps_time_s": durations, "attribution_method": method,
    }
    cpu = _region_cpu_s(store, sensors.get(PROCESS_CPU_SENSOR), spans,
                        _cpus(store.run(run_id).get("machine") or {}))
    if cpu:
        columns.update({"cpu_s": _mean(cpu), "cpu_s_std": _std(cpu), "reps_cpu_s": cpu})
    waits = [r["wait_per_cpu_s"] for r in analysis.load.get("contention", {}).get("per_rep", [])]
    if len(waits) == len(spans) and all(math.isfinite(w) for w in waits):
        columns["reps_wait_per_cpu_s"] = waits  # what load did to each repetition
    used = sorted({info["method"] for info in analysis.domains if info.get("method")})
    if used and used != [method]:
        columns["attribution_method"] = f"{method} (fell back to {'+'.join(used)})"
    return columns


def _domain_columns(
    store: Store, info: dict[str, Any], energy: dict[str, Any], sensor: dict[str, Any] | None,
    spans: Sequence[tuple[int, int]], time_s: float,
) -> tuple[dict[str, Any], tuple[float, float]] | None:
    """One domain's columns of the region (energy or the bound it is below, σ, each
    repetition's, idle power, the power check) and its (mean, σ); None without an estimate."""
    from fecomlite.analysis.run_analysis import finite_or_zero

    d = info["domain"]
    # the raw estimates: their spread is the noise, and a bound is drawn from them below
    per_rep = [e for e in energy["raw_per_rep_J"] if e is not None and math.isfinite(e)]
    mean, spread = _mean(per_rep), _std(per_rep) or 0.0
    if mean is None:
        return None
    readings = _region_readings(store, sensor, spans) if sensor else []
    # the readings' own scatter over the region: what a flat idle baseline does not know of
    scatter = (_std(readings) or 0.0) / math.sqrt(len(readings)) * time_s if readings else 0.0
    sigma = math.sqrt(finite_or_zero(energy.get("uncertainty_J")) ** 2 + scatter**2
                      + spread**2 / len(per_rep))
    columns = _energy_columns(d, mean, sigma)
    if columns[f"energy_J_{d}"] is not None and len(per_rep) == len(spans) and min(
            per_rep) > 0:  # each repetition a row of the fit (`fit.repetition_rows`)
        columns[f"reps_energy_J_{d}"] = per_rep
    columns[f"energy_J_{d}_std"] = _std(per_rep)
    columns[f"idle_W_{d}"] = info["idle_W"]
    if columns[f"energy_J_{d}"] is None:
        columns[f"power_check_{d}"] = "energy below resolution"
    elif sensor is not None and time_s:
        columns.update(_power_check(readings, finite_or_zero(sensor.get("period_s")), d,
                                    mean / time_s, sigma / time_s, info["idle_W"], time_s))
    return columns, (mean, sigma)


def _cpus(machine: dict[str, Any]) -> int | None:
    cpus = machine.get("cpu_affinity") or machine.get("cpu_logical")
    return int(cpus) if cpus else None


def _region_cpu_s(
    store: Store, sensor: dict[str, Any] | None, spans: Sequence[tuple[int, int]],
    cpus: int | None,
) -> list[float]:
    """Each repetition's CPU seconds in the training region: the program's share of all CPUs
    (`util:process`, %) over the region × CPUs × seconds; empty where a span is not resolved by
    the sensor (under two readings, or none above 0: the kernel counts CPU time in 10 ms ticks,
    and a region shorter than its windows reads 0 though the program worked)."""
    if sensor is None or not cpus:
        return []
    out = []
    for start, end in spans:
        shares = [float(v) for _, v in store.samples(sensor["id"], start, end, after_start=True)]
        if len(shares) < 2 or max(shares) <= 0:
            return []
        out.append(sum(shares) / len(shares) / 100 * cpus * (end - start) / 1e9)
    return out


def _energy_columns(domain: str, mean: float, sigma: float) -> dict[str, Any]:
    """The energy, or (not above 2σ, never negative) empty with the bound it is below."""
    if mean > 2 * sigma and mean > 0:
        return {f"energy_J_{domain}": mean, f"energy_J_{domain}_sigma": sigma}
    return {f"energy_J_{domain}": None, f"energy_J_{domain}_sigma": sigma,
            f"energy_J_{domain}_below": max(2 * sigma, abs(mean))}


def _region_readings(
    store: Store, sensor: dict[str, Any], spans: Sequence[tuple[int, int]]
) -> list[float]:
    """The sensor's power readings inside the region's spans (a counter's are differenced)."""
    values: list[float] = []
    for start, end in spans:
        rows = store.samples(sensor["id"], start, end, after_start=True)
        if sensor["kind"] == "power":
            values += [float(v) for _, v in rows]
        elif len(rows) >= 2:
            values += [(b[1] - a[1]) / ((b[0] - a[0]) / 1e9)
                       for a, b in itertools.pairwise(rows) if b[0] > a[0]]
    return values


def _power_check(
    readings: Sequence[float], period_s: float, domain: str, implied_W: float, sigma_W: float,
    idle_W: float, region_s: float,
) -> dict[str, Any]:
    """The implied mean power (energy ÷ time) against the mean of the readings inside the
    region, both above idle; a region under two sensor periods is not resolved."""
    from fecomlite.analysis.run_analysis import (
        finite_or_zero,  # loaded with the analysis, not at import
    )

    out: dict[str, Any] = {f"power_W_{domain}": implied_W}
    if not readings:
        out[f"power_check_{domain}"] = "no samples inside the region"
        return out
    sampled = sum(readings) / len(readings) - finite_or_zero(idle_W)
    out[f"sampled_W_{domain}"] = sampled
    if region_s < 2 * period_s:
        out[f"power_check_{domain}"] = (
            f"not resolved: the region ({region_s:.3g} s) is under two sensor periods "
            f"({period_s:.3g} s)")
        return out
    # a reading's interval straddles each end of the region: allow that much, 2σ and 10 %
    slack = 2 * sigma_W + (0.1 + period_s / region_s) * abs(sampled)
    if abs(implied_W - sampled) <= slack:
        out[f"power_check_{domain}"] = "ok"
    else:
        out[f"power_check_{domain}"] = (
            f"implied {implied_W:.3g} W against {sampled:.3g} W in the samples")
    return out



def default_domain(domains: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The energy a fit uses unless told otherwise, and why, in words."""
    additive = [m for m in domains.values() if m.get("additive")]
    if additive and all(m["provenance"] == "measured" for m in additive):
        return "all", "every energy domain is measured"
    if PROCESS_DOMAIN in domains:
        return PROCESS_DOMAIN, ("CPU power is estimated here from machine-wide utilisation, "
                                "which other processes disturb; the program's own CPU time is not")
    return "all", "the sum of the run's energy domains"


CPU_TIME = ("the training's CPU seconds: the energy of cpu-process is made from them, and load "
            "stretches a repetition's wall time, not its CPU time")


def on_cpu_time(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The rows with the training's CPU seconds as their time (`wall_time_s` keeps the wall
    time), for an energy made from CPU time; None where a row has none (sweeps from before, or a
    region too short for the CPU share to resolve)."""
    if not rows or any(r.get("cpu_s") is None or r["cpu_s"] <= 0 for r in rows):
        return None
    out = []
    for row in rows:
        swapped = {**row, "wall_time_s": row["time_s"], "time_s": row["cpu_s"]}
        reps = row.get("reps_cpu_s") or []
        if reps and len(reps) == len(row.get("reps_time_s") or []):
            swapped["reps_time_s"] = reps
        else:
            swapped.pop("reps_time_s", None)
        out.append(swapped)
    return out


def model_time(row: dict[str, Any], provenance: dict[str, Any]) -> float | None:
    """A row's time as a fitted model takes it: CPU seconds for a model fitted on them."""
    value = row.get("cpu_s" if provenance.get("time") == "cpu" else "time_s")
    return None if value is None else float(value)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _std(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """One row per configuration; columns in first-seen order, empty where a row has none,
    a repetition's values separated by spaces."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: "" if v is None else " ".join(map(str, v)) if isinstance(v, list)
                          else v for k, v in row.items()} for row in rows)
    return path


def gpu_hierarchies(machine: dict[str, Any]) -> list[dict[str, Any]]:
    """The L2 breakpoints of the machine's GPUs, for the report: the sweep trains on the CPU, so
    the features use the CPU's levels, but a GPU's L2 is where its energy per FLOP would jump."""
    return [hierarchy_for(f"gpu:{int(g.get('index', i))}", machine).to_json()
            for i, g in enumerate((machine or {}).get("gpus", []))]


def load_sweep(store: Store, sweep_id: int) -> dict[str, Any]:
    """A stored sweep's table; StoreError/ConfigError say why there is none."""
    run = store.run(sweep_id)
    if run["kind"] != SWEEP_KIND:
        raise ConfigError(f"run {sweep_id} is not a sweep (its kind is {run['kind']!r})")
    table = store.result(sweep_id, "sweep")
    if table is None:
        raise ConfigError(f"sweep {sweep_id} has no table (was it interrupted at the start?)")
    return table


def latest_sweep_id(store: Store) -> int:
    ids = store.run_ids((SWEEP_KIND,))
    if not ids:
        raise ConfigError(f"no sweep in {store.path}; run `fecomlite sweep` first")
    return ids[-1]
