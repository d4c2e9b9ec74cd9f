"""`fecomlite run --trace-layers` end to end: real server, real programs, PyTorch and Keras."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.build import build_report
from fecomlite.report.render import write_report
from fecomlite.runtime.batch_codec import CONTINUES
from fecomlite.store import Store

FAST = ["--repeat", "1", "--idle", "0.5", "--tail", "0.3", "--gate-max-wait", "2"]

TORCH_PROGRAM = """
    import torch
    import torch.nn as nn

    torch.manual_seed(0)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.body = torch.compile(
                nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16)),
                backend="aot_eager",
            )
            self.head = nn.Linear(16, 3)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.head(self.act(self.body(self.encoder(x).mean(1))))


    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(8, 6, 16)
    y = torch.randint(0, 3, (8,))
    for step in range(4):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        print("step", step, round(loss.item(), 4))
"""

KERAS_PROGRAM = """
    import numpy as np
    import keras


    class Scale(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), initializer="ones")

        def call(self, x):
            return x * self.w


    def graph():
        inp = keras.Input((8,))
        h = keras.layers.Dense(16, activation="relu", name="dense_1")(inp)
        h = Scale(name="scale")(h)
        return inp, keras.layers.Dense(1, name="out")(h)


    keras.utils.set_random_seed(0)
    x = np.random.rand(64, 8).astype("float32")
    y = np.random.rand(64, 1).astype("float32")
    eager_model = keras.Model(*graph(), name="eager_model")
    eager_model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    eager_model.fit(x, y, epochs=2, batch_size=16, verbose=0)


    class Steps(keras.callbacks.Callback):
        train = test = predict = 0

        def on_train_batch_end(self, batch, logs=None):
            self.train += 1

        def on_test_batch_end(self, batch, logs=None):
            self.test += 1

        def on_predict_batch_end(self, batch, logs=None):
            self.predict += 1


    steps = Steps()
    graph_model = keras.Model(*graph(), name="graph_model")
    graph_model.compile(optimizer="sgd", loss="mse")
    graph_model.fit(
        x, y, epochs=3, batch_size=8, validation_split=0.25, verbose=0, callbacks=[steps]
    )
    print("steps", steps.train, steps.test)
    xla_model = keras.Model(*graph(), name="xla_model")
    xla_model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    xla_model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    print("eager", round(float(eager_model.evaluate(x, y, verbose=0)), 4))
    evaluated, predicted = Steps(), Steps()
    print("graph", round(float(graph_model.evaluate(x, y, verbose=0, callbacks=[evaluated])), 4))
    graph_model.predict(x, batch_size=16, verbose=0, callbacks=[predicted])
    print("driven", evaluated.test, predicted.predict)
    print("xla", round(float(xla_model.evaluate(x, y, verbose=0)), 4))
"""

TF_LOG_TIME = re.compile(r"^([IWEF]\d{4}) \S+\s+\d+ ")  # "I0000 00:00:1796.08  1234 "
ADDRESS = re.compile(r"0x[0-9a-f]+")


def run_traced(home: Path, tmp_path: Path, body: str) -> tuple[Store, int, str, str]:
    """(store, run id, the program's output under the run, its output run plainly)."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    result = run_cli(tmp_path, "run", "--home", str(home), "--trace-layers", *FAST, str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    plain = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    store = Store(home / "store.sqlite", create=False)
    run_id = max(r["id"] for r in store.runs())
    logs = (home / "logs").glob("prog-*/rep-1.log")  # the module's runs share the home
    log = max(logs, key=lambda p: p.stat().st_mtime_ns).read_text()  # this run's: the newest
    return store, run_id, log, plain.stdout + plain.stderr


def ancestors(a, row: int) -> list[str]:
    out, p = [], int(a.calls["parent"][row])
    while p >= 0:
        out.append(a.api_names[a.calls["api"][p]])
        p = int(a.calls["parent"][p])
    return out


def rows_of(a, api: str) -> np.ndarray:
    return np.flatnonzero(a.calls["api"] == a.api_names.index(api))


def calls_of(a, api: str) -> np.ndarray:
    """The rows that begin a call (a call cut in pieces has one row a piece)."""
    rows = rows_of(a, api)
    return rows[(a.calls["status"][rows] & CONTINUES) == 0]


def assert_layers_nest_and_conserve_energy(a) -> None:
    """Attribution invariants with layer events: every call lies inside its parent (a stack,
    per thread), a parent's energy is its self energy plus its children's (so the layers' self
    energy sums within their parent's), and the top-level calls hold the energy in calls: layers
    add none."""
    parent, t0, t1 = a.calls["parent"], a.calls["t_start_ns"], a.calls["t_end_ns"]
    nested = parent >= 0
    assert np.all(t0[nested] >= t0[parent[nested]]) and np.all(t1[nested] <= t1[parent[nested]])
    for d in a.domains:
        energy = a.calls["energy_J"][d["domain"]]
        own = a.calls["self_energy_J"][d["domain"]]
        children = np.bincount(parent[nested], weights=energy[nested], minlength=energy.size)
        np.testing.assert_allclose(energy, own + children, rtol=1e-9, atol=1e-12)
        top = float(energy[~nested].sum())
        assert top == pytest.approx(d["in_calls_J"], rel=1e-6, abs=1e-9), d["domain"]


def assert_tree_adds_up(nodes: list[dict]) -> None:
    """On every row of the report's layer tree, inclusive = self + the children's inclusive."""
    for n in nodes:
        if n["children"]:
            children = sum(c["inclusive_J"] for c in n["children"])
            assert n["inclusive_J"] == pytest.approx(n["self_J"] + children, rel=1e-6, abs=1e-9)
            assert_tree_adds_up(n["children"])


def assert_each_layer_under_its_enclosing_layer(a, sep: str) -> None:
    """Every layer event's parent is the event of the nearest enclosing layer of the same phase
    and driving call (`encoder.layers.0.norm2` under `encoder.layers.0`), or a call when no
    layer encloses it."""
    from fecomlite.runtime.layers import facts

    parsed = {name: facts.parse(name) for name in a.api_names}
    for row in range(a.calls["api"].size):
        parts = parsed[a.api_names[a.calls["api"][row]]]
        if parts is None:
            continue
        steps = parts["path"].split(sep)
        expected = None
        for n in range(len(steps) - 1, 0, -1):
            same = {**parts, "path": sep.join(steps[:n])}
            found = [x for x, p in parsed.items()
                     if p is not None and {**p, "class": parts["class"]} == same]
            if found:
                expected = found[0]
                break
        up = int(a.calls["parent"][row])
        got = a.api_names[a.calls["api"][up]] if up >= 0 else None
        if expected is None:
            assert got is not None and facts.parse(got) is None, (parts, got)
        else:
            assert got == expected, (parts, got)


@pytest.mark.slow
def test_torch_layers_forward_and_backward_nest_under_the_driving_calls(home, tmp_path):
    store, run_id, log, plain = run_traced(home, tmp_path, TORCH_PROGRAM)
    assert log == plain  # the program prints exactly what it prints without the flag
    a = analyse_run(store, run_id)
    attn = "layer:Net/encoder.layers.0.self_attn (MultiheadAttention)"
    attn_back = "layer-backward:Net/encoder.layers.0.self_attn (MultiheadAttention)"
    assert calls_of(a, attn).size == 4 and calls_of(a, attn_back).size == 4
    # every layer ran once a step: one call a forward, one a backward pass (4 each), however
    # its backward span was cut around its siblings'
    layers = [n for n in a.api_names if n.startswith(("layer:", "layer-backward:"))]
    assert len(layers) > 10
    assert {n: calls_of(a, n).size for n in layers} == dict.fromkeys(layers, 4)
    for row in rows_of(a, attn):
        chain = ancestors(a, row)
        assert chain[:2] == [
            "layer:Net/encoder.layers.0 (TransformerEncoderLayer)",
            "layer:Net/encoder (TransformerEncoder)",
        ]
        assert "torch.nn.Module.__call__" in chain  # model(x), the user's call
    for row in rows_of(a, attn_back):
        chain = ancestors(a, row)
        assert chain[0] == "layer-backward:Net/encoder.layers.0 (TransformerEncoderLayer)"
        assert chain[-1].endswith(".backward")  # loss.backward()
    assert_layers_nest_and_conserve_energy(a)
    assert_each_layer_under_its_enclosing_layer(a, ".")

    report = build_report(store, run_id, analysis=a)
    apis = {r["api"]: r for r in report.json["apis"]}
    row = apis[attn]
    assert (
        row["kind"] == "layer"
        and row["phase"] == "forward"
        and row["class"] == ("MultiheadAttention")
    )
    assert row["params"] == 4 * 16 * 16 + 4 * 16  # in_proj (3·d·d + 3·d) and out_proj (d·d + d)
    assert row["saved_bytes_max"] > 0
    assert row["parent_api"] == "layer:Net/encoder.layers.0 (TransformerEncoderLayer)"
    assert apis["layer:Net/encoder (TransformerEncoder)"]["parent_api"].startswith("torch.nn.")
    assert apis[attn_back]["phase"] == "backward"
    # torch.compile'd: one unit, forward and backward, nothing inside it
    assert apis["layer:Net/body (OptimizedModule)"]["compiled"] is True
    assert "layer-backward:Net/body (OptimizedModule)" in apis
    assert not [
        name for name in apis if name.startswith(("layer:Net/body.", "layer-backward:Net/body."))
    ]
    assert any("torch.compile" in n for n in report.json["layer_notes"])
    assert_tree_adds_up(report.context["layers"]["tree"])
    rows = layer_tree_in_chromium(report, tmp_path / "report")
    depth = {label: indent for label, indent in rows}
    assert (
        depth["encoder.layers.0.self_attn (MultiheadAttention)"]
        > depth["encoder.layers.0 (TransformerEncoderLayer)"]
        > depth["encoder (TransformerEncoder)"]
    )
    assert (
        depth["↩ encoder.layers.0.self_attn (MultiheadAttention) backward"]
        > depth["↩ encoder.layers.0 (TransformerEncoderLayer) backward"]
    )


def layer_tree_in_chromium(report, out: Path) -> list[tuple[str, float]]:
    """(label, indentation in px) of each row of the page's layer tree, as Chromium lays it out."""
    from playwright.sync_api import sync_playwright

    write_report(report, out, ["html"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.goto((out / "index.html").as_uri())
        cells = page.locator("#layers tbody tr td:first-child")
        rows = [
            (
                " ".join(cells.nth(i).inner_text().split()),
                float(cells.nth(i).evaluate("e => parseFloat(getComputedStyle(e).paddingLeft)")),
            )
            for i in range(cells.count())
        ]
        browser.close()
    return rows


@pytest.mark.slow
def test_keras_layers_in_eager_fit_and_in_a_compiled_fit(home, tmp_path):
    store, run_id, log, plain = run_traced(home, tmp_path, KERAS_PROGRAM)

    def program_lines(text: str) -> list[str]:
        """Lines, TensorFlow's log lines without their times and addresses (XLA logs its
        service's); sorted, as the log interleaves stdout and stderr and `plain` has one after
        the other."""
        return sorted(ADDRESS.sub("0x", TF_LOG_TIME.sub(r"\1", line)) for line in text.splitlines())

    # exactly what it prints without the flag: the profiler's start/stop log lines are dropped
    assert program_lines(log) == program_lines(plain)
    a = analyse_run(store, run_id)
    names = set(a.api_names)
    calls = {"fit": "keras.Model.fit", "evaluate": "keras.Model.evaluate",
             "predict": "keras.Model.predict"}
    for model, drivers in (("eager_model", ("fit", "evaluate")),
                           ("graph_model", ("fit", "evaluate", "predict"))):
        for layer in ("dense_1 (Dense)", "scale (Scale)", "out (Dense)"):
            for driver in drivers:  # each driving call's layers under that call, and only it
                api = f"layer:{model}/{layer} in {driver}"
                assert api in names, api
                for row in rows_of(a, api):
                    assert ancestors(a, row)[-1] == calls[driver]
    # the compiled step's gradient ops give backward spans, under fit only
    for layer in ("dense_1 (Dense)", "scale (Scale)", "out (Dense)"):
        api = f"layer-backward:graph_model/{layer} in fit"
        assert api in names, api
        for row in rows_of(a, api):
            # right under fit, even where TensorFlow's inter-op threads ran two layers' gradient
            # ops at once (their spans are cut apart, `spans.nest`)
            assert ancestors(a, row) == ["keras.Model.fit"]
    assert not [n for n in names if n.startswith("layer-backward:eager_model/")]
    assert not [n for n in names if n.startswith("layer-backward:") and not n.endswith(" fit")]
    # one call a step: forward in every train and validation step of the compiled fit (the
    # validation fit runs stays fit's), backward in every train step, forward in every step
    # of evaluate and of predict, as the callbacks counted them
    train, test = map(int, re.search(r"^steps (\d+) (\d+)$", log, re.M).groups())
    assert (train, test) == (18, 6)  # 3 epochs of 48 / 8 train and 16 / 8 validation samples
    evaluated, predicted = map(int, re.search(r"^driven (\d+) (\d+)$", log, re.M).groups())
    assert (evaluated, predicted) == (2, 4)  # 64 samples in batches of 32 and of 16
    for layer in ("dense_1 (Dense)", "scale (Scale)", "out (Dense)"):
        for api, count in ((f"layer:graph_model/{layer} in fit", train + test),
                           (f"layer-backward:graph_model/{layer} in fit", train),
                           (f"layer:graph_model/{layer} in evaluate", evaluated),
                           (f"layer:graph_model/{layer} in predict", predicted)):
            assert len(calls_of(a, api)) == count, api
    # XLA: one unit in fit and evaluate (no kernel of its executable names a layer)
    assert not [n for n in names if "xla_model/" in n]
    assert "keras.Model.fit" in names
    assert_layers_nest_and_conserve_energy(a)
    assert_each_layer_under_its_enclosing_layer(a, "/")

    report = build_report(store, run_id, analysis=a)
    apis = {r["api"]: r for r in report.json["apis"]}
    for model in ("eager_model", "graph_model"):
        scale = apis[f"layer:{model}/scale (Scale) in evaluate"]
        assert scale["kind"] == "layer" and scale["params"] == 16 and scale["class"] == "Scale"
        assert (scale["driver"], scale["parent_api"]) == ("evaluate", "keras.Model.evaluate")
    back = apis["layer-backward:graph_model/dense_1 (Dense) in fit"]
    assert back["phase"] == "backward" and back["params"] == 8 * 16 + 16
    assert back["parent_api"] == "keras.Model.fit"
    assert_tree_adds_up(report.context["layers"]["tree"])
    notes = " ".join(report.json["layer_notes"])
    assert "graph_model" in notes and "TensorFlow profiler" in notes
    assert "cannot be timed" not in notes and "could not time" not in notes
    assert "eager_model" not in notes
    assert "eager backward ops carry no layer name" in notes
    xla = [n for n in report.json["layer_notes"] if n.startswith("xla_model")]
    assert len(xla) == 1 and "XLA" in xla[0] and "3 layers are not timed" in xla[0]
