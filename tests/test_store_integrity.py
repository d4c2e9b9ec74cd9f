"""Damaged, foreign, old and half-copied stores: read-only commands write nothing and say what
to do; a writer upgrades an old schema only after keeping a copy (issue #31)."""

from __future__ import annotations

import random
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from cli_runner import Result, invoke
from report_helpers import build_run

from fecomlite.store import SCHEMA_VERSION, Store, StoreError
from fecomlite.store.copy import copy_store

READERS = (["report", "1", "--format", "json"], ["export", "1", "--format", "openmetrics"],
           ["store", "check"])


def cli(*args: str, cwd: Path) -> Result:
    """`fecomlite ARGS` run in `cwd` as a user runs it."""
    return invoke(list(args), cwd=cwd)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("healthy") / "store.sqlite"
    with Store(path) as store:
        build_run(store)
    return path


def _copy(healthy: Path, folder: Path) -> Path:
    path = folder / "store.sqlite"
    shutil.copyfile(healthy, path)
    return path


def patched(path: Path) -> None:
    """40 random 64-byte patches past the header, as a failing disk or a stray write leaves."""
    data = bytearray(path.read_bytes())
    rng = random.Random(31)
    for _ in range(40):
        at = rng.randrange(100, len(data) - 64)
        data[at:at + 64] = rng.randbytes(64)
    path.write_bytes(bytes(data))


def sqlite_finds_damage(path: Path) -> bool:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA integrity_check").fetchall() != [("ok",)]
    except sqlite3.DatabaseError:
        return True
    finally:
        db.close()


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def foreign(path: Path) -> None:
    path.unlink()
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (body TEXT)")
    db.commit()
    db.close()


def old_schema(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("DROP TABLE batches")
    db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    db.execute("PRAGMA application_id=0")
    db.commit()
    db.close()


def live_copy_without_wal(path: Path) -> None:
    """A `cp` of a store whose server is writing: its rows are still in the -wal file."""
    live = path.with_name("live.sqlite")
    store = Store(live)
    store.create_run(program="x.py")
    shutil.copyfile(live, path)  # the -wal file is not copied
    store.close()


DAMAGES = {  # how the file was spoiled -> what the one-line error says
    "patched": (patched, "is damaged"),
    "truncated": (truncated, "is damaged"),
    "foreign": (foreign, "another application's SQLite file"),
    "old schema": (old_schema, "fecomlite store upgrade"),
    "live copy": (live_copy_without_wal, "-wal"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_read_only_commands_refuse_a_spoiled_store_and_leave_it_as_it_was(
    damage: str, healthy: Path, tmp_path: Path
):
    path = _copy(healthy, tmp_path)
    spoil, said = DAMAGES[damage]
    spoil(path)
    if damage in ("patched", "truncated"):
        assert sqlite_finds_damage(path)  # the fixture is damaged in SQLite's own eyes
    before = path.read_bytes()
    for args in READERS:
        where = ["--store", str(path)] if args[0] != "store" else [str(path)]
        result = cli(*args, *where, cwd=tmp_path)
        said_all = " ".join(result.output.split())
        assert result.exit_code != 0, (args, result.output)
        assert said in said_all, (args, result.output)
        assert "Traceback" not in result.output, (args, result.output)  # its own process
        assert path.read_bytes() == before, args
    wal = path.with_name("store.sqlite-wal")  # SQLite may open an empty one to read
    assert not wal.exists() or wal.stat().st_size == 0


def test_a_healthy_store_is_read_without_a_byte_written(healthy: Path, tmp_path: Path):
    path = _copy(healthy, tmp_path)
    before = path.read_bytes()
    result = cli("report", "1", "--store", str(path), "--format", "json", "--out",
                 str(tmp_path / "r"), cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.json").exists()
    assert path.read_bytes() == before
    checked = cli("store", "check", str(path), cwd=tmp_path)
    assert checked.exit_code == 0 and "whole" in checked.output, checked.output


def test_an_old_schema_is_upgraded_only_by_a_writer_which_keeps_a_copy(healthy: Path,
                                                                        tmp_path: Path):
    path = _copy(healthy, tmp_path)
    old_schema(path)
    with pytest.raises(StoreError, match="schema version 1"):
        Store(path, readonly=True)
    result = cli("store", "upgrade", str(path), cwd=tmp_path)
    assert result.exit_code == 0, result.output
    kept = tmp_path / "store.sqlite.schema1.bak"
    said = " ".join(result.output.split())
    assert f"from schema 1 to {SCHEMA_VERSION}" in said and kept.name in said
    db = sqlite3.connect(kept)  # the old file, as it was: schema 1, no batches table
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("1",)
    assert "batches" not in {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    db.close()
    with Store(path, readonly=True) as store:  # now readable, its run intact
        assert store.run(1)["program"] == "bench.py"
    again = cli("store", "upgrade", str(path), cwd=tmp_path)
    assert "already of schema" in again.output


def test_a_store_in_use_is_copied_whole_and_the_copy_stands_alone(tmp_path: Path):
    live = tmp_path / "live.sqlite"
    writer = Store(live)
    run = writer.create_run(program="train.py")
    assert Path(f"{live}-wal").stat().st_size > 0  # the row is in the -wal file only
    copy = tmp_path / "copy.sqlite"
    assert copy_store(live, copy) == 1
    writer.close()
    assert not Path(f"{copy}-wal").exists()
    with Store(copy, readonly=True) as store:
        assert store.run(run)["program"] == "train.py"
    result = cli("store", "copy", str(live), str(copy), cwd=tmp_path)
    assert result.exit_code == 1 and "exists" in result.output


def test_a_writer_refuses_a_damaged_store(healthy: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch):
    """`fecomlite run` on a damaged store: the server checks it before the first run (a large
    store while it already answers), and adds no run to it."""
    from fecomlite.server import service

    path = _copy(healthy, tmp_path)
    patched(path)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="is damaged"):
        service.MeasurementService(path, [])
    assert path.read_bytes() == before
    monkeypatch.setattr(service, "CHECK_AT_START_BYTES", 0)  # as a store of many GB
    served = service.MeasurementService(path, [])
    try:
        deadline = time.monotonic() + 30
        while served._damage is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(StoreError, match="is damaged"):
            served.create_run(program="x.py")
        assert any("is damaged" in note for note in served.notes)
    finally:
        served.close()


def test_a_plain_copy_of_an_idle_servers_store_holds_its_runs(tmp_path: Path):
    """The server checkpoints when its last run ends: the store file alone then holds it."""
    from test_server_support import FakeSensorForTests, encode_batch, serving

    home = tmp_path / "home"
    with serving(home, [FakeSensorForTests("p")]) as (_, client):
        run, token = client.create_run("x.py", [], "method", {})
        client.post_batch(run, token, encode_batch(1, 1, [("a.py:1:0", 10, 20, 1, 0, -1, -1)] * 3))
        client.finish_run(run, "finished", 0)
        copy = tmp_path / "copy.sqlite"
        shutil.copyfile(home / "store.sqlite", copy)  # the server still runs
    with Store(copy, readonly=True) as store:
        assert store.run(run)["status"] == "finished"
        assert store.event_count(run) == 3
