"""`fecomlite run` of a Python script: in place, its project rewritten as it is imported.

Before the run, every Python file of the project is rewritten once into the cache
(`fecomlite.instrument.importhook`; an unchanged project finds it all there): the sites of all
of them make the run's manifest, which the server stores with the run and the probe reads for
its per-site handlers. The program then starts as `python -m fecomlite.instrument.hookmain
SCRIPT ARGS` in the user's working directory, and every Python process it starts installs the
same hook (`child_environment`). The manifest is written content-addressed and whole (never
rewritten in place), so concurrent runs of one project share nothing mutable.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fecomlite.runner.workcopy import CopyError, ScriptError

HOOK_MAIN = "fecomlite.instrument.hookmain"


@dataclass
class InPlace:
    root: Path  # the project: its modules are rewritten
    env: dict[str, str]  # what the program's environment adds (the hook's settings)
    manifest_path: Path
    manifest: dict[str, Any]
    skipped: list[str] = field(default_factory=list)  # files that run as written, and why


def prepare_in_place(
    script: Path, cache_dir: Path, api: list[str], root: Path | None = None
) -> InPlace:
    """Rewrite the project of `script` (its root: `importhook.project_root`, or `root`) into
    `cache_dir`; raises `ScriptError` when the script itself cannot be rewritten, `CopyError`
    when the project's settings cannot be read."""
    from fecomlite.instrument.importhook import ImportHook, Rewriter, child_environment
    from fecomlite.instrument.importhook import project_root as find_root
    from fecomlite.instrument.project import InstrumentError
    from fecomlite.instrument.rewrite_cache import evict_daily

    evict_daily(cache_dir)  # the cache is trimmed once a day (LRU, 256 MiB, 30 days unused)
    script = Path(os.path.abspath(script))
    try:
        rewriter = Rewriter(root or find_root(script), api, cache_dir)
    except InstrumentError as exc:
        raise CopyError(str(exc)) from exc
    if root is not None and rewriter.root not in Path(os.path.realpath(script)).parents:
        raise CopyError(f"--project {root} does not contain the script {script}")
    sites, failures = rewriter.rewrite_all(script)
    own = rewriter.rel(str(script)) if rewriter.covers(str(script)) else None
    mine = [f for f in failures if f[0] == own]
    if mine:
        raise ScriptError("\n".join(_named(rewriter.root, f) for f in mine))
    manifest = {
        "format": 1,
        "source_root": str(rewriter.root),
        "api_roots": list(rewriter.roots),
        "sites": sites,
    }
    known = sorted({str(site.get("file", "")) for site in sites.values()})
    env = child_environment(ImportHook(rewriter), {"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                            _write_content(cache_dir, known))
    return InPlace(
        rewriter.root,
        env,
        _write_content(cache_dir, manifest),
        manifest,
        [f"{_named(rewriter.root, f)} (runs uninstrumented)" for f in failures],
    )


def logged_sites(folder: Path) -> dict[str, Any]:
    """The sites the run's processes logged as they rewrote modules the manifest does not hold
    (`importhook.SiteLog`: one JSON line per module in `<pid>.jsonl`); a torn last line (a
    process killed mid-write) is skipped."""
    sites: dict[str, Any] = {}
    for path in sorted(folder.glob("*.jsonl")):
        try:
            lines = path.read_bytes().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                logged = json.loads(line)["sites"]
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(logged, dict):
                sites.update(logged)
    return sites


def _write_content(cache_dir: Path, content: Any) -> Path:
    """Named by its content: a run never reads a manifest another run is writing."""
    from fecomlite.instrument.importhook import write_atomic

    data = json.dumps(content).encode()  # no indent: the C encoder, 30 times faster
    path = cache_dir / "manifests" / f"{hashlib.sha256(data).hexdigest()}.json"
    if not path.is_file():
        write_atomic(path, data)
    return path


def _named(root: Path, failure: list[Any]) -> str:
    rel, line, col, message = failure
    return f"{root / rel}:{line}:{col}: {message}"
