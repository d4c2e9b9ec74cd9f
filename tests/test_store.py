"""The run store alone: batches land whole, schema and file errors are named."""

from __future__ import annotations

import sqlite3
import stat

import pytest
from stored_events import events_table

from fecomlite.runtime import batch_codec
from fecomlite.store import APPLICATION_ID, SCHEMA_VERSION, Store, StoreError, private_home


def make_batch(sites: list[str], rows: list[tuple[int, int, int, int]], **meta) -> bytes:
    """rows: (site index, t0, t1, status) -> an encoded batch as the probe sends it."""
    from array import array

    columns = (
        array("i", [r[0] for r in rows]).tobytes(),
        array("q", [r[1] for r in rows]).tobytes(),
        array("q", [r[2] for r in rows]).tobytes(),
        array("Q", [7] * len(rows)).tobytes(),
        bytes(r[3] for r in rows),
        array("q", [100] + [-1] * (len(rows) - 1)).tobytes(),
        array("q", [-1] * len(rows)).tobytes(),
    )
    return batch_codec.encode({"rep": 2, "pid": 42, **meta}, sites, columns)


def test_a_batch_lands_with_its_sites_and_hyperparameters(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    run = store.create_run(program="train.py", settings={"repeat": 2})
    manifest = {"a.py:1:0": {"api": "torch.matmul", "file": "a.py", "line": 1, "kind": "function"}}
    header, cols = batch_codec.decode(
        make_batch(
            ["a.py:1:0", "region:epoch"],
            [(0, 10, 20, 0), (1, 5, 30, 1), (0, 40, 45, 0)],
            hyperparams={"epochs": 3},
        )
    )
    assert store.add_batch(run, header, cols, manifest) == 3
    rows = events_table(store).db.execute(
        "SELECT s.api, s.kind, e.rep, e.pid, e.tid, e.t_start_ns, e.status, e.in_bytes "
        "FROM events e JOIN sites s ON s.id = e.site_id ORDER BY e.t_start_ns"
    ).fetchall()
    assert [tuple(r) for r in rows] == [
        ("region:epoch", "region", 2, 42, 7, 5, 1, None),
        ("torch.matmul", "function", 2, 42, 7, 10, 0, 100),
        ("torch.matmul", "function", 2, 42, 7, 40, 0, None),
    ]
    assert store.run(run)["hyperparams"] == {"epochs": 3}
    assert store.run(run)["settings"] == {"repeat": 2}


def test_a_failing_batch_leaves_nothing_behind(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    run = store.create_run()
    header, cols = batch_codec.decode(make_batch(["a"], [(0, 1, 2, 0), (0, 3, 4, 0)]))
    cols = {**cols, "status": cols["status"][:1]}  # a column shorter than the others
    with pytest.raises(ValueError):
        store.add_batch(run, header, cols)
    assert store.event_count(run) == 0


def test_other_files_and_versions_are_refused_with_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="no run store"):
        Store(tmp_path / "missing.sqlite", create=False)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match="not a fecomlite run store"):
        Store(junk)
    path = tmp_path / "old.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        Store(path)


def test_latest_run_skips_child_runs(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    first = store.create_run()
    store.create_run(kind="datasize", parent_id=first)
    assert store.latest_run_id() == first
    second = store.create_run(kind="watch")
    assert store.latest_run_id() == second


def test_another_applications_sqlite_file_is_refused_untouched(tmp_path):
    path = tmp_path / "theirs.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (body TEXT)")
    db.execute("INSERT INTO notes VALUES ('keep me')")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a fecomlite run store.*did not create"):
        Store(path)
    assert path.read_bytes() == before  # no tables added, not switched to WAL
    assert not (tmp_path / "theirs.sqlite-wal").exists()


def test_a_damaged_store_is_a_clear_error(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.create_run(program="x.py")
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    for offset in range(0, len(data), 97):  # scattered corruption, header included
        data[offset] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=str(path)):
        Store(path)


def test_a_new_store_is_private_and_marked_as_fecomlites(tmp_path):
    folder = tmp_path / "home"
    with Store(folder / "s.sqlite") as store:
        store.create_run()
        assert store.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert len(store.store_id) == 32
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for name in ("s.sqlite", "s.sqlite-wal", "s.sqlite-shm"):  # SQLite copies the mode
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600


def test_a_version_1_store_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        run = store.create_run(program="x.py")
        store.db.execute("DROP TABLE batches")
        store.db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
        store.db.execute("PRAGMA application_id=0")
    with Store(path) as store:
        assert store.run(run)["program"] == "x.py"
        header, cols = batch_codec.decode(make_batch(["a"], [(0, 1, 2, 0)], proc="p", seq=0))
        assert store.add_batch(run, header, cols) == 1
        assert store.add_batch(run, header, cols) == 0  # stored once


def test_an_unwritable_home_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError, match=f"cannot create {blocker}"):
        Store(blocker / "home" / "s.sqlite")


def test_fecomlites_folders_are_created_private_at_every_level(tmp_path):
    home = private_home(tmp_path / "a" / "b" / ".fecomlite")
    for folder in (home, home.parent, home.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    home.chmod(0o755)  # left open by an older fecomlite
    assert stat.S_IMODE(private_home(home).stat().st_mode) == 0o700


def tuples(rows) -> list[tuple]:
    return [tuple(r) for r in rows]


def _stored_run(store: Store) -> int:
    run = store.create_run(program="train.py", level="method", settings={})
    header, cols = batch_codec.decode(make_batch(
        ["a.py:1:0", "region:train"], [(0, 10, 20, 0), (1, 5, 30, 0), (1, 50, 60, 0)]))
    store.add_batch(run, header, cols, {"a.py:1:0": {"api": "torch.matmul", "kind": "function"}})
    return run


def test_reads_return_what_was_written_by_name(tmp_path):
    """The reads others use instead of SQL (fecomlite/store/reads.py)."""
    store = Store(tmp_path / "s.sqlite")
    run = _stored_run(store)
    sensor = store.add_sensor(run, name="rapl", domain="cpu-package", unit="J", kind="counter",
                              provenance="measured", model="", period_s=0.1)
    store.add_samples([(sensor, t, float(t)) for t in (10, 20, 30, 40)])
    assert tuples(store.samples(sensor)) == [(10, 10.0), (20, 20.0), (30, 30.0), (40, 40.0)]
    assert tuples(store.samples(sensor, 20, 30)) == [(20, 20.0), (30, 30.0)]
    assert tuples(store.samples(sensor, 20, 30, after_start=True)) == [(30, 30.0)]
    assert tuples(store.samples(sensor, 25)) == [(30, 30.0), (40, 40.0)]
    assert store.max_sample(sensor, 0, 35) == 30.0
    assert store.max_sample(sensor, 41, 99) is None
    assert store.first_sample_ns(run) == 10
    assert tuples(store.site_spans(run, "region:train")) == [(5, 30), (50, 60)]
    assert [tuple(r[4:6]) for r in store.event_rows(run)] == [(5, 30), (10, 20), (50, 60)]
    assert store.first_event_ns(run) == 5
    assert sorted(store.site_apis(run).values()) == ["region:train", "torch.matmul"]
    assert store.sensor_names(run) == {"rapl"}


def test_run_queries_filter_by_kind_status_and_result(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    first = store.create_run(program="p.py", level="method", kind="instrumented",
                             status="finished")
    second = store.create_run(program="p.py", level="project", kind="sweep", status="running")
    third = store.create_run(program="p.py", level="method", kind="instrumented",
                             status="finished")
    assert store.run_ids() == [first, second, third]
    assert store.run_ids(("sweep",)) == [second]
    assert store.run_ids(status="finished", newest_first=True) == [third, first]
    assert store.latest_method_run("p.py", other_than=third) == first
    assert store.latest_method_run("q.py", other_than=third) is None
    store.put_result(first, "idle_baseline", {"sensors": {}})
    assert store.latest_run_with_result("idle_baseline", other_than=third) == first
    assert store.latest_run_with_result("idle_baseline", other_than=first) is None


def test_a_follower_reads_only_what_is_new(tmp_path):
    """The live view's reads: events stored after a cursor (a chunk id), per run."""
    store = Store(tmp_path / "s.sqlite")
    run = _stored_run(store)
    assert store.first_event_rowid(run) == 1
    assert store.new_calls_by_site_and_process(run, 1, store.last_rowid("events")) == []
    header, cols = batch_codec.decode(make_batch(
        ["region:train"], [(0, 70, 80, 0), (0, 81, 90, batch_codec.CONTINUES)]))
    store.add_batch(run, header, cols)
    top = store.last_rowid("events")
    assert top == 2
    grouped = store.new_calls_by_site_and_process(run, 1, top)
    assert [tuple(r)[1:] for r in grouped] == [(42, 1, 19)]  # a continuation adds time only
    assert tuple(store.last_new_call(run, 0, top))[1:3] == (81, 90)
    assert tuple(store.last_new_call(run, 0, 1))[1:3] == (50, 60)
    ending = store.new_calls_ending_after(run, 0, top, 25)
    assert list(zip(ending["t_start_ns"].tolist(), ending["t_end_ns"].tolist(), strict=True)) \
        == [(5, 30), (50, 60), (70, 80), (81, 90)]
    with pytest.raises(ValueError):
        store.last_rowid("runs; DROP TABLE runs")


def test_a_child_forked_while_a_writer_holds_the_store_can_write(tmp_path):
    """The writers of one process wait for each other on a lock per store file; a child forked
    while another thread of its parent held it (that thread is not in the child) must not wait
    for it forever."""
    import os
    import threading
    import time

    from fecomlite.store import _writer_lock

    path = tmp_path / "s.sqlite"
    Store(path).close()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _writer_lock(path):  # as a writer in its transaction holds it
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with Store(path) as store:
                    store.create_run(program="child.py")
                    code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60  # a child waiting for the lock forever fails here
        while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        if not done[0]:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        status = done[1] if done[0] else 1 << 8
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0
    with Store(path) as store:
        assert [r["program"] for r in store.runs()] == ["child.py"]
