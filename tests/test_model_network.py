"""Network configurations and model summaries: shapes, checks, and the same features either way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fecomlite.model.cache import CacheLevel, MemoryHierarchy
from fecomlite.model.features import training_step
from fecomlite.model.network import (
    ConfigError,
    NetworkConfig,
    layers_from_summary,
    read_summary,
    summary_of,
    training_of,
)
from fecomlite.model.sweep import FC_PROGRAM

H = MemoryHierarchy(
    "cpu", (CacheLevel("L1d", 32 << 10), CacheLevel("L2", 1 << 20), CacheLevel("DRAM", None)), "t"
)


@pytest.mark.parametrize(("shape", "widths"), [
    ("rectangle", [64, 64, 64, 64]),
    ("funnel", [64, 50, 37, 24]),  # 64 − 54·i/4, rounded
    ("exponential", [64, 32, 16, 8]),
    ("wide_first", [64, 32, 32, 32]),
])
def test_shapes(shape, widths):
    config = NetworkConfig(64, 4, shape, outputs=10)
    assert config.hidden_widths() == widths
    assert config.layer_sizes() == [32, *widths, 10]
    assert len(config.layers()) == 5


def test_steps_are_full_batches_only():
    config = NetworkConfig(16, 1, batch_size=100, dataset_size=1050, epochs=3)
    assert (config.steps_per_epoch, config.steps) == (10, 30)
    assert config.key == "rectangle-w16-d1-b100-n1050-e3"


@pytest.mark.parametrize(("fields", "message"), [
    ({"width": 0, "depth": 1}, "width must be a positive integer"),
    ({"width": 8, "depth": -2}, "depth must be a positive integer"),
    ({"width": 8, "depth": True}, "depth must be a positive integer"),
    ({"width": 8.5, "depth": 1}, "width must be a positive integer"),
    ({"width": 8, "depth": 1, "shape": "pyramid"}, "unknown shape 'pyramid'; known: rectangle"),
    ({"width": 8, "depth": 1, "optimizer": "lion"}, "unknown optimizer 'lion'"),
    ({"width": 8, "depth": 1, "batch_size": 64, "dataset_size": 10}, "smaller than batch size"),
    ({"width": 8, "depth": 1, "colour": "red"}, "unknown configuration keys: colour"),
    ({"width": 8}, "incomplete configuration"),
])
def test_bad_configurations_are_refused_with_the_reason(fields, message):
    with pytest.raises(ConfigError, match=message):
        NetworkConfig.from_json(fields)


def test_json_round_trip():
    config = NetworkConfig(32, 2, "funnel", 64, 2048, 2, 10, 3, "sgd")
    assert NetworkConfig.from_json(json.loads(json.dumps(config.to_json()))) == config


def test_a_summary_describes_the_same_training_step_as_its_configuration():
    config = NetworkConfig(128, 3, "funnel", batch_size=64, dataset_size=1024, epochs=2)
    summary = summary_of(config)
    training = training_of(summary)
    assert (training.batch_size, training.steps, training.optimizer) == (64, 32, "adam")
    from_summary = training_step(layers_from_summary(summary, training.batch_size), H)
    assert from_summary == training_step(config.layers(), H)


def test_summary_options_override_and_missing_values_are_named():
    summary = summary_of(NetworkConfig(8, 1))
    assert training_of(summary, batch_size=16, epochs=None).batch_size == 16
    del summary["dataset_size"]
    with pytest.raises(ConfigError, match="does not say dataset_size"):
        training_of(summary)
    assert training_of(summary, dataset_size=64).steps == 2


def test_summary_layers_other_than_dense():
    summary = {"format": "fecomlite-summary/1", "layers": [
        {"type": "Embedding", "input_shape": [20], "output_shape": [20, 16], "input_dim": 500},
        {"type": "Dropout", "input_shape": [20, 16], "output_shape": [20, 16]},
        {"type": "Conv2D", "input_shape": [8, 8, 3], "output_shape": [8, 8, 4],
         "kernel_size": [3, 3], "strides": [1, 1], "padding": "same"},
        {"type": "LSTM", "input_shape": [20, 16], "output_shape": [32]},
    ]}
    emb, drop, conv, lstm = layers_from_summary(summary, 2)
    assert emb.known and emb.params == 500 * 16 and emb.output_bytes == 2 * 20 * 16 * 4
    assert drop.known and drop.flops == 0 and "not counted" in drop.note
    assert conv.flops == 2 * (2 * 8 * 8 * 4) * 3 * 9 + 2 * 8 * 8 * 4
    assert not lstm.known and "no FLOP model for LSTM" in lstm.note


def test_incomplete_layers_and_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"layer 0 \(Dense\): incomplete"):
        layers_from_summary({"layers": [{"type": "Dense", "input_shape": [4]}]}, 2)
    with pytest.raises(ConfigError, match="positive integer"):
        layers_from_summary(
            {"layers": [{"type": "Dense", "input_shape": [4], "output_shape": [0]}]}, 2)
    path = tmp_path / "s.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        read_summary(path)
    path.write_text(json.dumps({"layers": []}))
    with pytest.raises(ConfigError, match="not a fecomlite-summary/1 summary"):
        read_summary(path)
    path.write_text(json.dumps({"format": "fecomlite-summary/1", "layers": []}))
    with pytest.raises(ConfigError, match="non-empty list of layers"):
        read_summary(path)
    with pytest.raises(ConfigError, match="cannot read summary"):
        read_summary(tmp_path / "missing.json")


@pytest.mark.slow
def test_the_keras_models_summary_matches_the_configuration(tmp_path):
    """fc_program writes the summary from the real Keras model: the same layers and parameters
    as the configuration says, hence the same features."""
    config = NetworkConfig(48, 3, "funnel", batch_size=16, dataset_size=256)
    out = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, str(FC_PROGRAM), "--config", json.dumps(config.to_json()),
         "--summary", str(out)], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = read_summary(out)
    expected = summary_of(config)
    assert [(lay["type"], lay["input_shape"], lay["output_shape"], lay["params"])
            for lay in summary["layers"]] == [
        (lay["type"], lay["input_shape"], lay["output_shape"], lay["params"])
        for lay in expected["layers"]]
    assert training_step(layers_from_summary(summary, 16), H) == training_step(config.layers(), H)
