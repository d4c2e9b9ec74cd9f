"""First use, detected: the modules a call imported, as the probe counted them.

The sized path (`runtime.probe._before`/`_after`) counts `sys.modules` around a site's first
sized call and keeps the growth beside the call's shapes (`runtime.capture.IMPORTED`, stored in
the run's result "shapes"): `torch.optim.AdamW(...)` importing 835 modules is a first use, said
so from what happened, not guessed from the memory its first call kept.
"""

from __future__ import annotations

from typing import Any

from fecomlite.analysis import units
from fecomlite.runtime.capture import IMPORTED


def shape_variants(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A site's distinct shape records without the import count (a first call's record and a
    later one of the same shapes are one variant)."""
    out: list[dict[str, Any]] = []
    for record in records:
        shapes = {k: v for k, v in record.items() if k != IMPORTED}
        if shapes not in out:
            out.append(shapes)
    return out


def imports_by_api(shapes: dict[str, list[dict[str, Any]]],
                   sites: list[dict[str, Any]]) -> dict[str, int]:
    """API → modules imported during its sites' first calls (APIs that imported none are
    absent)."""
    out: dict[str, int] = {}
    for site in sites:
        count = max((int(r.get(IMPORTED, 0)) for r in shapes.get(site.get("key"), [])
                     if isinstance(r, dict)), default=0)
        if count > 0 and site.get("api"):
            out[site["api"]] = out.get(site["api"], 0) + count
    return out


def mark(imported: int, memory: dict[str, Any]) -> str:
    """The "first use" mark of an API whose first call imported modules; "" if it imported
    none."""
    if imported <= 0:
        return ""
    kept = memory.get("rss_first_call_delta_mean_B")
    held = (f", and kept {units.scaled(kept, 'B')}" if isinstance(kept, (int, float))
            and kept == kept and kept > 0 else "")
    return (f"its first call imported {imported:,} module{'s' if imported != 1 else ''}"
            f"{held}: first-use work (imports), not the call's own cost or state")
