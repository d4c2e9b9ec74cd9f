"""Ingest spool files: the batches a probe wrote to disk because no server answered.

A spool file is a sequence of length-prefixed binary batches (`fecomlite.runtime.batch_codec`),
whose
headers carry "run" and "store" (the store's identity) when the process was started by a run
(docs/internals.md §2), and always the batch's id. A spool naming another store is refused whole,
before anything is stored, with a message that says so. Batches naming a run this store holds go
into that run; the others go into one new run of status `ingested`. Each batch is stored whole or
not at all, and at most once (its id): ingesting a spool twice, or a batch the server stored
before the probe gave up waiting, adds nothing. A torn or malformed record (a crash mid-write, a
value out of range) is counted, its reason kept, and skipped; the file is then kept, and the reply
says how many events it still holds. A record is read only when the file holds every byte it
claims (a file that is no spool, such as /etc/passwd, claims petabytes), and a file whose first
record is no batch is refused whole, untouched.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

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


MAX_RECORD_BYTES = 256 * 1024 * 1024  # a record claiming more is not read (a probe's are small)


class NotASpool(ValueError):
    """A file whose first record is not an event batch: refused whole, left as it is."""


@dataclass
class SpoolFile:
    """What one spool file held: events stored, and what could not be (kept, named)."""

    path: Path
    events: int = 0
    duplicates: int = 0
    bad: int = 0  # records that are not valid batches
    torn: int = 0  # records cut short (a crash mid-write), or whose length is out of range
    unstored_events: int = 0  # events the bad and torn records' headers say they hold
    reasons: list[str] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        """Every record stored, now or before: the file may go."""
        return not (self.bad or self.torn)

    def refuse(self, number: int, body: bytes, reason: str, *, torn: bool = False) -> None:
        if torn:
            self.torn += 1
        else:
            self.bad += 1
        self.unstored_events += _events_in(body)
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(f"{self.path.name} record {number}: {reason}")

    def kept_line(self) -> str | None:
        """Why the file is kept, e.g. "7,679 events in 1 torn record not stored, kept in …"."""
        if self.whole:
            return None
        parts = [f"{count} {what} record{'s' if count > 1 else ''}"
                 for count, what in ((self.torn, "torn"), (self.bad, "bad")) if count]
        return (f"{self.unstored_events:,} events in {' and '.join(parts)} not stored, kept in "
                f"{self.path}")


def records(stream: BinaryIO, size: int) -> Iterator[tuple[int, bytes, str | None]]:
    """(number, body, why it is torn or None) for each record of a spool file of `size` bytes.
    A record is read only when the file holds all it claims, and at most MAX_RECORD_BYTES."""
    offset = number = 0
    while offset < size:
        number += 1
        head = stream.read(8)
        offset += len(head)
        if len(head) < 8:
            yield number, b"", "cut short in its length"
            return
        (length,) = struct.unpack("<Q", head)
        if length > min(size - offset, MAX_RECORD_BYTES):
            peek = stream.read(min(size - offset, 4 + batch_codec.MAX_HEADER))
            why = (f"claims {length:,} bytes, the file holds {size - offset:,} more"
                   if length <= MAX_RECORD_BYTES else f"claims {length:,} bytes, over the limit")
            yield number, peek, why
            return
        body = stream.read(length)
        offset += length
        yield number, body, None


def survey(store: Store, spool: Path) -> None:
    """Refuse, before anything is stored, a file that is not a spool (its first record is no
    batch) or a spool whose records name another store."""
    mine = store.store_id
    with spool.open("rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if size == 0 and spool.suffix != ".spool":  # an empty .spool: spooling met a full disk
            raise NotASpool(f"{spool} is empty, and not named *.spool: left as it is")
        for number, body, _ in records(stream, size):
            try:
                named = batch_codec.header_of(body).get("store")
            except batch_codec.BatchError as exc:
                if number == 1:
                    raise NotASpool(f"{spool} is not a fecomlite spool (its first record is not "
                                    f"an event batch: {exc}); left as it is") from None
                continue
            if named is not None and named != mine:
                raise ForeignSpool(
                    f"{spool} was written for another fecomlite store (id {named}), not "
                    f"{store.path} (id {mine}); ingest it with the --home it was measured in"
                )


def ingest(
    store: Store, path: Path, manifest: dict[str, Any] | None = None,
    machine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Store every batch found at `path`; return counts of events (new ones), duplicates, runs,
    files, bad and torn records (with the first reasons), `whole` (every record of every file
    is stored: the files may go) and `kept` (a line per file that must stay). Raises
    ForeignSpool or NotASpool, storing nothing, when a file names another store or is no
    spool."""
    files = spool_files(path)
    for spool in files:
        survey(store, spool)
    if manifest is None:
        manifest = next((m for f in files if (m := find_manifest(f))), {})
    target = _Target(store, path, manifest, machine or {})
    done = [_ingest_file(store, spool, target) for spool in files]
    for run_id, rep in target.reps:
        store.upsert_repetition(run_id, rep)
    return {
        "events": sum(f.events for f in done),
        "duplicate_batches": sum(f.duplicates for f in done),
        "runs": sorted({run_id for run_id, _ in target.reps}), "files": len(files),
        "bad_records": sum(f.bad for f in done), "torn_records": sum(f.torn for f in done),
        "unstored_events": sum(f.unstored_events for f in done),
        "bad_reasons": [r for f in done for r in f.reasons][:MAX_REASONS],
        "whole": all(f.whole for f in done),
        "kept": [line for f in done if (line := f.kept_line())],
    }


class _Target:
    """Where batches go: the run a header names when this store holds it, else one new run."""

    def __init__(self, store: Store, path: Path, manifest: dict[str, Any],
                 machine: dict[str, Any]) -> None:
        self.store, self.path, self.manifest, self.machine = store, path, manifest, machine
        self.known: dict[int, dict[str, Any] | None] = {}  # run id -> site table; None: absent
        self.new_run: int | None = None
        self.reps: set[tuple[int, int]] = set()

    def run_of(self, header: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        run = _run_id(header.get("run"))
        if run is not None and run not in self.known:
            self.known[run] = _sites_of(self.store, run)
        sites = self.known.get(run) if run is not None else None
        if run is not None and sites is not None:
            return run, sites
        if self.new_run is None:
            self.new_run = _new_run(self.store, self.path, self.manifest, self.machine)
        return self.new_run, site_table(self.manifest)


def _ingest_file(store: Store, spool: Path, target: _Target) -> SpoolFile:
    found = SpoolFile(spool)
    with spool.open("rb") as stream:
        for number, body, torn in records(stream, os.fstat(stream.fileno()).st_size):
            if torn:
                found.refuse(number, body, f"torn: {torn}", torn=True)
                continue
            try:
                header, columns = batch_codec.decode(body, require_id=True)
            except batch_codec.BatchError as exc:
                found.refuse(number, body, str(exc))
                continue
            if store.has_batch(header):
                found.duplicates += 1
                continue
            run_id, sites = target.run_of(header)
            found.events += store.add_batch(run_id, header, columns, sites)
            target.reps.add((run_id, int(header.get("rep", 0))))
    return found


def _events_in(body: bytes) -> int:
    """The events a bad or torn record's header says it holds (0 when unreadable)."""
    try:
        return int(batch_codec.header_of(body)["n"])
    except (batch_codec.BatchError, KeyError, TypeError, ValueError):
        return 0


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
