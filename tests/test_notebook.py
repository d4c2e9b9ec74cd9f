"""Notebooks: `fecomlite run NB.ipynb` runs the cells through IPython, and `%%fecomlite` measures
a cell method by method (tested through IPython's own test shell)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from IPython.testing.globalipapp import start_ipython
from stored_events import events_table
from test_run_e2e import FAST

from fecomlite.api.notebook_magic import CellReport
from fecomlite.runtime import probe
from fecomlite.store import Store


def notebook(path: Path, *cells: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "cells": [{"cell_type": "markdown", "metadata": {}, "source": "# a notebook"}]
                + [
                    {
                        "cell_type": "code",
                        "metadata": {},
                        "outputs": [],
                        "execution_count": None,
                        "source": c,
                    }
                    for c in cells
                ],
                "metadata": {},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    return path


def run_notebook(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    return subprocess.run(
        [sys.executable, "-m", "fecomlite.runner.notebook", str(path)],
        cwd=path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cells_run_in_order_with_magics_and_shell_escapes(tmp_path):
    nb = notebook(
        tmp_path / "nb.ipynb",
        "x = 2\nlisted = !echo from-shell",
        "%time y = x * 21",
        "%%bash\necho from-bash",
        "print('answer', y, listed[0])",
    )
    result = run_notebook(nb)
    assert result.returncode == 0, result.stderr
    assert "from-bash" in result.stdout and "answer 42 from-shell" in result.stdout


def test_the_first_failing_cell_stops_the_run_with_status_1(tmp_path):
    nb = notebook(tmp_path / "nb.ipynb", "print('first')", "1 / 0", "print('never')")
    result = run_notebook(nb)
    assert result.returncode == 1
    assert "first" in result.stdout and "ZeroDivisionError" in result.stdout
    assert "never" not in result.stdout


def test_fecomlite_run_measures_a_notebook_with_canonical_api_names(home, tmp_path):
    nb = notebook(
        tmp_path / "analysis.ipynb",
        "import numpy as np",
        "a = np.ones((32, 32))\nfor _ in range(10):\n    b = np.matmul(a, a)",
        "%time c = np.sum(b)\nprint('total', float(np.sum(b)))",
    )
    result = run_cli(
        tmp_path, "run", "--home", str(home), "--api", "numpy", "--repeat", "1", *FAST, str(nb)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with Store(home / "store.sqlite", create=False) as store:
        run_id = max(r["id"] for r in store.runs())
        assert store.run(run_id)["status"] == "finished"
        counts = dict(
            events_table(store).db.execute(
                "SELECT s.api, count(*) FROM events e JOIN sites s ON s.id = e.site_id "
                "WHERE e.run_id=? GROUP BY s.api",
                (run_id,),
            ).fetchall()
        )
    assert counts["numpy.matmul"] == 10 and counts["numpy.ones"] == 1
    assert not any(".ipynb[" in api for api in counts)  # names, not site keys


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython()
    shell.run_line_magic("load_ext", "fecomlite")
    return shell


def test_the_cell_magic_shows_the_cells_apis_by_canonical_name(ip):
    ip.run_cell("import numpy as numpy_alias\nimport torch")
    result = ip.run_cell(
        "%%fecomlite --api numpy\n"
        "a = torch.ones(128, 128)\n"
        "for _ in range(5):\n"
        "    b = torch.matmul(a, a)\n"
        "root = numpy_alias.sqrt(16.0)\n"
    )
    assert result.success, result.error_in_exec
    report = result.result
    assert isinstance(report, CellReport)
    assert ip.user_ns["root"] == 4.0 and tuple(ip.user_ns["b"].shape) == (128, 128)
    rows = {r["api"]: r for r in report.rows}
    assert set(rows) == {"torch.ones", "torch.matmul", "numpy.sqrt"}
    assert rows["torch.matmul"]["calls"] == 5 and rows["torch.ones"]["calls"] == 1
    assert 0 < rows["torch.matmul"]["time_s"] < report.m.duration_s
    for domain, cell_J in report.m.energy_J.items():
        in_calls = sum(r["energy"].get(domain, 0.0) for r in report.rows)
        assert 0 <= in_calls <= cell_J * 1.001, domain
    text, page = repr(report), report._repr_html_()
    assert "torch.matmul" in text and "<code>torch.matmul</code>" in page
    assert "estimated" in page or "measured" in page


def test_a_failing_cell_raises_as_usual_and_puts_the_probe_back(ip):
    sender = probe._sender
    result = ip.run_cell("%%fecomlite\nraise KeyError('inside')\n")
    assert isinstance(result.error_in_exec, KeyError)
    assert probe._sender is sender


OBJECTS_CELL = (
    "import torch\n"
    "net = torch.nn.Linear(4, 1)\n"
    "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
    "x = torch.ones(8, 4)"
)
TRAINING_LOOP = (
    "for _ in range(4):\n"
    "    loss = net(x).pow(2).mean()\n"
    "    opt.zero_grad()\n"
    "    loss.backward()\n"
    "    opt.step()\n"
)


def test_a_python_cell_magics_body_is_instrumented_and_other_languages_are_named(tmp_path):
    from fecomlite.instrument.names import DEFAULT_ROOTS, Roots
    from fecomlite.instrument.notebook import instrument_notebook

    nb = notebook(tmp_path / "nb.ipynb", OBJECTS_CELL, "%%time\n" + TRAINING_LOOP,
                  "%%bash\necho hi")
    rewrite, errors = instrument_notebook(nb.read_text(), "nb.ipynb", Roots(DEFAULT_ROOTS))
    assert not errors
    timed = {s["written"] for s in rewrite.sites if s.get("cell") == 2}
    assert {"net", "opt.zero_grad", "loss.backward", "opt.step"} <= timed
    cells = json.loads(rewrite.text)["cells"]
    assert cells[2]["source"].startswith("%%time\n")  # the magic line is kept, first
    assert cells[3]["source"] == "%%bash\necho hi"
    assert any("nb.ipynb[3]" in note and "%%bash" in note for note in rewrite.notes)


@pytest.mark.slow
def test_run_records_a_timed_training_cell_on_objects_of_an_earlier_cell(home, tmp_path):
    nb = notebook(tmp_path / "train.ipynb", OBJECTS_CELL, "%%time\n" + TRAINING_LOOP)
    result = run_cli(tmp_path, "run", "--home", str(home), "--repeat", "1", *FAST, str(nb))
    assert result.returncode == 0, result.stdout + result.stderr
    with Store(home / "store.sqlite", create=False) as store:
        run_id = max(r["id"] for r in store.runs())
        rows = events_table(store).db.execute(
            "SELECT s.key, count(*) FROM events e JOIN sites s ON s.id = e.site_id "
            "WHERE e.run_id=? GROUP BY s.key", (run_id,)).fetchall()
    per_line: dict[str, int] = {}
    for key, n in rows:
        if key.startswith("train.ipynb[2]:"):  # the %%time cell
            line = key.split(":")[1]
            per_line[line] = per_line.get(line, 0) + n
    # net(x), .pow, .mean; zero_grad; backward; step: 4 iterations each
    assert per_line == {"3": 12, "4": 4, "5": 4, "6": 4}, rows


def test_the_magic_measures_training_on_objects_of_earlier_cells(ip):
    ip.run_cell(OBJECTS_CELL)
    result = ip.run_cell("%%fecomlite\n" + TRAINING_LOOP)
    assert result.success, result.error_in_exec
    rows = {r["api"]: r["calls"] for r in result.result.rows}
    assert rows["torch.Tensor.backward"] == 4, rows
    assert rows["torch.optim.SGD.step"] == 4 and rows["torch.optim.SGD.zero_grad"] == 4
    assert rows["torch.nn.Linear.__call__"] == 4
