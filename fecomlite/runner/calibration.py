"""The calibration repetition (issue 8): after the measured repetitions, rank the sites by
above-idle energy, run the program once more with the replayer on
(`fecomlite.runtime.calibration_replay`), and store what was replayed and what was skipped, and
why, as the run's "calibration" result."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from fecomlite.runtime.calibration_replay import (
    DEFAULT_GAP_S,
    DEFAULT_SECONDS,
    DEFAULT_TOP,
    ENV_GAP_S,
    ENV_REPORT,
    ENV_SECONDS,
    ENV_SITES,
    KIND,
    PREFIX,
    verdict,
)

if TYPE_CHECKING:
    from fecomlite.runner.experiment import OpenRun


def site_cost(row: dict[str, Any]) -> tuple[float, float]:
    """Rank of a site row (`RunAnalysis.sites`): its measured above-idle energy (package, DRAM,
    GPUs), then its time. Estimated energy is not used: a utilisation model gives short calls
    mostly noise, and busy time ranks them as well as it could."""
    energy = 0.0
    for domain, e in (row.get("energy") or {}).items():
        additive = domain in ("cpu-package", "dram") or domain.startswith("gpu:")
        value = e.get("above_idle_J")
        if additive and e.get("provenance") == "measured" and isinstance(value, (int, float)) \
                and math.isfinite(value):
            energy += value
    return energy, float(row.get("total_time_s") or 0.0)


def choose_sites(
    rows: list[dict[str, Any]], top: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(chosen, skipped, others): the `top` costliest allow-listed sites; every site that may not
    be replayed, with why; and how many allow-listed sites rank below the top."""
    chosen: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    others = 0
    for row in sorted(rows, key=site_cost, reverse=True):
        api, kind = str(row.get("api", "")), str(row.get("kind", ""))
        if row["key"].startswith(PREFIX) or kind in ("region", KIND, "layer"):
            continue
        allowed, reason = verdict(api, kind)
        if not allowed:
            skipped.append(_site_entry(row, reason=reason))
        elif len(chosen) < top:
            chosen.append(row)
        else:
            others += 1
    return chosen, skipped, others


def _site_entry(row: dict[str, Any], **more: Any) -> dict[str, Any]:
    energy, seconds = site_cost(row)
    return {"site": row["key"], "api": row.get("api", ""), "kind": row.get("kind", ""),
            "written": row.get("written", ""), "measured_above_idle_J": energy,
            "measured_time_s": seconds, **more}


def replay_sites(sites: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Manifest entries for replays of these sites (a manifest's site table): `calibrate:<key>`
    with API `calibrate:<api>`. Every site gets one: calls nested in a replay are replays too."""
    return {
        PREFIX + key: {**site, "api": PREFIX + str(site.get("api", key)), "kind": KIND,
                       "function": "<calibration replay>"}
        for key, site in sites.items() if not key.startswith(PREFIX)
    }


def run_calibration(
    run: OpenRun, top: int = DEFAULT_TOP, seconds: float = DEFAULT_SECONDS,
    gap_s: float = DEFAULT_GAP_S,
) -> dict[str, Any]:
    """Replay the `top` costliest allow-listed sites of the measured repetitions in one more
    repetition (`run_experiment(after=...)` calls this while the run still records); stores and
    returns the run's "calibration" result."""
    from fecomlite.analysis.run_analysis import analyse_run
    from fecomlite.store import Store

    result: dict[str, Any] = {"rep": None, "top": top, "seconds_per_site": seconds,
                              "gap_s": gap_s, "replayed": [], "skipped": [], "others": 0,
                              "exit_code": None, "notes": []}
    if run.settings.level != "method":
        result["notes"].append("project level: there are no call sites to replay")
        return _store_result(run, result)
    with Store(run.client.store_path) as store:
        rows = analyse_run(store, run.run_id, compare_levels=False).sites
        manifest = store.run(run.run_id)["manifest"]  # the site table run_experiment gave
    chosen, result["skipped"], result["others"] = choose_sites(rows, top)
    if not chosen:
        result["notes"].append("no allow-listed call site to replay")
        return _store_result(run, result)

    rep = len(run.outcome.repetitions) + 1
    run.client.set_manifest(run.run_id, {**manifest, **replay_sites(manifest)})
    report_path = run.log_dir / f"rep-{rep}-calibration.json"
    report_path.unlink(missing_ok=True)
    env = {ENV_SITES: json.dumps([row["key"] for row in chosen]), ENV_SECONDS: repr(seconds),
           ENV_GAP_S: repr(gap_s), ENV_REPORT: str(report_path)}
    repetition = run.repetition(rep, extra_env=env, extra={"calibration": True})
    result.update(rep=rep, exit_code=repetition.exit_code)
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        report = {}
        result["notes"].append("the program ended without running its exit hooks: nothing was "
                               "replayed")
    for row in chosen:
        done = report.get(row["key"])
        if done is None:
            result["skipped"].append(_site_entry(row, reason="not replayed"))
        elif "skipped" in done:
            result["skipped"].append(_site_entry(row, reason=done["skipped"]))
        else:
            result["replayed"].append(_site_entry(
                row, replay_site=PREFIX + row["key"], calls=done["calls"],
                seconds=done["seconds"], stopped=done.get("stopped")))
    if repetition.exit_code != 0:
        result["notes"].append(f"the calibration repetition exited with status "
                               f"{repetition.exit_code}")
    return _store_result(run, result)


def _store_result(run: OpenRun, result: dict[str, Any]) -> dict[str, Any]:
    from fecomlite.store import Store

    with Store(run.client.store_path) as store:
        store.put_result(run.run_id, "calibration", result)
    return result
