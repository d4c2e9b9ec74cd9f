"""The live view: a page served by the measurement server, kept current by Server-Sent Events.

GET / is the page (static/live.html); GET /static/NAME its assets: the report's stylesheet and
charts (fecomlite/report/static, shared, not copied) and the page's own script and styles, all
from the package, nothing from a network. GET /live/stream pushes the active run's state every
PUSH_S (more than twice a second) for as long as the viewer stays; the monitor refreshes only
while someone asks, so a server nobody watches does no work for this.

Each message is the whole state (small) plus the chart points closed since the previous message
(`reset` says when the viewer must drop what it has: the first message and a new run): the last
few minutes' 0.5 s bins (`points`) and the whole run in at most `overview.MAX_BUCKETS` buckets
a sensor (`overview`: the buckets closed since, and the one filling). Nothing is sent twice but
the whole run's buckets when their width doubles (a few times a run), so a message stays small
however long the run has recorded.

The figures are the analysis' model (`fecomlite.analysis.run_analysis`), computed here, not in the
page: each
domain's role (disjoint domains add; a share, such as cpu-process of the CPU package, is never
added), the program's above-idle energy = in calls + outside calls with tail and baseline apart,
an all-domains sum over disjoint domains only, and every percentage with the figure it is of.
The page only lays them out.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from fecomlite.analysis.run_analysis import (
    CPU_BUSY_MEANS,
    busy_at,
    cross_domain,
    domain_role,
    reliable_when,
)
from fecomlite.analysis.units import percent, scaled
from fecomlite.report.palette import MEMORY_COLORS, domain_color, domain_name
from fecomlite.report.render import jsonable
from fecomlite.server.monitor import BIN_S, Monitor, Snapshot
from fecomlite.server.replies import Reply, Stream

PUSH_S = 0.4
TOP_APIS = 15
HERE = Path(__file__).parent
REPORT_STATIC = HERE.parent / "report" / "static"
ASSETS: dict[str, tuple[Path, str]] = {
    "report.css": (REPORT_STATIC / "report.css", "text/css; charset=utf-8"),
    "charts.js": (REPORT_STATIC / "charts.js", "text/javascript; charset=utf-8"),
    "live.css": (HERE / "static" / "live.css", "text/css; charset=utf-8"),
    "live.js": (HERE / "static" / "live.js", "text/javascript; charset=utf-8"),
    "favicon.svg": (HERE / "static" / "favicon.svg", "image/svg+xml"),
}
# The page runs only the server's own scripts and talks only to the server.
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; "
                                "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                                "form-action 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
)


class AssetNotFound(LookupError):
    """No such file among the live view's assets."""


@cache
def _read(path: Path) -> bytes:
    return path.read_bytes()


def page() -> Reply:
    return Reply(_read(HERE / "static" / "live.html"), "text/html; charset=utf-8",
                 SECURITY_HEADERS)


def asset(name: str) -> Reply:
    """One of ASSETS by name; anything else is unknown (no path is ever built from `name`)."""
    if name not in ASSETS:
        raise AssetNotFound(f"no asset {name!r}")
    path, content_type = ASSETS[name]
    return Reply(_read(path), content_type, SECURITY_HEADERS)


def stream(monitor: Monitor, closing: threading.Event, push_s: float = PUSH_S) -> Stream:
    """The SSE stream of one viewer: a message every `push_s` until it leaves or the server
    stops."""

    def pump(write: Callable[[bytes], None], connected: Callable[[], bool]) -> None:
        write(b"retry: 2000\n\n")
        seen: dict[str, Any] = {"seq": 0, "run": None, "started": False, "overview": {}}
        due = time.monotonic()
        while connected():
            data = message(monitor, monitor.refresh(), seen)
            write(b"event: update\ndata: " + json.dumps(data, allow_nan=False).encode() + b"\n\n")
            due = max(due + push_s, time.monotonic())  # on a fixed beat, however long it took
            if closing.wait(due - time.monotonic()):
                return

    return Stream(pump, "text/event-stream; charset=utf-8",
                  (("Cache-Control", "no-store"), ("X-Accel-Buffering", "no")))


def message(monitor: Monitor, snap: Snapshot, seen: dict[str, Any]) -> dict[str, Any]:
    """What the page shows now; `seen` (the viewer's last seq and run) is updated."""
    run = snap.run
    run_id = run["id"] if run else None
    reset = not seen["started"] or seen["run"] != run_id
    t0 = (run or {}).get("t_start_ns") or snap.t_ns
    power = _power(snap)
    memory = _memory(snap)
    charted = [s["key"] for s in power + memory]
    points, seq = monitor.history(charted, 0 if reset else seen["seq"], t0)
    if reset:
        seen["overview"] = {}
    overview = monitor.overview(charted, seen["overview"])
    seen.update(seq=seq, run=run_id, started=True)
    return jsonable({
        "reset": reset,
        "host": snap.host,
        "t": (snap.t_ns - t0) / 1e9,
        "bin_s": BIN_S,
        "run": _run(run, snap.t_ns),
        "stage": snap.stage,
        "progress": snap.progress,
        "gate": _gate(snap.gate),
        "power": power,
        "memory": memory,
        "temperatures": [
            {"key": s["name"], "label": s["name"], "now": s["now"]}
            for s in snap.sensors if s["domain"] == "temperature"
        ],
        "utilisation": [
            {"key": s["name"], "label": s["name"], "now": s["now"]}
            for s in snap.sensors if s["domain"] == "utilisation"
        ],
        "points": {k: [[round(t, 3), v] for t, v in pts] for k, pts in points.items()},
        "overview": overview,
        "figures": _figures(snap),
        "calls": _calls(snap),
        "notes": snap.notes,
    })


def _run(run: dict[str, Any] | None, now: int) -> dict[str, Any] | None:
    if run is None:
        return None
    end = run.get("t_end_ns") or now
    return {**{k: run[k] for k in ("id", "kind", "program", "argv", "level", "status",
                                   "exit_code")},
            "elapsed_s": (end - run["t_start_ns"]) / 1e9 if run.get("t_start_ns") else None}


def _power(snap: Snapshot) -> list[dict[str, Any]]:
    """One series per energy domain: the sensor the report would use there."""
    by_name = {s["name"]: s for s in snap.sensors}
    out = []
    for domain, name in sorted(snap.energy_domains.items()):
        s = by_name[name]
        prov = s["provenance"] + (f", {s['model']}" if s["model"] else "")
        out.append({
            "key": name, "label": f"{domain_name(domain)} ({prov})", "domain": domain,
            "provenance": s["provenance"], "model": s["model"], "color": domain_color(domain),
            "now": s["now"], "idle": s["idle_w"],
        })
    return out


def _memory(snap: Snapshot) -> list[dict[str, Any]]:
    out = []
    for s in snap.sensors:
        if s["unit"] != "B" or s["kind"] != "gauge":
            continue
        if s["domain"] == "process-memory":
            what = "peak RSS" if "peak" in s["name"] else "process RSS"
            color = MEMORY_COLORS["rss"]
        elif s["domain"] in ("gpu-memory", "process-gpu-memory"):
            what = "process GPU memory" if s["domain"] == "process-gpu-memory" else "GPU memory"
            color = MEMORY_COLORS["gpu_memory"]
        else:
            continue
        out.append({"key": s["name"], "label": f"{what} ({s['provenance']}, {s['name']})",
                    "color": color, "now": s["now"], "peak": "peak" in s["name"]})
    return out


def _gate(gate: dict[str, Any] | None) -> dict[str, Any] | None:
    if gate is None:
        return None
    return {k: gate.get(k) for k in ("passed", "gated", "waited_s", "reasons")}


def _figures(snap: Snapshot) -> dict[str, Any]:
    """Each attributed domain's figures so far, as `RunAnalysis.domains` defines them, and the
    sum over the disjoint ones (`analysis.cross_domain`)."""
    by_name = {s["name"]: s for s in snap.sensors}
    load = _machine_load(by_name)
    domains = []
    for domain, name in sorted(snap.energy_domains.items()):
        s, f = by_name[name], snap.figures.get(domain)
        role = domain_role(domain)
        row = {"domain": domain, "label": domain_name(domain), "sensor": name,
               "provenance": s["provenance"], "model": s["model"], "color": domain_color(domain),
               **role, "of_label": domain_name(role["of"]) if role["of"] else None,
               "idle_W": s["idle_w"], "reliable": reliable_when(domain, load["busy"]),
               **(f or {})}
        if f is not None:
            row["in_calls_text"] = _share_text(f["in_calls_J"], f["program_J"], row["label"])
        domains.append(row)
    counted = {d["domain"]: {"above_idle_J": d["program_J"], "in_calls_J": d["in_calls_J"],
                             "uncertainty_J": 0.0, "total_J": 0.0, "provenance": d["provenance"]}
               for d in domains if "program_J" in d}
    total = cross_domain(counted)
    parts = total["domains"]
    return {
        "domains": domains,
        "load": load,
        "all_domains": {
            "label": "all domains (" + " + ".join(domain_name(d) for d in parts) + ")"
            if parts else "all domains", "domains": parts, "provenance": total["provenance"],
            "program_J": total["above_idle_J"] if parts else None,
            "in_calls_J": sum(counted[d]["in_calls_J"] for d in parts) if parts else None,
            "reliable": all(d["reliable"] for d in domains if d["domain"] in parts),
        },
    }


def _machine_load(by_name: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether other processes use the CPUs now (the machine's utilisation less the measured
    process tree's, in % of all CPUs), with the analysis' threshold (`analysis.machine_load`
    judges the whole run afterwards)."""
    machine, mine = by_name.get("util:cpu"), by_name.get("util:process")
    if machine is None or machine["now"] is None:
        return {"busy": False, "other_pct": None, "text": "other processes' CPU use not read"}
    other = max(machine["now"] - ((mine or {}).get("now") or 0.0), 0.0)
    busy = busy_at(other)
    text = f"other processes use {other:.0f} % of all CPUs now: " + (
        CPU_BUSY_MEANS if busy else "the machine is quiet")
    return {"busy": busy, "other_pct": other, "text": text}


def _share_text(part: float, whole: float, label: str) -> str:
    """A percentage that says what it is of."""
    if not whole > 0:
        return f"no share yet: the program's {label} above idle is {scaled(whole, 'J')}"
    return f"{percent(part / whole)} of the program's {label} above idle so far " \
           f"({scaled(whole, 'J')})"


def _calls(snap: Snapshot) -> dict[str, Any]:
    calls = snap.calls
    last = calls.get("last")
    domains = {d: next((s for s in snap.sensors if s["name"] == n), None)
               for d, n in snap.energy_domains.items()}
    programs = {d: f["program_J"] for d, f in snap.figures.items()}
    running: dict[str, float] = {}  # API -> how long its call in progress has run
    for c in calls.get("in_progress", []):
        running[c["api"]] = max(running.get(c["api"], 0.0), c["elapsed_s"])
    # by self time (a nested call's time is its own, not its caller's too), a call in progress
    # included (its first call may not have ended yet)
    called = sorted((a for a in snap.apis if a.calls or a.energy_J or a.api in running),
                    key=lambda a: (-(a.self_s + running.get(a.api, 0.0)), -a.seconds))
    return {
        "total": calls["total"],
        "last": None if last is None else {
            "api": last["api"], "raised": last["raised"],
            "ago_s": (snap.t_ns - last["t_end_ns"]) / 1e9,
            "took_s": (last["t_end_ns"] - last["t_start_ns"]) / 1e9,
        },
        "in_progress": [
            {k: c.get(k) for k in ("pid", "tid", "level", "depth", "site", "file", "line", "api",
                                   "static_api", "written", "elapsed_s")}
            for c in calls.get("in_progress", [])
        ],
        "domains": [
            {"domain": d, "label": domain_name(d), "provenance": s["provenance"],
             "model": s["model"], **domain_role(d)}
            for d, s in sorted(domains.items()) if s is not None
        ],
        "top": [{**_api_row(a, programs, domains), "running_s": running.get(a.api)}
                for a in called[:TOP_APIS]],
        "apis": len(called),
        "method": calls.get("method"),
        "settle_s": calls.get("settle_s"),
    }


def _api_row(a: Any, programs: dict[str, float], domains: dict[str, Any]) -> dict[str, Any]:
    """One API: its time in calls, self (innermost, over the steps attributed so far) and
    inclusive (each call's whole span, nested calls' included); its self energy above idle in
    each domain with figures so far (0 where it got none) and that as a share of the domain's
    program energy (self shares add up: nested calls are not counted twice); the sum over the
    disjoint domains (never a share domain)."""
    energy = {d: {"above_idle_J": a.energy_J.get(d, 0.0), "uncertainty_J": 0.0,
                  "total_J": 0.0, "provenance": s["provenance"]}
              for d, s in domains.items() if s is not None and d in programs}
    total = cross_domain(energy)
    return {
        "api": a.api, "calls": a.calls, "seconds": a.seconds, "self_s": a.self_s,
        "energy": {d: e["above_idle_J"] for d, e in energy.items()},
        "share": {d: e["above_idle_J"] / programs[d] for d, e in energy.items()
                  if programs[d] > 0},
        "all_domains": {"above_idle_J": total["above_idle_J"] if total["domains"] else None,
                        "provenance": total["provenance"], "domains": total["domains"]},
    }
