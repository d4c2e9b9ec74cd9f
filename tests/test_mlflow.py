"""MLflow round trip: a stored run logged into a local file store, read back with MLflow's own
client (skipped where MLflow is not installed: `pip install 'fecomlite[mlflow]'`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from report_helpers import build_run

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.runner.mlflow_log import log_run, metric_name
from fecomlite.store import Store

mlflow = pytest.importorskip("mlflow")


def test_params_metrics_tags_and_report_come_back(tmp_path, monkeypatch):
    """No tracking URI configured: a file store in ./mlruns, as the docs promise."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    uri = (tmp_path / "mlruns").as_uri()
    with Store(tmp_path / "store.sqlite") as store:
        run_id = build_run(store)
        store.update_run(
            run_id,
            hyperparams={"learning_rate": "0.01", "batch_size": "64"},
            settings={**store.run(run_id)["settings"], "carbon_intensity": 200.0},
        )
        mlflow_id = log_run(store, run_id)
        a = analyse_run(store, run_id)
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    got = client.get_run(mlflow_id)
    assert got.data.params["learning_rate"] == "0.01" and got.data.params["batch_size"] == "64"
    assert got.data.params["fecomlite.carbon_intensity"] == "200.0"
    for row in a.apis:
        assert got.data.metrics[metric_name("calls", row["api"])] == row["calls"]
        for domain, e in row["energy"].items():
            key = metric_name("energy_above_idle_J", domain, row["api"])
            assert got.data.metrics[key] == pytest.approx(e["above_idle_J"])
    assert got.data.metrics["run_co2e_g"] > 0
    for d in a.domains:
        assert got.data.tags[f"fecomlite.provenance.{d['domain']}"] == d["provenance"]
    assert "estimated at 200 gCO2e/kWh" in got.data.tags["fecomlite.co2e"]
    names = {Path(f.path).name for f in client.list_artifacts(mlflow_id, "fecomlite-report")}
    assert {"index.html", "report.json", "apis.csv", "sites.csv"} <= names
    local = client.download_artifacts(mlflow_id, "fecomlite-report/report.json", str(tmp_path))
    report = json.loads(Path(local).read_text())
    assert report["run"]["id"] == run_id and report["co2e"]["g_per_kwh"] == 200.0


def test_a_configured_tracking_uri_is_used(tmp_path, monkeypatch):
    uri = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.chdir(tmp_path)
    with Store(tmp_path / "store.sqlite") as store:
        mlflow_id = log_run(store, build_run(store, reps=1))
    assert mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(mlflow_id).info.run_id
    assert not (tmp_path / "mlruns").exists()


def test_metric_names_follow_mlflows_rules():
    assert metric_name("energy_above_idle_J", "gpu:0", "torch.matmul().sum") == (
        "energy_above_idle_J/gpu_0/torch.matmul__.sum"
    )
