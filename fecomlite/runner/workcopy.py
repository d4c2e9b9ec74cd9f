"""`fecomlite run`'s instrumented copy of the script's folder, in `<home>/work/`.

Python sources are instrumented and everything else is linked, so a data file beside the script
costs nothing. The copy is reused while the project, the API roots and the instrumenter are
unchanged. A syntax error in the script itself refuses the run here, before any server starts,
with the user's own file, line and column.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fecomlite.instrument.project import Failure

STAMP = Path(".fecomlite") / "source-state.json"  # what the copy was made from


class CopyError(Exception):
    """The instrumenter refused the script's folder (e.g. it is itself an instrumented copy)."""


class ScriptError(Exception):
    """The script cannot be instrumented (it would not run either): `file:line:col: message`."""


@dataclass
class WorkCopy:
    script: Path  # the instrumented script in the copy
    manifest: Path
    reused: bool  # the copy of an earlier run, unchanged
    skipped: list[str] = field(default_factory=list)  # other files left as they are, and why


def work_copy(script: Path, work_dir: Path, api: list[str]) -> WorkCopy:
    """The instrumented copy of `script`'s folder, made or reused; raises `ScriptError` or
    `CopyError`. (`check_syntax` first answers faster: it needs no libcst.)"""
    from fecomlite.instrument.project import InstrumentError

    script = script.resolve()
    project = script.parent
    digest = hashlib.sha1(str(project).encode()).hexdigest()[:8]
    out = work_dir / f"{project.name}-{digest}-instrumented"
    try:
        return _make_or_reuse(script, project, out, api)
    except InstrumentError as exc:
        raise CopyError(str(exc)) from exc


def _make_or_reuse(script: Path, project: Path, out: Path, api: list[str]) -> WorkCopy:
    from fecomlite.instrument.importhook import instrumenter_state
    from fecomlite.instrument.project import (
        MANIFEST,
        configured_roots,
        instrument_path,
        source_state,
    )

    copied = out / script.relative_to(project)
    key = json.dumps(
        {
            "instrumenter": instrumenter_state(),
            "roots": list(configured_roots(project, api)),
            "files": source_state(project, out),
        }
    )
    stamp = out / STAMP
    if (out / MANIFEST).is_file() and stamp.is_file() and stamp.read_text() == key:
        return WorkCopy(copied, out / MANIFEST, reused=True)
    stamp.unlink(missing_ok=True)
    result = instrument_path(project, out, api_roots=api, link_others=True)
    own = script.relative_to(project).as_posix()
    mine = [f for f in result.failures if f.path == own]
    if mine:
        raise ScriptError("\n".join(_named(project, f) for f in mine))
    assert result.manifest is not None
    stamp.write_text(key)
    skipped = [f"{_named(project, f)} (left uninstrumented)" for f in result.failures]
    return WorkCopy(copied, result.manifest, reused=False, skipped=skipped)


def check_syntax(script: Path) -> None:
    """Raise `ScriptError` with the script's own path, line and column if Python would refuse
    it (what `python script.py` would say, without running anything)."""
    try:
        compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{script}:{exc.lineno or 1}:{exc.offset or 1}"
        raise ScriptError(f"{where}: {exc.msg}") from exc
    except ValueError as exc:  # null bytes
        raise ScriptError(f"{script}:1:1: {exc}") from exc


def _named(project: Path, failure: Failure) -> str:
    return f"{project / failure.path}:{failure.line}:{failure.col}: {failure.message}"
