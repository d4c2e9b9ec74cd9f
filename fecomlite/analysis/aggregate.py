"""Per-API and per-site rows: calls, times, energy per domain (inclusive, self, per call, per
repetition, with its uncertainty), never shown below zero beyond noise, and their order."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis import noise_floor, pieces
from fecomlite.analysis.call_memory import MEMORY_COLUMNS, memory_row
from fecomlite.analysis.distributions import t_quantile
from fecomlite.analysis.sensors_baseline import addable, finite_or_zero
from fecomlite.analysis.units import scaled
from fecomlite.runtime.batch_codec import CONTINUES, RAISED


def mean_ci95(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % t-interval of the mean; NaN bounds with fewer than 2 values."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    t = t_quantile(0.975, values.size - 1)
    half = t * float(values.std(ddof=1)) / math.sqrt(values.size)
    return mean, mean - half, mean + half


def _summary(values: np.ndarray) -> dict[str, float]:
    mean, lo, hi = mean_ci95(values)
    return {
        "sum": float(values.sum()), "mean": mean,
        "median": float(np.median(values)) if values.size else math.nan,
        "stdev": float(values.std(ddof=1)) if values.size > 1 else math.nan,
        "ci95_low": lo, "ci95_high": hi,
    }


_GROUPED = ("rep", "status", "duration_s", *MEMORY_COLUMNS)  # the columns `Grouped` sorts


@dataclass
class Groups:
    """The sites or the APIs: each group's calls' (start, end) in `Grouped` order and, per
    domain, the sums over them that need no call on its own (self energy, energy with idle,
    calls below the sensor's resolution, the uncertainty's sharing and measurement parts),
    summed by bincount over the calls as they are rather than gathered into group order."""

    bounds: np.ndarray
    sums: dict[str, dict[str, np.ndarray]]


@dataclass
class Grouped:
    """A run's calls sorted once by (API, site, as stored), so that each site's calls and each
    API's calls are one slice of the columns (views, not a copy made per group and column):
    the columns `aggregate` reads (`call`, where calls are in pieces, renumbered to positions in
    this order, so a call's pieces still share one value) and per domain the calls' energy_J
    (their per-call statistics need each call); `sites` and `apis` (`Groups`)."""

    cols: dict[str, np.ndarray]
    energy: dict[str, np.ndarray]
    sites: Groups
    apis: Groups


def grouped(calls: dict[str, Any], results: dict[str, at.Attribution],
            api_of_site: np.ndarray) -> Grouped:
    """`Grouped` of the whole-run analysis' calls (`RunAnalysis.calls`)."""
    n_sites = api_of_site.size
    by_api = np.argsort(api_of_site, kind="stable")  # sites by API, then as numbered
    rank = np.empty(n_sites, np.int64)
    rank[by_api] = np.arange(n_sites)
    key = rank[calls["site"]]
    order = at.small_int_order(key)
    starts = np.searchsorted(key[order], np.arange(n_sites + 1))  # by rank
    site_bounds = np.stack((starts[rank], starts[rank + 1]), axis=1)
    api_starts = np.searchsorted(api_of_site[by_api], np.arange(int(api_of_site.max(
        initial=-1)) + 2))
    api_bounds = np.stack((starts[api_starts[:-1]], starts[api_starts[1:]]), axis=1)
    cols = {k: _in_order(calls[k], order) for k in _GROUPED if k in calls}
    if (calls["status"] & CONTINUES).any():  # calls in pieces: which call each piece is of
        position = np.empty(order.size, np.int64)
        position[order] = np.arange(order.size)
        cols["call"] = position[calls["call"][order]]
    energy = {d: calls["energy_J"][d][order] for d in results}
    return Grouped(cols, energy, Groups(site_bounds, _sums(calls, results, "site", n_sites)),
                   Groups(api_bounds, _sums(calls, results, "api", api_bounds.shape[0])))


def _sums(calls: dict[str, Any], results: dict[str, at.Attribution], by: str,
          n: int) -> dict[str, dict[str, np.ndarray]]:
    """Per domain, `Groups.sums` of the groups `calls[by]` numbers."""
    group = calls[by]
    return {d: {"self_J": np.bincount(group, calls["self_energy_J"][d], n),
                "total_J": np.bincount(group, calls["energy_total_J"][d], n),
                "below": np.bincount(group, calls["below_resolution"][d], n),
                "sharing_abs": np.bincount(group, np.abs(res.sharing_J), n),
                "measurement_sq": np.bincount(group, res.measurement_J ** 2, n)}
            for d, res in results.items()}


def aggregate(
    g: Grouped, groups: Groups, domains: dict[str, dict[str, Any]],
    above: dict[str, float], reps: list[dict[str, Any]], results: dict[str, at.Attribution],
    api_of_group: np.ndarray, same: dict[tuple[tuple[int, int], int], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One row per group (site or API) of `groups`; api_of_group: each group's API index (its
    fitted intensity sets the group's uncertainty); same: rows made before (`by_calls`), one
    of which is copied where a group holds the same calls with the same API (an API of one
    site: its row is its site's).

    Row: calls (continuations are pieces of a call, not calls: `pieces`), raised (calls of which a
    piece raised), total_time_s (inclusive), mean_time_s (per call, its pieces summed),
    per_rep_calls (calls in each repetition); energy:
    {domain: {sensor, provenance, model, method, above_idle_J (Σ inclusive), total_J (with idle
    share), self_J, uncertainty_J (1σ of the sum, `attribution.group_uncertainty`), per_call: {sum,
    mean, median, stdev, ci95_low, ci95_high}, share (self_J of the repetitions' above-idle
    energy: over all rows, with the domain's outside_calls_share, 100 %), inclusive_share
    (above_idle_J's: nested rows overlap, as in a profiler), below_resolution_share, per_rep_J,
    rep_mean_J, rep_ci95_low, rep_ci95_high, and never below zero (`floor_at_zero`):
    below_zero, raw_above_idle_J, raw_self_J, raw_per_rep_J}}; all_domains: the sum over
    additive domains with its provenance (raw_above_idle_J, below_zero likewise); memory:
    rss_peak_max_B, rss_delta_mean_B, gpu_mem_peak_max_B, gpu_mem_delta_mean_B."""
    cols = g.cols
    rep, status = cols["rep"], cols["status"]
    rep_ids = [r["rep"] for r in reps] or sorted(set(rep.tolist()))
    whole = not bool((status & CONTINUES).any())  # no call in pieces: an event is a call
    rows = []
    for i, (a, b) in enumerate(groups.bounds.tolist()):
        api = int(api_of_group[i])
        if same and b > a and ((a, b), api) in same:
            rows.append(copy.deepcopy(same[(a, b), api]))
            continue
        idx = slice(a, b)
        in_rep = [rep[idx] == r for r in rep_ids]
        n_calls = pieces.call_count(status[idx])
        total_s = float(cols["duration_s"][idx].sum())
        row: dict[str, Any] = {
            "calls": n_calls,
            "raised": (int(((status[idx] & RAISED) != 0).sum()) if whole
                       else pieces.calls_raised(cols["call"], idx, status)),
            "total_time_s": total_s,
            "mean_time_s": total_s / n_calls if n_calls else math.nan,
            # calls in each repetition: with per_rep_J, each repetition's energy per call
            "per_rep_calls": [pieces.call_count(status[idx][m]) for m in in_rep],
            "energy": {},
            "memory": memory_row(cols, idx),
        }
        for domain, info in domains.items():
            e = g.energy[domain][idx]
            each_call = e if whole else pieces.per_call(cols["call"], idx, g.energy[domain])
            sums = {k: float(v[i]) for k, v in groups.sums[domain].items()}
            row["energy"][domain] = _domain_energy(
                e, each_call, [e[m] for m in in_rep], sums, info, above[domain],
                (results[domain], api, total_s), n_calls)
            floor_at_zero(row["energy"][domain], row["energy"][domain]["uncertainty_J"],
                          n_calls, len(rep_ids))
        row["all_domains"] = cross_domain(row["energy"])
        rows.append(row)
    return rows


def by_calls(groups: Groups, api_of_group: np.ndarray, rows: list[dict[str, Any]]
             ) -> dict[tuple[tuple[int, int], int], dict[str, Any]]:
    """`aggregate`'s rows by their groups' calls and API: `aggregate(same=...)`."""
    return {((a, b), int(api)): row for (a, b), api, row
            in zip(groups.bounds.tolist(), api_of_group, rows, strict=True)}


def _domain_energy(
    e: np.ndarray, each_call: np.ndarray, per_rep_e: list[np.ndarray], sums: dict[str, float],
    info: dict[str, Any], above: float, fit: tuple[at.Attribution, int, float], n_calls: int,
) -> dict[str, Any]:
    """One group's figures in one domain (`aggregate`): e, its calls' inclusive energy; sums,
    its `Groups.sums`; fit: the domain's attribution, the group's API and its calls' time."""
    res, api, busy_s = fit
    per_rep = [float(x.sum()) for x in per_rep_e]
    rep_mean, rep_lo, rep_hi = mean_ci95(np.array(per_rep))
    # the sharing inside sensor intervals, and the idle baseline's own spread over the calls'
    # time (what subtracting an idle level that drifts can be off by)
    sigma = math.hypot(
        at.group_sigma(sums["sharing_abs"], sums["measurement_sq"], res, api),
        finite_or_zero(info.get("idle_sigma_W", math.nan)) * busy_s)
    return {
        "sensor": info["sensor"], "provenance": info["provenance"],
        "model": info["model"], "method": info["method"],
        "above_idle_J": float(e.sum()),
        "total_J": sums["total_J"],
        "self_J": sums["self_J"],
        "uncertainty_J": sigma,
        "per_call": {**_summary(each_call),
                     "noise_J": sigma / n_calls if n_calls else math.nan},
        # self: over the APIs, with the program outside calls, it sums to 100 %;
        # inclusive counts nested calls in their callers too and sums to more
        "share": sums["self_J"] / above,
        "inclusive_share": float(e.sum() / above),
        "share_sigma": sigma / above,
        "below_resolution_share": sums["below"] / e.size if e.size else math.nan,
        "per_rep_J": per_rep, "rep_mean_J": rep_mean,
        "rep_ci95_low": rep_lo, "rep_ci95_high": rep_hi,
    }


def _in_order(column: np.ndarray, order: np.ndarray) -> np.ndarray:
    """column[order]; a column of one value (GPU memory without a GPU gauge: NaN) as a view."""
    if column.size and (np.isnan(column).all() if column.dtype.kind == "f"
                        else bool((column == column[0]).all())):
        return np.broadcast_to(column[:1], column.shape)
    return column[order]


def floor_at_zero(e: dict[str, Any], sigma: float, calls: int, reps: int) -> None:
    """Never below zero (`noise_floor`): the raw above-idle, self and per-repetition estimates
    stay as raw_*; the shown figures are 0 within noise, NaN beyond it (`below_zero` says
    which); per-call and per-repetition figures by their own noise (σ over the calls, the
    repetitions)."""
    raw_above, raw_self = e["above_idle_J"], e["self_J"]
    states = {noise_floor.below_zero(raw_above, sigma), noise_floor.below_zero(raw_self, sigma)}
    e["raw_above_idle_J"], e["raw_self_J"] = raw_above, raw_self
    e["below_zero"] = next((s for s in (noise_floor.BEYOND_NOISE, noise_floor.WITHIN_NOISE)
                            if s in states), None)
    e["above_idle_J"] = noise_floor.shown(raw_above, sigma)
    e["self_J"] = noise_floor.shown(raw_self, sigma)
    # below zero: a share is 0 within noise, else unknown
    if e["self_J"] != raw_self:
        e["share"] = 0.0 if e["self_J"] == 0 else math.nan
    if e["above_idle_J"] != raw_above:
        e["inclusive_share"] = 0.0 if e["above_idle_J"] == 0 else math.nan
    per_call = e["per_call"]
    per_call["sum"] = e["above_idle_J"]
    for key in ("mean", "median"):
        per_call[key] = noise_floor.shown(per_call[key], sigma / max(calls, 1))
    e["rep_mean_J"] = noise_floor.shown(e["rep_mean_J"], sigma / max(reps, 1))
    e["raw_per_rep_J"] = e["per_rep_J"]  # for statistics over repetitions (the sweep)
    e["per_rep_J"] = [noise_floor.shown(v, sigma / math.sqrt(max(reps, 1)))
                      for v in e["per_rep_J"]]


def below_zero_reasons(
    domains: list[dict[str, Any]], rows: list[dict[str, Any]], name: str, label: str,
    skip: Collection[str] = (),
) -> set[str]:
    """Flag a domain unreliable where some of its per-API (per-site) figures fell below zero
    beyond their noise, with the reason in words (those figures are not shown); the domains
    flagged, to `skip` in the next pass."""
    flagged = set()
    for d in domains:
        key = d["domain"]
        if key in skip:
            continue
        bad = [r for r in rows
               if r["energy"].get(key, {}).get("below_zero") == noise_floor.BEYOND_NOISE]
        if not bad:
            continue
        worst = min(bad, key=lambda r: min(r["energy"][key]["raw_above_idle_J"],
                                           r["energy"][key]["raw_self_J"]))
        e = worst["energy"][key]
        depth = -min(e["raw_above_idle_J"], e["raw_self_J"])
        d["unreliable"].append(
            f"{len(bad)} {name[:-1] if len(bad) == 1 else name} came out below the idle "
            f"baseline by more than {'its' if len(bad) == 1 else 'their'} noise "
            f"(most: {worst[label]}, by {scaled(depth, 'J')}, noise ± "
            f"{scaled(e['uncertainty_J'], 'J')}): the idle baseline was "
            "higher than this domain's level while they ran (other load during the baseline, "
            "or an idle level that drifted), so their figures are not shown")
        d["reliable"] = False
        flagged.add(key)
    return flagged


def cross_domain(energy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sum over additive domains (package, DRAM, GPUs), `estimated` if any part is; of the
    parts' raw estimates (a part never floored, such as the live view's, as it is), never shown
    below zero (`noise_floor`), and never "below idle" when no part is (parts each zero within
    their noise add to zero: the 3σ of a sum is less than the sum of the parts' 3σ)."""
    parts = {d: e for d, e in energy.items() if addable(d.partition("@")[0])}
    if not parts:
        return {"above_idle_J": math.nan, "uncertainty_J": math.nan, "total_J": math.nan,
                "provenance": None, "domains": []}
    estimated = any(e["provenance"] != "measured" for e in parts.values())
    raw = float(sum(e.get("raw_above_idle_J", e["above_idle_J"]) for e in parts.values()))
    sigma = math.sqrt(sum(finite_or_zero(e["uncertainty_J"]) ** 2 for e in parts.values()))
    state = noise_floor.below_zero(raw, sigma)
    if state == noise_floor.BEYOND_NOISE and not any(
            noise_floor.below_zero(e.get("raw_above_idle_J", e["above_idle_J"]),
                                   finite_or_zero(e["uncertainty_J"])) == noise_floor.BEYOND_NOISE
            for e in parts.values()):
        state = noise_floor.WITHIN_NOISE  # parts each zero within noise add to zero, not less
    return {
        "above_idle_J": {None: raw, noise_floor.WITHIN_NOISE: 0.0}.get(state, math.nan),
        "raw_above_idle_J": raw,
        "below_zero": state,
        "uncertainty_J": sigma,
        "total_J": float(sum(e["total_J"] for e in parts.values())),
        "provenance": "estimated" if estimated else "measured",
        "domains": sorted(parts),
    }


def lead_domain(domains: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first reliable measured domain, else the first reliable one (on a busy machine the
    program's own share leads): what tables are ranked by and data-size energies are fitted in."""
    ranked = sorted(domains, key=lambda d: (not d.get("reliable", True),
                                            d["provenance"] != "measured", d["domain"]))
    return ranked[0] if ranked else None


def sort_key(domains: list[dict[str, Any]]) -> Callable[[dict[str, Any]], float]:
    """Rows by above-idle energy of the lead domain (`lead_domain`); a figure not shown (below
    zero beyond noise) last."""
    lead = lead_domain(domains)
    first = lead["domain"] if lead else None

    def key(row: dict[str, Any]) -> float:
        value = row["energy"][first]["above_idle_J"] if first else row["total_time_s"]
        return value if math.isfinite(value) else -math.inf

    return key
