"""Calls whose callee the instrumenter cannot name statically (a project function's result, an
attribute, a container element, a name from an earlier notebook cell) are wrapped by
`probe.dcall`, which looks at the callee when the call runs: a framework callee is measured and
named as any site; anything else is called straight through and leaves no event. Calls that are
provably not framework calls (builtins, the project's own functions, literals' methods) are not
wrapped at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from textwrap import dedent

import pytest

from fecomlite.instrument.project import instrument_path
from fecomlite.runtime import batch_codec

REPO = Path(__file__).resolve().parents[1]

FACTORY = """
    import torch
    from torch import nn


    def make_net() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


    def make_optimizer(net):
        return torch.optim.SGD(net.parameters(), lr=0.1)
"""
TRAIN = """
    x = torch.randn(16, 4)
    losses = []
    for step in range(3):
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))
    print("losses", len(losses), " ".join(str(v) for v in [1, 2]))
"""
TWO_MODULES = {
    "factory.py": FACTORY,
    "main.py": "import torch\nfrom factory import make_net, make_optimizer\n\n"
    "net = make_net()\nopt = make_optimizer(net)\n" + dedent(TRAIN),
}
ONE_FILE = {
    "main.py": dedent(FACTORY) + "\n\nnet = make_net()\nopt = make_optimizer(net)\n"
    + dedent(TRAIN),
}


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (root / rel).write_text(dedent(text).lstrip(), encoding="utf-8")
    return root


def test_calls_on_objects_of_unknown_origin_are_decided_at_run_time(tmp_path: Path) -> None:
    result = instrument_path(write(tmp_path / "p", TWO_MODULES), list_only=True)
    assert result.ok, result.failures
    main = {str(s["written"]): s for s in result.sites.values() if s["file"] == "main.py"}
    for written in ("net", "opt.zero_grad", "loss.backward", "opt.step", "loss.item"):
        assert main[written]["resolved"] == "runtime", written
        assert main[written]["kind"] == "call"
    assert main["torch.randn"]["api"] == "torch.randn" and "resolved" not in main["torch.randn"]
    # the project's own functions, builtins and a list's methods are never framework calls
    for written in ("make_net", "make_optimizer", "range", "round", "print", "losses.append",
                    '" ".join', "str"):
        assert written not in main, written


def test_a_copy_calls_dcall_and_list_names_the_sites_run_time_resolved(tmp_path: Path) -> None:
    project = write(tmp_path / "p", TWO_MODULES)
    result = instrument_path(project, tmp_path / "copy")
    text = (result.out / "main.py").read_text()
    assert '__fecomlite__.dcall("main.py:13:4", opt.step)' in text
    assert '__fecomlite__.call("main.py:7:4", torch.randn, 16, 4)' in text
    listed = subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", "instrument", str(project), "--list"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    step = next(line for line in listed.stdout.splitlines() if line.startswith("main.py:13:4"))
    assert "run time" in step
    assert "decided at run time" in listed.stdout


def test_a_method_on_a_result_of_unknown_type_is_decided_when_it_runs(tmp_path: Path) -> None:
    files = {"main.py": """
        from tensorflow import keras

        model = keras.Sequential([keras.layers.Dense(2)])
        probs = model.predict([[1.0]])
        print(probs.argmax())
    """}
    result = instrument_path(write(tmp_path / "p", files), list_only=True)
    argmax = next(s for s in result.sites.values() if s["written"] == "probs.argmax")
    assert argmax["resolved"] == "runtime"  # a NumPy array at run time: no framework API


PROBE_SCRIPT = """
import traceback
import fractions

import numpy

import fecomlite.runtime.probe as p


def mine(x):
    return x + 1


out = []
for i in range(4):
    for dcall in (p.dcall, p._python_dcall):
        tag = "c" if dcall is p.dcall else "py"
        out.append(dcall(f"{tag}:1:0", mine, i))
        out.append(dcall(f"{tag}:2:0", fractions.Fraction, i, 3))
        half = fractions.Fraction(1, 2)
        out.append(dcall(f"{tag}:3:0", half.limit_denominator, 10))
        out.append(dcall(f"{tag}:4:0", mine if i % 2 else fractions.Fraction, i))
        out.append(int(dcall(f"{tag}:5:0", numpy.arange(3).argmax)))
        try:
            dcall(f"{tag}:6:0", mine, "x")
        except TypeError as error:
            frames = traceback.extract_tb(error.__traceback__)
            out.append([f.name for f in frames])
print(repr([item if isinstance(item, list) else str(item) for item in out]))
"""


def _spool_counts(spool: Path) -> tuple[Counter[str], dict[str, dict[str, str]]]:
    counts: Counter[str] = Counter()
    names: dict[str, dict[str, str]] = {}
    for header, columns in _batches(spool):
        counts.update(header["sites"][i] for i in columns["site"])
        names.update(header.get("names") or {})
    return counts, names


def _batches(spool: Path) -> list[tuple[dict, dict]]:
    with open(spool, "rb") as f:
        return [batch_codec.decode(record) for record in batch_codec.read_records(f)]


def _hyperparameters(folder: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    for header, _ in _batches(folder / "spool.bin"):
        found.update({k: v for k, v in (header.get("hyperparams") or {}).items()
                      if k != "sources"})
    return found


def run_probed(folder: Path, script: str, roots: list[str]) -> tuple[str, Counter[str], dict]:
    (folder / "prog.py").write_text(script)
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"api_roots": roots, "sites": {}}))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(folder),
           "FECOMLITE_SPOOL": str(folder / "spool.bin"), "FECOMLITE_MANIFEST": str(manifest),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "prog.py"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    counts, names = _spool_counts(folder / "spool.bin")
    return done.stdout, counts, names


def test_dcall_measures_framework_callees_and_passes_the_others_through(tmp_path: Path) -> None:
    stdout, counts, names = run_probed(tmp_path, PROBE_SCRIPT, ["fractions"])
    for tag in ("c", "py"):
        assert counts[f"{tag}:1:0"] == 0  # the user's function
        assert counts[f"{tag}:2:0"] == 4 and counts[f"{tag}:3:0"] == 4  # class, method
        assert counts[f"{tag}:4:0"] == 2  # decided again each time the callee changes
        assert counts[f"{tag}:5:0"] == 0  # a NumPy method: numpy is no root here
        assert counts[f"{tag}:6:0"] == 0
        assert names[f"{tag}:2:0"]["api"] == "fractions.Fraction"
        assert names[f"{tag}:3:0"]["api"] == "fractions.Fraction.limit_denominator"
    out = eval(stdout)  # noqa: S307 - the program's own repr
    first_round = [["1", "0", "1/2", "0", "2", ["<module>", "mine"]]] * 2  # C, then Python
    assert [out[:6], out[6:12]] == first_round
    tracebacks = [item for item in out if isinstance(item, list)]
    assert tracebacks and all(frames == ["<module>", "mine"] for frames in tracebacks)


def _api_counts(folder: Path) -> Counter[str]:
    counts, names = _spool_counts(folder / "spool.bin")
    manifest = json.loads((folder / ".fecomlite" / "manifest.json").read_text())
    by_api: Counter[str] = Counter()
    for site, n in counts.items():
        named = names.get(site) or {}
        by_api[named.get("api") or manifest["sites"][site]["api"]] += n
    return by_api


def _run_copy(copy: Path, script: str = "main.py") -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(copy),
           "FECOMLITE_SPOOL": str(copy / "spool.bin"),
           "FECOMLITE_MANIFEST": str(copy / ".fecomlite" / "manifest.json"),
           "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, script], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_torch_project_trained_in_another_module_is_measured_as_one_file(
    tmp_path: Path,
) -> None:
    split = instrument_path(write(tmp_path / "two", TWO_MODULES), tmp_path / "two-copy")
    whole = instrument_path(write(tmp_path / "one", ONE_FILE), tmp_path / "one-copy")
    assert _run_copy(split.out) == _run_copy(whole.out)
    counts = _api_counts(split.out)
    assert counts == _api_counts(whole.out)
    assert _hyperparameters(split.out) == _hyperparameters(whole.out)
    for api in ("torch.nn.Sequential.__call__", "torch.Tensor.backward", "torch.optim.SGD.step",
                "torch.optim.SGD.zero_grad", "torch.Tensor.mean"):
        assert counts[api] == 3, (api, counts)


KERAS_FACTORY = """
    import keras


    def build_model():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                  keras.layers.Dense(1)])
        return model
"""
KERAS_TRAIN = """
    import numpy as np

    x = np.ones((32, 4), "float32")
    y = np.zeros((32, 1), "float32")
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    print("loss", model.evaluate(x, y, verbose=0) >= 0)
"""


@pytest.mark.slow
def test_a_keras_model_built_in_another_module_is_fitted_and_measured(tmp_path: Path) -> None:
    two = {"factory.py": KERAS_FACTORY,
           "main.py": "from factory import build_model\n\nmodel = build_model()\n"
           + dedent(KERAS_TRAIN)}
    one = {"main.py": dedent(KERAS_FACTORY) + "\n\nmodel = build_model()\n" + dedent(KERAS_TRAIN)}
    split = instrument_path(write(tmp_path / "two", two), tmp_path / "two-copy")
    whole = instrument_path(write(tmp_path / "one", one), tmp_path / "one-copy")
    assert _run_copy(split.out) == _run_copy(whole.out) == "loss True\n"
    counts = _api_counts(split.out)
    assert counts == _api_counts(whole.out)
    for api in ("keras.Sequential.compile", "keras.Sequential.fit", "keras.Sequential.evaluate"):
        assert counts[api] == 1, (api, counts)
    hyperparameters = _hyperparameters(split.out)  # read from `fit` and `compile` as in one file
    assert hyperparameters == _hyperparameters(whole.out)
    assert hyperparameters["epochs"] == 2 and hyperparameters["batch_size"] == 16
