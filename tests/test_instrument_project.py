"""Instrumenting whole projects: the copy, the manifest, configuration, refusals, bad input,
notebooks, the process pool and the command line."""

from __future__ import annotations

import gc
import hashlib
import json
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fecomlite.instrument import project as project_module
from fecomlite.instrument import transform
from fecomlite.instrument.command import instrument_command
from fecomlite.instrument.project import (
    MANIFEST,
    InstrumentError,
    default_out,
    instrument_path,
)

TORCH_SCRIPT = "import torch\n\n\ndef main():\n    return torch.ones(2)\n"


def make(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_copy_instruments_python_copies_the_rest_and_skips_environments(tmp_path: Path) -> None:
    src = make(
        tmp_path / "proj",
        {
            "train.py": TORCH_SCRIPT,
            "util.py": "def helper():\n    return 1\n",
            "models/net.py": "from torch import nn\nlayer = nn.Linear(2, 2)\n",
            "data/points.csv": "x,y\n1,2\n",
            ".git/config": "[core]\n",
            "__pycache__/train.cpython-311.pyc": b"\x00",
            "venv/pyvenv.cfg": "home = /usr\n",
            "venv/lib/site.py": TORCH_SCRIPT,
            "pkg.egg-info/PKG-INFO": "Name: pkg\n",
        },
    )
    before = digest(src)
    result = instrument_path(src)
    out = tmp_path / "proj-instrumented"
    assert result.out == out and result.ok
    assert digest(src) == before  # the original is never written to
    assert tree(out) == {
        "train.py",
        "util.py",
        "models/net.py",
        "data/points.csv",
        ".fecomlite/manifest.json",
        ".fecomlite/original/train.py",  # the user's text of each rewritten file
        ".fecomlite/original/models/net.py",
    }
    assert (out / ".fecomlite/original/train.py").read_bytes() == (src / "train.py").read_bytes()
    assert (out / "util.py").read_bytes() == (src / "util.py").read_bytes()
    assert (out / "data/points.csv").read_bytes() == (src / "data/points.csv").read_bytes()
    assert "__fecomlite__.call(" in (out / "train.py").read_text()
    assert (result.files_instrumented, result.files_unchanged, result.files_copied) == (2, 1, 1)
    assert result.sites_by_root == {"torch": 2}
    assert result.lines == 5 + 2 + 2


def test_manifest_format(tmp_path: Path) -> None:
    src = make(
        tmp_path / "proj", {"models/net.py": "from torch import nn\nlayer = nn.Linear(2, 2)\n"}
    )
    result = instrument_path(src, api_roots=["numpy"])
    manifest = json.loads((tmp_path / "proj-instrumented" / MANIFEST).read_text())
    assert result.manifest == tmp_path / "proj-instrumented" / MANIFEST
    assert manifest == {
        "format": 1,
        "source_root": str(src),
        "api_roots": ["tensorflow", "keras", "tf_keras", "torch", "numpy"],
        "sites": {
            "models/net.py:2:8": {
                "file": "models/net.py",
                "line": 2,
                "col": 8,
                "api": "torch.nn.Linear",
                "written": "nn.Linear",
                "kind": "constructor",
                "root": "torch",
                "function": "<module>",
                "source": "nn.Linear(2, 2)",
            }
        },
    }


COPY_OF_TRAIN = {"train.py", ".fecomlite/manifest.json", ".fecomlite/original/train.py"}


def test_default_out_lies_beside_the_input(tmp_path: Path) -> None:
    src = make(tmp_path / "proj", {"train.py": TORCH_SCRIPT, "nb.ipynb": "{}"})
    assert default_out(src) == tmp_path / "proj-instrumented"
    assert default_out(src / "train.py") == src / "train-instrumented"
    assert default_out(src / "nb.ipynb") == src / "nb-instrumented"
    result = instrument_path(src / "train.py")
    assert tree(result.out) == COPY_OF_TRAIN
    assert list(result.sites) == ["train.py:5:11"]
    (src / "run").write_text(TORCH_SCRIPT)  # a script without a suffix, given alone
    assert list(instrument_path(src / "run", list_only=True).sites) == ["run:5:11"]


def test_pyproject_and_api_options_add_roots(tmp_path: Path) -> None:
    src = make(
        tmp_path / "proj",
        {
            "pyproject.toml": '[project]\nname = "p"\n\n[tool.fecomlite]\napi = ["math"]\n',
            "calc.py": "import json\nimport math\nprint(math.sqrt(4), json.dumps(1))\n",
        },
    )
    result = instrument_path(src, api_roots=["json"], list_only=True)
    assert {site["api"] for site in result.sites.values()} == {"math.sqrt", "json.dumps"}
    assert result.api_roots[-2:] == ("math", "json")
    (src / "pyproject.toml").write_text('[tool.fecomlite]\napi = "math"\n')
    with pytest.raises(InstrumentError, match="must be a list of strings"):
        instrument_path(src, list_only=True)


def test_list_only_writes_nothing(tmp_path: Path) -> None:
    src = make(tmp_path / "proj", {"train.py": TORCH_SCRIPT})
    result = instrument_path(src, list_only=True)
    assert list(result.sites) == ["train.py:5:11"] and result.manifest is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


def test_instrumenting_twice_is_refused(tmp_path: Path) -> None:
    src = make(tmp_path / "proj", {"train.py": TORCH_SCRIPT})
    first = instrument_path(src)
    with pytest.raises(InstrumentError, match="already an instrumented copy"):
        instrument_path(first.out, tmp_path / "again")
    single = instrument_path(first.out / "train.py", tmp_path / "single")
    assert [f.message for f in single.failures] == [
        "already instrumented (it uses __fecomlite__); refusing to wrap twice"
    ]
    assert (
        '__fecomlite__.call("train.py:5:11", torch.ones'
        in (tmp_path / "single" / "train.py").read_text()
    )  # copied as it was: never wrapped twice


def test_out_folder_safety(tmp_path: Path) -> None:
    src = make(tmp_path / "proj", {"train.py": TORCH_SCRIPT})
    with pytest.raises(InstrumentError, match="would contain the original"):
        instrument_path(src, src)
    with pytest.raises(InstrumentError, match="would contain the original"):
        instrument_path(src, tmp_path)
    make(tmp_path / "foreign", {"keep.txt": "mine"})
    with pytest.raises(InstrumentError, match="not a fecomlite copy"):
        instrument_path(src, tmp_path / "foreign")
    assert (tmp_path / "foreign" / "keep.txt").read_text() == "mine"
    first = instrument_path(src)
    (first.out / "stale.py").write_text("old\n")
    second = instrument_path(src)  # an earlier copy is replaced as a whole
    assert "stale.py" not in tree(second.out)
    inside = instrument_path(src, src / "build" / "instr")  # out inside the project: skipped
    assert tree(inside.out) == COPY_OF_TRAIN
    instrument_path(src / "train.py")  # src/train-instrumented/, an earlier copy in the project
    again = instrument_path(src, tmp_path / "again")
    assert tree(again.out) == COPY_OF_TRAIN and again.ok
    assert "train-instrumented: skipped: an instrumented copy" in again.notes


def test_bad_input_is_reported_and_the_rest_instrumented(tmp_path: Path) -> None:
    src = make(
        tmp_path / "proj",
        {
            "good.py": TORCH_SCRIPT,
            "bad.py": "import torch\n\ndef f(:\n    pass\n",
            "latin.py": b"# -*- coding: latin-1 -*-\nimport torch\nname = '\xe9t\xe9'\n"
            b"torch.ones(1)\n",
            "nocookie.py": b"import torch\nx = '\xe9'\n",
            "empty.py": "",
            "sub/mod.py": TORCH_SCRIPT,
        },
    )
    (src / "sub" / "loop").symlink_to("..")
    (src / "selfloop.py").symlink_to("selfloop.py")
    (src / "dangling.txt").symlink_to("missing.txt")
    result = instrument_path(src)
    failures = [str(f) for f in result.failures]
    assert failures[0].startswith("bad.py:3:7: ")
    assert failures[1:] == [
        "nocookie.py:2:6: cannot decode byte 0xe9 as utf-8 (declare the file's encoding with a "
        "coding cookie)",
    ]
    assert sorted(result.notes) == [
        "dangling.txt: skipped: broken symlink",
        "selfloop.py: skipped: symlink loop",
        f"sub/loop: skipped: symlink loop (points back to {src})",
    ]
    instrumented = {str(s["file"]) for s in result.sites.values()}
    assert instrumented == {"good.py", "latin.py", "sub/mod.py"}
    latin = (result.out / "latin.py").read_bytes()
    assert b"'\xe9t\xe9'" in latin and b'__fecomlite__.call("latin.py:4:0"' in latin
    assert (result.out / "bad.py").read_bytes() == (src / "bad.py").read_bytes()
    assert (result.out / "empty.py").read_bytes() == b""
    assert result.files_instrumented == 3 and result.files_unchanged == 1


def test_unreadable_file(tmp_path: Path) -> None:
    src = make(tmp_path / "proj", {"good.py": TORCH_SCRIPT, "locked.py": TORCH_SCRIPT})
    (src / "locked.py").chmod(0)
    try:
        if os.access(src / "locked.py", os.R_OK):
            pytest.skip("root reads any file: see test_unreadable_file_injected")
        result = instrument_path(src)
    finally:
        (src / "locked.py").chmod(0o644)
    assert [str(f) for f in result.failures] == ["locked.py:1:1: cannot read: Permission denied"]
    assert list(result.sites) == ["good.py:5:11"]


def test_unreadable_file_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root reads any file whatever its mode, so here the read itself is made to fail."""
    src = make(tmp_path / "proj", {"good.py": TORCH_SCRIPT, "locked.py": TORCH_SCRIPT})
    read_bytes = Path.read_bytes

    def refuse(path: Path) -> bytes:
        if path.name == "locked.py":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    result = instrument_path(src)
    assert [str(f) for f in result.failures] == ["locked.py:1:1: cannot read: Permission denied"]
    assert list(result.sites) == ["good.py:5:11"]


def notebook(*cells: list[str] | str, kind: str = "code") -> str:
    return json.dumps(
        {
            "cells": [{"cell_type": kind, "metadata": {}, "source": c} for c in cells],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def test_notebooks_stay_notebooks(tmp_path: Path) -> None:
    src = make(
        tmp_path / "proj",
        {
            "explore.ipynb": notebook(
                ["%matplotlib inline\n", "import torch\n", "files = !ls\n", "x = torch.ones(1)"],
                "for i in range(2):\n    !echo {i}\n    y = torch.zeros(i)\n",
                ["%%bash\n", "echo torch.ones(1)\n"],
                "text = '''\n%not a magic\n'''\ntorch.eye(2)?\nprint(torch.eye(2))\n",
                ["def broken(:\n"],
            )
        },
    )
    result = instrument_path(src)
    out = json.loads((result.out / "explore.ipynb").read_text())
    sources = [c["source"] for c in out["cells"]]
    assert sources[0] == [
        "%matplotlib inline\n",
        "import fecomlite.runtime.probe as __fecomlite__; import torch\n",
        "files = !ls\n",
        'x = __fecomlite__.call("explore.ipynb[0]:4:4", torch.ones, 1)',
    ]
    assert sources[1] == (  # the import in cell 0 reaches here: cells share one namespace
        "import fecomlite.runtime.probe as __fecomlite__\nfor i in range(2):\n    !echo {i}\n"
        '    y = __fecomlite__.call("explore.ipynb[1]:3:8", torch.zeros, i)\n'
    )
    assert sources[2] == ["%%bash\n", "echo torch.ones(1)\n"]
    assert sources[3].startswith(
        "import fecomlite.runtime.probe as __fecomlite__; text = '''\n%not a magic"
    )
    assert 'torch.eye(2)?\nprint(__fecomlite__.call("explore.ipynb[3]:5:6"' in sources[3]
    assert sources[4] == ["def broken(:\n"]
    assert [str(f) for f in result.failures] == ["explore.ipynb:1:12: cell 4: invalid syntax"]
    assert {k: (s["cell"], s["line"]) for k, s in result.sites.items()} == {
        "explore.ipynb[0]:4:4": (0, 4),
        "explore.ipynb[1]:3:8": (1, 3),
        "explore.ipynb[3]:5:6": (3, 5),
    }
    assert any("explore.ipynb[1]: line numbers shift by one" in n for n in result.notes)


def test_process_pool_gives_the_same_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"m{i}.py": TORCH_SCRIPT.replace("ones(2)", f"ones({i})") for i in range(6)}
    files["bad.py"] = "import torch\nx = (\n"
    src = make(tmp_path / "proj", files)
    serial = instrument_path(src, tmp_path / "serial")
    monkeypatch.setattr(project_module, "PARALLEL_MIN_BYTES", 0)
    parallel = instrument_path(src, tmp_path / "parallel", workers=2)
    assert (serial.workers, parallel.workers) == (1, 2)
    assert parallel.sites == serial.sites and len(parallel.sites) == 6
    assert parallel.failures == serial.failures
    assert digest(parallel.out) == digest(serial.out)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_edited_after_the_first_pass_is_instrumented_as_it_now_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """The first pass's parse is reused only for the very text the file pass reads: a file
    edited in between (its call a line lower) is parsed again, the others are not."""
    src = make(tmp_path / "proj", {f"m{i}.py": TORCH_SCRIPT for i in range(4)})
    edited = TORCH_SCRIPT.replace("    return", "    # the same call, a line lower\n    return")
    first_pass = project_module._project_table

    def then_edit(*args: object) -> object:
        table = first_pass(*args)  # type: ignore[arg-type]
        (src / "m2.py").write_text(edited)
        return table

    parsed_again: list[str] = []
    parse_check = transform.parse_check

    def counted(text: str, filename: str, **options: bool) -> object:
        parsed_again.append(filename)
        return parse_check(text, filename, **options)

    monkeypatch.setattr(project_module, "_project_table", then_edit)
    monkeypatch.setattr(transform, "parse_check", counted)
    monkeypatch.setattr(project_module, "PARALLEL_MIN_BYTES", 0)
    result = instrument_path(src, tmp_path / "out", workers=workers)
    assert result.ok and result.workers == workers
    if workers == 1:  # forked workers count in their own processes
        assert parsed_again == ["m2.py"]
    expected = instrument_path(src / "m2.py", tmp_path / "alone")
    assert (result.out / "m2.py").read_text() == (tmp_path / "alone" / "m2.py").read_text()
    assert result.sites["m2.py:6:11"] == {"file": "m2.py", **expected.sites["m2.py:6:11"]}


@pytest.mark.parametrize("enabled", [True, False])
def test_garbage_collection_is_left_as_the_caller_had_it(tmp_path: Path, enabled: bool) -> None:
    """Collection pauses while a file is rewritten, in the caller's process too, and comes back
    only where it was on: also after a file that could not be parsed."""
    src = make(tmp_path / "proj", {"ok.py": TORCH_SCRIPT, "bad.py": "import torch\nx = (\n"})
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        result = instrument_path(src, tmp_path / "out", workers=1)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert [f.path for f in result.failures] == ["bad.py"] and len(result.sites) == 1


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("instrument")(instrument_command)

    @app.callback()
    def main() -> None:
        """Subcommands are required, as in fecomlite's own CLI."""

    return app


def test_command_line(tmp_path: Path) -> None:
    src = make(tmp_path / "proj", {"train.py": TORCH_SCRIPT, "bad.py": "x = (\n"})
    runner = CliRunner()
    listed = runner.invoke(cli(), ["instrument", str(src), "--list"], terminal_width=200)
    assert listed.exit_code == 1, listed.output
    assert "train.py:5:11  torch.ones  function  torch.ones in main" in listed.stdout
    assert "bad.py:1:5: '(' was never closed" in listed.output
    assert not (tmp_path / "proj-instrumented").exists()
    (src / "bad.py").unlink()
    done = runner.invoke(cli(), ["instrument", str(src), "--out", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert "1 (torch 1)" in done.stdout and (tmp_path / "o" / MANIFEST).is_file()
    refused = runner.invoke(cli(), ["instrument", str(tmp_path / "o")])
    assert refused.exit_code == 2 and "already an instrumented copy" in refused.output


def test_the_copy_keeps_folder_modes_and_links_out_of_the_project_stay_links(
    tmp_path: Path,
) -> None:
    outside = make(tmp_path / "elsewhere", {"secret.txt": "key", "lib/mod.py": TORCH_SCRIPT})
    src = make(tmp_path / "proj", {"train.py": TORCH_SCRIPT, "private/data.txt": "x"})
    (src / "private").chmod(0o700)
    src.chmod(0o750)
    (src / "secret.txt").symlink_to(outside / "secret.txt")
    (src / "lib").symlink_to(outside / "lib")
    (src / "inside.py").symlink_to("train.py")  # within the project: followed as before
    result = instrument_path(src, tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "private").stat().st_mode & 0o777 == 0o700
    assert out.stat().st_mode & 0o777 == 0o750
    for name, target in (("secret.txt", outside / "secret.txt"), ("lib", outside / "lib")):
        assert (out / name).is_symlink() and os.readlink(out / name) == str(target)
        assert f"{name}: kept as a link to {target} (outside the project, not followed)" in \
            result.notes
    assert not any(key.startswith("lib/") for key in result.sites)  # not instrumented
    assert (out / "inside.py").is_file() and not (out / "inside.py").is_symlink()
