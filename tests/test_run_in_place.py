"""`fecomlite run` runs the program in place: the same `__file__`, `sys.argv`, working directory,
`inspect` source, pickling and child processes as `python script.py`, byte for byte, while its
framework calls (the spawned child's included) are measured; concurrent runs of one project in
one home all finish; a program killed by a signal is named by it and exits as a shell says."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import run_cli

from fecomlite.report.build import build_report
from fecomlite.store import Store

MAIN = """\
import inspect
import multiprocessing
import os
import pickle
import sys

import torch
from model import Net, work


def main():
    print("file", __file__)
    print("argv", sys.argv, sys.orig_argv[1:])
    print("cwd", os.getcwd())
    print("path0", sys.path[0])
    print("spec", __spec__, __name__)
    print("source", inspect.getsourcefile(work), inspect.getsource(work).splitlines()[0])
    print("pickle", pickle.loads(pickle.dumps(Net(3))).total())
    with open(os.path.join(os.path.dirname(__file__), "..", "data", "x.txt")) as f:
        print("data", f.read().strip())
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print("spawn", pool.map(work, [2]))
    print("[epoch 0] [/abs/path] done", end=" ")
    print()


if __name__ == "__main__":
    main()
"""

MODEL = """\
import torch


class Net:
    def __init__(self, n):
        self.n = n

    def total(self):
        return torch.ones(self.n).sum().item()


def work(n):
    return torch.zeros(n).sum().item() + n
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose script sits in a subfolder and reads `../data`."""
    root = tmp_path / "proj"
    (root / "train").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "x.txt").write_text("hello from data\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'proj'\n")
    (root / "train" / "main.py").write_text(MAIN)
    (root / "train" / "model.py").write_text(MODEL)
    return root


def user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.slow
def test_the_program_sees_what_python_gives_it_and_is_measured(home, project):
    plain = subprocess.run(
        [sys.executable, "./train/main.py", "a", "b"], cwd=project, env=user_env(),
        capture_output=True, timeout=300, check=True,
    )
    assert b"hello from data" in plain.stdout and not plain.stderr
    result = run_cli(project, "run", "--home", str(home), "--quick", "--quiet", "--format",
                     "json", "./train/main.py", "a", "b", timeout=600)
    assert result.returncode == 0, result.stderr
    log = next((home / "logs").glob("main-*/rep-1.log")).read_bytes()
    assert log == plain.stdout  # __file__, argv, cwd, sys.path[0], inspect, pickle, spawn
    calls = {row["api"]: row["calls"] for row in json.loads(result.stdout)["apis"]}
    assert calls.get("torch.ones") == 1 and calls.get("torch.Tensor.sum") == 2
    assert calls.get("torch.zeros") == 1  # called in the spawned child only
    assert not list(project.rglob(".fecomlite"))  # nothing written beside the user's files


@pytest.mark.slow
def test_eight_concurrent_runs_of_one_project_in_one_home_all_finish(home, tmp_path):
    script = write(tmp_path, "prog.py", """
        import json
        for i in range(50):
            json.dumps({"i": i})
        print("ok")
    """)
    args = ("run", "--home", str(home), "--quick", "--quiet", "--api", "json", "--format",
            "json", str(script))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: run_cli(tmp_path, *args, timeout=900), range(8)))
    for result in results:
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["status"] == "finished"
        assert {row["api"]: row["calls"] for row in summary["apis"]}["json.dumps"] == 50
    assert len({json.loads(r.stdout)["run"] for r in results}) == 8


@pytest.mark.parametrize(("how", "name", "status"), [
    ("os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL", 137),
    ("ctypes.string_at(0)", "SIGSEGV", 139),
])
def test_a_program_killed_by_a_signal_is_named_and_exits_as_a_shell_says(
    home, tmp_path, how, name, status
):
    script = write(tmp_path, "dies.py", f"""
        import ctypes, faulthandler, json, os, signal
        faulthandler.disable()
        json.dumps([1])
        {how}
    """)
    result = run_cli(tmp_path, "run", "--home", str(home), "--quick", "--quiet", "--api", "json",
                     str(script), timeout=600)
    assert result.returncode == status, result.stdout + result.stderr
    assert f"was killed by {name}" in result.stdout
    with Store(home / "store.sqlite", create=False) as store:
        run = store.runs()[-1]
        header = build_report(store, run["id"]).context["header"]
    assert header["ended"] == f"killed by {name}"  # the report's badge, not "exit -9"


LOADER = """\
import importlib
import json
import multiprocessing
import sys


def load(name):
    return importlib.import_module("plugins." + name).encode({"n": name})


if __name__ == "__main__":
    print(load("a" + sys.argv[1]), json.dumps([1]))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(pool.map(load, ["b" + sys.argv[1]]))
"""


def test_modules_imported_by_a_computed_name_are_named_like_the_others(home, tmp_path):
    """A plugin found at run time (in the program, and in a spawned child) is rewritten, and
    the report names its site by file, line and function, as it names a static import's."""
    root = tmp_path / "proj"
    (root / "plugins").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'proj'\n")
    (root / "plugins" / "__init__.py").write_text("")
    for name in ("a1", "b1"):
        write(root / "plugins", f"{name}.py", """
            import json


            def encode(value):
                return json.dumps(value)
        """)
    write(root, "main.py", LOADER)
    result = run_cli(root, "run", "--home", str(home), "--quick", "--quiet", "--api", "json",
                     "main.py", "1", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "report"
    shown = run_cli(root, "report", "--store", str(home / "store.sqlite"), "-f", "csv", "-o",
                    str(out))
    assert shown.returncode == 0, shown.stderr
    with open(out / "sites.csv", newline="") as f:
        sites = {row["key"]: row for row in csv.DictReader(f)}
    named = {(row["file"], row["line"], row["function"], row["api"], row["written"], row["calls"])
             for row in sites.values()}
    assert named == {
        ("main.py", "12", "<module>", "json.dumps", "json.dumps", "1"),
        ("plugins/a1.py", "6", "encode", "json.dumps", "json.dumps", "1"),
        ("plugins/b1.py", "6", "encode", "json.dumps", "json.dumps", "1"),  # the child's
    }


SHOWS = """\
import json
import os
import subprocess
import sys

print(json.dumps({"path": sys.path, "env": sorted(os.environ.items())}))
child = [sys.executable, os.path.join(os.path.dirname(__file__), "child.py")]
print(subprocess.run(child, env={**os.environ, "MINE": "1"}, capture_output=True, text=True,
                     check=True).stdout, end="")
"""


def test_the_program_sees_no_bootstrap_and_its_children_are_measured(home, tmp_path):
    """`sys.path` and the environment are those `python script.py` gives (no hookboot, no
    FECOMLITE_ variables), while a child started with an environment the program made is
    still rewritten and measured."""
    root = tmp_path / "proj"
    (root / "sub").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'proj'\n")
    write(root / "sub", "shows.py", SHOWS)
    write(root / "sub", "child.py", "import listed\nlisted.show()\n")
    write(root / "sub", "listed.py", """
        import json
        import os


        def show():
            print("child", json.dumps(sorted(k for k in os.environ if "FECOMLITE" in k)))
    """)
    env = {**user_env(), "COLUMNS": "200"}  # as run_cli gives the CLI
    plain = subprocess.run([sys.executable, "sub/shows.py"], cwd=root, env=env,
                           capture_output=True, timeout=120, check=True)
    result = run_cli(root, "run", "--home", str(home), "--quick", "--quiet", "--api", "json",
                     "--format", "json", "sub/shows.py", timeout=600)
    assert result.returncode == 0, result.stderr
    log = next((home / "logs").glob("shows-*/rep-1.log")).read_bytes()
    assert log == plain.stdout
    assert b"hookboot" not in log and b"child []" in log
    calls = {row["api"]: row["calls"] for row in json.loads(result.stdout)["apis"]}
    assert calls["json.dumps"] == 2  # the program's and its child's
