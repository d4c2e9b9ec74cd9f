"""The report's "Energy model" section: the fitted model of a sweep, and what it predicts for a run.

A sweep's report shows the model `fecomlite model fit --sweep ID` stored on it (result "model"):
coefficients with standard errors, R² and cross-validated error beside the naive models', energy
per FLOP against working-set size with the cache breakpoints, and measured against fitted energy.
Any other run's report uses the latest fitted model in the same store (a configuration run's own
sweep's first) and shows measured against predicted only where the features are known: a
configuration run knows its network, so its training region can be predicted; a framework call is
predicted per call from the shapes the probe recorded at its sites (result "shapes"), and an API
without recorded shapes is listed as not predictable rather than given an invented figure.
Predictions are always `estimated`, with the model named.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from fecomlite.analysis import units
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.model.cache import MemoryHierarchy
from fecomlite.model.features import FeatureError, api_kind, training_step
from fecomlite.model.fit import (
    TIME_MODEL_NOTE,
    EnergyModels,
    FitError,
    LinearFit,
    target_energy,
)
from fecomlite.model.identify import sentence
from fecomlite.model.network import ConfigError, NetworkConfig
from fecomlite.model.predict import predict, predict_call
from fecomlite.model.recorded_shapes import features_from_shapes
from fecomlite.model.sweep import (
    CONFIG_KIND,
    MODEL_RESULT,
    REGION_SITE,
    SWEEP_KIND,
    measured_columns,
    model_time,
)
from fecomlite.report.first_use import shape_variants
from fecomlite.report.palette import SERIES_COLORS
from fecomlite.store import Store

MODEL_NAME = "memory-aware energy model"
CONFIDENCE = 0.9
NO_SHAPES = "no shapes recorded: prediction needs layer shapes"
# feature -> (unit shown, factor from the fit's J per feature unit)
_UNITS = {"flops": ("pJ/FLOP", 1e12), "time_s": ("W", 1.0),
          "params_steps": ("pJ/(param·step)", 1e12)}
_BYTES_UNIT = ("pJ/byte", 1e12)


@dataclass
class ModelSection:
    """The template's `model` context and the charts it draws (keys of the page's charts)."""

    context: dict[str, Any]
    charts: dict[str, Any]


def model_section(store: Store, analysis: RunAnalysis) -> ModelSection | None:
    """The section for this run, or None when there is nothing true to show."""
    run = analysis.run
    if run.get("kind") == SWEEP_KIND:
        return sweep_section(store, int(run["id"]))
    return run_section(store, analysis)


# -- a sweep's own model ------------------------------------------------------------------------


def sweep_section(store: Store, sweep_id: int) -> ModelSection:
    """The fitted model of sweep `sweep_id`, or a note saying how to fit one."""
    data = store.result(sweep_id, MODEL_RESULT)
    table = store.result(sweep_id, "sweep") or {}
    configurations = configuration_rows(table)
    if data is None:
        return ModelSection({"kind": "unfitted", "sweep_id": sweep_id,
                             "configurations": configurations}, {})
    models = EnergyModels.from_json(data)
    fit, identified = shown_fit(models)
    context = {
        "kind": "sweep", "sweep_id": sweep_id, **_about(models),
        "configurations": configurations,
        "shown_model": fit.name, "identified": identified,
        "identification_note": "" if identified else sentence(_check(models)),
        "coefficients": coefficient_rows(fit),
        "comparison": [
            {"model": c["model"], "r2": _fixed(c["r2"]), "cv": _percent(c["cv_rel_rmse"]),
             "n": c["n"], "features": ", ".join(c["features"]), "rank": c["rank"]}
            for c in models.comparison()
        ],
        "best": models.best_name,
        "time_model": models.time_model, "left_out": models.left_out,
        "time_models": [
            {"form": t["form"], "terms": t["terms"],
             "cv": _percent(t["cv_rel_rmse"]) if math.isfinite(t["cv_rel_rmse"])
             else "– (no fold could fit its terms)",
             "r2": _fixed(t["r2"]), "chosen": t["chosen"]}
            for t in sorted(models.time_models, key=lambda t: (
                not t["chosen"], t["cv_rel_rmse"] if math.isfinite(t["cv_rel_rmse"]) else math.inf))
        ],
        "r2": _fixed(fit.r2), "cv": _percent(fit.cv_rel_rmse), "folds": fit.cv_folds,
        "sigma": _percent(fit.sigma) if fit.weighting == "relative" else _g(fit.sigma),
        "sigma_within": "" if not fit.groups else _percent(fit.sigma_within)
        if fit.weighting == "relative" else _g(fit.sigma_within),
        "sigma_between": _percent(fit.sigma_between) if fit.weighting == "relative"
        else _g(fit.sigma_between),
        "breakpoints": [{"level": b["level"], "size": units.scaled(b["size_bytes"], "B")}
                        for b in data.get("breakpoints", [])],
    }
    charts = {
        "model-per-flop": per_flop_chart(models, data.get("breakpoints", []),
                                         table.get("rows", []) if identified else []),
        "model-fit": fit_chart(models.points),
    }
    return ModelSection(context, charts)


def configuration_rows(table: dict[str, Any]) -> dict[str, Any]:
    """The sweep's configurations as its table holds them: each one's run, training time and
    energy above idle per domain (per repetition; "< x" below resolution), with each domain's
    provenance."""
    domains = table.get("domains") or {}
    rows = []
    for r in table.get("rows") or []:
        energy = []
        for d in sorted(domains):
            value, below = r.get(f"energy_J_{d}"), r.get(f"energy_J_{d}_below")
            energy.append(units.scaled(value, "J") if value is not None else (
                f"< {units.scaled(below, 'J')}" if below is not None else "–"))
        rows.append({"key": r.get("key", "?"), "run": r.get("run_id"),
                     "time": units.scaled(r.get("time_s"), "s"), "energy": energy})
    heads = [{"domain": d, "provenance": m.get("provenance"), "model": m.get("model")}
             for d, m in sorted(domains.items())]
    return {"rows": rows, "domains": heads}


def _check(models: EnergyModels) -> dict[str, Any]:
    """The model's identification check; a model saved before there was one: not checked."""
    return models.identification or {
        "identified": False,
        "reasons": ["it was fitted before fecomlite checked this (fit it again with "
                    "`fecomlite model fit`)"]}


def shown_fit(models: EnergyModels) -> tuple[LinearFit, bool]:
    """(the fit whose coefficients are shown, whether the per-level costs are identified): the
    memory-aware fit where the data identify its per-level costs, else the time/FLOP model
    (a model saved before it existed: the memory-aware fit without its per-level rows)."""
    if _check(models).get("identified"):
        return models.memory_aware, True
    time_flops = models.fits.get("time_flops")
    if time_flops is not None:
        return time_flops, False
    memory = models.memory_aware
    keep = [i for i, f in enumerate(memory.features) if not f.startswith("bytes_")]
    trimmed = LinearFit.from_json({
        **memory.to_json(), "features": [memory.features[i] for i in keep],
        "coef": memory.coef[keep].tolist(), "cov": memory.cov[np.ix_(keep, keep)].tolist(),
        "dropped": []})
    return trimmed, False


def coefficient_rows(fit: LinearFit) -> list[dict[str, str]]:
    """Each coefficient with its standard error, in a readable unit; dropped features named."""
    rows = []
    for i, feature in enumerate(fit.features):
        unit, factor = _UNITS.get(feature, _BYTES_UNIT)
        rows.append({"feature": feature, "coef": _g(fit.coef[i] * factor),
                     "se": _g(fit.std_errors[i] * factor), "unit": unit,
                     "coef_raw": float(fit.coef[i]), "se_raw": float(fit.std_errors[i])})
    for feature in fit.dropped:
        rows.append({"feature": feature, "coef": "–", "se": "–",
                     "unit": "no configuration reached this level",
                     "coef_raw": None, "se_raw": None})
    for feature in fit.omitted:
        rows.append({"feature": feature, "coef": "–", "se": "–",
                     "unit": "left out: too few configurations, a multiple of another "
                     "term's column, or a smaller model predicts held-out ones better",
                     "coef_raw": None, "se_raw": None})
    return rows


def per_flop_chart(
    models: EnergyModels, breakpoints: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """pJ/FLOP against the largest layer working set (log x): measured and fitted per
    configuration, the model's step curve, and a vertical line at each cache size."""
    measured = [[p["max_working_set"], p["pj_per_flop"]] for p in models.points
                if p.get("pj_per_flop") and p["max_working_set"] > 0]
    fitted = [[p["max_working_set"], p["fitted_J"] / p["flops"] * 1e12] for p in models.points
              if p.get("flops") and p["max_working_set"] > 0 and p["fitted_J"] > 0]
    series = [  # measured last, drawn on top of the fitted values it is compared with
        {"label": "fitted, same configuration", "color": SERIES_COLORS[1], "markers": True,
         "line": False, "points": sorted(fitted)},
        {"label": "measured", "color": SERIES_COLORS[0], "markers": True, "line": False,
         "points": sorted(measured)},
    ]
    curve = step_curve(models, breakpoints, rows, [x for x, _ in measured])
    if curve:
        series.append({"label": "model at the sweep's median bytes and time per FLOP",
                       "color": SERIES_COLORS[2], "dash": True, "points": curve})
    return {
        "type": "lines", "series": series, "xLog": True, "yLog": True, "yZero": False,
        "xUnit": "B", "yUnit": "", "xName": "working set", "yName": "pJ per FLOP",
        "xLabel": "largest layer working set (bytes, log scale)",
        "yLabel": f"pJ per FLOP ({models.provenance.get('label', '')})", "height": 300,
        "vlines": [{"x": b["size_bytes"],
                    "label": f"{b['level']} {units.scaled(b['size_bytes'], 'B')}"}
                   for b in breakpoints],
    }


def step_curve(
    models: EnergyModels, breakpoints: list[dict[str, Any]], rows: list[dict[str, Any]],
    xs: list[float],
) -> list[list[float]]:
    """The memory-aware model's pJ/FLOP as the working set crosses each level, for a network
    moving the sweep's median bytes per FLOP in the median seconds per FLOP: a step function
    whose steps are the fitted per-byte costs of the levels. Empty without the table's rows."""
    fit = models.memory_aware
    coef = dict(zip(fit.features, fit.coef.tolist(), strict=True))
    used = [r for r in rows if r.get("flops_per_step") and model_time(r, models.provenance)]
    if not used or not xs:
        return []
    bytes_per_flop = statistics.median(r["bytes_per_step"] / r["flops_per_step"] for r in used)
    time_per_flop = statistics.median(
        model_time(r, models.provenance) / (r["flops_per_step"] * r["steps"]) for r in used)
    base = coef.get("flops", 0.0) + coef.get("time_s", 0.0) * time_per_flop
    edges = [float(b["size_bytes"]) for b in breakpoints]  # smallest first, as the levels
    bounds = [min([*xs, *edges]) / 2, *edges, max([*xs, *edges]) * 2]
    points: list[list[float]] = []
    for level, a, b in zip(models.levels, bounds, bounds[1:], strict=False):
        per_byte = coef.get(f"bytes_{level}")
        value = (base + per_byte * bytes_per_flop) * 1e12 if per_byte is not None else None
        if value is not None and value > 0:
            points += [[a, value], [b, value]]
    return points


def fit_chart(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Measured against fitted energy per configuration (log-log), with the line y = x."""
    pairs = [[p["measured_J"], p["fitted_J"]] for p in points
             if p["measured_J"] > 0 and p["fitted_J"] > 0]
    series = [{"label": "configurations", "color": SERIES_COLORS[0], "markers": True,
               "line": False, "points": sorted(pairs)}]
    if pairs:
        lo = min(min(p) for p in pairs)
        hi = max(max(p) for p in pairs)
        series.append({"label": "y = x (a perfect fit)", "color": SERIES_COLORS[3], "dash": True,
                       "points": [[lo, lo], [hi, hi]]})
    return {"type": "lines", "series": series, "xLog": True, "yLog": True, "yZero": False,
            "xUnit": "J", "yUnit": "J", "xName": "measured", "yName": "fitted",
            "xLabel": "measured energy", "yLabel": "fitted energy", "height": 300}


# -- an ordinary run: measured against predicted -----------------------------------------------


def latest_model(store: Store, prefer: int | None = None) -> tuple[int, EnergyModels] | None:
    """(sweep id, models) of sweep `prefer` if it has a fitted model, else of the latest one."""
    ids = store.run_ids((SWEEP_KIND,), newest_first=True)
    if prefer in ids:
        ids.remove(prefer)
        ids.insert(0, prefer)
    for sweep_id in ids:
        data = store.result(sweep_id, MODEL_RESULT)
        if data is not None:
            return sweep_id, EnergyModels.from_json(data)
    return None


def run_section(store: Store, analysis: RunAnalysis) -> ModelSection | None:
    """Measured against predicted for what the model can truly predict in this run."""
    run = analysis.run
    found = latest_model(store, run.get("parent_id"))
    if found is None:
        return None
    sweep_id, models = found
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    if run.get("kind") == CONFIG_KIND and (run.get("settings") or {}).get("network"):
        row, note = training_row(store, run, models, sweep_id)
        rows += [row] if row else []
        notes += [note] if note else []
    shapes = store.result(int(run["id"]), "shapes") or {}
    api_rows: list[dict[str, Any]] = []
    unpredictable: list[dict[str, Any]] = []
    for api in analysis.apis:
        if api_kind(api["api"]) is None:
            continue
        row, why = api_row(api, analysis.sites, shapes, models)
        if row is not None:
            api_rows.append(row)
        else:
            unpredictable.append({"api": api["api"], "kind": api_kind(api["api"]),
                                  "calls": api.get("calls"), "why": why})
    if not rows and not api_rows and not unpredictable and not notes:
        return None
    context = {"kind": "run", "sweep_id": sweep_id, **_about(models), "rows": rows,
               "api_rows": api_rows, "unpredictable": unpredictable, "notes": notes,
               "run_provenance": _run_provenance(analysis, models),
               "confidence": units.percent(CONFIDENCE)}
    return ModelSection(context, {})


def api_row(
    api: dict[str, Any], sites: list[dict[str, Any]], shapes: dict[str, list[dict[str, Any]]],
    models: EnergyModels,
) -> tuple[dict[str, Any] | None, str]:
    """(row, "") measured against predicted energy per call of one API, or (None, why not).

    Each site with recorded shapes is priced at its own mean call time; the API's prediction is
    the call-weighted mean over those sites (its bounds too: the model's parameter error is
    shared by every site). A site whose shapes varied is priced at the mean over its variants."""
    mine = [s for s in sites if s.get("api") == api["api"] and s.get("calls")]
    shaped = [s for s in mine if shapes.get(s.get("key"))]
    if not shaped:
        return None, NO_SHAPES
    measured = _per_call_energy(api, models)
    if measured is None:
        return None, f"this run has no {models.domain} energy to compare with the model"
    hierarchy = MemoryHierarchy.from_json(models.hierarchy)
    sums = [0.0, 0.0, 0.0]
    calls = 0
    notes: list[str] = []
    for site in shaped:
        variants = shape_variants(shapes[site["key"]])
        try:
            priced = [predict_call(models, features_from_shapes(api["api"], v), hierarchy,
                                   float(site["mean_time_s"]), CONFIDENCE) for v in variants]
        except (FeatureError, FitError) as exc:
            return None, f"{site['key']}: {exc}"
        if len(variants) > 1:
            notes.append(f"{site['key']}: {len(variants)} different shapes seen; their "
                         "predictions are averaged (calls per shape are not recorded)")
        for i in range(3):
            sums[i] += site["calls"] * statistics.fmean(p[i] for p in priced)
        calls += site["calls"]
    if calls < sum(s["calls"] for s in mine):
        notes.append(f"predicted from {calls} of {sum(s['calls'] for s in mine)} calls: "
                     "the other sites' shapes were not recorded")
    mean, low, high = (v / calls for v in sums)
    value, provenance = measured
    return {
        "what": api["api"], "calls": api.get("calls"), "sites": len(shaped),
        "measured": units.scaled(value, "J"), "measured_provenance": provenance,
        "predicted": units.scaled(mean, "J"),
        "interval": f"{units.scaled(low, 'J')} – {units.scaled(high, 'J')}",
        "ratio": units.sig3(value / mean) if mean > 0 else "–",
        "inside": low <= value <= high, "measured_J": value, "predicted_J": mean,
        "low_J": low, "high_J": high, "notes": notes,
    }, ""


def _per_call_energy(api: dict[str, Any], models: EnergyModels) -> tuple[float, str] | None:
    """(mean energy per call over the model's domains, measured | estimated), as the model's
    target counts it (above idle, or with the idle share), None without those domains."""
    used = list(models.provenance.get("domains") or {})
    energy = api.get("energy") or {}
    if not used or not api.get("calls") or any(d not in energy for d in used):
        return None
    key = "total_J" if models.target == "total" else "above_idle_J"
    value = sum(float(energy[d][key]) for d in used) / api["calls"]
    kinds = {energy[d]["provenance"] for d in used}
    return value, "measured" if kinds == {"measured"} else "estimated"


def _run_provenance(analysis: RunAnalysis, models: EnergyModels) -> str:
    """The run's energy in the model's domains: measured, or estimated with its models named."""
    used = set(models.provenance.get("domains") or {})
    mine = [d for d in analysis.domains if d.get("domain") in used]
    if not mine:
        return "none of the model's domains"
    if all(d.get("provenance") == "measured" for d in mine):
        return "measured"
    named = sorted({str(d["model"]) for d in mine if d.get("model")})
    return "estimated" + (f" (model {', '.join(named)})" if named else "")


def training_row(
    store: Store, run: dict[str, Any], models: EnergyModels, sweep_id: int
) -> tuple[dict[str, Any] | None, str | None]:
    """(row, None) for a configuration run's training region, or (None, why it cannot be)."""
    try:
        config = NetworkConfig.from_json(run["settings"]["network"])
        hierarchy = MemoryHierarchy.from_json(models.hierarchy)
        step = training_step(config.layers(), hierarchy, config.optimizer)
    except (ConfigError, ValueError) as exc:
        return None, f"the run's network cannot be read: {exc}"
    columns, domains = measured_columns(store, int(run["id"]))
    used = list(models.provenance.get("domains") or {})
    try:
        measured = target_energy(columns, used, models.target)
        time_s = model_time(columns, models.provenance)
        if time_s is None:
            raise KeyError("time_s")
    except (KeyError, TypeError):
        return None, (f"{REGION_SITE}: this run has no {models.domain} energy "
                      f"({', '.join(used)}) to compare with the model")
    try:
        p = predict(models, step, config.steps, time_s=time_s, confidence=CONFIDENCE)
    except FitError as exc:
        return None, f"{REGION_SITE}: {exc}"
    kinds = sorted({domains[d]["provenance"] for d in used if d in domains})
    in_fit = int(run["id"]) in (models.provenance.get("runs") or [])
    return {
        "what": f"{REGION_SITE} ({config.key})", "measured": units.scaled(measured, "J"),
        "measured_provenance": "measured" if kinds == ["measured"] else "estimated",
        "predicted": units.scaled(p.energy_J, "J"),
        "interval": f"{units.scaled(p.low_J, 'J')} – {units.scaled(p.high_J, 'J')}",
        "ratio": units.sig3(measured / p.energy_J) if p.energy_J > 0 else "–",
        "inside": p.low_J <= measured <= p.high_J, "in_fit": in_fit,
        "measured_J": measured, "predicted_J": p.energy_J, "low_J": p.low_J, "high_J": p.high_J,
        "notes": p.notes,
    }, None


# -- shared -------------------------------------------------------------------------------------


def _about(models: EnergyModels) -> dict[str, Any]:
    """What the model was fitted on, and its provenance (a model's figures are `estimated`)."""
    label = str(models.provenance.get("label", "unknown"))
    return {
        "model_name": MODEL_NAME, "target": models.target, "domain": models.domain,
        "n": models.configurations,
        "rows": models.memory_aware.n, "energy_label": label,
        "load_notes": [info["text"] for info in models.load.values() if info.get("applied")],
        "energy_provenance": "measured" if label == "measured" else "estimated",
        "energy_models": ", ".join(sorted({str(d["model"]) for d in
                                           (models.provenance.get("domains") or {}).values()
                                           if d.get("model")})) or None,
        "levels": ", ".join(models.levels),
        "hierarchy_source": str(models.hierarchy.get("source", "")),
        "time_model_note": TIME_MODEL_NOTE if models.time_proportional else "",
    }


def _fixed(value: float) -> str:
    return f"{value:.3f}" if isinstance(value, float) and math.isfinite(value) else "–"


def _g(value: float) -> str:
    """Three significant digits at any magnitude (a standard error may be 1e-12 of its unit)."""
    return f"{value:.3g}" if math.isfinite(value) else "–"


def _percent(value: float | None) -> str:
    return f"{value * 100:.3g} %" if value is not None and math.isfinite(value) else "–"
