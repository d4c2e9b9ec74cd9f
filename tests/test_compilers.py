"""Compiled code survives instrumentation: what a function or module of one file becomes when
another file compiles it (torch.compile, torch.jit.script, torch.jit.trace) is the same with and
without fecomlite, and so are tracebacks and `inspect.getsource`.

Each test writes a two-file project, instruments it, and runs the original and the instrumented
copy, each in its own process with the real probe (no server: events go to a spool file).
"""

from __future__ import annotations

import importlib
import linecache
import subprocess
import sys
import threading
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

from fecomlite.instrument.project import ORIGINALS, instrument_path
from fecomlite.runtime import batch_codec
from fecomlite.runtime import source as probe_source

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 300

# A dynamo backend that prints the code of each graph it gets: equal output, equal graphs.
SHOW_GRAPHS = dedent(
    """
    import torch._dynamo
    from torch._dynamo.utils import counters


    def show(gm, example_inputs):
        print("graph:", gm.code.strip())
        return gm.forward
    """
)


def _project(root: Path, files: dict[str, str]) -> tuple[Path, Path]:
    src = root / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(dedent(text).lstrip())
    result = instrument_path(src, root / "copy", ["math"])
    assert result.ok and result.sites, result.failures
    return src, result.out


def _start(folder: Path, args: tuple[str, ...]) -> subprocess.Popen[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(folder),
        "FECOMLITE_SPOOL": str(folder / "spool.bin"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "main.py", *args],
        cwd=folder,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=RUN_TIMEOUT_S)
    return process.returncode, out, err


def _run_both(src: Path, copy: Path, *args: str) -> tuple[tuple[int, str, str], ...]:
    """The original and the instrumented copy, at once; paths in the output are made equal."""
    original, instrumented = _start(src, args), _start(copy, args)
    first, second = _finish(original), _finish(instrumented)
    second = (second[0], *(text.replace(str(copy), str(src)) for text in second[1:]))
    return first, second


def _assert_same(src: Path, copy: Path, *args: str) -> str:
    original, instrumented = _run_both(src, copy, *args)
    assert original[0] == 0, original[2]
    assert instrumented == original, instrumented[2]
    return original[1]


def test_torchscript_compiles_functions_and_modules_of_another_file(tmp_path: Path) -> None:
    src, copy = _project(
        tmp_path,
        {
            "ops.py": """
                import math

                import torch
                from torch import nn


                def f(x: torch.Tensor) -> torch.Tensor:
                    return torch.relu(x)


                def guarded(x: torch.Tensor) -> torch.Tensor:
                    if not torch.jit.is_scripting():
                        x = x * math.sqrt(4.0)
                    return torch.tanh(x)


                class Stats(nn.Module):
                    def __init__(self) -> None:
                        super().__init__()
                        self.scale = nn.Linear(2, 2)

                    def forward(self, x: torch.Tensor) -> torch.Tensor:
                        return self.spread(self.scale(x)) + torch.mean(x)

                    @torch.jit.export
                    def spread(self, x: torch.Tensor) -> torch.Tensor:
                        return torch.std(x, dim=0)

                    @torch.jit.export
                    def peak(self, x: torch.Tensor) -> torch.Tensor:
                        return torch.amax(torch.abs(x), dim=1)
                """,
            "main.py": """
                import torch
                from ops import Stats, f, guarded

                x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]])
                print(torch.jit.script(f)(x))
                print(torch.jit.script(f).code)
                print(guarded(x), torch.jit.script(guarded)(x))
                torch.manual_seed(0)
                stats = torch.jit.script(Stats())
                print(stats(x), stats.spread(x), stats.peak(x))
                print(stats.code, stats.peak.code)
                """,
        },
    )
    instrumented_ops = (copy / "ops.py").read_text()
    assert '"ops.py:8:11", torch.relu' in instrumented_ops  # eager calls are still measured
    assert "not torch.jit.is_scripting():" in instrumented_ops  # the guard is never wrapped
    out = _assert_same(src, copy)
    assert "tensor([[0., 2.]," in out and "def peak" in out


def test_torch_compile_of_another_file_captures_the_original_graphs(tmp_path: Path) -> None:
    src, copy = _project(
        tmp_path,
        {
            "ops.py": """
                import torch
                from torch import nn


                def f(x):
                    return torch.sin(x) * torch.cos(x)


                class Net(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(4, 3)

                    @torch.compile(backend="eager", fullgraph=True)
                    def embed(self, x):
                        return torch.softmax(self.fc(x), dim=-1)
                """,
            "main.py": SHOW_GRAPHS
            + dedent(
                """
                import torch
                from ops import Net, f

                g = torch.compile(f, backend=show)
                for n in (2, 3, 4):  # the second call recompiles with a dynamic size
                    print(n, g(torch.ones(n)))
                torch._dynamo.reset()
                whole = torch.compile(f, backend=show, fullgraph=True)
                print(whole(torch.ones(3)))
                torch.manual_seed(0)
                print(Net().embed(torch.ones(2, 4)))
                print(dict(counters["stats"]))
                print("breaks", dict(counters["graph_break"]))
                """
            ),
        },
    )
    out = _assert_same(src, copy)
    assert out.count("graph:") == 3 and "torch.sin(l_x_)" in out  # embed: its own backend
    assert "'unique_graphs': 4" in out and "breaks {}\n" in out


def _spooled_sites(folder: Path) -> set[str]:
    with open(folder / "spool.bin", "rb") as spool:
        return {
            header["sites"][index]
            for header, columns in map(batch_codec.decode, batch_codec.read_records(spool))
            for index in columns["site"]
        }


def test_tf_function_of_another_file_traces_the_original_and_records_no_tracing(
    tmp_path: Path,
) -> None:
    src, copy = _project(
        tmp_path,
        {
            "ops.py": """
                import tensorflow as tf


                def step(x):
                    y = tf.matmul(x, x)
                    if tf.reduce_sum(y) > 0:
                        y = tf.nn.relu(y)
                    return tf.reduce_mean(y)


                def fast(x):
                    return tf.reduce_sum(tf.sin(x) * tf.cos(x))


                def eager(x):
                    return tf.reduce_max(x)
                """,
            "main.py": """
                import tensorflow as tf
                from ops import eager, fast, step

                tf.get_logger().setLevel("ERROR")  # retracing warnings name addresses
                g = tf.function(step)
                h = tf.function(fast, jit_compile=True)
                raw = tf.function(fast, autograph=False)  # runs the body's Python as it is
                for n in (2, 3, 4):  # a trace for each shape
                    x = tf.ones((n, n))
                    print(float(g(x)), float(h(x)), float(raw(x)), float(eager(x)))
                counts = (g, h, raw)
                print([f.experimental_get_tracing_count() for f in counts])
                print(tf.autograph.to_code(step))
                print(h.experimental_get_compiler_ir(tf.ones((2, 2)))(stage="hlo").count("sin"))
                """,
        },
    )
    original, instrumented = _run_both(src, copy)  # stderr: TensorFlow's timestamped log
    assert original[0] == 0 and instrumented[:2] == original[:2], instrumented[2]
    out = original[1]
    assert "[3, 3, 3]" in out and "ag__.if_stmt" in out
    sites = _spooled_sites(copy)
    assert {"main.py:10:16", "main.py:10:29", "main.py:10:42"} <= sites, sites  # compiled
    assert [site for site in sites if site.startswith("ops.py")] == ["ops.py:16:11"]  # eager


@pytest.mark.parametrize("earlier_calls", [0, 1, 2, 3])
def test_jit_trace_after_earlier_calls_of_the_traced_sites(
    tmp_path: Path, earlier_calls: int
) -> None:
    src, copy = _project(
        tmp_path,
        {
            "layer.py": """
                import torch
                from torch import nn


                class M(nn.Module):
                    def forward(self, x):
                        return torch.permute(torch.relu(x), (1, 0))
                """,
            "main.py": """
                import sys

                import torch
                from layer import M

                m = M()
                for _ in range(int(sys.argv[1])):
                    m(torch.ones(2, 3))
                traced = torch.jit.trace(m, torch.ones(2, 3))  # checks two more invocations
                print(traced(-torch.ones(3, 5)).shape, traced.code)
                """,
        },
    )
    if earlier_calls == 0:
        _assert_same(src, copy, "0")
        return
    code, out, err = _finish(_start(copy, (str(earlier_calls),)))
    assert code == 0 and "torch.Size([5, 3])" in out and "permute" in out, err


def test_tracebacks_and_getsource_show_the_users_lines(tmp_path: Path) -> None:
    src, copy = _project(
        tmp_path,
        {
            "calc.py": """
                import inspect
                import math

                import torch


                def norm(x):
                    y = torch.sqrt(x)
                    return math.sqrt(-1.0) + y


                def show():
                    print(inspect.getsource(norm))
                """,
            "main.py": """
                import traceback

                import torch
                from calc import norm, show

                show()
                for attempt in range(5):  # the sized path first, then the fast path
                    try:
                        norm(torch.ones(2))
                    except ValueError:
                        print(traceback.format_exc())
                norm(torch.ones(2))
                """,
        },
    )
    assert "__fecomlite__.call(" in (copy / "calc.py").read_text()
    original, instrumented = _run_both(src, copy)
    assert original[0] == 1 and "ValueError: math domain error" in original[2]
    assert instrumented == original  # printed and uncaught tracebacks, line and caret alike
    assert "return math.sqrt(-1.0) + y" in original[2] and "fecomlite" not in instrumented[2]


def test_linecache_serves_the_original_until_cleared_and_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(linecache, "updatecache", linecache.updatecache)  # restored after
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    src, copy = _project(
        tmp_path,
        {"main.py": "import math\n\nprint(math.sqrt(4.0))\n", "plain.py": "x = 1\n"},
    )
    instrumented = str(copy / "main.py")
    assert (copy / ORIGINALS / "main.py").read_text() == (src / "main.py").read_text()
    assert not (copy / ORIGINALS / "plain.py").exists()  # unchanged files are their own text
    probe_source.serve_original_sources()
    probe_source.serve_original_sources()  # a second import wraps nothing twice
    assert linecache.getline(instrumented, 3) == "print(math.sqrt(4.0))\n"
    linecache.checkcache()  # the copy on disk differs from the entry: it is kept all the same
    assert linecache.getlines(instrumented) == (src / "main.py").read_text().splitlines(True)
    linecache.clearcache()
    assert linecache.getline(instrumented, 3) == "print(math.sqrt(4.0))\n"
    assert probe_source.original_of(str(copy / "plain.py")) is None
    assert not getattr(linecache.updatecache.__wrapped__, "__fecomlite__", False)


def test_no_original_is_kept_where_lines_moved(tmp_path: Path) -> None:
    _, copy = _project(tmp_path, {"main.py": "if True:\n    import math\n    math.sqrt(4.0)\n"})
    assert (copy / "main.py").read_text().count("\n") == 4  # the probe import took a line
    assert not (copy / ORIGINALS / "main.py").exists()
    assert probe_source.original_of(str(copy / "main.py")) is None


def test_every_probe_entry_point_compiles_to_the_plain_calls_graph() -> None:
    """The C path, the pure-Python fallback and the GPU-synchronising path alike: one graph,
    no break under fullgraph=True, nothing of the probe in it."""
    from fecomlite.runtime import probe

    torch = importlib.import_module("torch")
    dynamo = importlib.import_module("torch._dynamo")  # registered by the probe's import hook
    graphs: list[str] = []

    def keep(gm: Any, inputs: list[Any]) -> Any:
        graphs.append(gm.code)
        return gm.forward

    x = torch.ones(3)
    entries = (probe.call, probe._python_call, probe.dcall, probe._python_dcall)
    for entry in dict.fromkeys(entries):
        dynamo.reset()
        graphs.clear()

        def twice(x: Any, entry: Any = entry) -> Any:
            return entry("t.py:1:0", torch.sin, x) + entry("t.py:2:0", torch.cos, x=x)

        compiled = torch.compile(twice, backend=keep, fullgraph=True)
        assert torch.equal(compiled(x), torch.sin(x) + torch.cos(x))
        assert len(graphs) == 1, entry
        assert "torch.sin(" in graphs[0] and "torch.cos(" in graphs[0] and "call" not in graphs[0]
