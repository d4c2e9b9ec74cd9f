"""A run's idle baseline in words: where it came from (measured, reused from another run, the
server's rolling estimate) and how old it was, as the summary and the report say it."""

from __future__ import annotations

from typing import Any


def described(detail: dict[str, Any]) -> str:
    """Where a run's idle baseline came from, with its age, in words (summary and report)."""
    if not detail.get("sensors"):
        return "no idle baseline"
    if "rolling" in detail:
        rolling = detail["rolling"]
        return (
            f"the server's rolling estimate: {detail['seconds']:g} s of readings between runs "
            f"({rolling['readings']} readings, quiet and stable), ending {rolling['age_s']:g} s "
            "before this run began; the machine's state as the run began matched it"
        )
    if detail.get("reused_from_run") is not None:
        return (
            f"reused from run {detail['reused_from_run']}, measured {detail['age_s']:g} s "
            f"before over {detail['seconds']:g} s; a {detail['check']['seconds']:g} s check "
            "as this run began agreed with it"
        )
    return f"measured over {detail['seconds']:g} s before the first repetition"
