"""What `fecomlite run` does before and around the program: the project rewritten into the
cache (never beside its files, rewritten again only where it changed), a syntax error reported
before any server starts, and the program's output shown live and logged."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli

from fecomlite.runner.inplace import prepare_in_place
from fecomlite.runner.output import Output
from fecomlite.runner.workcopy import CopyError, ScriptError, check_syntax
from fecomlite.server.client import live_client
from fecomlite.store import Store


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def quick_run(home: Path, script: Path, *more: str) -> list[str]:
    """`fecomlite run` arguments of a quick run of `script` in `home` with the options `more`."""
    return ["run", "--home", str(home), "--quick", *more, str(script)]


def user_env() -> dict[str, str]:
    """The environment a user's shell gives `fecomlite`: no FECOMLITE_ variables inherited."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    write(
        folder,
        "train.py",
        """
        import torch
        from helpers import scale
        print(scale(torch.ones(2)))
    """,
    )
    write(folder, "helpers.py", "def scale(x):\n    return x * 2\n")
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"\0" * 100_000)
    write(folder, "config.yaml", "lr: 0.1\n")
    return folder


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def rewrites(cache: Path) -> set[Path]:
    return set((cache / "rewrites").rglob("*.json"))


def test_the_project_is_rewritten_into_the_cache_never_beside_its_files(project, tmp_path):
    before = files_of(project)
    prepared = prepare_in_place(project / "train.py", tmp_path / "cache", [])
    assert files_of(project) == before
    assert prepared.root == project.resolve()
    assert {site["file"] for site in prepared.manifest["sites"].values()} == {"train.py"}
    assert json.loads(prepared.manifest_path.read_text()) == prepared.manifest
    assert prepared.manifest_path.is_relative_to(tmp_path / "cache")


def test_an_unchanged_project_rewrites_nothing_and_an_edit_rewrites_that_file(project, tmp_path):
    cache = tmp_path / "cache"
    prepare_in_place(project / "train.py", cache, [])
    first = rewrites(cache)
    assert len(first) == 2  # train.py, helpers.py
    prepare_in_place(project / "train.py", cache, [])
    assert rewrites(cache) == first
    write(project, "helpers.py", "def scale(x):\n    return x * 3\n")
    prepare_in_place(project / "train.py", cache, [])
    assert len(rewrites(cache) - first) == 1  # helpers.py alone: its exports did not change
    prepare_in_place(project / "train.py", cache, ["numpy"])
    assert len(rewrites(cache)) == 5  # other API roots: every file anew


def test_a_warm_start_does_not_load_the_rewriter(project, tmp_path):
    prepare_in_place(project / "train.py", tmp_path / "cache", [])
    script, cache = str(project / "train.py"), str(tmp_path / "cache")
    code = (
        "import sys; from pathlib import Path; from fecomlite.runner.inplace import "
        "prepare_in_place\n"
        f"prepare_in_place(Path({script!r}), Path({cache!r}), [])\n"
        "print('libcst' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False"]  # libcst: a second of every run's start


def test_a_helper_that_cannot_be_parsed_is_named_and_runs_as_it_is(project, tmp_path):
    write(project, "helpers.py", "print 'python 2'\n")
    prepared = prepare_in_place(project / "train.py", tmp_path / "cache", [])
    assert len(prepared.skipped) == 1
    assert prepared.skipped[0].startswith(f"{project.resolve() / 'helpers.py'}:1:1:")


def test_only_what_the_script_imports_is_rewritten_before_the_run(project, tmp_path):
    write(project, "tests/test_big.py", "import torch\ntorch.ones(1)\n")
    write(project, "pkg/__init__.py", "")
    write(project, "pkg/nn.py", "import torch\ndef f():\n    return torch.zeros(1)\n")
    write(project, "train.py", "from pkg import nn\nimport helpers\nprint(nn.f())\n")
    prepared = prepare_in_place(project / "train.py", tmp_path / "cache", [])
    assert {site["file"] for site in prepared.manifest["sites"].values()} == {"pkg/nn.py"}
    assert len(rewrites(tmp_path / "cache")) == 4  # train, helpers, pkg/__init__, pkg/nn


def test_a_syntax_error_names_the_users_file_line_and_column(tmp_path):
    script = write(tmp_path, "bad.py", "x = 1\nif x\n    pass\n")
    with pytest.raises(ScriptError, match=rf"^{script}:2:5: expected ':'$"):
        check_syntax(script)


def test_a_syntax_error_stops_the_run_before_any_server_starts(tmp_path):
    home = tmp_path / "home"
    script = write(tmp_path, "bad.py", "import torch\nx = (1,\n")
    result = run_cli(tmp_path, "run", "--home", str(home), str(script), timeout=120)
    assert result.returncode == 2
    assert f"{script}:2:5: '(' was never closed" in result.stdout
    assert live_client(home) is None
    assert not (home / "server.json").exists() and not (home / "server.log").exists()


def test_the_programs_output_shows_while_it_runs_and_is_logged(home, tmp_path):
    go = tmp_path / "go"
    script = write(
        tmp_path,
        "talk.py",
        f"""
        import pathlib, sys, time
        print("first line", flush=False)
        print("to stderr", file=sys.stderr)
        deadline = time.monotonic() + 60
        while not pathlib.Path({str(go)!r}).exists():
            if time.monotonic() > deadline:
                sys.exit("nobody saw the first line")
            time.sleep(0.05)
        print("second line")
    """,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "fecomlite.cli", *quick_run(home, script, "--level", "project")],
        cwd=tmp_path,
        env=user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:  # the program is still waiting for `go` when its line shows
            seen.append(line)
            if line.strip() == "first line":
                go.touch()
                break
        rest, errors = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, "".join(seen) + errors
    assert "second line" in rest
    assert "to stderr" in errors and "to stderr" not in rest
    log = next((home / "logs").glob("talk-*/rep-1.log")).read_text()
    assert "first line" in log and "to stderr" in log and "second line" in log


def test_quiet_keeps_the_output_in_the_log_only(home, tmp_path):
    script = write(tmp_path, "hush.py", "print('only in the log')\n")
    result = run_cli(
        tmp_path,
        *quick_run(home, script, "--level", "project", "--quiet", "--format", "csv"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "only in the log" not in result.stdout + result.stderr
    assert result.stdout.splitlines()[0].startswith("api,calls,time_s,")
    assert "<program>" in result.stdout
    log = next((home / "logs").glob("hush-*/rep-1.log")).read_text()
    assert "only in the log" in log


def test_json_owns_stdout_and_the_programs_output_goes_to_stderr(home, tmp_path):
    script = write(tmp_path, "chatty.py", "print('program says hello')\n")
    result = run_cli(
        tmp_path, *quick_run(home, script, "--level", "project", "--format", "json"), timeout=300
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["status"] == "finished" and summary["repetitions"] == 1
    assert [row["api"] for row in summary["apis"]] == ["<program>"]
    assert "program says hello" in result.stderr


def test_a_standalone_spool_follows_fecomlite_home(tmp_path, monkeypatch):
    from fecomlite.runtime.sender import spool_path

    monkeypatch.setenv("FECOMLITE_HOME", str(tmp_path / "home"))
    assert spool_path("") == tmp_path / "home" / "spool" / f"{os.getpid()}.spool"
    assert spool_path(str(tmp_path / "given.spool")) == tmp_path / "given.spool"


def test_a_piped_table_keeps_whole_names(home, tmp_path):
    script = write(
        tmp_path,
        "windows.py",
        """
        import numpy as np
        from numpy.lib.stride_tricks import sliding_window_view

        for _ in range(3):
            sliding_window_view(np.arange(1000.0), 10).sum()
    """,
    )
    env = user_env()
    env.pop("COLUMNS", None)  # a pipe, as `fecomlite run ... | tee` gives it
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fecomlite.cli",
            *quick_run(home, script, "--api", "numpy", "--quiet"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "numpy.lib.stride_tricks.sliding_window_view" in result.stdout
    assert "* : most of this energy" in result.stdout or " * " not in result.stdout


class ClosedTerminalForTests(io.StringIO):
    """Our stdout after `fecomlite run ... | head` has exited: every write fails."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_terminal_neither_blocks_the_program_nor_loses_its_log(tmp_path):
    read, closed = os.pipe()
    os.close(read)  # our stdout after `fecomlite run ... | head` has exited: every write fails
    code = "import sys; sys.stdout.write('x' * 1_000_000); print('end', file=sys.stderr)"
    try:
        with open(tmp_path / "rep-1.log", "wb") as log:
            output = Output((closed, closed), log)
            proc = subprocess.Popen(
                [sys.executable, "-c", code], stdout=output.child[0], stderr=output.child[1]
            )
            output.start()
            assert proc.wait(timeout=120) == 0  # a pipe nobody drained would block at 64 kB
            output.join(30)
    finally:
        os.close(closed)
    logged = (tmp_path / "rep-1.log").read_bytes()
    assert logged.count(b"x") == 1_000_000 and b"end" in logged


def test_unreadable_project_settings_are_a_copy_error(project, tmp_path):
    (project / "pyproject.toml").write_text("[tool.fecomlite]\napi = \"numpy\"\n")
    with pytest.raises(CopyError, match="api must be a list of strings"):
        prepare_in_place(project / "train.py", tmp_path / "cache", [])


def test_a_traceback_names_the_users_file_not_the_copy(home, tmp_path):
    script = write(tmp_path, "fails.py", "import math\n\nmath.sqrt(-1)\n")
    result = run_cli(tmp_path, *quick_run(home, script), timeout=300)
    assert result.returncode == 1
    assert f'File "{script}", line 3' in result.stderr
    assert "-instrumented" not in result.stderr and "hookmain" not in result.stderr
    log = next((home / "logs").glob("fails-*/rep-1.log")).read_text()
    assert f'File "{script}", line 3' in log


def test_piped_output_says_it_is_waiting_at_the_gate(home, tmp_path):
    """A pipe or a log shows no progress bar: the first run on a busy machine waited minutes at
    the gate with nothing said. It is said, once per repetition."""
    script = write(tmp_path, "wait.py", "print('ran')\n")
    result = run_cli(tmp_path, "run", "--home", str(home), "--repeat", "1", "--idle", "0",
                     "--tail", "0.2", "--gate-max-wait", "0.5", "--level", "project",
                     str(script), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "rep 1: waiting at the stability gate for a quiet machine (at most 0.5 s)" in (
        result.stdout)


def test_a_project_given_must_contain_the_script(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(CopyError, match="does not contain the script"):
        prepare_in_place(project / "train.py", tmp_path / "cache", [], elsewhere)
    prepared = prepare_in_place(project / "train.py", tmp_path / "cache", [], tmp_path)
    assert prepared.root == tmp_path.resolve()
    assert {site["file"] for site in prepared.manifest["sites"].values()} == {"proj/train.py"}


def test_everything_after_the_script_is_the_scripts_own(home, tmp_path):
    """As with `python SCRIPT ARGS`: `--repeat 7` after the script is the program's argument,
    not fecomlite's option (the run has one repetition); an option of ours the program refused
    is named, and the older `SCRIPT -- ARGS` form still works."""
    script = write(tmp_path, "args.py", """\
        import sys
        print("ARGS", sys.argv[1:])
        sys.exit(2 if "--quick" in sys.argv else 0)
        """)
    result = run_cli(tmp_path, *quick_run(home, script), "--repeat", "7", "-x", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "ARGS ['--repeat', '7', '-x']" in result.stdout
    refused = run_cli(tmp_path, *quick_run(home, script), "--", "--quick", timeout=300)
    assert refused.returncode == 2
    assert "ARGS ['--quick']" in refused.stdout
    assert "--quick went to the program" in " ".join(refused.stdout.split())
    with Store(home / "store.sqlite", create=False) as store:  # the home holds other tests' runs
        ours = [r["id"] for r in store.runs() if r.get("program", "").endswith("args.py")]
        assert [len(store.repetitions(run_id)) for run_id in ours] == [1, 1]


def test_options_after_a_notebook_are_refused_by_name(home, tmp_path):
    notebook = write(tmp_path, "nb.ipynb", "{}")
    result = run_cli(tmp_path, *quick_run(home, notebook), "--repeat", "1", timeout=300)
    assert result.returncode == 2
    assert "a notebook takes no arguments" in " ".join(result.stderr.split())
