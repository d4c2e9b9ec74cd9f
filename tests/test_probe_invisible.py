"""The probe is invisible to the program: no frame of fecomlite stands between the user's line
and the framework call, on the first (sized) call of a site and after a resample alike, so APIs
that look at their caller (`torch.fx.wrap`, TorchScript's scope lookup), warning attribution and
filters, FX tracing and dynamo
behave exactly as without instrumentation.

One two-file project is run original and instrumented (real probe, events to a spool file) and
must print the same; the program forces the sized path again itself (`resample`: the probe's
per-site state reset, a no-op without the probe)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from textwrap import dedent

import pytest

from fecomlite.instrument.project import instrument_path

REPO = Path(__file__).resolve().parents[1]

PREP = """
    import torch
    import torch.nn.functional as F


    def clamp_norm(x):
        return x / (x.norm() + 1)


    torch.fx.wrap("clamp_norm")


    class Scaler:
        def __init__(self, k: float):
            self.k = k

        def apply(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) * self.k


    ScriptedScaler = torch.jit.script(Scaler)


    def soften(x):
        return F.softmax(x)  # no dim: warns, from this module
"""
MAIN = """
    import importlib
    import sys
    import warnings

    import torch
    import torch._dynamo
    from torch import nn

    import prep


    def resample():
        probe = sys.modules.get("fecomlite.runtime.probe")
        if probe is not None:
            probe.forget_decisions()


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return prep.clamp_norm(torch.relu(self.fc(x)))


    def step(v):
        v = torch.sin(v)
        if torch.allclose(v, v):
            v = v + 1
        return torch.cos(v)


    warnings.filterwarnings("error", module="prep")
    x = torch.ones(2, 4)
    for attempt in ("first", "resampled"):
        if attempt == "resampled":
            prep = importlib.reload(prep)  # module level again: fx.wrap, jit.script
        try:
            prep.soften(x)
            print(attempt, "softmax: no error")
        except UserWarning as warning:
            print(attempt, "softmax raised", str(warning)[:40])
        traced = torch.fx.symbolic_trace(Net())
        print(attempt, "fx", [n.op for n in traced.graph.nodes], tuple(traced(x).shape))
        print(attempt, "script", prep.ScriptedScaler(2.0).apply(x).sum().item())
        explained = torch._dynamo.explain(step)(x)
        print(attempt, "dynamo", explained.graph_count, explained.graph_break_count)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.tensor(torch.ones(1))  # warns: copy construct, attributed to this line
        print(attempt, "warned at", [(w.filename.rsplit("/", 1)[-1], w.lineno) for w in seen])
        resample()
"""


def _run(folder: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(folder),
           "FECOMLITE_SPOOL": str(folder / "spool.bin"), "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "main.py"], cwd=folder, env=env, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.slow
def test_caller_frames_warnings_tracers_and_dynamo_see_the_users_code(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "prep.py").write_text(dedent(PREP).lstrip())
    (src / "main.py").write_text(dedent(MAIN).lstrip())
    result = instrument_path(src, tmp_path / "copy")
    sites = {str(s["written"]) for s in result.sites.values()}
    assert {"torch.fx.wrap", "torch.jit.script", "F.softmax", "torch.tensor"} <= sites
    original, instrumented = _run(src), _run(result.out)
    assert original.returncode == 0, original.stderr
    assert instrumented.stdout == original.stdout, instrumented.stderr
    assert instrumented.returncode == 0
    out = original.stdout
    assert "first softmax raised" in out and "resampled softmax raised" in out
    assert "call_function" in out and "warned at [('main.py'," in out


TF_UNCAUGHT = """
    import tensorflow as tf

    x = tf.constant([1.0, 2.0, 3.0])
    print("before", tf.reduce_sum(x).numpy())
    tf.reshape(x, [2, 2])  # uncaught: TensorFlow rebuilds the traceback from live frames
"""


@pytest.mark.slow
def test_an_uncaught_tensorflow_error_prints_the_same_traceback(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text(dedent(TF_UNCAUGHT).lstrip())
    result = instrument_path(src, tmp_path / "copy")
    assert "__fecomlite__.call(" in (result.out / "main.py").read_text()
    original, instrumented = _run(src), _run(result.out)
    assert original.returncode == instrumented.returncode == 1
    assert "InvalidArgumentError" in original.stderr
    assert instrumented.stdout == original.stdout
    printed, expected = (_traceback_lines(instrumented.stderr.replace(str(result.out), str(src))),
                         _traceback_lines(original.stderr))
    user_line = next(i for i, line in enumerate(expected) if "tf.reshape(x, [2, 2])" in line)
    assert printed[user_line:user_line + 2] == expected[user_line:user_line + 2]  # with carets
    # every entry's file, line and source as Python prints them; under the frame TensorFlow
    # rebuilt from a live frame Python draws the columns of another line: no carets there
    assert _without_carets(printed) == _without_carets(expected)


def _traceback_lines(stderr: str) -> list[str]:
    start = "Traceback (most recent call last)"  # TensorFlow's own log lines carry times
    return stderr[stderr.index(start):].splitlines()


def _without_carets(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip(" ^~")]


def test_a_program_run_in_place_keeps_its_exception_hooks(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        "import sys, threading\n"
        "import fecomlite.runtime.probe\n"
        "print(sys.excepthook is sys.__excepthook__,"
        " threading.excepthook is threading.__excepthook__)\n"
    )
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True True\n"
