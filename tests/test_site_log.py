"""Sites of modules a program imports by a computed name: each process logs them once, the
runner reads the log whole lines only, and the store names rows its events made from a key."""

from __future__ import annotations

import json
from pathlib import Path

from fecomlite.instrument.importhook import SiteLog
from fecomlite.runner.inplace import logged_sites
from fecomlite.store import Store

SITE = {"file": "plugins/a.py", "line": 5, "col": 11, "api": "json.dumps",
        "written": "json.dumps", "kind": "function", "function": "encode",
        "source": "json.dumps(value)"}


def test_a_process_logs_the_sites_of_files_the_manifest_lacks_once(tmp_path: Path):
    known = tmp_path / "known.json"
    known.write_text(json.dumps(["main.py"]))
    log = SiteLog(tmp_path, known)
    log.add("main.py", {"main.py:3:1": {**SITE, "file": "main.py"}})  # the manifest's already
    log.add("plugins/a.py", {"plugins/a.py:5:11": SITE})
    log.add("plugins/a.py", {"plugins/a.py:5:11": SITE})  # a reload: logged once
    log.add("plugins/empty.py", {})
    lines = [json.loads(line) for f in tmp_path.glob("*.jsonl")
             for line in f.read_text().splitlines()]
    assert lines == [{"file": "plugins/a.py", "sites": {"plugins/a.py:5:11": SITE}}]


def test_the_runner_reads_whole_lines_of_every_process(tmp_path: Path):
    (tmp_path / "1.jsonl").write_text(json.dumps({"file": "a", "sites": {"a:1:1": SITE}}) + "\n")
    (tmp_path / "2.jsonl").write_text(
        json.dumps({"file": "b", "sites": {"b:2:1": SITE}}) + "\n" + '{"file": "c", "si')
    assert sorted(logged_sites(tmp_path)) == ["a:1:1", "b:2:1"]  # the torn line left out


def test_rows_made_from_a_key_take_the_manifest_and_keep_an_adopted_name(tmp_path: Path):
    with Store(tmp_path / "s.sqlite") as store:
        run = store.create_run()
        store.site_ids(run, ["plugins/a.py:5:11", "plugins/b.py:7:3"], {})
        store._name_sites(run, {"plugins/b.py:7:3": {"api": "json.JSONEncoder.encode"}}, {})
        manifest = {"plugins/a.py:5:11": SITE,
                    "plugins/b.py:7:3": {**SITE, "file": "plugins/b.py", "line": 7}}
        assert store.describe_sites(run, manifest) == 2
        assert store.describe_sites(run, manifest) == 0  # described once
        rows = {r["key"]: r for r in store.sites(run)}
    a, b = rows["plugins/a.py:5:11"], rows["plugins/b.py:7:3"]
    assert (a["file"], a["line"], a["function"], a["api"]) == \
        ("plugins/a.py", 5, "encode", "json.dumps")
    assert (b["file"], b["line"], b["api"]) == ("plugins/b.py", 7, "json.JSONEncoder.encode")
