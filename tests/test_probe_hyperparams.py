"""Real PyTorch and Keras training programs, instrumented and run with the probe: the names the
store ends with exist in the framework, and the hyperparameters are the ones training used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fecomlite.instrument import instrument_path
from fecomlite.runtime import batch_codec
from fecomlite.runtime.hyperparams import Hyperparams, TrainingStepReader
from fecomlite.store import Store
from tests.test_probe_names import resolves

REPO = Path(__file__).resolve().parents[1]

TORCH_PROGRAM = """\
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 10)

    def forward(self, x):
        return F.log_softmax(self.fc1(torch.flatten(x, 1)), dim=1)


def train(model, train_loader, optimizer):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


def test(model, test_loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    print("correct", correct)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    train_set = TensorDataset(torch.randn(256, 1, 4, 4), torch.randint(0, 10, (256,)))
    test_set = TensorDataset(torch.randn(512, 1, 4, 4), torch.randint(0, 10, (512,)))
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=256)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train(model, train_loader, optimizer)
        test(model, test_loader)
        scheduler.step()


main()
"""

FLAT_TORCH_PROGRAM = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 3
data = TensorDataset(torch.randn(96, 6), torch.randint(0, 2, (96,)))
train_dl = DataLoader(data, batch_size=16, shuffle=True)
eval_dl = DataLoader(data, batch_size=48)
net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
criterion = nn.CrossEntropyLoss()
for epoch in range(EPOCHS):
    for xb, yb in train_dl:
        opt.zero_grad()
        criterion(net(xb), yb).backward()
        opt.step()
    with torch.no_grad():
        hits = sum((net(xb).argmax(1) == yb).sum().item() for xb, yb in eval_dl)
"""

KERAS_PROGRAM = """\
import numpy as np
import tensorflow as tf
import keras
from keras import layers


class Small(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = layers.Dense(3)

    def call(self, x):
        return self.dense(x)


x = np.random.rand(128, 8).astype("float32")
y = np.random.randint(0, 3, 128)

inputs = keras.Input((8,))
model = keras.Model(inputs, layers.Dense(3)(layers.Dense(4)(inputs)))
sequential = keras.Sequential([keras.Input((8,)), layers.Dense(3)])
subclassed = Small()
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=2, verbose=0)
sequential.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
sequential.fit(x, y, batch_size=32, epochs=2, verbose=0)
subclassed.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3), loss="mse")
subclassed.fit(x, np.zeros((128, 3), "float32"), batch_size=32, epochs=2, verbose=0)

sgd = keras.optimizers.SGD(learning_rate=0.05)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
for xb, yb in tf.data.Dataset.from_tensor_slices((x, y)).batch(16):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    sgd.apply_gradients(zip(grads, model.trainable_variables))
"""

KERAS_CUSTOM_LOOP = """\
import argparse

import numpy as np
import tensorflow as tf
import keras

x = np.random.rand(96, 8).astype("float32")
y = np.random.randint(0, 3, 96)
train_ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96).batch(24).prefetch(2)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
optimizer = keras.optimizers.Adam(learning_rate=2e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def test_step(xb):
    return model(xb, training=False)


def train_epoch(ds):
    for xb, yb in ds:
        train_step(xb, yb)


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
for epoch in range(1, args.epochs + 1):
    train_epoch(train_ds)
    for xb, _ in train_ds:
        test_step(xb)
"""


def run_instrumented(tmp_path: Path, source: str) -> tuple[dict[str, Any], dict[str, Any], dict]:
    """Instrument and run a program with the probe spooling; the store's sites by key
    ({"api", "written"}), the run's hyperparameters and the manifest's sites."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "train.py").write_text(source)
    return run_project(tmp_path, tmp_path / "project")


def run_project(tmp_path: Path, project: Path) -> tuple[dict[str, Any], dict[str, Any], dict]:
    """`run_instrumented` for the `train.py` of a project folder."""
    result = instrument_path(project, tmp_path / "copy")
    assert not result.failures
    manifest = json.loads(result.manifest.read_text())["sites"]
    spool = tmp_path / "probe.spool"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FECOMLITE_MANIFEST": str(result.manifest),
        "FECOMLITE_SPOOL": str(spool),
        "FECOMLITE_URL": "",
        "FECOMLITE_RUN": "",
    }
    proc = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path / "copy",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with Store(tmp_path / "store.sqlite") as store, open(spool, "rb") as stream:
        run = store.create_run(program="train.py")
        for batch in batch_codec.read_records(stream):
            header, columns = batch_codec.decode(batch)
            store.add_batch(run, header, columns, manifest)
        sites = {
            r["key"]: dict(r)
            for r in store.db.execute("SELECT key, api, written FROM sites WHERE run_id=?", (run,))
        }
        return sites, store.run(run)["hyperparams"], manifest


def assert_named(sites: dict[str, Any], expected: dict[str, str]) -> None:
    """The API of the sites written as each key (per-site views show the written form)."""
    found = {w: {s["api"] for s in sites.values() if s["written"] == w} for w in expected}
    assert found == {w: {api} for w, api in expected.items()}


def assert_names_exist(sites: dict[str, Any], manifest: dict[str, Any]) -> None:
    for site in sites.values():
        assert "()" not in site["api"], site
        assert resolves(site["api"]), site
    assert not [s["api"] for s in manifest.values() if "()" in s["api"]]


def test_an_mnist_style_torch_program(tmp_path: Path) -> None:
    sites, hyperparams, manifest = run_instrumented(tmp_path, TORCH_PROGRAM)
    assert_names_exist(sites, manifest)
    assert_named(
        sites,
        {
            "model (Net)": "torch.nn.Module.__call__",  # the user's class beside the API
            "loss.backward": "torch.Tensor.backward",
            "optimizer.step": "torch.optim.Adadelta.step",
            "StepLR": "torch.optim.lr_scheduler.StepLR",
            "scheduler.step": "torch.optim.lr_scheduler.StepLR.step",
            "pred.eq(target.view_as(pred)).sum().item": "torch.Tensor.item",
            "output.argmax": "torch.Tensor.argmax",
        },
    )
    sources = hyperparams.pop("sources")
    assert hyperparams == {
        "batch_size": 64,
        "epochs": 2,  # the loop in main around train(...), the step's function
        "optimizer": "Adadelta",
        "learning_rate": 1.0,
        "parameters": 16 * 10 + 10,
    }
    assert "train_loader" in sources["batch_size"]  # not the test loader's 256
    assert sources["epochs"] == "range(args.epochs) around the call of train in main"
    assert sources["optimizer"].startswith("optimizer.step (train.py:")


def test_a_flat_torch_loop_reports_its_epochs(tmp_path: Path) -> None:
    sites, hyperparams, manifest = run_instrumented(tmp_path, FLAT_TORCH_PROGRAM)
    assert_names_exist(sites, manifest)
    assert_named(sites, {"net": "torch.nn.Sequential.__call__", "opt.step": "torch.optim.SGD.step"})
    sources = hyperparams.pop("sources")
    assert hyperparams == {
        "batch_size": 16,  # not the evaluation loader's 48
        "epochs": 3,
        "optimizer": "SGD",
        "learning_rate": 0.1,
        "parameters": 6 * 8 + 8 + 8 * 2 + 2,
    }
    assert sources["epochs"] == "range(EPOCHS) around the loop over train_dl"


def test_keras_fit_of_every_model_kind_then_a_custom_loop(tmp_path: Path) -> None:
    pytest.importorskip("keras")
    sites, hyperparams, manifest = run_instrumented(tmp_path, KERAS_PROGRAM)
    assert_names_exist(sites, manifest)
    assert_named(
        sites,
        {
            "model.fit": "keras.Model.fit",  # a keras.src...Functional: not public, Model is
            "sequential.fit": "keras.Sequential.fit",
            "subclassed.fit (Small)": "keras.Model.fit",
            "subclassed.compile (Small)": "keras.Model.compile",
            "sgd.apply_gradients": "keras.optimizers.SGD.apply_gradients",
            "model": "keras.Model.__call__",
        },
    )
    sources = hyperparams.pop("sources")
    assert hyperparams["optimizer"] == "Adam"  # compile's, not the later loop's SGD
    assert hyperparams["learning_rate"] == pytest.approx(1e-3)
    assert (hyperparams["batch_size"], hyperparams["epochs"]) == (32, 2)
    assert sources["optimizer"].startswith("model.compile (train.py:")


def test_a_keras_custom_loop_with_a_tf_function_step_reports_its_epochs_and_optimizer(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorflow")
    sites, hyperparams, manifest = run_instrumented(tmp_path, KERAS_CUSTOM_LOOP)
    assert_names_exist(sites, manifest)
    polymorphic = "tensorflow.types.experimental.PolymorphicFunction.__call__"
    assert_named(
        sites, {"train_step (tf.function)": polymorphic, "test_step (tf.function)": polymorphic}
    )
    sources = hyperparams.pop("sources")
    assert hyperparams == {
        "epochs": 3,
        "optimizer": "Adam",
        "learning_rate": pytest.approx(2e-3),
        "batch_size": 24,  # train_ds's batch(), through the shuffle before it
    }
    assert sources["batch_size"].startswith("ds, iterated around train_step (train.py:")
    assert sources["epochs"] == "range(args.epochs) around the call of train_epoch in <module>"
    assert sources["optimizer"].startswith("train_step (train.py:")


def test_epochs_around_calls_of_a_training_function_are_left_out_where_loops_disagree(
    tmp_path: Path,
) -> None:
    source = textwrap.dedent("""\
        import torch
        def train(model: torch.nn.Module, loader, opt: torch.optim.Optimizer):
            for x, y in loader:
                model(x).sum().backward()
                opt.step()
        def evaluate(model: torch.nn.Module, loader):
            for x, y in loader:
                model(x).sum().backward()
        def main(model, loader, opt, warmup, epochs):
            for epoch in range(warmup):
                train(model, loader, opt)
            for epoch in range(1, epochs + 1):
                train(model, loader, opt)
            for epoch in range(epochs):
                evaluate(model, loader)
        """)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "t.py").write_text(source)
    result = instrument_path(tmp_path / "p", tmp_path / "out")
    epochs = {
        (s["function"], s["written"]): (s.get("epochs"), s.get("epochs_in"))
        for s in result.sites.values()
    }
    assert epochs[("train", "opt.step")] == (None, None)  # range(warmup) or range(epochs)?
    assert epochs[("evaluate", "model(x).sum().backward")] == ("epochs", "main")


class FakeSink:
    """Stands in for the probe's Sender: keeps what it was handed."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def add_hyperparams(self, params: dict[str, Any]) -> None:
        self.sent.append(params)


def test_a_higher_rank_wins_and_a_tie_at_one_rank_leaves_the_value_out() -> None:
    sink = FakeSink()
    hyperparams = Hyperparams(sink)
    hyperparams.offer({"optimizer": "SGD", "batch_size": 16}, "loop", 1)
    hyperparams.offer({"optimizer": "Adam"}, "compile", 2)
    hyperparams.offer({"optimizer": "RMSprop"}, "loop", 1)  # lower rank: ignored
    hyperparams.offer({"batch_size": 32}, "another loop", 1)  # a tie: unsure
    hyperparams.offer({"batch_size": 16}, "loop", 1)  # and it stays out
    assert sink.sent == [
        {
            "optimizer": "SGD",
            "batch_size": 16,
            "sources": {"optimizer": "loop", "batch_size": "loop"},
        },
        {"optimizer": "Adam", "sources": {"optimizer": "compile", "batch_size": "loop"}},
        {"batch_size": None, "sources": {"optimizer": "compile"}},
    ]


def test_the_store_drops_a_hyperparameter_sent_as_unsure(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite") as store:
        run = store.create_run(program="p.py")
        store.merge_hyperparams(run, {"batch_size": 16, "optimizer": "SGD"})
        store.merge_hyperparams(run, {"batch_size": None})
        assert store.run(run)["hyperparams"] == {"optimizer": "SGD"}


def test_the_manifest_names_what_the_loop_around_a_training_step_iterates(tmp_path: Path) -> None:
    source = textwrap.dedent("""\
        import torch
        def fit(model: torch.nn.Module, loaders, opt: torch.optim.Optimizer, epochs):
            for epoch in range(epochs):
                for i, (x, y) in enumerate(loaders.train):
                    model(x).sum().backward()
                    opt.step()
            torch.save(model, "m")
        """)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "t.py").write_text(source)
    result = instrument_path(tmp_path / "p", tmp_path / "out")
    loops = {s["written"]: (s.get("loop"), s.get("epochs")) for s in result.sites.values()}
    assert loops["model(x).sum().backward"] == (["loaders.train", "epochs"], "epochs")
    assert loops["opt.step"] == (["loaders.train", "epochs"], "epochs")  # innermost first
    assert loops["torch.save"] == (None, None)


def test_a_training_step_is_read_at_its_first_call_and_then_takes_the_fast_path() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import fecomlite.runtime.probe as probe

    sink, site = FakeSink(), "t.py:9:0"
    reader = TrainingStepReader(
        {"written": "opt.step", "loop": ["loader"]}, Hyperparams(sink), site
    )
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    loader = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=4)
    probe._special[site] = reader
    try:
        for _ in range(3):
            for (x,) in loader:
                net(x).sum().backward()
                probe.call(site, opt.step)
    finally:
        probe._special.pop(site, None)
    assert site in probe._fast  # no longer slowed down by the reader
    values = {"optimizer": "SGD", "learning_rate": 0.5, "parameters": 3, "batch_size": 4}
    assert [{k: v for k, v in sent.items() if k != "sources"} for sent in sink.sent] == [values]


def test_the_configured_rate_and_its_schedule_not_the_rate_at_the_first_step() -> None:
    """Recorded case: AdamW(lr=3e-3) driven by OneCycleLR(max_lr=3e-3), whose first step runs
    at 1.2e-4 (printed 0.00011999999999999988 before)."""
    import torch

    import fecomlite.runtime.probe as probe

    sink, site = FakeSink(), "t.py:12:0"
    reader = TrainingStepReader({"written": "opt.step", "loop": []}, Hyperparams(sink), site)
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=4)
    probe._special[site] = reader
    try:
        for _ in range(2):
            net(torch.ones(1, 2)).sum().backward()
            probe.call(site, opt.step)
            schedule.step()
    finally:
        probe._special.pop(site, None)
    sent = {k: v for k, v in sink.sent[0].items() if k != "sources"}
    assert sent["learning_rate"] == 0.003 and repr(sent["learning_rate"]) == "0.003"
    assert sent["lr_schedule"] == "OneCycleLR" and sent["max_lr"] == 0.003


def test_keras_fit_batch_size_of_a_pipeline_and_samples_after_the_validation_split() -> None:
    """Recorded cases: fit(dataset.batch(128)) and fit(x, y, validation_split=0.1) of 1,600."""
    import numpy as np

    from fecomlite.runtime.hyperparams import _keras_fit, as_written

    tf = pytest.importorskip("tensorflow")
    data = tf.data.Dataset.from_tensor_slices(np.zeros((512, 4), "float32")).shuffle(64)
    pipeline = data.batch(128).prefetch(tf.data.AUTOTUNE)
    assert _keras_fit(None, (pipeline,), {"epochs": 2}, None)["batch_size"] == 128
    x = np.zeros((1600, 4), "float32")
    split = _keras_fit(None, (x, None), {"validation_split": 0.1, "batch_size": 64}, None)
    assert split["training_samples"] == 1440 and split["batch_size"] == 64
    given = _keras_fit(None, (x, None), {"validation_split": 0.1, "validation_data": (x, x)}, None)
    assert given["training_samples"] == 1600  # validation_data given: nothing held out
    assert as_written(0.0029999999999999996) == 0.003 and as_written(1e-8) == 1e-8
