"""`fecomlite ingest` deletes a spool only when every record is stored, refuses what is no
spool untouched, and names torn records with the events they hold (issue #31)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import invoke
from test_server_support import FakeSensorForTests, encode_batch, served

from fecomlite.runtime import batch_codec
from fecomlite.store import Store

EVENT = ("train.py:1:0", 10, 20, 1, 0, -1, -1)


def _said(result) -> str:
    return " ".join(result.output.split())


@pytest.fixture()
def server(tmp_path: Path):
    with served(tmp_path / "home", [FakeSensorForTests("p")]) as client:
        yield client


def _events(home: Path) -> int:
    with Store(home / "store.sqlite", readonly=True) as store:
        return sum(store.event_count(run["id"]) for run in store.runs())


def test_a_torn_spool_is_kept_and_its_lost_events_counted(server, tmp_path: Path):
    run, _ = server.create_run("x.py", [], "method", {})
    spool = tmp_path / "rep-1.spool"
    torn = encode_batch(1, 1, [EVENT] * 7679, run=str(run))
    with open(spool, "wb") as f:
        batch_codec.write_record(f, encode_batch(1, 1, [EVENT] * 12, run=str(run)))
        f.write(len(torn).to_bytes(8, "little") + torn[: len(torn) // 2])  # a crash mid-write
    before = spool.read_bytes()
    result = invoke(["ingest", str(spool), "--home", str(tmp_path / "home")])
    assert result.exit_code == 1, result.output
    assert "12 events stored" in _said(result)
    assert f"7,679 events in 1 torn record not stored, kept in {spool}" in _said(result)
    assert spool.read_bytes() == before
    again = invoke(["ingest", str(spool), "--home", str(tmp_path / "home")])  # nothing twice
    assert "0 events stored" in _said(again) and _events(tmp_path / "home") == 12


@pytest.mark.parametrize("content", [b"meeting notes\nbuy milk\n" * 40, b""],
                         ids=["text", "empty"])
def test_a_file_that_is_no_spool_is_refused_untouched(server, tmp_path: Path, content: bytes):
    notes = tmp_path / "notes.txt"
    notes.write_bytes(content)
    result = invoke(["ingest", str(notes), "--home", str(tmp_path / "home")])
    assert result.exit_code == 1
    assert "left as it is" in _said(result) and "Traceback" not in result.output
    assert notes.read_bytes() == content
    assert _events(tmp_path / "home") == 0


def test_a_folder_and_a_system_file_are_named_not_tracebacks(server, tmp_path: Path):
    run, _ = server.create_run("x.py", [], "method", {})
    folder = tmp_path / "spools"
    folder.mkdir()
    with open(folder / "a.spool", "wb") as f:
        batch_codec.write_record(f, encode_batch(1, 1, [EVENT] * 3, run=str(run)))
    result = invoke(["ingest", str(folder), "/etc/passwd", str(tmp_path / "missing.spool"),
                     "--home", str(tmp_path / "home")])
    said = _said(result)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "3 events stored" in said and not (folder / "a.spool").exists()  # whole: deleted
    assert "/etc/passwd is not a fecomlite spool" in said and "MemoryError" not in said
    assert f"no spool file or folder at {tmp_path / 'missing.spool'}" in said
    empty = invoke(["ingest", str(folder), "--home", str(tmp_path / "home")])
    assert empty.exit_code == 1 and "holds no *.spool files" in _said(empty)
