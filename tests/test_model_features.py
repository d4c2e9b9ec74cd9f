"""Features from shapes: FLOPs, parameters, bytes and working sets, checked against hand counts."""

from __future__ import annotations

import pytest

from fecomlite.model.cache import CacheLevel, MemoryHierarchy
from fecomlite.model.features import (
    OPTIMIZERS,
    ApiFeatures,
    FeatureError,
    api_features,
    conv2d,
    dense,
    embedding,
    matmul,
    run_features,
    training_step,
)

SMALL = MemoryHierarchy(
    "cpu", (CacheLevel("L1d", 1024), CacheLevel("L2", 1 << 20), CacheLevel("DRAM", None)), "test"
)


def test_dense_counts_products_bias_parameters_and_bytes():
    f = dense(4, 3, 2)
    assert f.flops == 2 * 4 * 3 * 2 + 4 * 2
    assert f.backward_flops == 2 * (2 * 4 * 3 * 2) + 4 * 2
    assert f.params == 3 * 2 + 2
    assert (f.weight_bytes, f.input_bytes, f.output_bytes) == (8 * 4, 4 * 3 * 4, 4 * 2 * 4)
    assert f.bytes_read == f.weight_bytes + f.input_bytes
    no_bias = dense(4, 3, 2, bias=False)
    assert (no_bias.flops, no_bias.params) == (48, 6)


def test_matmul_broadcasts_batch_dimensions_and_refuses_mismatches():
    f = matmul((5, 2, 3), (3, 4))
    assert f.flops == 2 * 5 * 2 * 3 * 4
    assert f.output_bytes == 5 * 2 * 4 * 4
    assert f.params == 0
    assert matmul((7, 1, 2, 3), (6, 3, 4)).flops == 2 * 7 * 6 * 2 * 3 * 4
    with pytest.raises(FeatureError, match="inner dimensions"):
        matmul((2, 3), (4, 5))
    with pytest.raises(FeatureError, match="do not broadcast"):
        matmul((2, 2, 3), (5, 3, 4))
    with pytest.raises(FeatureError, match="two matrices"):
        matmul((3,), (3, 4))


def test_conv2d_output_size_follows_padding_and_stride():
    same = conv2d(2, 8, 8, 3, 16, 3)
    assert same.output_bytes == 2 * 8 * 8 * 16 * 4
    assert same.flops == 2 * (2 * 8 * 8 * 16) * 3 * 9 + 2 * 8 * 8 * 16
    assert same.params == 9 * 3 * 16 + 16
    valid = conv2d(2, 8, 8, 3, 16, (3, 3), stride=2, padding="valid")
    assert valid.output_bytes == 2 * 3 * 3 * 16 * 4
    with pytest.raises(FeatureError, match="does not fit"):
        conv2d(1, 2, 2, 1, 1, 5, padding="valid")
    with pytest.raises(FeatureError, match="padding"):
        conv2d(1, 8, 8, 1, 1, 3, padding="full")


def test_embedding_reads_only_the_rows_it_gathers():
    few = embedding(10, 1000, 8)
    assert few.flops == 0 and few.backward_flops == 80
    assert few.params == 8000
    assert few.weight_bytes == 10 * 8 * 4
    assert embedding(5000, 1000, 8).weight_bytes == 1000 * 8 * 4


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_sizes_must_be_positive_integers(bad):
    with pytest.raises(FeatureError, match="positive integer"):
        dense(bad, 3, 2)


@pytest.mark.parametrize(("api", "kind_flops"), [
    ("keras.layers.Dense.__call__", 56.0),
    ("torch.nn.Linear.forward", 56.0),
    ("torch.nn.functional.linear", 56.0),
])
def test_api_names_map_to_their_flop_model(api, kind_flops):
    f = api_features(api, batch=4, in_features=3, out_features=2)
    assert f.known and f.api == api and f.flops == kind_flops


def test_products_and_unknown_apis():
    assert api_features("torch.bmm", a_shape=(2, 3, 4), b_shape=(2, 4, 5)).flops == 2 * 2 * 60
    unknown = api_features("tensorflow.nn.softmax", x=(3, 4))
    assert not unknown.known and unknown.flops == 0
    assert "no FLOP model for tensorflow.nn.softmax" in unknown.note
    with pytest.raises(FeatureError, match="keras.layers.Dense"):
        api_features("keras.layers.Dense", batch=4, in_features=3)  # out_features missing


def test_training_step_sums_forward_backward_and_optimiser():
    layer = dense(4, 3, 2)
    step = training_step([layer], SMALL, "adam")
    assert step.flops == layer.flops + layer.backward_flops + 12 * layer.params
    sgd = training_step([layer], SMALL, "sgd")
    assert sgd.flops == layer.flops + layer.backward_flops + 2 * layer.params
    param_bytes = layer.params * 4
    forward = layer.weight_bytes + layer.input_bytes + layer.output_bytes
    backward = layer.output_bytes + 2 * layer.weight_bytes + 2 * layer.input_bytes
    update = (4 + 3) * param_bytes  # adam: reads w, g, m, v; writes w, m, v
    assert step.bytes_moved == forward + backward + update
    assert step.weight_bytes == param_bytes and step.params == layer.params
    with pytest.raises(FeatureError, match="unknown optimizer"):
        training_step([layer], SMALL, "lion")


def test_each_layers_bytes_go_to_the_level_its_working_set_fits_in():
    tiny, mid, huge = dense(1, 4, 4), dense(32, 128, 128), dense(64, 1024, 1024)
    step = training_step([tiny, mid, huge], SMALL)
    parts = [training_step([layer], SMALL) for layer in (tiny, mid, huge)]
    assert [max(p.bytes_by_level, key=p.bytes_by_level.get) for p in parts] == [
        "L1d", "L2", "DRAM"]
    assert sum(step.bytes_by_level.values()) == pytest.approx(step.bytes_moved)
    for level in ("L1d", "L2", "DRAM"):
        assert step.bytes_by_level[level] == pytest.approx(
            sum(p.bytes_by_level[level] for p in parts))
    assert step.max_working_set == max(p.max_working_set for p in parts)


def test_unknown_calls_are_listed_not_counted():
    known = dense(4, 3, 2)
    step = training_step([known, ApiFeatures("keras.layers.LSTM", False)], SMALL)
    assert step.unknown == ("keras.layers.LSTM",)
    assert step.flops == training_step([known], SMALL).flops


def test_run_features_scale_a_step_by_the_number_of_steps():
    step = training_step([dense(8, 16, 16)], SMALL)
    values = run_features(step.flops, step.params, step.bytes_by_level, 10)
    assert values["flops"] == 10 * step.flops
    assert values["params_steps"] == 10 * step.params
    assert values["steps"] == 10
    assert sum(values[f"bytes_{lv}"] for lv in SMALL.level_names) == pytest.approx(
        10 * step.bytes_moved)
    assert set(OPTIMIZERS) == {"adam", "sgd"}
