"""`fecomlite sweep --dry-run`, `fecomlite model fit` and `predict` on a store with a sweep table.

The sweep table here is synthetic (test_model_fit.synthetic_rows); the real sweep is run end to end
in test_sweep.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from test_model_fit import ESTIMATED, PLANTED, grid_configs, synthetic_rows
from typer.testing import CliRunner

from fecomlite.model.command import MODEL_RESULT, model_app, sweep_command
from fecomlite.model.sweep import SWEEP_FORMAT, SWEEP_KIND
from fecomlite.store import Store

cli = typer.Typer()
cli.command("sweep")(sweep_command)
cli.add_typer(model_app, name="model")
runner = CliRunner()


@pytest.fixture
def home(tmp_path):
    """A store holding one synthetic sweep (id 1) and one ordinary run (id 2)."""
    rows = synthetic_rows(np.random.default_rng(30), grid_configs())
    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = store.create_run(kind=SWEEP_KIND, status="finished")
        for i, row in enumerate(rows):
            row["run_id"] = 100 + i
        store.put_result(sweep_id, "sweep", {
            "format": SWEEP_FORMAT, "sweep_id": sweep_id, "framework": "keras",
            "hierarchy": PLANTED.to_json(), "domains": ESTIMATED, "rows": rows,
        })
        store.create_run(kind="instrumented")
    return tmp_path


def invoke(*args: str):
    return runner.invoke(cli, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def fitted(home):
    assert invoke("model", "fit", "--home", str(home)).exit_code == 0
    return home


def test_fit_prints_coefficients_comparison_and_provenance_and_stores_the_model(home, tmp_path):
    out = tmp_path / "model.json"
    done = invoke("model", "fit", "--home", str(home), "--out", str(out))
    assert done.exit_code == 0, done.output
    assert "fitted on estimated (model cpu-util-linear) energy" in done.output
    assert "ranked by out-of-sample (cross-validated) error" in " ".join(done.output.split())
    for name in ("memory_aware", "time_flops", "flops_only", "params_only"):
        assert name in done.output
    assert "effectively a time model" not in done.output  # cpu-util-linear is not time × power
    with Store(home / "store.sqlite") as store:
        saved = store.result(1, MODEL_RESULT)
    assert saved == json.loads(out.read_text())
    # per-level costs are printed as costs only where the data identify them
    identified = saved["identification"]["identified"]
    assert "pJ/FLOP" in done.output and ("pJ/byte" in done.output) == identified
    flat = " ".join(done.output.split())
    assert ("cannot tell the memory levels' costs apart" in flat) != identified
    assert saved["provenance"]["sweep_id"] == 1 and len(saved["points"]) == len(grid_configs())


def test_an_energy_proportional_to_cpu_time_is_said_to_make_a_time_model(home):
    with Store(home / "store.sqlite") as store:
        table = store.result(1, "sweep")
        table["domains"] = {"cpu-package": {"provenance": "estimated",
                                            "model": "process-cpu-share", "additive": True}}
        store.put_result(1, "sweep", table)
    done = invoke("model", "fit", "--home", str(home))
    assert done.exit_code == 0, done.output
    assert "effectively a time model" in " ".join(done.output.split())


def test_predict_from_a_configuration_with_the_stored_model(fitted):
    home = fitted
    done = invoke("model", "predict", "--width", "100", "--depth", "2", "--batch-size", "64",
                  "--dataset-size", "2048", "--home", str(home))
    assert done.exit_code == 0, done.output
    assert "predicted energy (above-idle, all)" in done.output
    assert "90 % interval" in done.output and "training time" in done.output
    assert "model fitted on estimated (model cpu-util-linear) energy (sweep_id 1" in done.output
    as_json = invoke("model", "predict", "--width", "100", "--depth", "2", "--batch-size", "64",
                     "--dataset-size", "2048", "--home", str(home), "--json")
    result = json.loads(as_json.output)
    assert result["low_J"] < result["energy_J"] < result["high_J"]
    assert result["provenance"]["label"].startswith("estimated")


def test_predict_from_a_summary_equals_the_configuration(fitted, tmp_path):
    from fecomlite.model.network import NetworkConfig, summary_of

    home = fitted
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary_of(NetworkConfig(100, 2, batch_size=64,
                                                        dataset_size=2048))))
    by_summary = invoke("model", "predict", "--summary", str(path), "--home", str(home), "--json")
    by_config = invoke("model", "predict", "--width", "100", "--depth", "2", "--batch-size", "64",
                       "--dataset-size", "2048", "--home", str(home), "--json")
    assert by_summary.exit_code == 0, by_summary.output
    assert json.loads(by_summary.output)["energy_J"] == json.loads(by_config.output)["energy_J"]


@pytest.mark.parametrize(("args", "message"), [
    (["model", "predict", "--depth", "2"], "give --width and --depth"),
    (["model", "predict", "--width", "0", "--depth", "2"], "width must be a positive integer"),
    (["model", "predict", "--width", "8", "--depth", "2", "--shape", "blob"], "unknown shape"),
    (["model", "predict", "--width", "8", "--depth", "2", "--sweep", "2"], "run 2 is not a sweep"),
    (["model", "predict", "--summary", "nowhere.json"], "cannot read summary"),
    (["model", "predict", "--width", "8", "--depth", "2", "--summary", "s.json"], "not both"),
    (["model", "fit", "--sweep", "2"], "run 2 is not a sweep (its kind is 'instrumented')"),
    (["model", "fit", "2"], "run 2 (instrumented) carries no network configuration"),
    (["model", "fit", "--domain", "gpu:0"], "no energy domain 'gpu:0'"),
    (["model", "fit", "--target", "peak"], "target is one of"),
])
def test_clear_errors(fitted, args, message):
    done = invoke(*args, "--home", str(fitted))
    assert done.exit_code == 2, done.output
    assert message in done.output.replace("\n", " ")


def test_predict_before_any_fit_says_how_to_fit(home):
    done = invoke("model", "predict", "--width", "8", "--depth", "1", "--home", str(home))
    assert done.exit_code == 2
    assert "sweep 1 has no fitted model; run `fecomlite model fit --sweep 1` first" in done.output


def test_fit_on_runs_rebuilds_their_rows(tmp_path):
    """Runs given by id: features from each run's configuration, energy from its samples, on
    the cache levels of the sweep they belong to."""
    from test_sweep import recorded_run

    from fecomlite.model.network import NetworkConfig

    with Store(tmp_path / "store.sqlite") as store:
        sweep_id = store.create_run(kind=SWEEP_KIND, status="finished")
        store.put_result(sweep_id, "sweep", {"sweep_id": sweep_id, "hierarchy": PLANTED.to_json()})
        ids = [recorded_run(store, network=NetworkConfig(w, d).to_json(), parent_id=sweep_id)
               for w in (8, 32, 128, 512) for d in (1, 2)]
    out = tmp_path / "m.json"
    done = invoke("model", "fit", *map(str, ids), "--home", str(tmp_path), "--out", str(out))
    assert done.exit_code == 0, done.output
    assert "energy domain cpu-process" in done.output
    model = json.loads(out.read_text())
    assert model["provenance"]["runs"] == ids
    assert model["provenance"]["hierarchy"] == f"the cache levels of sweep {sweep_id}"
    assert model["provenance"]["label"] == "estimated (model process-cpu-share)"
    assert model["fits"]["memory_aware"]["y"] == pytest.approx([7.0] * len(ids), rel=0.02)
    both = invoke("model", "fit", "1", "--sweep", "1", "--home", str(tmp_path))
    assert both.exit_code == 2 and "not both" in both.output


def test_no_store_is_an_error_not_a_new_store(tmp_path):
    done = invoke("model", "fit", "--home", str(tmp_path / "nothing"))
    assert done.exit_code == 2 and "no run store" in done.output
    assert not (tmp_path / "nothing" / "store.sqlite").exists()


def test_sweep_dry_run_lists_configurations_and_refuses_bad_grids(tmp_path):
    done = invoke("sweep", "--dry-run", "--widths", "8,64", "--depths", "1", "--shapes",
                  "rectangle", "--batch-sizes", "32", "--dataset-sizes", "256")
    assert done.exit_code == 0, done.output
    assert "rectangle-w8-d1-b32-n256-e1" in done.output
    assert "rectangle-w64-d1-b32-n256-e1" in done.output
    assert "cache levels: L1d" in done.output
    bad = invoke("sweep", "--dry-run", "--shapes", "pyramid")
    assert bad.exit_code == 2 and "unknown shape 'pyramid'" in bad.output
    grid = tmp_path / "g.toml"
    grid.write_text("widths = [8,")
    bad_file = invoke("sweep", "--dry-run", "--grid", str(grid))
    assert bad_file.exit_code == 2 and "not a valid grid file" in bad_file.output
    assert invoke("sweep", "--dry-run", "--framework", "jax").exit_code == 2
