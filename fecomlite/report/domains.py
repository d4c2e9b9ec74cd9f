"""Which energy domains a figure that adds domains may add, shared by the bars and the layers
tree so both show the domains the report leads with."""

from __future__ import annotations

from typing import Any

from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.report.palette import domain_name


def stacked_domains(a: RunAnalysis) -> list[dict[str, Any]]:
    """The domains a stacked bar may add: the disjoint ones (`analysis.domain_role`), reliable
    first; on a busy machine without a reliable one, the program's own share alone."""
    disjoint = [d for d in a.domains if d.get("addable")]
    if any(d.get("reliable", True) for d in disjoint) or not disjoint:
        return disjoint or [d for d in a.domains if d.get("role") == "share"][:1]
    share = [d for d in a.domains if d.get("role") == "share"]
    return share[:1] or disjoint


def described(domains: list[dict[str, Any]]) -> str:
    """`cpu-process (estimated)`, `CPU package + DRAM (estimated)`: what a summed figure sums."""
    names = " + ".join(domain_name(d["domain"]) for d in domains)
    estimated = any(d["provenance"] != "measured" for d in domains)
    return f"{names} ({'estimated' if estimated else 'measured'})" if domains else ""
