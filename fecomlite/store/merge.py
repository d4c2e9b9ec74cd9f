"""One store for a job recorded on several nodes: `fecomlite merge STORE...`.

Each node's fecomlite records its ranks in its own store. A job is the run whose processes carry
the launcher's run id (TORCHELASTIC_RUN_ID) in every store. Times are CLOCK_MONOTONIC of each
node, which start at each machine's boot: every process records its offset wall clock −
monotonic, so node n's times move onto the first node's axis by (offset_n − offset_first). That
is as good as the nodes' wall clocks agree (NTP/PTP: typically well under a millisecond, far
below a sensor's 100 ms period).

In the merged store a node's sensors and their domains carry its name (`gpu:0@node1`,
`cpu-package@node1`) and attribute to that node's calls only (`devices.device_owners`); its pids
become node·2³² + pid, so pids of different machines never collide.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from fecomlite.store import Store, events

PID_STRIDE = 2**32  # merged pid = node * PID_STRIDE + pid


class MergeError(ValueError):
    """Stores that do not hold parts of one job."""


def node_domain(domain: str, node: int) -> str:
    return f"{domain}@node{node}"


def job_run(store: Store, job: str | None) -> tuple[int, str, int]:
    """(run id, job id, node) of the latest run holding ranks of `job` (any job when None)."""
    rows = store.db.execute(
        "SELECT run_id, job, min(node) FROM processes "
        + ("WHERE job=? " if job else "")
        + "GROUP BY run_id ORDER BY run_id DESC LIMIT 1",
        (job,) if job else (),
    ).fetchall()
    if not rows:
        wanted = f"of job {job!r}" if job else "with ranks (run under torchrun)"
        raise MergeError(f"{store.path} holds no run {wanted}")
    return int(rows[0][0]), str(rows[0][1]), int(rows[0][2])


def merge_stores(paths: list[Path], out: Path, job: str | None = None) -> int:
    """Merge the job's run of every store into a new run in `out`; returns its id."""
    parts = []
    for path in paths:
        store = Store(path, readonly=True)
        run_id, found, node = job_run(store, job)
        job = job or found
        parts.append((store, run_id, node))
    nodes = [node for _, _, node in parts]
    if len(set(nodes)) != len(nodes):
        raise MergeError(f"two stores hold the same node ({nodes}): give each node's store once")
    parts.sort(key=lambda p: p[2])
    offsets = {node: _clock_offset(store, run_id) for store, run_id, node in parts}
    reference = offsets[parts[0][2]]
    shifts = {node: offset - reference for node, offset in offsets.items()}
    with Store(out) as merged:
        if merged.runs():
            raise MergeError(f"{out} already holds runs: merge into a new file")
        new_id = _merge_run(merged, parts, shifts, job or "", paths)
        for store, run_id, node in parts:
            _copy_node(merged, new_id, store, run_id, node, shifts[node])
            store.close()
    return new_id


def _clock_offset(store: Store, run_id: int) -> int:
    rows = store.db.execute("SELECT clock_offset_ns FROM processes WHERE run_id=?", (run_id,))
    return int(statistics.median(r[0] for r in rows))


def _merge_run(
    merged: Store,
    parts: list[tuple[Store, int, int]],
    shifts: dict[int, int],
    job: str,
    paths: list[Path],
) -> int:
    runs = [(store.run(run_id), node) for store, run_id, node in parts]
    first = runs[0][0]
    failed = [r["status"] for r, _ in runs if r["status"] != "finished"]
    idle = {f"{name}@node{node}": w for r, node in runs for name, w in (r["idle"] or {}).items()}
    starts = [r["t_start_ns"] + shifts[n] for r, n in runs if r["t_start_ns"] is not None]
    ends = [r["t_end_ns"] + shifts[n] for r, n in runs if r["t_end_ns"] is not None]
    settings = {
        **first["settings"],
        "job": job,
        "merged_from": [str(p) for p in paths],
        "clock_shift_ns": {f"node{n}": s for n, s in shifts.items()},
    }
    run_id = merged.create_run(
        kind=first["kind"],
        program=first["program"],
        argv=first["argv"],
        level=first["level"],
        status=failed[0] if failed else "finished",
        settings=settings,
        hyperparams=first["hyperparams"],
        idle=idle,
        manifest=first["manifest"],
        machine={"nodes": {f"node{n}": r["machine"] for r, n in runs}},
        t_start_ns=min(starts, default=None),
        t_end_ns=max(ends, default=None),
    )
    reps: dict[int, dict[str, Any]] = {}
    for store, src, node in parts:
        for rep in store.repetitions(src):
            row = reps.setdefault(rep["rep"], {"gate": rep["gate"], "extra": rep["extra"]})
            for key, pick in (("t_start_ns", min), ("t_end_ns", max), ("tail_end_ns", max)):
                if rep[key] is not None:
                    value = rep[key] + shifts[node]
                    row[key] = pick(row.get(key, value), value)
            row["exit_code"] = row.get("exit_code") or rep["exit_code"]  # a failure shows
    for rep, row in reps.items():
        merged.upsert_repetition(run_id, rep, **row)
    return run_id


def _copy_node(merged: Store, run_id: int, store: Store, src: int, node: int, shift: int) -> None:
    """A node's sensors, samples, sites, events and processes, on the merged time axis."""
    details = merged.result(run_id, "sensors") or {}
    node_details = store.result(src, "sensors") or {}
    sensor_ids = {}
    for s in store.sensors(src):
        name = f"{s['name']}@node{node}"
        sensor_ids[s["id"]] = merged.add_sensor(
            run_id,
            name=name,
            domain=node_domain(s["domain"], node),
            unit=s["unit"],
            kind=s["kind"],
            provenance=s["provenance"],
            model=s["model"],
            period_s=s["period_s"],
        )
        if s["name"] in node_details:
            details[name] = node_details[s["name"]]
    merged.put_result(run_id, "sensors", details)
    with merged.transaction():
        for old, new in sensor_ids.items():
            rows = store.db.execute("SELECT t_ns, value FROM samples WHERE sensor_id=?", (old,))
            merged.db.executemany(
                "INSERT INTO samples VALUES (?, ?, ?)", ((new, t + shift, v) for t, v in rows)
            )
    sites = {
        r["id"]: dict(r) for r in store.db.execute("SELECT * FROM sites WHERE run_id=?", (src,))
    }
    manifest = {s["key"]: s for s in sites.values()}
    site_ids = merged.site_ids(run_id, manifest.keys(), manifest)
    base = node * PID_STRIDE
    with merged.transaction():
        events.copy_run(store.db, merged.db, src, run_id,
                        {old: site_ids[site["key"]] for old, site in sites.items()}, base, shift)
        for p in store.processes(src):
            device = p["device"] if p["device"] == "cpu" else node_domain(p["device"], node)
            merged.put_process(run_id, base + p["pid"], {**p, "device": device})
    shapes = store.result(src, "shapes")
    if shapes:
        merged.put_result(run_id, "shapes", {**(merged.result(run_id, "shapes") or {}), **shapes})


def describe(store_path: Path, run_id: int) -> str:
    """One line on what was merged, for the command."""
    with Store(store_path, readonly=True) as store:
        settings = store.run(run_id)["settings"]
        ranks = len({p["rank"] for p in store.processes(run_id)})
    shifts = json.dumps(settings.get("clock_shift_ns", {}))
    return f"job {settings.get('job')!r}: {ranks} ranks; clock shifts (ns) {shifts}"
