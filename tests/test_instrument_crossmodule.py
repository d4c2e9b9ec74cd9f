"""Project-wide resolution: framework subclasses and objects imported from the project's own
modules resolve as they do where they are defined (``exports.py``)."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from fecomlite.instrument import project as project_module
from fecomlite.instrument.exports import Export, StarNames, build_table, module_identities
from fecomlite.instrument.names import DEFAULT_ROOTS, Roots
from fecomlite.instrument.project import instrument_path

CASES = Path(__file__).parent / "instrument_cases"

TORCH_MODEL = dedent(
    """
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

        def helper(self):
            return 1
    """
)
KERAS_MODEL = dedent(
    """
    import tensorflow as tf
    from tensorflow import keras


    class Classifier(tf.keras.Model):
        def call(self, x):
            return x


    encoder = keras.Sequential([keras.layers.Dense(2)])
    """
)


def sites_of(root: Path, files: dict[str, str], **options: object) -> dict[str, dict[str, str]]:
    """file → {written callee: canonical api} of the sites found in a project and named there
    (not the calls of unknown callees decided at run time: test_runtime_resolved.py)."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(dedent(text), encoding="utf-8")
    result = instrument_path(root, list_only=True, **options)  # type: ignore[arg-type]
    assert result.ok, result.failures
    found: dict[str, dict[str, str]] = {}
    for site in result.sites.values():
        if site["kind"] == "call":
            continue
        found.setdefault(str(site["file"]), {})[str(site["written"])] = str(site["api"])
    return found


def test_torch_subclass_imported_from_another_module(tmp_path: Path) -> None:
    train = """
        import torch
        from model import Net

        net = Net()
        out = net(torch.ones(2))
        net.eval()
        net.helper()
        net.forward(out)
        """
    found = sites_of(tmp_path, {"model.py": TORCH_MODEL, "train.py": train})
    assert found["train.py"] == {
        "net": "torch.nn.Module.__call__",
        "torch.ones": "torch.ones",
        "net.eval": "torch.nn.Module.eval",
    }  # Net() is the user's constructor; helper and forward are the user's methods


def test_keras_subclass_and_module_level_object(tmp_path: Path) -> None:
    train = """
        import model
        from model import Classifier, encoder

        Classifier().fit([1])
        encoder.predict([1])
        model.encoder.evaluate([1])
        """
    found = sites_of(tmp_path, {"model.py": KERAS_MODEL, "train.py": train})
    assert found["train.py"] == {
        "Classifier().fit": "keras.Model.fit",
        "encoder.predict": "keras.Sequential.predict",
        "model.encoder.evaluate": "keras.Sequential.evaluate",
    }  # train.py mentions no framework: only the project's own names lead to the sites


def test_relative_imports_and_chains_through_project_classes(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/model.py": TORCH_MODEL,
        "pkg/deeper.py": "from .model import Net\n\n\nclass Deeper(Net):\n    pass\n",
        "pkg/train.py": """
            from . import model
            from .deeper import Deeper

            Deeper()(1)
            Deeper().helper()
            model.Net()(2)
            """,
    }
    found = sites_of(tmp_path, files)
    assert found["pkg/train.py"] == {
        "Deeper()": "torch.nn.Module.__call__",
        "model.Net()": "torch.nn.Module.__call__",
    }


def test_local_subclass_of_an_imported_class(tmp_path: Path) -> None:
    train = """
        from model import Net


        class Wider(Net):
            def __init__(self):
                super().__init__()

            def extra(self):
                return self.helper()


        w = Wider()
        w(1)
        w.train()
        w.extra()
        """
    found = sites_of(tmp_path, {"model.py": TORCH_MODEL, "train.py": train})
    assert found["train.py"] == {
        "w": "torch.nn.Module.__call__",
        "w.train": "torch.nn.Module.train",
    }
    # super().__init__ and self.helper are Net's own methods: user code, not wrapped


def test_a_local_name_shadows_the_imported_class(tmp_path: Path) -> None:
    train = """
        from model import Net


        class Net:
            def __call__(self, x):
                return x


        Net()(1)
        """
    found = sites_of(tmp_path, {"model.py": TORCH_MODEL, "train.py": train})
    assert "train.py" not in found


def test_names_that_are_not_exported_stay_unknown(tmp_path: Path) -> None:
    files = {
        "model.py": TORCH_MODEL + "\n\ndef build():\n    return Net()\n\n\nplain = object()\n",
        "train.py": "from model import build, plain, Missing\n\n"
        "build()(1)\nplain(2)\nMissing()(3)\n",
    }
    assert "train.py" not in sites_of(tmp_path, files)  # functions' returns: out of scope


def test_script_folder_and_src_layout(tmp_path: Path) -> None:
    files = {
        "src/lib/model.py": TORCH_MODEL,
        "src/lib/__init__.py": "",
        "scripts/model.py": KERAS_MODEL,
        "scripts/run.py": "from lib.model import Net\nfrom model import encoder\n\n"
        "Net()(1)\nencoder.fit()\n",
    }
    found = sites_of(tmp_path, files)
    assert found["scripts/run.py"] == {
        "Net()": "torch.nn.Module.__call__",
        "encoder.fit": "keras.Sequential.fit",
    }  # lib.* from the src/ layout; `model` is the script's sibling, not a root module


def test_workers_receive_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(project_module, "PARALLEL_MIN_BYTES", 0)
    files = {"model.py": TORCH_MODEL, "train.py": "from model import Net\n\nNet()(1)\n"}
    files |= {f"other{i}.py": "import torch\ntorch.ones(1)\n" for i in range(3)}
    found = sites_of(tmp_path, files, workers=2)
    assert found["train.py"] == {"Net()": "torch.nn.Module.__call__"}


def test_framework_attributes_of_an_imported_instance(tmp_path: Path) -> None:
    model = """
        import torch
        from torch import nn


        class Base(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(4, 1)
                self.either = nn.ReLU()

            def grow(self):
                self.either = nn.Tanh()  # set from two callees: no one type


        class Net(Base):
            def __init__(self, big):
                super().__init__()
                self.body = nn.Conv2d(1, 2, 3)
                self.maybe = nn.Linear(2, 2) if big else None  # not always a framework call
                self.size = 4
        """
    train = """
        import torch
        from model import Net

        net = Net(True)
        x = torch.ones(1, 1, 4, 4)
        net.body(x)
        net.head(x)
        net.either(x)
        net.maybe(x)
        net.size
        net.body.weight.sum()
        """
    found = sites_of(tmp_path, {"model.py": model, "train.py": train})
    assert found["train.py"] == {
        "torch.ones": "torch.ones",
        "net.body": "torch.nn.Conv2d.__call__",
        "net.head": "torch.nn.Linear.__call__",  # set by a base class
        "net.body.weight.sum": "torch.nn.Conv2d.weight.sum",
    }


def test_star_import_of_a_project_module_brings_its_framework_names(tmp_path: Path) -> None:
    model = """
        import torch
        from torch import nn
        from tensorflow import keras

        zeros = None  # not torch.zeros: rebinding a name drops what an import bound it to
        ones = torch.ones
        encoder = keras.Sequential()


        class Net(nn.Module):
            def helper(self):
                return 1
        """
    train = """
        from model import *

        x = torch.rand(2)
        layer = nn.Linear(2, 2)
        layer(x)
        Net()(x)
        Net().helper()
        encoder.fit()
        zeros(2)
        """
    found = sites_of(tmp_path, {"model.py": model, "train.py": train})
    assert found["train.py"] == {
        "torch.rand": "torch.rand",
        "nn.Linear": "torch.nn.Linear",
        "layer": "torch.nn.Linear.__call__",
        "Net()": "torch.nn.Module.__call__",
        "encoder.fit": "keras.Sequential.fit",
    }


def test_star_imports_follow_pythons_order_all_and_chains(tmp_path: Path) -> None:
    files = {
        "helpers.py": "def zeros(n):\n    return [0] * n\n\n\ndef _private():\n    pass\n",
        "layers.py": "from torch.nn import *\n\n__all__ = ['Linear', 'Tanh']\n\n\n"
                     "def Tanh():\n    return 'mine'\n",
        "pkg/__init__.py": "",
        "pkg/base.py": "import torch as T\n",
        "pkg/run.py": "from .base import *\n\nT.ones(1)\n",
        "a.py": "from torch import *\nfrom helpers import *\n\nzeros(2)\nones(2)\n_private()\n",
        "b.py": "from helpers import *\nfrom torch import *\n\nzeros(2)\n",
        "c.py": "from layers import *\n\nLinear(2, 2)\nTanh()\nReLU()\n",
    }
    found = sites_of(tmp_path, files)
    # a.py: helpers' zeros is the user's (the last star import that binds it wins)
    assert found["a.py"] == {"ones": "torch.ones"}
    assert found["b.py"] == {"zeros": "torch.zeros"}
    # c.py: Linear through layers' own star import; Tanh is layers' own; ReLU is not in __all__
    assert found["c.py"] == {"Linear": "torch.nn.Linear"}
    assert found["pkg/run.py"] == {"T.ones": "torch.ones"}  # a relative star import


def test_table_contents() -> None:
    sources = {
        "model.py": TORCH_MODEL + "\nnet = Net()\n",
        "pkg/__init__.py": "from model import Net as Renamed\n\n\nclass Sub(Renamed):\n    x = 1\n",
    }
    table = build_table(sources, Roots(DEFAULT_ROOTS))
    members = frozenset({"__init__", "forward", "helper", "fc"})
    typed = (("fc", "torch.nn.Linear"),)  # self.fc = nn.Linear(2, 2)
    assert table.exports["model"] == {
        "Net": Export("class", "torch.nn.Module", "Net", members, typed),
        "net": Export("instance", "torch.nn.Module", "Net", members, typed),
    }
    assert table.exports["pkg"] == {
        "Sub": Export("class", "torch.nn.Module", "Sub", members | {"x"}, typed)}
    assert table.stars["model"] == StarNames(
        frozenset({"nn", "Net", "net"}), None, (("nn", "torch.nn"),), ())
    assert table.stars["pkg"].apis == () and table.stars["pkg"].bound == {"Renamed", "Sub"}
    assert module_identities("src/pkg/__init__.py") == [("src.pkg", "src.pkg"), ("pkg", "pkg")]


def test_sample_scripts_resolve_across_modules() -> None:
    scripts = CASES / "scripts"
    result = instrument_path(scripts, list_only=True, api_roots=["fakeapi"])
    found = {
        str(s["written"]): str(s["api"])
        for s in result.sites.values()
        if s["file"] == "crossmodule.py" and s["kind"] != "call"  # named here, not at run time
    }
    assert found == {
        "net": "fakeapi.Layer.__call__",
        "net.fit": "fakeapi.Layer.fit",
        "encoder.m": "fakeapi.Thing.m",
        "cm.Net()": "fakeapi.Layer.__call__",
    }  # tests/test_instrument_semantics.py runs this script original vs instrumented


def test_functions_another_module_compiles_with_a_tracing_compiler_are_left_alone(
    tmp_path: Path,
) -> None:
    util = """
        import tensorflow as tf


        def square(x):
            return tf.matmul(x, x)


        def unused(x):
            return tf.reduce_min(x)
        """
    ops = """
        import jax.numpy as jnp
        import tensorflow as tf
        import torch
        from util import square


        def step(x):
            return tf.reduce_mean(square(x))


        def fast(x):
            return tf.reduce_sum(tf.sin(x))


        def pure(x):
            return jnp.sum(jnp.cos(x))


        def eager(x):
            return tf.reduce_max(x)


        def scripted(x):
            return torch.relu(x)
        """
    train = """
        import tensorflow as tf
        import torch
        from jax import jit

        import ops
        from ops import step as train_step

        g = tf.function(train_step)
        h = tf.function(jit_compile=True)(ops.fast)
        j = jit(ops.pure)
        s = torch.jit.script(ops.scripted)
        print(ops.eager(tf.ones(2)), g, h, j, s)
        """
    files = {"util.py": util, "ops.py": ops, "train.py": train}
    found = sites_of(tmp_path, files, api_roots=["jax"])
    assert found["util.py"] == {"tf.reduce_min": "tensorflow.reduce_min"}  # square: in a graph
    assert found["ops.py"] == {
        "tf.reduce_max": "tensorflow.reduce_max",  # never compiled: measured
        "torch.relu": "torch.relu",  # PyTorch's compilers see through the probe at run time
    }
    assert found["train.py"]["tf.function"] == "tensorflow.function"
    sources = {rel: dedent(text) for rel, text in files.items()}
    table = build_table(sources, Roots((*DEFAULT_ROOTS, "jax")))
    assert table.traced == {"ops": {"step", "fast", "pure"}, "util": {"square"}}
