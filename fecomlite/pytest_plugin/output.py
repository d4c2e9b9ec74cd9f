"""What people read: the terminal summary, the Markdown summary (a CI job summary or a PR
comment) and the JSON document. Test ids and API names are user strings: control characters
are dropped for the terminal, Markdown and HTML specials escaped for Markdown."""

from __future__ import annotations

import html
import math
import re
from typing import Any

from fecomlite.analysis import units
from fecomlite.terminal import without_control

TOP_TESTS = 10
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md(value: Any) -> str:
    """A user string as Markdown text that renders as itself, on one line."""
    text = without_control(value).replace("\n", " ").replace("\t", " ")
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def _mean(values: list[Any]) -> float:
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(v) / len(v) if v else math.nan


def _verdicts(test: dict[str, Any], kind: str) -> list[tuple[str, dict[str, Any]]]:
    figures = test["memory"].items() if kind == "memory" else test["energy"].items()
    return [(k, v) for k, v in figures if v.get("verdict") in ("higher", "lower")]


def _figure_text(kind: str, key: str, v: dict[str, Any]) -> str:
    unit = "B" if kind == "memory" else "J"
    what = v.get("label", key) if kind == "memory" else f"{key} energy"
    return (f"{what} {units.scaled(v['a'], unit)} → {units.scaled(v['b'], unit)} "
            f"({units.percent(v['rel']) if v['rel'] < 0 else '+' + units.percent(v['rel'])}, "
            f"noise ± {units.scaled(v['noise'], unit)})")


def _apis_text(changes: list[dict[str, Any]], unit: str) -> str:
    return ", ".join(f"{c['api']} {units.scaled(c['diff'], unit, signed=True)}" for c in changes)


def changed(comparison: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Tests that got costlier or cheaper (memory and energy apart), each with its lines."""
    out: dict[str, list[dict[str, Any]]] = {"costlier": [], "cheaper": []}
    for t in comparison["tests"]:
        for kind, unit, apis in (("memory", "B", "memory_apis"), ("energy", "J", "energy_apis")):
            for key, v in _verdicts(t, kind):
                side = "costlier" if v["verdict"] == "higher" else "cheaper"
                same_way = [c for c in t[apis] if (c["diff"] > 0) == (side == "costlier")]
                out[side].append({"nodeid": t["nodeid"], "kind": kind,
                                  "figure": _figure_text(kind, key, v),
                                  "apis": _apis_text(same_way, unit)})
    return out


def no_verdict_reasons(comparison: dict[str, Any]) -> dict[str, int]:
    """Why energy had no verdict, with how many tests each reason covers."""
    reasons: dict[str, int] = {}
    for t in comparison["tests"]:
        lead = t["energy_lead"]
        v = t["energy"].get(lead) if lead else None
        if v and v.get("verdict") not in ("higher", "lower", "within noise"):
            why = re.sub(r"\d+ %", "N %", v.get("why") or v["verdict"])
            reasons[why] = reasons.get(why, 0) + 1
    return reasons


def provenance_text(rows: dict[str, dict[str, Any]]) -> str:
    sensors: dict[str, dict[str, Any]] = {}
    for row in rows.values():
        sensors.update(row["sensors"])
    return "; ".join(f"{d} {s['provenance']}" + (f" ({s['model']})" if s.get("model") else "")
                     for d, s in sorted(sensors.items())) or "no energy sensor"


def header(rows: dict[str, dict[str, Any]], instrumented: bool) -> list[str]:
    reps = sorted({r["repetitions"] for r in rows.values()})
    busy = sum(1 for r in rows.values() if r.get("busy"))
    return [
        f"{len(rows)} tests measured ({'/'.join(map(str, reps)) or 0} repetition(s) each); "
        f"energy idle included: {provenance_text(rows)}",
        (f"{busy} measured while other processes kept the CPUs busy; " if busy else "")
        + ("APIs: the framework calls of the instrumented modules" if instrumented else
           "APIs: none (no module was instrumented at import: whole-test figures only)"),
    ]


def costliest(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The tests with the most energy (else time) per repetition."""
    def total(row: dict[str, Any]) -> float:
        disjoint = [_mean(v) for d, v in row["energy_J"].items() if d in ("cpu-package", "dram")
                    or d.startswith("gpu:")]
        return sum(disjoint) if disjoint else _mean(row["duration_s"])

    ranked = sorted(rows.values(), key=lambda r: -total(r))[:TOP_TESTS]
    return [{"nodeid": r["nodeid"], "duration_s": _mean(r["duration_s"]), "energy_J": total(r),
             "peak_B": _mean(r["memory"]["host_peak_B"]),
             "apis": ", ".join(a["api"] for a in r["apis"][:3])} for r in ranked]


def terminal_lines(rows: dict[str, dict[str, Any]], comparison: dict[str, Any] | None,
                   instrumented: bool, baseline: str | None) -> list[str]:
    lines = header(rows, instrumented)
    if comparison is None:
        lines.append(f"costliest tests (per repetition; top {TOP_TESTS}):")
        lines += [f"  {c['nodeid']}  {units.scaled(c['duration_s'], 's')}  "
                  f"{units.scaled(c['energy_J'], 'J')}  peak +{units.scaled(c['peak_B'], 'B')}"
                  + (f"  [{c['apis']}]" if c["apis"] else "") for c in costliest(rows)]
        return [without_control(x) for x in lines]
    lines.append(f"compared with baseline {baseline}:")
    groups = changed(comparison)
    for side in ("costlier", "cheaper"):
        lines.append(f"{side}: {len(groups[side]) or 'none'}")
        for c in groups[side]:
            lines.append(f"  {c['nodeid']}: {c['figure']}" + (f"; APIs: {c['apis']}"
                                                              if c["apis"] else ""))
    for why, n in no_verdict_reasons(comparison).items():
        lines.append(f"energy, no verdict for {n} test(s): {why}")
    if comparison["new"] or comparison["gone"]:
        lines.append(f"{len(comparison['new'])} test(s) not in the baseline, "
                     f"{len(comparison['gone'])} in the baseline only")
    if comparison["gone"] and not comparison["tests"]:
        lines.append("no test id in common: was the baseline saved from another rootdir? (a "
                     "path given as `--fecomlite-compare PATH` counts for pytest's rootdir; "
                     "write --fecomlite-compare=PATH)")
    if comparison["fail"]:
        gates = ",".join(f"{k}:{100 * v:g}%" for k, v in comparison["fail"].items())
        lines.append(f"gate {gates}: " + ("FAILED" if comparison["failures"] else "passed"))
        lines += [f"  {f}" for f in comparison["failures"]]
    return [without_control(x) for x in lines]


def markdown(rows: dict[str, dict[str, Any]], comparison: dict[str, Any] | None,
             instrumented: bool, baseline: str | None) -> str:
    out = ["### fecomlite: energy and memory per test", ""]
    out += [md(x) + "  " for x in header(rows, instrumented)]
    out.append("")
    if comparison is None:
        out += ["| test | time | energy | peak memory | APIs |", "| --- | --- | --- | --- | --- |"]
        out += [f"| {md(c['nodeid'])} | {units.scaled(c['duration_s'], 's')} | "
                f"{units.scaled(c['energy_J'], 'J')} | +{units.scaled(c['peak_B'], 'B')} | "
                f"{md(c['apis'])} |" for c in costliest(rows)]
        return "\n".join(out) + "\n"
    if comparison["fail"]:
        gates = ",".join(f"{k}:{100 * v:g}%" for k, v in comparison["fail"].items())
        out.append(f"**Gate {gates}: {'failed' if comparison['failures'] else 'passed'}**")
        out += [f"- {md(f)}" for f in comparison["failures"]]
        out.append("")
    out.append(f"Compared with baseline {md(baseline)}.")
    out.append("")
    groups = changed(comparison)
    if groups["costlier"] or groups["cheaper"]:
        out += ["| test | change | figure | APIs that account for it |",
                "| --- | --- | --- | --- |"]
        for side in ("costlier", "cheaper"):
            out += [f"| {md(c['nodeid'])} | {side} ({c['kind']}) | {md(c['figure'])} | "
                    f"{md(c['apis'])} |" for c in groups[side]]
    else:
        out.append("No test got costlier or cheaper beyond the noise of both measurements.")
    reasons = no_verdict_reasons(comparison)
    if reasons:
        out += ["", "Energy, no verdict: " + "; ".join(f"{md(w)} ({n})" for w, n in
                                                      reasons.items())]
    return "\n".join(out) + "\n"


def json_document(rows: dict[str, dict[str, Any]], comparison: dict[str, Any] | None,
                  baseline: str | None) -> dict[str, Any]:
    return {"tests": [rows[k] for k in sorted(rows)], "baseline": baseline,
            "comparison": comparison,
            "gate_failed": bool(comparison and comparison["failures"])}
