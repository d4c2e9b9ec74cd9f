"""A fresh clone collects its tests with nothing from outside it: no sibling folder, no other
checkout. The clone is made in an empty folder (it has no siblings at all), and every file
or folder the collection opens under the original repository's parent folder is recorded
(Python's audit hook), except the test's own folder and what the collection itself created
there (temporary files, when that parent is the temporary folder); none may be found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

COLLECT = """
import json, os, sys
forbidden, clone, report = sys.argv[1:4]
home = os.path.dirname(clone)  # the test's own folder: the clone and this report
existing = set(os.listdir(forbidden))  # what a collection could find beside the checkout
seen = set()

def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], str):
        path = os.path.abspath(args[0])
        ours = path == home or path.startswith(
            (home + os.sep, sys.prefix + os.sep, sys.base_prefix + os.sep))
        beside = path.startswith(forbidden + os.sep) and (
            path[len(forbidden) + 1:].split(os.sep)[0] in existing)  # not made since (temp files)
        if beside and not ours:  # (the interpreter's files are its)
            seen.add(path)

sys.addaudithook(hook)
# an editable install of the original checkout would serve what the clone lacks (its built C
# parts): a fresh clone has no install, so only its own files may answer
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(getattr(f, "__module__", ""))]
import pytest
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"])
import fecomlite
with open(report, "w") as f:
    json.dump({"code": int(code), "outside": sorted(seen), "fecomlite": fecomlite.__file__}, f)
"""


def test_a_fresh_clone_collects_every_test_from_its_own_files(tmp_path: Path):
    if not (REPO / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clone"]  # nothing beside it
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env["PYTHONPATH"] = str(clone)
    result = subprocess.run(
        [sys.executable, "-c", COLLECT, str(REPO.parent), str(clone), str(report)],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    found = json.loads(report.read_text())
    assert found["code"] == 0, result.stdout[-3000:]
    assert "error" not in result.stdout.splitlines()[-1]
    assert found["fecomlite"].startswith(str(clone) + os.sep)
    assert found["outside"] == []


class FakeItemForTests:
    """A collected test with its markers: what the collection hook reads and adds."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.added: list[object] = []

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.names else None

    def add_marker(self, marker: object) -> None:
        self.added.append(marker)


def test_without_chromium_the_browser_tests_are_skipped_with_the_reason(tmp_path, monkeypatch):
    import conftest

    monkeypatch.setattr(conftest, "CHROMIUM", tmp_path / "no-chromium")
    browser, other = FakeItemForTests("browser"), FakeItemForTests("slow")
    conftest.pytest_collection_modifyitems(None, [browser, other])
    assert other.added == []
    [skip] = browser.added
    assert skip.mark.name == "skip"
    assert "no Chromium at" in skip.mark.kwargs["reason"]
    assert "apt-get install -y chromium" in skip.mark.kwargs["reason"]
