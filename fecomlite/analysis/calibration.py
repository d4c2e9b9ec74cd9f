"""The analysis' side of calibration replays (issue 8): a replay's API shares its API's power
intensity in the fit, and the report shows the replays on their own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fecomlite.runtime.calibration_replay import PREFIX

if TYPE_CHECKING:
    from fecomlite.analysis.run_result import RunAnalysis


def fit_groups(api_names: list[str]) -> tuple[list[str], list[int]]:
    """(fit names, index into them for each API name): a replay's API `calibrate:<api>` shares
    `<api>`'s power intensity, so that replays inform the fit while the tables keep them apart."""
    names = sorted({a.removeprefix(PREFIX) for a in api_names})
    index = {a: i for i, a in enumerate(names)}
    return names, [index[a.removeprefix(PREFIX)] for a in api_names]


def replay_table(analysis: RunAnalysis) -> list[dict[str, Any]]:
    """The replays on their own, for the report: per replayed site and domain, the above-idle
    power the replays drew alone, beside the intensity the fit gives the API."""
    out = []
    for row in analysis.sites:
        if not row["key"].startswith(PREFIX):
            continue
        api = str(row["api"]).removeprefix(PREFIX)
        seconds = row["total_time_s"]
        domains = {}
        for domain, e in row["energy"].items():
            fitted = ((analysis.intensities.get(domain) or {}).get("apis") or {}).get(api) or {}
            domains[domain] = {
                "above_idle_J": e["above_idle_J"],
                "power_W": e["above_idle_J"] / seconds if seconds > 0 else float("nan"),
                "fitted_W": fitted.get("intensity_W"), "fitted_sigma_W": fitted.get("sigma_W"),
                "provenance": e["provenance"], "model": e["model"],
            }
        out.append({"site": row["key"].removeprefix(PREFIX), "api": api, "calls": row["calls"],
                     "seconds": seconds, "energy": domains})
    return out
