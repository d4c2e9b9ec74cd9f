"""The wire format of probe event batches: a JSON header and fixed-width columns.

Why not JSON rows: encoding one event as JSON costs ~650 ns in Python, more than the probe itself.
Columns come out of the probe's buffer as bytes and go into numpy on the server without a Python
loop per event, and decoding validates every length, so a malformed body is refused, never trusted.

Layout: u32 header length (little endian), UTF-8 JSON header {"n", "sites", ...meta}, then the
columns in COLUMNS order, each n items of its dtype. A spool file is a sequence of
u64 length + batch records.

Every header field is checked against a range (`HEADER_FIELDS`) and every column value too: a
batch that would later break an analysis (a pid of 10**400, a rep of 1e308, NaN, a hyperparameter
nested a thousand deep) is refused here with the reason, never stored. A batch's id is its
sender's random `proc` and its `seq`uence number: the store keeps each id once (exactly once).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import numpy as np

CONTENT_TYPE = "application/x-fecomlite-batch"

COLUMNS: tuple[tuple[str, str, int], ...] = (  # name, numpy dtype, item size
    ("site", "<i4", 4),  # index into header["sites"]
    ("t_start_ns", "<i8", 8),
    ("t_end_ns", "<i8", 8),
    ("tid", "<u8", 8),
    ("status", "u1", 1),  # 0 returned, 1 raised
    ("in_bytes", "<i8", 8),  # -1: not sampled
    ("out_bytes", "<i8", 8),
)
_ITEM_SIZE = sum(size for _, _, size in COLUMNS)
MAX_HEADER = 16 * 1024 * 1024
MAX_SITES = 100_000
MAX_TEXT = 4096  # a site key, a hyperparameter's name or text value
MAX_DEPTH = 8  # nesting of hyperparameters and shapes
MAX_ITEMS = 10_000  # entries of one hyperparameter/shape object or list
MAX_NS = 2**62  # monotonic clock stamps: ~146 years
RAISED = 1  # an event's status bits: the call raised
CONTINUES = 2  # a later piece of the event before it of its site and thread (a layer's span cut
# apart where other layers' work ran): that call's time, not a call of its own
PROC_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_INT_RANGES = {
    "rep": 10**6, "pid": 2**32, "seq": 2**62, "total": 2**62,
    # a distributed job's process (fecomlite/runtime/identity.py)
    "rank": 2**20, "local_rank": 2**20, "node": 2**20, "clock_offset_ns": 2**63,
}
_TEXT_FIELDS = ("device", "job")  # a distributed process's device ("gpu:N", "cpu") and job id
MAX_OPEN_THREADS = 16  # `open`: threads whose calls in progress a batch carries
MAX_OPEN_CALLS = 8  # `open`: calls shown per thread, outermost first (the probe's OPEN_DEPTH)

# The site of a project-level run's one event: the whole program process, stored by the server
# (thread 0) around the calls the program itself records (regions, a sweep's training).
PROJECT_SITE = "<program>"


class BatchError(ValueError):
    """A batch body that is not in this format."""


def encode(meta: dict[str, Any], site_names: list[str], columns: tuple[bytes, ...]) -> bytes:
    """Build a batch from the probe's drained columns (bytes in COLUMNS order, site first)."""
    n = len(columns[0]) // 4
    header = json.dumps({**meta, "n": n, "sites": site_names}, separators=(",", ":")).encode()
    return struct.pack("<I", len(header)) + header + b"".join(columns)


def decode(
    body: bytes, *, require_id: bool = False
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and columns of one batch; raises BatchError (saying what is wrong) on anything
    malformed or out of range. `require_id`: the batch must carry its id (proc, seq)."""
    import numpy as np  # the server's side only: the probe never imports numpy

    header, header_len = _header(body)
    check_header(header, require_id=require_id)
    n, sites = header["n"], header["sites"]
    offset = 4 + header_len
    if len(body) - offset != n * _ITEM_SIZE:
        raise BatchError(f"batch body holds {len(body) - offset} bytes, expected {n * _ITEM_SIZE}")
    columns: dict[str, np.ndarray] = {}
    for name, dtype, size in COLUMNS:
        columns[name] = np.frombuffer(body, dtype=dtype, count=n, offset=offset)
        offset += size * n
    if n and (columns["site"].min() < 0 or columns["site"].max() >= len(sites)):
        raise BatchError("site index out of range")
    _check_columns(columns)
    return header, columns


def header_of(body: bytes) -> dict[str, Any]:
    """The header of a batch alone (checked), without its columns."""
    header, _ = _header(body)
    check_header(header)
    return header


def _header(body: bytes) -> tuple[dict[str, Any], int]:
    if len(body) < 4:
        raise BatchError("batch too short")
    (header_len,) = struct.unpack_from("<I", body)
    if header_len > MAX_HEADER or 4 + header_len > len(body):
        raise BatchError("batch header length out of range")
    try:
        header = json.loads(body[4 : 4 + header_len], parse_constant=_no_constant)
    except RecursionError as exc:
        raise BatchError("batch header nested too deep") from exc
    except ValueError as exc:
        raise BatchError(f"batch header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise BatchError("batch header is not an object")
    return header, header_len


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def check_header(header: dict[str, Any], *, require_id: bool = False) -> None:
    """Every field known, of its type and within its range; raises BatchError naming it."""
    for key in set(header) - {"n", "sites", "run", "store", "proc", *_INT_RANGES}:
        check_value(header[key], key)  # bounded even where unused (a newer probe's fields)
    n, sites = header.get("n"), header.get("sites")
    if not _is_int(n) or not 0 <= n <= MAX_HEADER or not isinstance(sites, list):
        raise BatchError("batch header lacks n or sites")
    if len(sites) > MAX_SITES or not all(isinstance(s, str) and len(s) <= MAX_TEXT
                                         for s in sites):
        raise BatchError(f"sites must be at most {MAX_SITES} strings of {MAX_TEXT} characters")
    for key, limit in _INT_RANGES.items():
        if key in header and not (_is_int(header[key]) and 0 <= header[key] < limit):
            raise BatchError(f"{key} must be an integer in 0..{limit - 1}")
    for key in ("run", "store"):
        value = header.get(key)
        if value is not None and not (isinstance(value, str) and PROC_ID.fullmatch(value)):
            raise BatchError(f"{key} must be a short identifier")
    if "proc" in header and not (isinstance(header["proc"], str)
                                 and PROC_ID.fullmatch(header["proc"])):
        raise BatchError("proc must be 1-64 letters, digits, '_' or '-'")
    if require_id and ("proc" not in header or "seq" not in header):
        raise BatchError("a batch must carry its id (proc and seq)")
    if "total" in header and header["total"] < n:
        raise BatchError("total (events produced so far) is less than this batch's n")
    for key in _TEXT_FIELDS:
        if key in header and not isinstance(header[key], str):
            raise BatchError(f"{key} must be a text")
    for key in ("hyperparams", "shapes"):
        if key in header and not isinstance(header[key], dict):
            raise BatchError(f"{key} must be an object")
    if "open" in header:
        _check_open(header["open"])


def _check_open(value: Any) -> None:
    """`open`: the sending process's calls in progress, [{"tid", "depth", "calls": [[site key,
    start ns], ...]}] (docs/internals.md §2)."""
    def thread_ok(t: Any) -> bool:
        return (isinstance(t, dict) and set(t) == {"tid", "depth", "calls"}
                and _is_int(t["tid"]) and 0 <= t["tid"] < 2**63
                and _is_int(t["depth"]) and 0 <= t["depth"] < 2**31
                and isinstance(t["calls"], list) and len(t["calls"]) <= MAX_OPEN_CALLS
                and all(isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)
                        and len(c[0]) <= MAX_TEXT and _is_int(c[1]) and 0 <= c[1] <= MAX_NS
                        for c in t["calls"]))

    if not (isinstance(value, list) and len(value) <= MAX_OPEN_THREADS
            and all(thread_ok(t) for t in value)):
        raise BatchError(f"open must list at most {MAX_OPEN_THREADS} threads, each "
                         f"{{tid, depth, calls: at most {MAX_OPEN_CALLS} [site, start ns]}}")


def check_value(value: Any, where: str, depth: int = 0) -> None:
    """A JSON value of bounded depth and size, whose numbers are finite."""
    if depth > MAX_DEPTH:
        raise BatchError(f"{where} is nested deeper than {MAX_DEPTH}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BatchError(f"{where} holds a number that is not finite")
    if _is_int(value) and not -(2**63) <= value < 2**63:
        raise BatchError(f"{where} holds an integer beyond 64 bits")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise BatchError(f"{where} holds a text over {MAX_TEXT} characters")
    if isinstance(value, dict | list) and len(value) > MAX_ITEMS:
        raise BatchError(f"{where} holds over {MAX_ITEMS} entries")
    if isinstance(value, dict):
        for key, item in value.items():
            check_value(key, where, depth + 1)
            check_value(item, f"{where}.{key[:40]}", depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_value(item, where, depth + 1)


def _check_columns(columns: dict[str, np.ndarray]) -> None:
    if not len(columns["site"]):
        return
    for name in ("t_start_ns", "t_end_ns"):
        if columns[name].min() < 0 or columns[name].max() > MAX_NS:
            raise BatchError(f"{name} out of range 0..2**62")
    if (columns["t_end_ns"] < columns["t_start_ns"]).any():
        raise BatchError("an event ends before it starts")
    if columns["status"].max() > RAISED | CONTINUES:
        raise BatchError("status bits must be 1 (raised) and 2 (continues the call before it)")
    for name in ("in_bytes", "out_bytes"):
        if columns[name].min() < -1:
            raise BatchError(f"{name} must be -1 (not sampled) or a size")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def write_record(stream: BinaryIO, batch: bytes) -> None:
    """Append one batch to a spool file in a single write."""
    stream.write(struct.pack("<Q", len(batch)) + batch)


def read_records(stream: BinaryIO) -> Iterator[bytes]:
    """The batches of a spool file; a torn last record (a crash mid-write) is skipped."""
    while True:
        size = stream.read(8)
        if len(size) < 8:
            return
        (length,) = struct.unpack("<Q", size)
        batch = stream.read(length)
        if len(batch) < length:
            return
        yield batch
