"""A stored run logged to MLflow: hyperparameters as params, per-API and per-run energy, memory
and CO2e as metrics, the report (HTML, JSON, CSV) as artifacts.

Used by `fecomlite run --mlflow` (or `mlflow = true` in [tool.fecomlite]). The tracking URI is
MLflow's own: `MLFLOW_TRACKING_URI` when set, else a file store in `./mlruns` (MLflow 3 keeps
that backend in maintenance and asks for `MLFLOW_ALLOW_FILE_STORE=true`, which is then set for
this process: the default needs no database). MLflow is an
optional dependency (`pip install 'fecomlite[mlflow]'`); without it the run is kept and a note
says how to install it. Metric names follow MLflow's rules (letters, digits, `_ - . / space`):
`energy_above_idle_J/<domain>/<api>`, other characters become `_`; tags say which figures are
estimated.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from fecomlite.analysis.carbon import Intensity, from_settings
from fecomlite.store import Store

DEFAULT_URI = "mlruns"
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def tracking_uri() -> str:
    """MLflow's configured tracking URI, else a file store in ./mlruns."""
    configured = os.environ.get("MLFLOW_TRACKING_URI")
    if configured:
        return configured
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return Path(DEFAULT_URI).resolve().as_uri()


def metric_name(*parts: str) -> str:
    return "/".join(_UNSAFE.sub("_", p) for p in parts)


def figures(a: Any, intensity: Intensity | None) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) of an analysed run: run and per-API energy per domain, time, calls,
    peak RSS, CO2e; tags carry each domain's provenance and the CO2e label."""
    from fecomlite.report.co2e import run_energy_J

    metrics: dict[str, float] = {}
    tags: dict[str, str] = {"fecomlite.run": str(a.run["id"])}
    for d in a.domains:
        metrics[metric_name("run_energy_above_idle_J", d["domain"])] = d["above_idle_in_reps_J"]
        tags[f"fecomlite.provenance.{d['domain']}"] = d["provenance"]
    for row in a.apis:
        api = row["api"]
        metrics[metric_name("calls", api)] = row["calls"]
        metrics[metric_name("time_s", api)] = row["total_time_s"]
        for domain, e in row["energy"].items():
            metrics[metric_name("energy_above_idle_J", domain, api)] = e["above_idle_J"]
        peak = (row.get("memory") or {}).get("rss_peak_max_B")
        if peak is not None:
            metrics[metric_name("rss_peak_B", api)] = peak
    if intensity is not None:
        metrics["run_co2e_g"] = intensity.grams(run_energy_J(a))
        tags["fecomlite.co2e"] = intensity.label()
    clean = {
        k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)
    }
    return clean, tags


def log_run(store: Store, run_id: int, experiment: str = "fecomlite") -> str:
    """Log run `run_id` to MLflow; returns the MLflow run id."""
    import mlflow

    from fecomlite.analysis.run_analysis import analyse_run
    from fecomlite.report.build import build_report
    from fecomlite.report.render import write_report

    a = analyse_run(store, run_id)
    settings = a.run.get("settings") or {}
    intensity = from_settings(settings)
    metrics, tags = figures(a, intensity)
    params = {str(k): str(v) for k, v in (a.run.get("hyperparams") or {}).items()}
    params.update({f"fecomlite.{k}": str(v) for k, v in settings.items() if k != "params"})
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment)
    name = f"{Path(a.run.get('program') or 'program').name} (fecomlite run {run_id})"
    with mlflow.start_run(run_name=name) as active:
        mlflow.log_params(params)
        mlflow.log_metrics(metrics)
        mlflow.set_tags(tags)
        with tempfile.TemporaryDirectory() as folder:
            report = build_report(store, run_id, analysis=a, intensity=intensity)
            write_report(report, Path(folder), ["html", "json", "csv"])
            mlflow.log_artifacts(folder, artifact_path="fecomlite-report")
        return active.info.run_id
