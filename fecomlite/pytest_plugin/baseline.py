"""Baselines: a session's rows as one JSON file, written whole or not at all (a temporary file
renamed over the old one), so it can be committed, kept as a CI artifact, or kept in the
fecomlite home (private, as everything there)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import fecomlite
from fecomlite.store import StoreError, private_dir, private_home

FORMAT = "fecomlite-pytest-baseline"
VERSION = 1


class BaselineError(ValueError):
    """A baseline that cannot be read or written (the message names the file)."""


def document(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "fecomlite": fecomlite.__version__,
        "created_unix": time.time(),
        "machine": {"node": platform.node(), "processor": platform.processor(),
                    "cpus": os.cpu_count()},
        "tests": [rows[k] for k in sorted(rows)],
    }


def write_json(path: Path, data: Any, private: bool = False) -> None:
    """Write `data` as JSON at `path` atomically (0600 and a 0700 folder when `private`)."""
    try:
        if private:  # <home>/pytest-baselines/NAME.json: the home is its owner's alone
            private_home(path.parent.parent)
            private_dir(path.parent)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, allow_nan=True)
        os.replace(tmp, path)
    except (OSError, StoreError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise BaselineError(f"cannot write {path}: {why}") from exc


def save(path: Path, rows: dict[str, dict[str, Any]], in_home: bool) -> None:
    write_json(path, document(rows), private=in_home)


def load(path: Path) -> dict[str, dict[str, Any]]:
    """nodeid -> row of a saved baseline."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"no baseline at {path} (save one with --fecomlite-save)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"cannot read the baseline {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BaselineError(f"{path} is not a fecomlite pytest baseline")
    if data.get("version") != VERSION:
        raise BaselineError(f"{path} is a baseline of format version {data.get('version')}; "
                            f"this fecomlite reads version {VERSION}")
    try:
        return {row["nodeid"]: row for row in data["tests"]}
    except (KeyError, TypeError):
        raise BaselineError(f"{path}: its tests are damaged") from None
