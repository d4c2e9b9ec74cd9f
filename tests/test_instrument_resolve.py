"""Name resolution: which calls are framework calls, and their canonical names and kinds.

Static only: TensorFlow and PyTorch are named in the sources but never imported here.
"""

from __future__ import annotations

from textwrap import dedent

import pytest

from fecomlite.instrument.names import DEFAULT_ROOTS, Roots, canonical
from fecomlite.instrument.transform import instrument_source


def sites(source: str, roots: tuple[str, ...] = DEFAULT_ROOTS) -> dict[str, tuple[str, str]]:
    """written callee → (canonical api, kind), for every call wrapped with a static name (calls
    of unknown callees, decided when they run, are tested in test_runtime_resolved.py)."""
    result = instrument_source(dedent(source), "t.py", Roots(roots))
    return {str(s["written"]): (str(s["api"]), str(s["kind"])) for s in named(result.sites)}


def named(found: list[dict[str, object]]) -> list[dict[str, object]]:
    """The sites the instrumenter names: not those of unknown callees (kind `call`)."""
    return [site for site in found if site["kind"] != "call"]


def apis(source: str, roots: tuple[str, ...] = DEFAULT_ROOTS) -> list[str]:
    result = instrument_source(dedent(source), "t.py", Roots(roots))
    return [str(s["api"]) for s in named(result.sites)]


@pytest.mark.parametrize(
    "source",
    [
        "import tensorflow as tf\ntf.keras.layers.Dense(1)",
        "from tensorflow import keras\nkeras.layers.Dense(1)",
        "from tensorflow.keras import layers\nlayers.Dense(1)",
        "from tensorflow.keras import layers as L\nL.Dense(1)",
        "from tensorflow.keras.layers import Dense\nDense(1)",
        "import keras\nkeras.layers.Dense(1)",
        "from keras import layers\nlayers.Dense(1)",
        "import tf_keras\ntf_keras.layers.Dense(1)",
        "import tensorflow.keras.layers\ntensorflow.keras.layers.Dense(1)",
        "from tensorflow.keras.layers import *\nDense(1)",
    ],
)
def test_one_api_one_name_however_imported(source: str) -> None:
    assert apis(source) == ["keras.layers.Dense"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import tensorflow as tf\nm = tf.keras.Sequential()\nm.fit()", "keras.Sequential.fit"),
        ("from keras import models\nm = models.Sequential()\nm.fit()", "keras.Sequential.fit"),
        ("from tensorflow.keras.models import Model\nModel().fit()", "keras.Model.fit"),
        ("import torch.nn as nn\nnn.Conv2d(1, 2, 3)", "torch.nn.Conv2d"),
        ("from torch import nn\nnn.Conv2d(1, 2, 3)", "torch.nn.Conv2d"),
        ("from torch.nn.modules.conv import Conv2d\nConv2d(1, 2, 3)", "torch.nn.Conv2d"),
        ("import torch.optim.adam as a\na.Adam([])", "torch.optim.Adam"),
    ],
)
def test_aliases_and_reexports_agree(source: str, expected: str) -> None:
    assert expected in apis(source)


def test_canonical_chains_aliases() -> None:
    assert canonical("tensorflow.keras.models.Sequential.fit") == "keras.Sequential.fit"
    assert canonical("torch.nn.modules.linear.Linear") == "torch.nn.Linear"
    assert canonical("torch.nn.functional.relu") == "torch.nn.functional.relu"


def test_objects_returned_by_framework_calls() -> None:
    found = sites(
        """
        import tensorflow as tf
        ds = tf.data.Dataset.from_tensor_slices([1, 2]).shuffle(8).batch(2)
        t = tf.constant(1)
        t.numpy()
        with tf.GradientTape() as tape:
            y = t * t
        tape.gradient(y, t)
        """
    )
    assert found == {
        "tf.data.Dataset.from_tensor_slices": (
            "tensorflow.data.Dataset.from_tensor_slices",
            "function",
        ),
        "tf.data.Dataset.from_tensor_slices([1, 2]).shuffle": (
            "tensorflow.data.Dataset.shuffle",
            "method",
        ),
        "tf.data.Dataset.from_tensor_slices([1, 2]).shuffle(8).batch": (
            "tensorflow.data.Dataset.shuffle/batch",
            "method",
        ),
        "tf.constant": ("tensorflow.constant", "function"),
        "t.numpy": ("tensorflow.constant/numpy", "method"),
        "tf.GradientTape": ("tensorflow.GradientTape", "constructor"),
        "tape.gradient": ("tensorflow.GradientTape.gradient", "method"),
    }


def test_keras_subclass_methods_and_graph_bodies() -> None:
    found = sites(
        """
        import keras


        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.dense = keras.layers.Dense(2)

            def call(self, x):
                return self.dense(x)

            def summary_line(self):
                return self.count_params()


        net = Net()
        net.fit([1])
        net([1])
        Net().evaluate([1])
        net.summary_line()
        """
    )
    assert found == {
        "super().__init__": ("keras.Model.__init__", "method"),
        "keras.layers.Dense": ("keras.layers.Dense", "constructor"),
        "self.count_params": ("keras.Model.count_params", "method"),
        "net.fit": ("keras.Model.fit", "method"),
        "net": ("keras.Model.__call__", "method"),
        "Net().evaluate": ("keras.Model.evaluate", "method"),
    }  # `call` runs inside Keras' graph: its body is not instrumented; Net() is user code


def test_torch_module_subclass() -> None:
    found = sites(
        """
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 4, 3)
                self.helper = make_helper()

            def forward(self, x):
                return self.helper(self.conv1(x))


        def make_helper():
            return lambda x: x


        net = Net()
        out = net(torch.ones(1))
        net.forward(out)
        out.sum()
        """
    )
    assert found == {
        "super().__init__": ("torch.nn.Module.__init__", "method"),
        "nn.Conv2d": ("torch.nn.Conv2d", "constructor"),
        "self.conv1": ("torch.nn.Conv2d.__call__", "method"),
        "net": ("torch.nn.Module.__call__", "method"),
        "torch.ones": ("torch.ones", "function"),
        "out.sum": ("torch.nn.Module.__call__/sum", "method"),
    }  # self.helper is the user's attribute, forward the user's method: neither is wrapped


def test_graph_compiled_functions_are_one_unit() -> None:
    source = """
        import tensorflow as tf
        import torch


        def helper(x):
            return tf.square(x)


        @tf.function
        def step(x):
            return helper(tf.reduce_sum(x))


        def plain(x):
            return tf.abs(x)


        fast = tf.function(plain)
        step(1)
        fast(2)


        class Net(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x)


        model = Net()
        compiled = torch.compile(model)
        compiled(3)
        model(4)
        """
    found = sites(source)
    polymorphic = "tensorflow.types.experimental.PolymorphicFunction.__call__"
    assert found == {
        "tf.function": ("tensorflow.function", "function"),
        "step": (polymorphic, "compiled"),  # what tf.function returns, by its public type
        "fast": (polymorphic, "compiled"),
        "torch.compile": ("torch.compile", "function"),
        "compiled": ("torch.nn.Module.__call__", "compiled"),  # OptimizedModule calls through it
        "model": ("torch.nn.Module.__call__", "method"),
    }  # helper (called from a graph), plain (compiled) and Net.forward: bodies untouched
    units = {s["written"]: (s.get("compiler"), s.get("unit")) for s in compiled_sites(source)}
    assert units == {
        "step": ("tensorflow.function", "step"),
        "fast": ("tensorflow.function", "plain"),
        "compiled": ("torch.compile", "Net"),
    }


def compiled_sites(source: str) -> list[dict[str, object]]:
    result = instrument_source(dedent(source), "t.py", Roots(DEFAULT_ROOTS))
    return [s for s in result.sites if s["kind"] == "compiled"]


def test_compiled_units_are_named_by_the_public_type_of_what_their_compiler_returns() -> None:
    found = sites(
        """
        import torch


        def f(x):
            return x + 1


        class Net(torch.nn.Module):
            def forward(self, x):
                return x


        compiled_f = torch.compile(f)
        scripted_f = torch.jit.script(f)
        scripted_net = torch.jit.script(Net())
        traced_linear = torch.jit.trace(torch.nn.Linear(2, 2), torch.ones(1, 2))
        compiled_f(1)
        compiled_f.cache_info()
        scripted_f(1)
        scripted_net(1)
        scripted_net.save("m.pt")
        traced_linear(1)
        """
    )
    assert {k: v for k, v in found.items() if v[1] != "function"} == {
        "compiled_f": ("torch.compile", "compiled"),  # a plain function: no public type
        "compiled_f.cache_info": ("torch.compile/cache_info", "method"),
        "scripted_f": ("torch.jit.ScriptFunction.__call__", "compiled"),
        "scripted_net": ("torch.jit.ScriptModule.__call__", "compiled"),
        "scripted_net.save": ("torch.jit.ScriptModule.save", "method"),
        "traced_linear": ("torch.jit.ScriptModule.__call__", "compiled"),
        "torch.nn.Linear": ("torch.nn.Linear", "constructor"),
    }


def test_scopes_decide_what_a_name_is() -> None:
    found = sites(
        """
        import torch


        def shadowed(torch):
            return torch.ones(1)  # a parameter, not the module


        def local():
            torch = FakeTorch()
            return torch.zeros(1)


        try:
            import tensorflow as tf
        except ImportError:
            tf = None
        tf.constant(1)
        [torch.ones(1) for torch in range(2)]
        torch.eye(2)
        """
    )
    assert found == {
        "tf.constant": ("tensorflow.constant", "function"),
        "torch.eye": ("torch.eye", "function"),
    }


def test_parameters_typed_by_annotation_default_and_call_sites() -> None:
    found = sites(
        """
        import keras
        import torch
        from torch import nn


        def run(model: nn.Module, x):
            return model(x)


        def train(m, opt=torch.optim.SGD([])):
            m.fit()
            opt.step()


        def build():
            model = keras.Sequential()
            return model


        train(build())
        """
    )
    assert found["model"] == ("torch.nn.Module.__call__", "method")
    assert found["m.fit"] == ("keras.Sequential.fit", "method")
    assert found["opt.step"] == ("torch.optim.SGD.step", "method")
    assert "build" not in found and "train" not in found  # user functions: not wrapped


def test_annotations_are_never_wrapped() -> None:
    found = sites(
        """
        import torch


        def f(x: torch.device("cpu") = torch.device("cpu")) -> torch.Size([1]):
            y: torch.zeros(1) = torch.ones(1)
            return y
        """
    )
    assert list(found) == ["torch.device", "torch.ones"]


def test_extra_roots_and_dotted_roots() -> None:
    source = "import numpy as np\nnp.mean([1])\nnp.linalg.norm([1])\n"
    assert apis(source) == []
    assert apis(source, ("numpy",)) == ["numpy.mean", "numpy.linalg.norm"]
    assert apis(source, ("numpy.linalg",)) == ["numpy.linalg.norm"]


def test_manifest_fields() -> None:
    result = instrument_source(
        "import torch\n\n\nclass A:\n    def go(self):\n"
        "        return torch.ones(\n            2)\n",
        "pkg/a.py",
        Roots(DEFAULT_ROOTS),
    )
    assert result.sites == [
        {
            "key": "pkg/a.py:6:15",
            "line": 6,
            "col": 15,
            "api": "torch.ones",
            "written": "torch.ones",
            "kind": "function",
            "root": "torch",
            "function": "A.go",
            "source": "torch.ones(",
        }
    ]
