"""Ingest spool files: the batches a probe wrote to disk because no server answered.

A spool file is a sequence of length-prefixed binary batches (`fecomlite.runtime.batch_codec`),
whose
headers carry "run" and "store" (the store's identity) when the process was started by a run
(docs/internals.md §2), and always the batch's id. A spool naming another store is refused whole,
before anything is stored, with a message that says so. Batches naming a run this store holds go
into that run; the others go into one new run of status `ingested`. Each batch is stored whole or
not at all, and at most once (its id): ingesting a spool twice, or a batch the server stored
before the probe gave up waiting, adds nothing. A torn or malformed record (a crash mid-write, a
value out of range) is counted, its reason kept, and skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fecomlite.runtime import batch_codec
from fecomlite.store import Store, StoreError

SPOOL_GLOB = "*.spool"
MAX_REASONS = 5  # bad records' reasons reported


class ForeignSpool(ValueError):
    """A spool written for another store (another fecomlite home)."""


def spool_files(path: Path) -> list[Path]:
    """The spool files at `path`: the file itself, or every `*.spool` in a directory."""
    if path.is_dir():
        return sorted(path.glob(SPOOL_GLOB))
    if path.is_file():
        return [path]
    raise FileNotFoundError(f"no spool file or directory at {path}")


def site_table(manifest: dict[str, Any]) -> dict[str, Any]:
    """The site table of a manifest: its "sites", or the mapping itself when given bare."""
    sites = manifest.get("sites")
    return sites if isinstance(sites, dict) else manifest


def find_manifest(spool: Path) -> dict[str, Any]:
    """The manifest beside a spool in the default layout (`.fecomlite/{spool/,manifest.json}`)."""
    try:
        manifest = json.loads((spool.parent.parent / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def ingest(
    store: Store, path: Path, manifest: dict[str, Any] | None = None,
    machine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Store every batch found at `path`; return counts of events (new ones), duplicates, runs,
    files and bad records (with the first reasons). Raises ForeignSpool, storing nothing, when
    a file names another store."""
    files = spool_files(path)
    for spool in files:
        _check_store(store, spool)
    if manifest is None:
        manifest = next((m for f in files if (m := find_manifest(f))), {})
    known: dict[int, dict[str, Any] | None] = {}  # run id -> its site table; None: not here
    new_run: int | None = None
    reps: set[tuple[int, int]] = set()
    events = duplicates = bad = 0
    reasons: list[str] = []
    for spool in files:
        with spool.open("rb") as stream:
            for number, record in enumerate(batch_codec.read_records(stream), 1):
                try:
                    header, columns = batch_codec.decode(record, require_id=True)
                except batch_codec.BatchError as exc:
                    bad += 1
                    if len(reasons) < MAX_REASONS:
                        reasons.append(f"{spool.name} record {number}: {exc}")
                    continue
                if store.has_batch(header):
                    duplicates += 1
                    continue
                run = _run_id(header.get("run"))
                if run is not None and run not in known:
                    known[run] = _sites_of(store, run)
                if run is not None and known[run] is not None:
                    run_id, sites = run, known[run]
                else:
                    if new_run is None:
                        new_run = _new_run(store, path, manifest, machine or {})
                    run_id, sites = new_run, site_table(manifest)
                events += store.add_batch(run_id, header, columns, sites)
                reps.add((run_id, int(header.get("rep", 0))))
    for run_id, rep in reps:
        store.upsert_repetition(run_id, rep)
    runs = sorted({run_id for run_id, _ in reps})
    return {"events": events, "duplicate_batches": duplicates, "runs": runs,
            "files": len(files), "bad_records": bad, "bad_reasons": reasons}


def _check_store(store: Store, spool: Path) -> None:
    """Refuse a spool whose records name another store (read before anything is stored)."""
    mine = store.store_id
    with spool.open("rb") as stream:
        for record in batch_codec.read_records(stream):
            try:
                named = batch_codec.header_of(record).get("store")
            except batch_codec.BatchError:
                continue
            if named is not None and named != mine:
                raise ForeignSpool(
                    f"{spool} was written for another fecomlite store (id {named}), not "
                    f"{store.path} (id {mine}); ingest it with the --home it was measured in"
                )


def _sites_of(store: Store, run_id: int) -> dict[str, Any] | None:
    try:
        return site_table(store.run(run_id)["manifest"])
    except StoreError:
        return None


def _new_run(
    store: Store, path: Path, manifest: dict[str, Any], machine: dict[str, Any]
) -> int:
    return store.create_run(
        kind="instrumented", status="ingested", program=str(manifest.get("source_root", "")),
        settings={"spool": str(path)}, manifest=manifest, machine=machine,
    )


def _run_id(value: Any) -> int | None:
    """The run a header names (the probe sends the id as it got it: a string), or None."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
