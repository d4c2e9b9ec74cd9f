"""Names users recognise: the probe names each call from the callee that ran, and the store makes
that the site's API (static names are only the fallback, and never contain `()`)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - as users write it
from torch import nn

from fecomlite.runtime import names
from fecomlite.runtime.names import adopted, runtime_name, set_roots, shown_written
from fecomlite.runtime.sender import Sender
from fecomlite.store import Store


@pytest.fixture(autouse=True)
def framework_roots():
    """The roots these names are found under (an earlier test's import hook or notebook magic
    may have set the process's own), put back after."""
    before = names._roots
    set_roots(["tensorflow", "keras", "tf_keras", "torch", "numpy"])
    yield
    names._roots = before


def resolves(name: str) -> bool:
    """Whether `name` is importable and reachable attribute by attribute from its module."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                found = getattr(found, part)
        except AttributeError:
            return False
        return True
    return False


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc(x), dim=1)


ALIVE: list[object] = []


def torch_callees() -> dict[str, object]:
    net = Net()
    out = net(torch.ones(2, 4))
    loss = F.nll_loss(out, torch.zeros(2, dtype=torch.long))
    pred = out.argmax(dim=1, keepdim=True)
    optimizer = torch.optim.Adadelta(net.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)  # wraps optimizer.step
    # AdamW inherits Adam's step; a scheduler's wrapper of it still names the AdamW it steps
    adamw = torch.optim.AdamW(net.parameters())
    torch.optim.lr_scheduler.CosineAnnealingLR(adamw, T_max=2)
    ALIVE.append(adamw)  # the wrapper holds it weakly, as a program's optimizer is held
    return {
        "torch.nn.Module.__call__": net,
        "torch.nn.Linear.__call__": net.fc,
        "torch.Tensor.backward": loss.backward,
        "torch.Tensor.argmax": out.argmax,
        "torch.Tensor.eq": pred.eq,
        "torch.Tensor.sum": pred.eq(pred).sum,
        "torch.Tensor.item": pred.sum().item,
        "torch.optim.Adadelta.step": optimizer.step,
        "torch.optim.AdamW.step": adamw.step,
        "torch.optim.lr_scheduler.StepLR.step": scheduler.step,
        "torch.optim.lr_scheduler.StepLR": torch.optim.lr_scheduler.StepLR,
        "torch.nn.functional.nll_loss": F.nll_loss,
        "torch.flatten": torch.flatten,
        "torch.utils.data.DataLoader": torch.utils.data.DataLoader,
        "torch.nn.Module.train": net.train,
    }


def test_torch_callees_get_the_public_name_of_what_ran() -> None:
    callees = torch_callees()
    named = {expected: runtime_name(fn) for expected, fn in callees.items()}
    assert {expected: n and n["api"] for expected, n in named.items()} == {
        expected: expected for expected in callees
    }
    for name in named:
        assert resolves(name), name
        assert "()" not in name
    assert named["torch.nn.Module.__call__"]["type"] == "Net"  # the user's class, beside
    assert named["torch.nn.Module.train"]["type"] == "Net"
    assert "type" not in named["torch.nn.Linear.__call__"]


def test_keras_models_of_every_kind_are_named_by_their_public_class() -> None:
    keras = pytest.importorskip("keras")

    class Small(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):  # noqa: ANN001, ANN202
            return self.dense(x)

    inputs = keras.Input((4,))
    functional = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    sequential = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    sub = Small()
    sgd = keras.optimizers.SGD(0.1)
    expected = {
        "keras.Sequential.fit": sequential.fit,
        "keras.Sequential.__call__": sequential,
        "keras.Model.fit": functional.fit,  # a keras.src...Functional: not public, Model is
        "keras.Model.__call__": functional,
        "keras.optimizers.SGD.apply_gradients": sgd.apply_gradients,
        "keras.layers.Dense.__call__": sequential.layers[0],
        "keras.optimizers.Adam": keras.optimizers.Adam,
    }
    for name, fn in expected.items():
        assert runtime_name(fn)["api"] == name
        assert resolves(name), name
    assert runtime_name(sub.fit) == {"api": "keras.Model.fit", "callee": "method", "type": "Small"}


def test_a_callee_without_a_public_name_keeps_the_static_one() -> None:
    def helper() -> None:
        return None

    assert runtime_name(helper) is None  # a user function
    assert runtime_name(lambda: None) is None
    # numpy.add is a numpy.ufunc: the name the user called it by says more
    assert adopted({"api": "numpy.add", "kind": "function"}, runtime_name(np.add)) is None

    class OwnCall(nn.Module):
        def __call__(self, x: torch.Tensor) -> torch.Tensor:  # the user's override ran
            return x

    assert runtime_name(OwnCall()) is None


def test_compiled_units_are_named_by_the_public_type_of_what_their_compiler_returned() -> None:
    tf = pytest.importorskip("tensorflow")

    @tf.function
    def train_step(x):  # noqa: ANN001, ANN202
        return x * 2

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    expected = {
        "tensorflow.types.experimental.PolymorphicFunction.__call__": train_step,
        "torch.nn.Module.__call__": torch.compile(Net()),  # OptimizedModule: torch's, private
        "torch.ScriptFunction.__call__": torch.jit.trace(plain, torch.ones(1)),
    }
    for name, fn in expected.items():
        assert runtime_name(fn) == {"api": name, "callee": "object"}
        assert resolves(name), name
    assert runtime_name(torch.compile(plain)) is None  # a plain function: the static name stands


def test_a_method_without_a_public_name_is_named_where_the_framework_defines_it() -> None:
    tf = pytest.importorskip("tensorflow")
    # tf.Tensor has no `numpy`: only the eager tensor's private class holds it
    named = runtime_name(tf.argmax(tf.ones((2, 3)), axis=1).numpy)
    assert named == {"api": "tensorflow.python.framework.ops.EagerTensor.numpy", "callee": "method"}
    assert resolves(named["api"])


def test_a_compiled_site_shows_the_users_function_and_its_compiler_beside_written() -> None:
    api = "tensorflow.types.experimental.PolymorphicFunction.__call__"
    step = {"api": api, "kind": "compiled", "written": "train_step"}
    found = {"api": api, "callee": "object"}
    assert adopted({**step, "compiler": "tensorflow.function", "unit": "train_step"}, found) == (
        api,
        "train_step (tf.function)",
    )
    assert shown_written(
        {**step, "compiler": "tensorflow.function", "unit": "main.train_step"}
    ) == (
        "train_step (tf.function)"  # a function defined in main
    )
    assert adopted({**step, "compiler": "tensorflow.function", "unit": "plain"}, found) == (
        api,
        "train_step (plain, tf.function)",
    )
    assert shown_written({**step, "compiler": "torch.compile", "written": "net"}) == (
        "net (torch.compile)"
    )
    assert shown_written({"api": "torch.ones", "kind": "function", "written": "torch.ones"}) == (
        "torch.ones"
    )


class FakeConfig:
    """A sender configuration without server or run (what a Sender reads of probe._Config)."""

    url = run = token = spool = ""
    rep = 0


def test_the_sender_sends_a_site_name_once_and_gives_up_on_a_site_whose_callee_changes() -> None:
    sender = Sender(FakeConfig())
    sender.add_name("a:1:0", {"api": "torch.Tensor.sum", "callee": "method"})
    sender.add_name("a:1:0", {"api": "torch.Tensor.sum", "callee": "method"})
    assert sender._take_names() == {"a:1:0": {"api": "torch.Tensor.sum", "callee": "method"}}
    sender.add_name("a:1:0", {"api": "torch.Tensor.sum", "callee": "method"})
    assert sender._take_names() == {}  # already sent
    sender.add_name("a:1:0", {"api": "numpy.ndarray.sum", "callee": "method"})
    assert sender._take_names() == {"a:1:0": {}}  # two callees: the static name again
    sender.add_name("a:1:0", {"api": "torch.Tensor.sum", "callee": "method"})
    assert sender._take_names() == {}


def test_the_store_makes_the_probe_name_the_api_and_keeps_the_user_class_in_view(tmp_path) -> None:
    manifest = {
        "m.py:3:4": {"api": "torch.nn.Module.to/__call__", "written": "model", "kind": "method"},
        "m.py:4:4": {
            "api": "torch.nn.functional.nll_loss/backward",
            "written": "loss.backward",
            "kind": "method",
        },
        "m.py:5:4": {"api": "torch.Tensor.sum", "written": "t.sum", "kind": "method"},
    }
    header = {
        "rep": 1,
        "pid": 1,
        "sites": [],
        "names": {
            "m.py:3:4": {"api": "torch.nn.Module.__call__", "callee": "object", "type": "Net"},
            "m.py:4:4": {"api": "torch.Tensor.backward", "callee": "method"},
            "m.py:5:4": {},  # seen running two different callees
        },
    }
    columns = {
        name: np.array([], dtype)
        for name, dtype in (
            ("site", "<i4"),
            ("t_start_ns", "<i8"),
            ("t_end_ns", "<i8"),
            ("tid", "<u8"),
            ("status", "u1"),
            ("in_bytes", "<i8"),
            ("out_bytes", "<i8"),
        )
    }
    with Store(tmp_path / "store.sqlite") as store:
        run = store.create_run(program="m.py")
        store.add_batch(run, header, columns, manifest)  # names may come before any event
        rows = {
            r["key"]: (r["api"], r["written"])
            for r in store.db.execute("SELECT key, api, written FROM sites WHERE run_id=?", (run,))
        }
    assert rows == {
        "m.py:3:4": ("torch.nn.Module.__call__", "model (Net)"),
        "m.py:4:4": ("torch.Tensor.backward", "loss.backward"),
        "m.py:5:4": ("torch.Tensor.sum", "t.sum"),
    }
