"""The import hook's public API (`install`, `ImportHook.sites`, `uninstall`, `run_script`), as
the pytest plugin and `fecomlite run` use it: project modules rewritten under their own
filenames, everything else untouched, a cache shared by concurrent users."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHECK = """\
import inspect, json, sys, traceback
from pathlib import Path
from fecomlite.instrument.importhook import install
root, cache = Path(sys.argv[1]), Path(sys.argv[2])
hook = install(root, api_roots=["json"], cache_dir=cache)
sys.path.insert(0, str(root))
import helper, plainmod
out = {
    "file": helper.__file__,
    "rewritten": hasattr(helper, "__fecomlite__"),
    "plain_rewritten": hasattr(plainmod, "__fecomlite__"),
    "source": inspect.getsource(helper.encode),
    "value": helper.encode({"a": 1}),
    "sites": sorted(hook.sites),
}
try:
    helper.fails()
except ValueError as error:
    frame = [f for f in traceback.extract_tb(error.__traceback__) if "json" not in f.filename][-1]
    out["where"] = [frame.filename, frame.lineno, frame.line]
hook.uninstall()
out["installed"] = hook in sys.meta_path
print(json.dumps(out))
"""

HELPER = """\
\"\"\"A project module.\"\"\"
import json


def encode(value):
    return json.dumps(value)   # two spaces: the user's text


def fails():
    return json.loads("not json")
"""


def test_install_rewrites_project_modules_under_their_own_names(tmp_path: Path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "helper.py").write_text(HELPER)
    (root / "plainmod.py").write_text("X = 1\n")
    check = tmp_path / "check.py"
    check.write_text(CHECK)
    env = {**os.environ, "FECOMLITE_HOME": str(tmp_path / "home")}
    env = {k: v for k, v in env.items() if k not in ("FECOMLITE_URL", "FECOMLITE_HOOK")}
    runs = [
        subprocess.run([sys.executable, str(check), str(root), str(tmp_path / "cache")],
                       env=env, capture_output=True, text=True, timeout=120)
        for _ in range(2)  # cold, then warm from the cache
    ]
    first, second = (json.loads(r.stdout) for r in runs)
    assert first == second
    assert first["file"] == str(root / "helper.py")
    assert first["rewritten"] and not first["plain_rewritten"]
    assert first["source"] == textwrap.dedent("""\
        def encode(value):
            return json.dumps(value)   # two spaces: the user's text
        """)
    assert first["value"] == '{"a": 1}'
    assert first["sites"] == ["helper.py:10:11", "helper.py:6:11"]
    assert first["where"] == [str(root / "helper.py"), 10, 'return json.loads("not json")']
    assert not first["installed"]
    assert not list(root.rglob("*.json")) and not (root / ".fecomlite").exists()


def test_a_python_the_program_starts_installs_the_same_hook(tmp_path: Path):
    from fecomlite.instrument.importhook import ImportHook, Rewriter, child_environment

    root = tmp_path / "proj"
    root.mkdir()
    (root / "helper.py").write_text(HELPER)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("print('their sitecustomize ran')\n")
    hook = ImportHook(Rewriter(root, ["json"], tmp_path / "cache"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(theirs), env.get("PYTHONPATH", "")])
    env = child_environment(hook, {**env, "FECOMLITE_HOME": str(tmp_path / "home")})
    code = "import helper; print(helper.__file__, hasattr(helper, '__fecomlite__'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.splitlines() == ["their sitecustomize ran", f"{root / 'helper.py'} True"]


def test_the_project_root_is_the_working_directory_or_a_marked_folder_above_the_script(
    tmp_path: Path,
):
    from fecomlite.instrument.importhook import project_root

    script = tmp_path / "repo" / "tools" / "deep" / "run.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    assert project_root(script, tmp_path / "elsewhere") == script.parent  # nothing marks it
    assert project_root(script, tmp_path / "repo" / "tools") == tmp_path / "repo" / "tools"
    (tmp_path / "repo" / "pyproject.toml").write_text("")
    assert project_root(script, tmp_path / "elsewhere") == tmp_path / "repo"
    assert project_root(script, script.parent) == script.parent  # the nearest wins
    assert project_root(tmp_path / "x.py", Path(tempfile.gettempdir())) == tmp_path


def test_the_programs_processes_use_the_runs_first_pass_without_listing_the_project(
    tmp_path: Path, monkeypatch,
):
    from fecomlite.instrument.importhook import Rewriter

    root = tmp_path / "proj"
    root.mkdir()
    (root / "helper.py").write_text(HELPER)
    (root / "api.py").write_text("from json import dumps as encode\n")  # an export
    runner = Rewriter(root, ["json"], tmp_path / "cache")
    runner.rewrite_all()
    key = runner.table_key()

    def listing(self: Rewriter) -> list[Path]:
        raise AssertionError("listed the project again")

    data = (root / "helper.py").read_bytes()
    expected = runner.entry(str(root / "helper.py"), data)
    monkeypatch.setattr(Rewriter, "python_files", listing)
    child = Rewriter(root, ["json"], tmp_path / "cache", table_key=key)
    assert child.entry(str(root / "helper.py"), data) == expected
    assert child.table_key() == key
    monkeypatch.undo()  # the run's first pass gone from the cache: listed and made again
    for table in (tmp_path / "cache" / "tables").iterdir():
        table.unlink()
    orphan = Rewriter(root, ["json"], tmp_path / "cache", table_key=key)
    assert orphan.entry(str(root / "helper.py"), data) == expected
    assert orphan.table_key() == key
