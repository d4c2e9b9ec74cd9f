"""Ingest spool files: the batches a probe wrote to disk because no server answered.

A spool file is a sequence of length-prefixed binary batches (`fecomlite.batch_codec`), whose
headers carry "run" and "token" when the process was started by a run (docs/internals.md §2).
Batches naming a run this store holds go into that run; the others go into one new run of status
`ingested`. A torn or malformed record (a crash mid-write) is counted and skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fecomlite import batch_codec
from fecomlite.store import Store, StoreError

SPOOL_GLOB = "*.spool"


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
    """Store every batch found at `path`; return counts of events, runs, files and bad records."""
    files = spool_files(path)
    if manifest is None:
        manifest = next((m for f in files if (m := find_manifest(f))), {})
    known: dict[int, dict[str, Any] | None] = {}  # run id -> its site table; None: not here
    new_run: int | None = None
    reps: set[tuple[int, int]] = set()
    events = bad = 0
    for spool in files:
        with spool.open("rb") as stream:
            for record in batch_codec.read_records(stream):
                try:
                    header, columns = batch_codec.decode(record)
                except batch_codec.BatchError:
                    bad += 1
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
    return {"events": events, "runs": runs, "files": len(files), "bad_records": bad}


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
