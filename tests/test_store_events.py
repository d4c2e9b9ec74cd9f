"""Call events kept as compressed chunks (fecomlite/store/events.py): what goes in comes out,
and a store of the previous schema is upgraded, its old file kept."""

from __future__ import annotations

import sqlite3
from array import array

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fecomlite.runtime import batch_codec
from fecomlite.store import SCHEMA_VERSION, Store, events

TIDS = [1, 2**64 - 3, 140_000_123_456]
event = st.tuples(
    st.integers(0, 4),  # site index
    st.integers(0, 2**40),  # start
    st.integers(0, 2**30),  # duration
    st.sampled_from(TIDS),
    st.integers(0, batch_codec.RAISED | batch_codec.CONTINUES),
    st.one_of(st.just(-1), st.integers(0, 2**50)),
    st.one_of(st.just(-1), st.integers(0, 2**50)),
)


def _batch(rows: list[tuple[int, ...]], sites: list[str]) -> bytes:
    columns = (
        array("i", [r[0] for r in rows]).tobytes(),
        array("q", [r[1] for r in rows]).tobytes(),
        array("q", [r[1] + r[2] for r in rows]).tobytes(),
        array("Q", [r[3] for r in rows]).tobytes(),
        bytes(r[4] for r in rows),
        array("q", [r[5] for r in rows]).tobytes(),
        array("q", [r[6] for r in rows]).tobytes(),
    )
    return batch_codec.encode({"rep": 3, "pid": 77}, sites, columns)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(event, max_size=40), min_size=1, max_size=3))
def test_any_batch_reads_back_as_it_was_sent(tmp_path_factory, batches):
    store = Store(tmp_path_factory.mktemp("s") / "s.sqlite")
    run = store.create_run()
    sites = [f"a.py:{i}:0" for i in range(5)]
    ids = store.site_ids(run, sites, {})
    sent = []
    for rows in batches:
        header, cols = batch_codec.decode(_batch(rows, sites))
        assert store.add_batch(run, header, cols) == len(rows)
        sent += rows
    # the old rows' order: by start, ties in the order stored
    sent.sort(key=lambda r: r[1])
    tid = np.array([r[3] for r in sent], np.uint64).view(np.int64).tolist()
    expected = [(3, ids[sites[r[0]]], 77, t, r[1], r[1] + r[2], r[4], r[5], r[6])
                for r, t in zip(sent, tid, strict=True)]
    assert store.event_rows(run) == expected
    assert store.event_count(run) == len(sent)
    streamed = list(store.event_chunks(run))
    assert sum(c["t_start_ns"].size for c in streamed) == len(sent)
    for chunk in streamed:  # each chunk by start
        assert (np.diff(chunk["t_start_ns"]) >= 0).all()
    store.close()


def _as_schema_2(path, rows):
    """Make the store at `path` look as the previous release left it: events one row each."""
    db = sqlite3.connect(path)
    db.executescript(
        "DROP TABLE event_chunks;"
        "CREATE TABLE events (run_id INTEGER NOT NULL, rep INTEGER NOT NULL, site_id INTEGER "
        "NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, t_start_ns INTEGER NOT NULL, "
        "t_end_ns INTEGER NOT NULL, status INTEGER NOT NULL, in_bytes INTEGER, out_bytes "
        "INTEGER);"
        "CREATE INDEX events_by_run ON events (run_id, rep, t_start_ns);"
        "UPDATE meta SET value='2' WHERE key='schema_version'; PRAGMA user_version=2;")
    db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()


def test_a_previous_schema_store_is_upgraded_and_its_old_file_kept(tmp_path):
    path = tmp_path / "store.sqlite"
    with Store(path) as store:
        run = store.create_run(program="train.py")
        site = store.site_ids(run, ["a.py:1:0"], {})["a.py:1:0"]
    rows = [(run, 1, site, 9, 5, 30, 40, 0, 64, None), (run, 1, site, 9, 5, 10, 20, 1, None, 8),
            (run, 2, site, 9, -7, 10, 15, 2, None, None)]
    _as_schema_2(path, rows)
    with Store(path) as store:
        assert store.event_rows(run) == [
            (1, site, 9, 5, 10, 20, 1, -1, 8), (1, site, 9, 5, 30, 40, 0, 64, -1),
            (2, site, 9, -7, 10, 15, 2, -1, -1)]
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert not events.has_rows(store.db)
        message = store.upgrade_note
    kept = tmp_path / "store.sqlite.schema2.bak"
    assert f"upgraded the run store {path}" in message and str(kept) in message
    assert "3 call events" in message
    old = sqlite3.connect(kept)  # the file as it was, untouched
    assert old.execute("SELECT count(*) FROM events").fetchone()[0] == 3
    old.close()
    with Store(path) as store:  # upgraded once: nothing more to say
        assert store.event_count(run) == 3
        assert store.upgrade_note is None


def _codec_1_blob(rows: list[tuple[int, ...]]) -> bytes:
    """A chunk as the previous release wrote it (codec 1): every byte plane of every column,
    shuffled, then zlib. `rows`: (site id, thread 0/1, start, duration, status, in, out), by
    start."""
    import struct
    import zlib

    cols = list(zip(*rows, strict=True))
    starts = np.array(cols[2], np.int64)
    stored = [(np.diff(starts, prepend=starts[0]), "<i8"), (np.array(cols[3]), "<i8"),
              (np.array(cols[0]), "<i4"), (np.array(cols[1]), "<i4"), (np.array(cols[4]), "u1"),
              (np.array(cols[5]), "<i8"), (np.array(cols[6]), "<i8")]
    parts = [struct.pack("<I", 2), np.array([5, 6], "<u8").tobytes()]
    for values, dtype in stored:
        v = values.astype(dtype)
        parts.append(v.view(np.uint8).reshape(v.size, v.itemsize).T.tobytes())
    return zlib.compress(b"".join(parts), 1)


def test_a_chunk_of_the_previous_codec_reads_as_written(tmp_path):
    """Codec 2 leaves constant byte planes out and keeps sizes sparse; chunks stored by the
    previous release (codec 1) are still read."""
    with Store(tmp_path / "s.sqlite") as store:
        run = store.create_run()
        site = store.site_ids(run, ["a.py:1:0"], {})["a.py:1:0"]
        rows = [(site, 0, 100, 5, 0, -1, -1), (site, 1, 103, 900, 1, 4096, -1),
                (site, 0, 2**33, 2**20, 2, -1, 7)]
        store.db.execute(
            "INSERT INTO event_chunks (run_id, rep, pid, n, t_first_ns, t_last_ns, codec, data) "
            "VALUES (?, 1, 42, 3, 100, ?, 1, ?)", (run, 2**33 + 2**20, _codec_1_blob(rows)))
        store.add_events(run, 2, 43, {"site_id": [site], "tid": [6], "t_start_ns": [7],
                                      "t_end_ns": [9], "status": [0], "in_bytes": [-1],
                                      "out_bytes": [12]})
        assert store.event_rows(run) == [
            (1, site, 42, 5, 100, 105, 0, -1, -1), (1, site, 42, 6, 103, 1003, 1, 4096, -1),
            (1, site, 42, 5, 2**33, 2**33 + 2**20, 2, -1, 7), (2, site, 43, 6, 7, 9, 0, -1, 12)]
        codecs = store.db.execute("SELECT codec FROM event_chunks ORDER BY id").fetchall()
        assert [c[0] for c in codecs] == [1, events.CODEC]


def test_a_large_chunk_with_noisy_times_reads_back_as_written():
    """Planes of noise (the low bytes of ns-grained times) are kept raw beside the zlib part; a
    chunk of them, with a few sizes taken, on a dozen threads, reads back exactly."""
    rng = np.random.default_rng(11)
    n = 20_000
    start = np.sort(rng.integers(0, 2**40, n))
    many_threads = np.array(TIDS + list(range(3, 12)), np.uint64)  # past the few picked out
    cols = {"site_id": rng.integers(0, 50, n), "tid": rng.choice(many_threads, n),
            "t_start_ns": start, "t_end_ns": start + rng.integers(0, 2**24, n),
            "status": rng.integers(0, 4, n),
            "in_bytes": np.where(rng.random(n) < 0.01, rng.integers(0, 2**50, n), -1),
            "out_bytes": np.where(rng.random(n) < 0.01, rng.integers(0, 2**50, n), -1)}
    chunk = events.encode(cols)
    (packed,) = np.frombuffer(chunk.blob[:4], "<u4")
    assert len(chunk.blob) - 4 - packed >= 4 * n  # the noisy planes, stored as they are
    back = events.decode(chunk.n, chunk.t_first, chunk.blob)
    for name, values in cols.items():
        expected = np.asarray(values).view(np.int64) if name == "tid" else values
        assert np.array_equal(back[name], expected), name


def test_a_run_reads_back_in_the_order_a_sort_of_every_event_gives(tmp_path):
    """`run_columns` decodes each chunk into its place and moves only the events out of order:
    the columns equal those of all chunks joined and sorted stably by (rep, start), and by start
    alone (`by_rep=False`), over chunks stored out of order, repetitions interleaved, ties."""
    rng = np.random.default_rng(5)
    with Store(tmp_path / "s.sqlite") as store:
        run = store.create_run()
        for k in range(12):
            n = int(rng.integers(1, 300))
            start = np.sort(rng.integers(0, 10_000, n))  # ties, and chunks overlapping in time
            events.write(store.db, run, int(rng.integers(1, 4)), 40 + k % 3, {
                "site_id": rng.integers(0, 9, n), "tid": rng.integers(1, 4, n),
                "t_start_ns": start, "t_end_ns": start + rng.integers(0, 500, n),
                "status": rng.integers(0, 4, n), "in_bytes": np.full(n, -1),
                "out_bytes": rng.integers(-1, 99, n)})
        parts = [cols for _, cols in events.chunks(store.db, "run_id=?", (run,))]
        joined = {c: np.concatenate([p[c] for p in parts]) for c in events.COLUMNS}
        for by_rep in (True, False):
            keys = (joined["t_start_ns"], joined["rep"]) if by_rep else (joined["t_start_ns"],)
            order = np.lexsort(keys)
            got = events.run_columns(store.db, run, by_rep=by_rep)
            for c in events.COLUMNS:
                assert np.array_equal(got[c], joined[c][order]), (c, by_rep)
                assert got[c].dtype == joined[c].dtype


def test_dense_ranks_are_np_uniques_inverse():
    """`dense_ranks` by its range table (small ranges), by picking out a few values (thread
    ids, far apart) or by a sort (more values, NaN): each column's count and ranks are
    `np.unique`'s."""
    from fecomlite.store.reads import dense_ranks

    rng = np.random.default_rng(3)
    tids = np.array([140_245_118_125_888, 7, -3, 2**62], np.int64)
    columns = [rng.integers(0, 50, 5000), tids[rng.integers(0, 4, 5000)],
               tids[rng.integers(0, 2, 3)], rng.integers(-2**62, 2**62, 5000),
               np.concatenate((tids[rng.integers(0, 4, 2000)], rng.integers(0, 2**60, 9))),
               np.where(rng.random(3000) < 0.1, np.nan, rng.integers(0, 3, 3000) * 1e12)]
    for column in columns:
        values, inverse = np.unique(column, return_inverse=True)
        distinct, ranks = dense_ranks(column)
        assert distinct == values.size
        assert np.array_equal(ranks, inverse.reshape(-1))
