"""The run store: one SQLite file holding runs, sensor samples, call events and results.

SQLite in WAL mode, one transaction per batch, so a killed writer leaves a store that opens and
holds everything committed before. The schema is versioned in `meta` and in SQLite's own
`user_version`; `application_id` marks the file as fecomlite's, and both are checked before
anything is written, so a foreign or damaged file is refused untouched. The file is its owner's
alone (0600, in a 0700 folder): it holds argv, parameters and source lines. Each probe batch's id
is kept in `batches` under a primary key, so a batch is stored at most once whatever its path.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fecomlite.runtime.comm_hooks import site_row as collective_site_row
from fecomlite.runtime.layers import facts as layer_facts
from fecomlite.runtime.names import adopted, shown_written
from fecomlite.store import call_buckets, events, integrity
from fecomlite.store.reads import StoreReads

SCHEMA_VERSION = 3
APPLICATION_ID = int.from_bytes(b"FCML", "big")
# older schemas this one upgrades in place (v2 added `batches`; v3 keeps events as chunks, the
# old file kept beside it: `Store._upgrade_events`)
UPGRADABLE = {"1", "2"}
MAX_SHAPE_VARIANTS = 8  # distinct argument shapes kept per call site

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    created_unix REAL NOT NULL,          -- wall clock, for display
    kind TEXT NOT NULL DEFAULT 'instrumented',   -- instrumented | watch | datasize | calibration
    parent_id INTEGER,                   -- a data-size or calibration run's main run
    program TEXT NOT NULL DEFAULT '',
    argv TEXT NOT NULL DEFAULT '[]',     -- json
    level TEXT NOT NULL DEFAULT 'method',
    status TEXT NOT NULL DEFAULT 'running',  -- running | finished | failed | interrupted
    exit_code INTEGER,
    settings TEXT NOT NULL DEFAULT '{}',     -- json: every setting used
    hyperparams TEXT NOT NULL DEFAULT '{}',  -- json
    machine TEXT NOT NULL DEFAULT '{}',      -- json
    idle TEXT NOT NULL DEFAULT '{}',         -- json: sensor name -> idle power (W) or value
    manifest TEXT NOT NULL DEFAULT '{}',     -- json: the instrumenter's manifest, if any
    t_start_ns INTEGER,
    t_end_ns INTEGER
);
CREATE TABLE IF NOT EXISTS repetitions (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    rep INTEGER NOT NULL,
    t_start_ns INTEGER,
    t_end_ns INTEGER,                    -- the program ended
    tail_end_ns INTEGER,                 -- sampling after the program ended
    exit_code INTEGER,
    gate TEXT NOT NULL DEFAULT '{}',     -- json: what was checked, passed, waited
    extra TEXT NOT NULL DEFAULT '{}',    -- json: e.g. the data-size fraction
    PRIMARY KEY (run_id, rep)
);
CREATE TABLE IF NOT EXISTS sensors (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    name TEXT NOT NULL,
    domain TEXT NOT NULL,
    unit TEXT NOT NULL,
    kind TEXT NOT NULL,                  -- counter | power | gauge
    provenance TEXT NOT NULL,            -- measured | estimated
    model TEXT,
    period_s REAL,
    UNIQUE (run_id, name)
);
CREATE TABLE IF NOT EXISTS samples (
    sensor_id INTEGER NOT NULL REFERENCES sensors(id),
    t_ns INTEGER NOT NULL,
    value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_sensor ON samples (sensor_id, t_ns);
CREATE TABLE IF NOT EXISTS sites (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,
    file TEXT NOT NULL DEFAULT '',
    line INTEGER NOT NULL DEFAULT 0,
    col INTEGER NOT NULL DEFAULT 0,
    api TEXT NOT NULL DEFAULT '',
    written TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL DEFAULT 'function',
    function TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL DEFAULT '',
    UNIQUE (run_id, key)
);
CREATE TABLE IF NOT EXISTS processes (  -- ranks of a distributed job (fecomlite/distributed)
    run_id INTEGER NOT NULL REFERENCES runs(id),
    pid INTEGER NOT NULL,                -- as in events
    rank INTEGER NOT NULL,
    local_rank INTEGER NOT NULL,
    node INTEGER NOT NULL DEFAULT 0,
    device TEXT NOT NULL DEFAULT 'cpu',  -- gpu:N (NVML index) or cpu
    job TEXT NOT NULL DEFAULT '',        -- the launcher's run id (TORCHELASTIC_RUN_ID)
    clock_offset_ns INTEGER NOT NULL DEFAULT 0,  -- wall clock - CLOCK_MONOTONIC on its node
    PRIMARY KEY (run_id, pid)
);
CREATE TABLE IF NOT EXISTS batches (
    proc TEXT NOT NULL,                  -- the sending process's random id
    seq INTEGER NOT NULL,                -- its batch number
    run_id INTEGER NOT NULL REFERENCES runs(id),
    events INTEGER NOT NULL,
    total INTEGER,                       -- events the process had produced, this batch's too
    PRIMARY KEY (proc, seq)
);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    name TEXT NOT NULL,
    value TEXT NOT NULL,                 -- json
    PRIMARY KEY (run_id, name)
);
""" + events.SCHEMA + call_buckets.SCHEMA  # call events: compressed column chunks
# (fecomlite/store/events.py); calls folded past a detail window (store/call_buckets.py)

PROCESS_FIELDS = {  # a batch header's rank fields, and their types
    "rank": int,
    "local_rank": int,
    "node": int,
    "device": str,
    "job": str,
    "clock_offset_ns": int,
}
JSON_COLUMNS = ("argv", "settings", "hyperparams", "machine", "idle", "manifest", "gate", "extra")


def default_home() -> Path:
    """Where fecomlite keeps its store, server state and spool: $FECOMLITE_HOME or ./.fecomlite."""
    return Path(os.environ.get("FECOMLITE_HOME", ".fecomlite")).resolve()


def default_store_path() -> Path:
    return default_home() / "store.sqlite"


class StoreError(RuntimeError):
    """The store file is missing, of another schema version, not a fecomlite store, damaged, or
    cannot be opened (the message names the path)."""


MAX_ROW_ID = 2**63 - 1  # SQLite's largest integer


def run_ids_in_range(ids: Sequence[int]) -> list[int]:
    """Run ids as given on a command line, refused (StoreError) beyond what SQLite holds."""
    for run_id in ids:
        if not 0 < run_id <= MAX_ROW_ID:
            raise StoreError(f"no run {run_id}: run ids are whole numbers from 1")
    return list(ids)


def write_error(exc: OSError) -> str:
    """A failed write of an output file or folder, in one line."""
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot write{where}: {exc.strerror or exc}"


def private_dir(path: Path) -> Path:
    """Create `path` and its missing parents as 0700; an existing folder is left as it is."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    try:
        for folder in reversed(missing):
            folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {path}: {exc.strerror or exc}") from exc
    return path


def private_home(home: Path) -> Path:
    """fecomlite's folder, its owner's alone (0700), made so if an older version left it open."""
    private_dir(home)
    try:
        if home.stat().st_mode & 0o077:
            home.chmod(0o700)
    except OSError as exc:
        raise StoreError(f"cannot use {home}: {exc.strerror or exc}") from exc
    return home


class Store(StoreReads, call_buckets.BucketStore):
    """A connection to one run store. Not thread-safe: one Store per thread."""

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = True, readonly: bool = False
    ) -> None:
        """`readonly`: open the file as it is, write nothing, and refuse it unless it is a whole
        store of this schema (the reads of `report`, `export`, `merge`). Otherwise a writer's
        store, created if missing (`create`), upgraded from an older schema after a copy is
        kept beside it (`upgrade_note` then says so)."""
        self.path = Path(path)
        self.readonly = readonly
        self.upgrade_note: str | None = None
        self._site_cache: dict[int, dict[str, int]] = {}  # run -> committed site key -> id
        if (readonly or not create) and not self.path.exists():
            raise StoreError(f"no run store at {self.path} (run `fecomlite run` first)")
        if self.path.exists() and not self.path.is_file():
            raise StoreError(f"{self.path} is a directory, not a run store file")
        fresh = not readonly and (not self.path.exists() or self.path.stat().st_size == 0)
        if fresh:
            _create_private(self.path)
        try:
            if readonly:
                self.db = integrity.connect_readonly(self.path)
            else:
                self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        except sqlite3.OperationalError as exc:
            raise StoreError(f"cannot open the run store {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:  # read-only: its first read found it damaged
            raise self._refusal(exc) from exc
        self.db.row_factory = sqlite3.Row
        try:
            self._open(fresh)
        except sqlite3.DatabaseError as exc:
            self.db.close()
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            raise self._refusal(exc) from exc
        except (StoreError, OSError) as exc:
            self.db.close()
            if isinstance(exc, OSError):
                raise StoreError(f"cannot use the run store {self.path}: {exc}") from exc
            raise

    def _refusal(self, exc: sqlite3.DatabaseError) -> StoreError:
        """What SQLite's error on opening says of the file, in one line."""
        if isinstance(exc, sqlite3.OperationalError):
            return StoreError(f"cannot use the run store {self.path}: {exc}")
        if "not a database" in str(exc):
            return StoreError(f"{self.path} is not a fecomlite run store, or is damaged: {exc}")
        return StoreError(integrity.damaged(self.path, str(exc)))

    def _open(self, fresh: bool) -> None:
        """Check the file before anything is written; a reader also checks its pages."""
        version = None if fresh else self._check_identity()
        if self.readonly:
            if version != str(SCHEMA_VERSION):
                raise StoreError(
                    f"{self.path} has schema version {version} (an older fecomlite's); "
                    f"`fecomlite store upgrade {self.path}` upgrades it, keeping a copy"
                )
            self.check()
            return
        if self.db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        if version != str(SCHEMA_VERSION):
            if version is not None:
                kept = integrity.keep_copy(self.db, self.path, version)
                moved = self._upgrade_events()
                self.upgrade_note = (f"upgraded the run store {self.path} from schema "
                                     f"{version} to {SCHEMA_VERSION} ({moved:,} call events "
                                     f"now kept as compressed chunks); the old file is kept "
                                     f"as {kept}")
            self._init_schema()
        elif not call_buckets.has_table(self.db):  # a store of this schema from before --keep
            self._init_schema()

    def check(self) -> None:
        """Refuse a store whose pages SQLite finds damaged (~3.4 s per GB, a full read)."""
        reason = integrity.damage_reason(self.db, self.path)
        if reason:
            raise StoreError(reason)

    def checkpoint(self) -> None:
        """Move what the -wal file holds into the store file (without waiting for readers), so
        that a plain copy of an idle store's file holds every run."""
        self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _check_identity(self) -> str:
        """Refuse a file fecomlite did not create (or of another schema) before writing;
        returns its schema version."""
        reason = integrity.foreign_reason(self.db, self.path, APPLICATION_ID)
        if reason:
            raise StoreError(reason)
        version = integrity.schema_version(self.db)
        if version != str(SCHEMA_VERSION) and version not in UPGRADABLE:
            raise StoreError(
                f"{self.path} has schema version {version}, this fecomlite reads {SCHEMA_VERSION}"
            )
        return version

    def _upgrade_events(self) -> int:
        """Schema <= 2 kept a row per call: its events become chunks (the caller has kept the
        file as it was). Returns how many were moved; 0 where another process did it first."""
        with self.transaction():
            if not events.has_rows(self.db):
                return 0  # another process upgraded it meanwhile
            for statement in events.SCHEMA.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            moved = events.convert_rows(self.db)
        self.db.execute("VACUUM")
        return moved

    def _init_schema(self) -> None:
        if self._schema_current():
            return  # opening a current store writes nothing: its disk may be full
        with self.transaction():
            self.db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            for statement in SCHEMA.split(";"):  # every statement is IF NOT EXISTS
                if statement.strip():
                    self.db.execute(statement)
            self.db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            self.db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (uuid.uuid4().hex,)
            )

    def _schema_current(self) -> bool:
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master")}
        return (self.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
                and self.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
                and {"meta", "runs", "event_chunks", "batches", "results", call_buckets.TABLE}
                <= tables)

    @property
    def store_id(self) -> str:
        """This store's random identity: spools name it, so `ingest` refuses another's."""
        return str(self.db.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()[0])

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self) -> _Transaction:
        """Everything inside commits together or not at all."""
        return _Transaction(self.db, _writer_lock(self.path))

    # -- runs ---------------------------------------------------------------------------------

    def create_run(self, **fields: Any) -> int:
        fields.setdefault("created_unix", time.time())
        cols, vals = _encode(fields)
        with self.transaction():
            cur = self.db.execute(
                f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", vals
            )
        return int(cur.lastrowid)

    def update_run(self, run_id: int, **fields: Any) -> None:
        cols, vals = _encode(fields)
        with self.transaction():
            self.db.execute(
                f"UPDATE runs SET {', '.join(c + '=?' for c in cols)} WHERE id=?", (*vals, run_id)
            )

    def interrupt_open_runs(self) -> list[int]:
        """Mark `interrupted` the runs still `running` (their server is gone: a new one starts),
        ending each at its last sample; returns their ids."""
        with self.transaction():
            ids = [r[0] for r in self.db.execute("SELECT id FROM runs WHERE status='running'")]
            self.db.execute(
                "UPDATE runs SET status='interrupted', t_end_ns=coalesce(t_end_ns, ("
                "SELECT max(s.t_ns) FROM samples s JOIN sensors n ON n.id=s.sensor_id "
                "WHERE n.run_id=runs.id)) WHERE status='running'"
            )
        return ids

    def merge_hyperparams(self, run_id: int, params: dict[str, Any]) -> None:
        with self.transaction():
            self._merge_hyperparams(run_id, params)

    def _merge_hyperparams(self, run_id: int, params: dict[str, Any]) -> None:
        row = self.db.execute("SELECT hyperparams FROM runs WHERE id=?", (run_id,)).fetchone()
        merged = {**json.loads(row[0]), **params} if row else params
        merged = {k: v for k, v in merged.items() if v is not None}  # None: found unsure
        self.db.execute("UPDATE runs SET hyperparams=? WHERE id=?", (json.dumps(merged), run_id))

    def run(self, run_id: int) -> dict[str, Any]:
        """The run's row, with `lost_events`: events its probes could neither send nor spool,
        and of them `lost_at_exit`: those of processes that died before sending them."""
        row = self.db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id} in {self.path}")
        lost = self.result(run_id, "lost_events") or {}
        return {**_decode(row), "lost_events": int(lost.get("events", 0)),
                "lost_at_exit": int(lost.get("at_exit", 0))}

    def runs(self) -> list[dict[str, Any]]:
        return [_decode(r) for r in self.db.execute("SELECT * FROM runs ORDER BY id")]

    def latest_run_id(self, kinds: Sequence[str] = ("instrumented", "watch")) -> int:
        marks = ",".join("?" * len(kinds))
        row = self.db.execute(
            f"SELECT max(id) FROM runs WHERE kind IN ({marks}) AND parent_id IS NULL", tuple(kinds)
        ).fetchone()
        if row is None or row[0] is None:
            raise StoreError(f"no runs in {self.path}")
        return int(row[0])

    # -- repetitions --------------------------------------------------------------------------

    def upsert_repetition(self, run_id: int, rep: int, **fields: Any) -> None:
        cols, vals = _encode(fields)
        with self.transaction():
            self.db.execute(
                "INSERT OR IGNORE INTO repetitions (run_id, rep) VALUES (?, ?)", (run_id, rep)
            )
            if cols:
                self.db.execute(
                    f"UPDATE repetitions SET {', '.join(c + '=?' for c in cols)} "
                    "WHERE run_id=? AND rep=?",
                    (*vals, run_id, rep),
                )

    def repetitions(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM repetitions WHERE run_id=? ORDER BY rep", (run_id,))
        return [_decode(r) for r in rows]

    # -- sensors and samples ------------------------------------------------------------------

    def add_sensor(self, run_id: int, **fields: Any) -> int:
        cols, vals = _encode({"run_id": run_id, **fields})
        with self.transaction():
            cur = self.db.execute(
                f"INSERT INTO sensors ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                "ON CONFLICT (run_id, name) DO UPDATE SET period_s=excluded.period_s",
                vals,
            )
            if not cur.lastrowid:
                return self.sensor_id(run_id, fields["name"])
        return self.sensor_id(run_id, fields["name"])

    def sensor_id(self, run_id: int, name: str) -> int:
        row = self.db.execute(
            "SELECT id FROM sensors WHERE run_id=? AND name=?", (run_id, name)
        ).fetchone()
        if row is None:
            raise StoreError(f"run {run_id} has no sensor {name!r}")
        return int(row[0])

    def sensors(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM sensors WHERE run_id=? ORDER BY id", (run_id,))
        return [dict(r) for r in rows]

    def add_samples(self, rows: Iterable[tuple[int, int, float]]) -> None:
        """rows: (sensor_id, t_ns, value), committed as one batch."""
        with self.transaction():
            self.db.executemany("INSERT INTO samples VALUES (?, ?, ?)", rows)

    # -- sites and events ---------------------------------------------------------------------

    def site_ids(
        self, run_id: int, keys: Iterable[str], manifest: dict[str, Any]
    ) -> dict[str, int]:
        """Map site keys to ids, creating rows (from the manifest where it knows the key). Ids
        once committed never change: they are remembered, so a batch of known sites (all but a
        run's first few) asks the store nothing."""
        wanted = set(keys)
        known = self._site_cache.get(run_id, {})
        if wanted <= known.keys():
            return {k: known[k] for k in wanted}
        with self.transaction():  # under the write lock: another writer may add them now
            known = {
                r[0]: r[1]
                for r in self.db.execute("SELECT key, id FROM sites WHERE run_id=?", (run_id,))
            }
            for key in sorted(wanted - known.keys()):
                info = manifest.get(key) or _site_from_key(key)
                cur = self.db.execute(
                    "INSERT INTO sites (run_id, key, file, line, col, api, written, kind, "
                    "function, source) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        run_id,
                        key,
                        info.get("file", ""),
                        info.get("line", 0),
                        info.get("col", 0),
                        info.get("api", key),
                        shown_written(info),
                        info.get("kind", "function"),
                        info.get("function", ""),
                        info.get("source", ""),
                    ),
                )
                known[key] = int(cur.lastrowid)
        if not self.db.in_transaction:  # committed: an outer transaction could still undo them
            self._site_cache[run_id] = known
        return {k: known[k] for k in wanted}

    def describe_sites(self, run_id: int, manifest: dict[str, Any]) -> int:
        """Rows made from a site's key alone (its events came before the manifest knew it: a
        module the program imported by a computed name) take the manifest's file, line, kind,
        function and source; their API too, unless the probe's run-time name replaced it
        (`_name_sites`). Returns how many rows were described."""
        rows = self.db.execute(
            "SELECT id, key, api, written FROM sites WHERE run_id=? AND file=''", (run_id,)
        ).fetchall()
        updates = []
        for site_id, key, api, written in rows:
            info = manifest.get(key)
            if not isinstance(info, dict) or not info.get("file"):
                continue
            named = api != key  # a name the probe adopted at run time stays
            updates.append((
                info.get("file", ""), info.get("line", 0), info.get("col", 0),
                api if named else info.get("api", key),
                written if named and written else shown_written(info),
                info.get("kind", "function"), info.get("function", ""), info.get("source", ""),
                site_id,
            ))
        with self.transaction():
            self.db.executemany(
                "UPDATE sites SET file=?, line=?, col=?, api=?, written=?, kind=?, function=?, "
                "source=? WHERE id=?", updates)
        return len(updates)

    def has_batch(self, header: dict[str, Any]) -> bool:
        """Whether the batch with this header's id (proc, seq) is stored already."""
        if "proc" not in header:
            return False
        row = self.db.execute(
            "SELECT 1 FROM batches WHERE proc=? AND seq=?", (header["proc"], header.get("seq", 0))
        ).fetchone()
        return row is not None

    def lost_events(self, run_id: int, totals: dict[str, int] | None = None) -> int:
        """Events the run's processes produced that never arrived: for each process, the events
        it had produced by its latest batch (`total`; `totals` adds what the server heard of but
        could not store) less those stored."""
        produced = dict(totals or {})
        stored: dict[str, int] = {}
        for proc, total, stored_n in self.db.execute(
            "SELECT proc, max(total), sum(events) FROM batches WHERE run_id=? GROUP BY proc",
            (run_id,),
        ):
            produced[proc] = max(produced.get(proc, 0), total or 0)
            stored[proc] = stored_n
        return sum(max(n - stored.get(proc, 0), 0) for proc, n in produced.items())

    def add_batch(
        self,
        run_id: int,
        header: dict[str, Any],
        columns: dict[str, Any],
        manifest: dict[str, Any] | None = None,
    ) -> int:
        """Store one decoded probe batch (fecomlite.runtime.batch_codec) whole, hyperparameters too;
        a batch whose id (proc, seq) is stored already is skipped: returns 0. The events are
        compressed before the write lock is taken (`events.Encoded`): concurrent batches
        compress side by side and wait only for their few inserts."""
        names: list[str] = header["sites"]
        ids = self.site_ids(run_id, names, manifest or {})
        site_ids = events.site_ids_of(columns["site"], [ids[name] for name in names])
        chunk = events.encode(self._event_columns(site_ids, columns))
        with self.transaction():
            if "proc" in header:
                claimed = self.db.execute(
                    "INSERT OR IGNORE INTO batches (proc, seq, run_id, events, total) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        header["proc"],
                        header.get("seq", 0),
                        run_id,
                        header["n"],
                        header.get("total"),
                    ),
                )
                if claimed.rowcount == 0:
                    return 0
            return self._add_events(run_id, header, chunk, manifest)

    def _add_events(
        self,
        run_id: int,
        header: dict[str, Any],
        chunk: events.Encoded,
        manifest: dict[str, Any] | None,
    ) -> int:
        rep, pid = int(header.get("rep", 0)), int(header.get("pid", 0))
        n = events.put(self.db, run_id, rep, pid, chunk)
        if header.get("hyperparams"):
            self._merge_hyperparams(run_id, header["hyperparams"])
        if "rank" in header:
            self.put_process(run_id, pid, header)
        if isinstance(header.get("shapes"), dict) and header["shapes"]:
            self._merge_shapes(run_id, header["shapes"])
        if isinstance(header.get("names"), dict) and header["names"]:
            self._name_sites(run_id, header["names"], manifest or {})
        # fecomlite.runtime.layers
        if isinstance(header.get("layers"), dict) and header["layers"]:
            self.put_result(
                run_id,
                "layers",
                layer_facts.merge(self.result(run_id, "layers") or {}, header["layers"]),
            )
        return n

    @staticmethod
    def _event_columns(site_ids: Any, columns: dict[str, Any]) -> dict[str, Any]:
        """A batch's columns with the store's site ids; every column one length, or ValueError
        (nothing is stored then)."""
        stored = {**{k: columns[k] for k in ("tid", "t_start_ns", "t_end_ns", "status",
                                              "in_bytes", "out_bytes")}, "site_id": site_ids}
        if len({len(v) for v in stored.values()}) > 1:
            raise ValueError("a batch's columns differ in length")
        return stored

    def add_events(self, run_id: int, rep: int, pid: int, columns: dict[str, Any]) -> int:
        """Store events given with the store's site ids (columns site_id, tid, t_start_ns,
        t_end_ns, status, in_bytes, out_bytes; a size not taken is -1) as one chunk."""
        with self.transaction():
            return events.write(self.db, run_id, rep, pid,
                                self._event_columns(columns["site_id"], columns))

    def _name_sites(self, run_id: int, names: dict[str, Any], manifest: dict[str, Any]) -> None:
        """Batch "names": {site: the public name of the callee it ran}, as the probe found it
        (`runtime.names`); the site's canonical API becomes that name where `adopted` says so,
        else its static one (again). The manifest keeps the static name and written form."""
        ids = self.site_ids(run_id, names, manifest)  # the name may come before the events
        for key, found in names.items():
            info = manifest.get(key) or _site_from_key(key)
            named = adopted(info, found) if isinstance(found, dict) else None
            api, written = named or (info.get("api", key), shown_written(info))
            self.db.execute(
                "UPDATE sites SET api=?, written=? WHERE id=?", (api, written, ids[key])
            )

    def put_process(self, run_id: int, pid: int, fields: dict[str, Any]) -> None:
        """The rank of process `pid` (`fecomlite.runtime.identity.rank_fields`); a device
        named later (CUDA initialised after the first batch) replaces "cpu"."""
        row = {k: PROCESS_FIELDS[k](fields[k]) for k in PROCESS_FIELDS if k in fields}
        self.db.execute(
            f"INSERT INTO processes (run_id, pid, {', '.join(row)}) "
            f"VALUES (?, ?{', ?' * len(row)}) ON CONFLICT (run_id, pid) DO UPDATE SET "
            "device = CASE WHEN excluded.device = 'cpu' THEN device ELSE excluded.device END",
            (run_id, pid, *row.values()),
        )

    def processes(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM processes WHERE run_id=? ORDER BY rank, pid", (run_id,)
        )
        return [dict(r) for r in rows]

    def _merge_shapes(self, run_id: int, shapes: dict[str, Any]) -> None:
        """Result "shapes": {site: [distinct shape records, first seen first]}; a site whose
        shapes vary keeps up to MAX_SHAPE_VARIANTS of them, so the report can say so."""
        merged: dict[str, list[Any]] = self.result(run_id, "shapes") or {}
        for site, record in shapes.items():
            seen = merged.setdefault(site, [])
            if record not in seen and len(seen) < MAX_SHAPE_VARIANTS:
                seen.append(record)
        self.put_result(run_id, "shapes", merged)

    # -- results ------------------------------------------------------------------------------

    def put_result(self, run_id: int, name: str, value: Any) -> None:
        with self.transaction():
            self.db.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?)", (run_id, name, json.dumps(value))
            )

    def result(self, run_id: int, name: str) -> Any:
        row = self.db.execute(
            "SELECT value FROM results WHERE run_id=? AND name=?", (run_id, name)
        ).fetchone()
        return None if row is None else json.loads(row[0])


_WRITER_LOCKS: dict[str, threading.RLock] = {}
_WRITER_LOCKS_GUARD = threading.Lock()


def _forget_writer_locks() -> None:
    """In a forked child: the parent's threads, which may hold a lock, are not there."""
    global _WRITER_LOCKS_GUARD
    _WRITER_LOCKS.clear()
    _WRITER_LOCKS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_forget_writer_locks)


def _writer_lock(path: Path) -> threading.RLock:
    """One lock per store file in this process, taken around each write transaction: writers of
    one process (the server's request threads, its sampler) wait on it and wake as it is let go,
    not in SQLite's busy handler, which sleeps 1-100 ms between tries whatever the wait."""
    key = os.path.realpath(path)
    with _WRITER_LOCKS_GUARD:
        return _WRITER_LOCKS.setdefault(key, threading.RLock())


class _Transaction:
    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> None:
        self.nested = self.db.in_transaction
        if not self.nested:
            self.lock.acquire()
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.lock.release()
                raise

    def __exit__(self, exc_type: object, *_: object) -> None:
        if self.nested:
            return
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.lock.release()


def _create_private(path: Path) -> None:
    """An empty store file readable by its owner only (SQLite's -wal and -shm files copy the
    mode), in a 0700 folder; a read-only or full home is named, not a traceback."""
    private_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as exc:
        raise StoreError(f"cannot create the run store {path}: {exc.strerror or exc}") from exc


def _encode(fields: dict[str, Any]) -> tuple[list[str], list[Any]]:
    cols = list(fields)
    vals = [json.dumps(v) if c in JSON_COLUMNS else v for c, v in fields.items()]
    return cols, vals


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    return {k: json.loads(row[k]) if k in JSON_COLUMNS else row[k] for k in row.keys()}  # noqa: SIM118 - a Row iterates over values


def _site_from_key(key: str) -> dict[str, Any]:
    """A site the manifest does not know (a region, or a probe without manifest)."""
    if key.startswith("region:"):
        return {"api": key, "written": key[7:], "kind": "region"}
    return layer_facts.site_row(key) or collective_site_row(key) or {"api": key}
