"""Shapes on the probe's sized path: recorded once per site per resample, sent in the batch
header, merged into the run's "shapes" result, and read back as the energy model's features."""

from __future__ import annotations

import math

import numpy as np
import pytest
from stored_events import events_table
from test_probe import run_script, spooled
from test_store import make_batch

from fecomlite.model.features import conv2d, dense, embedding, matmul
from fecomlite.model.recorded_shapes import features_from_shapes
from fecomlite.runtime import batch_codec
from fecomlite.runtime.capture import call_shapes, record_shapes, shape_of
from fecomlite.runtime.sender import Sender
from fecomlite.store import MAX_SHAPE_VARIANTS, Store


def shapes_sent(tmp_path) -> list[dict]:
    headers, _ = spooled(tmp_path)
    return [h["shapes"] for h in headers if "shapes" in h]


def test_a_numpy_matmul_sends_its_shapes_once(tmp_path):
    result = run_script(tmp_path, """
        import numpy as np
        import fecomlite.runtime.probe as __fecomlite__
        a, b = np.ones((4, 8), np.float32), np.ones((8, 3), np.float64)
        for _ in range(10):
            y = __fecomlite__.call("prog.py:5:8", np.matmul, a, b)
        print(y.shape, y.sum())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["(4,", "3)", "96.0"]
    (sent,) = shapes_sent(tmp_path)  # three sized calls, one resample window: one record
    assert sent == {"prog.py:5:8": {
        "args": [{"shape": [4, 8], "dtype": "float32", "itemsize": 4},
                 {"shape": [8, 3], "dtype": "float64", "itemsize": 8}],
        "result": [{"shape": [4, 3], "dtype": "float64", "itemsize": 8}]}}


@pytest.mark.slow
def test_a_torch_linear_call_sends_its_weight_shapes(tmp_path):
    result = run_script(tmp_path, """
        import torch
        import fecomlite.runtime.probe as __fecomlite__
        fc = torch.nn.Linear(16, 5)
        x = torch.ones(32, 16)
        y = __fecomlite__.call("prog.py:6:4", fc, x)
        print(tuple(y.shape))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(32, 5)"
    (sent,) = shapes_sent(tmp_path)
    record = sent["prog.py:6:4"]
    assert record["args"] == [{"shape": [32, 16], "dtype": "float32", "itemsize": 4}]
    assert record["weights"]["weight"]["shape"] == [5, 16]
    assert record["weights"]["bias"]["shape"] == [5]
    assert features_from_shapes("torch.nn.Linear.__call__", record) == dense(
        32, 16, 5, api="torch.nn.Linear.__call__")


def test_shapes_are_resent_only_when_they_change(tmp_path):
    class Config:
        url, run, token, rep, spool = "", "1", "t", 0, str(tmp_path / "events.spool")

    sender = Sender(Config())
    empty = lambda: ([], *(b"" for _ in range(7)))  # noqa: E731 - a drained, empty buffer
    a, b = np.ones((2, 3)), np.ones((3, 4))
    for shapes in ((a, b), (a, b), (a.T, a)):  # one record per resample window
        record_shapes(sender, "s:1:0", np.matmul, shapes, {}, np.matmul(*shapes))
        sender.send(empty)
    sent = shapes_sent(tmp_path)
    assert [s["s:1:0"]["args"][0]["shape"] for s in sent] == [[2, 3], [3, 2]]


def test_a_tensor_that_fails_to_describe_itself_costs_the_call_nothing(tmp_path):
    class Hostile:
        dtype = np.dtype("float32")

        @property
        def shape(self):
            raise RuntimeError("no shape for you")

    class Sink:
        def add_shapes(self, site, shapes):
            raise AssertionError("a hostile argument must not produce a record")

    record_shapes(Sink(), "s:1:0", np.add, (Hostile(),), {}, None)  # returns, never raises
    assert shape_of(object()) is None and shape_of(np.float32) is None
    assert shape_of(np.ones((2, 0), np.int8)) == {"shape": [2, 0], "dtype": "int8", "itemsize": 1}


def test_the_store_keeps_each_sites_distinct_shapes(tmp_path):
    first = {"args": [{"shape": [4, 8]}]}
    second = {"args": [{"shape": [2, 8]}]}
    with Store(tmp_path / "s.sqlite") as store:
        run = store.create_run(program="train.py")
        for shapes in ({"a:1:0": first}, {"a:1:0": first, "b:2:0": second}, {"a:1:0": second}):
            header, cols = batch_codec.decode(make_batch(["a:1:0"], [(0, 1, 2, 0)],
                                                         shapes=shapes))
            store.add_batch(run, header, cols)
        for i in range(MAX_SHAPE_VARIANTS + 2):
            header, cols = batch_codec.decode(make_batch(["c:3:0"], [(0, 1, 2, 0)],
                                                         shapes={"c:3:0": {"args": [i]}}))
            store.add_batch(run, header, cols)
        saved = store.result(run, "shapes")
        events = events_table(store).db.execute("SELECT count(*) FROM events").fetchone()[0]
    assert events == 3 + MAX_SHAPE_VARIANTS + 2  # the shapes ride along: no event is lost
    assert saved["a:1:0"] == [first, second] and saved["b:2:0"] == [second]
    assert len(saved["c:3:0"]) == MAX_SHAPE_VARIANTS


def test_recorded_shapes_become_the_models_features():
    f32 = {"dtype": "float32", "itemsize": 4}
    keras_conv = {"args": [{"shape": [8, 32, 32, 3], **f32}],
                  "result": [{"shape": [8, 15, 15, 16], **f32}],
                  "weights": {"kernel": {"shape": [3, 3, 3, 16], **f32},
                              "bias": {"shape": [16], **f32}, "strides": [2, 2]}}
    assert features_from_shapes("keras.layers.Conv2D.__call__", keras_conv) == conv2d(
        8, 32, 32, 3, 16, (3, 3), stride=2, padding="valid",
        api="keras.layers.Conv2D.__call__")
    torch_conv = {"args": [{"shape": [1, 3, 8, 8], **f32}],
                  "result": [{"shape": [1, 4, 8, 8], **f32}],
                  "weights": {"weight": {"shape": [4, 3, 3, 3], **f32}, "stride": [1, 1]}}
    assert features_from_shapes("torch.nn.Conv2d.__call__", torch_conv) == conv2d(
        1, 8, 8, 3, 4, (3, 3), padding="same", bias=False, api="torch.nn.Conv2d.__call__")
    method = {"self": {"shape": [5, 6], **f32}, "args": [{"shape": [6], **f32}]}
    assert features_from_shapes("torch.Tensor.matmul", method) == matmul(
        [5, 6], [6, 1], api="torch.Tensor.matmul")
    lookup = {"args": [{"shape": [4, 10], "dtype": "int64", "itemsize": 8}],
              "weights": {"weight": {"shape": [1000, 64], **f32}}}
    assert features_from_shapes("torch.nn.Embedding.__call__", lookup) == embedding(
        40, 1000, 64, api="torch.nn.Embedding.__call__")
    halves = {"args": [{"shape": [3, 7, 16], "dtype": "float16", "itemsize": 2}],
              "weights": {"kernel": {"shape": [16, 2], **f32}}}
    got = features_from_shapes("keras.layers.Dense.__call__", halves)
    assert got.flops == 2.0 * 21 * 16 * 2 and got.input_bytes == 21 * 16 * 2


def test_shapes_that_do_not_fit_are_refused_with_the_reason():
    from fecomlite.model.features import FeatureError

    with pytest.raises(FeatureError, match="does not match"):
        features_from_shapes("torch.nn.Linear.__call__", {
            "args": [{"shape": [2, 7]}], "weights": {"weight": {"shape": [5, 16]}}})
    with pytest.raises(FeatureError, match="unknown dimensions"):
        features_from_shapes("tensorflow.matmul", {"args": [{"shape": [None, 4]},
                                                            {"shape": [4, 2]}]})
    assert not features_from_shapes("torch.relu", {"args": [{"shape": [3]}]}).known


def test_call_shapes_looks_into_tuples_and_keywords():
    a = np.ones((3, 2))
    got = call_shapes(np.linalg.svd, (a,), {"full_matrices": False, "w": a.T},
                      np.linalg.svd(a, full_matrices=False))
    assert [r["shape"] for r in got["result"]] == [[3, 2], [2], [2, 2]]
    assert got["kwargs"] == {"w": {"shape": [2, 3], "dtype": "float64", "itemsize": 8}}
    assert "weights" not in got and "self" not in got
    assert math.prod(got["args"][0]["shape"]) == 6
