"""A long training's cost in the store: bytes per call, ingest rate, report seconds and peak RSS
at 1 M and 10 M calls (100 M with --huge), and how each grows with the run.

The run is synthetic but shaped like a real one: 50 call sites, a training step of 45 nested
calls on the main thread (one outer call around 44 inner ones, log-normal durations, ns-grained
times) and 5 data-loading calls a step on a second thread, a raised call now and then, sizes
taken for a few calls; 10 Hz power sensors (CPU package, DRAM) and a 200 Hz RSS gauge, written
as the server writes them. Events go through the store's write path as the server stores a
probe batch (`batch_codec.decode` + `Store.add_batch`, one batch per 0.2 s of the run, the
probe's flush period); one size also through the server's HTTP ingest (`--senders` processes
posting on kept-alive connections, as the probe does). `report` runs in a child process whose
peak RSS is read with `getrusage(RUSAGE_CHILDREN)` in an intermediary of its own; by default it
analyses every size streamed (`--stream-above 0`), as a run above `run_analysis.STREAM_ABOVE`
calls is (`analysis/streamed.py`).

    python benchmarks/long_training.py [--sizes 1000000 10000000] [--huge] [--report-max N]
                                       [--stream-above N] [--http N] [--senders S]
                                       [--batch-calls N] [--json FILE] [--keep DIR] [--real N]

Then a real instrumented run of `--real` calls (5 M by default) through `fecomlite run` and
`fecomlite report`, as `real_training_run.py` makes it.

Runs against whichever fecomlite is on PYTHONPATH: the same script measured the previous
row-per-call store (PYTHONPATH=a checkout of the older release) and the chunked one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import real_training_run

from fecomlite.runtime import batch_codec
from fecomlite.store import Store

SITES = 50
INNER, LOADER = 44, 5  # calls a step: 1 outer + 44 inner on the main thread, 5 on the loader
MAIN_TID, LOADER_TID = 140_245_118_125_888, 140_244_937_520_896
FLUSH_NS = 200_000_000  # the probe's flush period
POWER_NS, RSS_NS = 100_000_000, 5_000_000
T0 = 10_000_000_000


def steps(rng: np.random.Generator, n_steps: int, start: int) -> dict[str, np.ndarray]:
    """`n_steps` training steps from `start`: columns in the order the probe records them
    (by end)."""
    dur = np.clip(rng.lognormal(np.log(40e3), 0.8, (n_steps, INNER)), 2e3, 5e6).astype(np.int64)
    gap = rng.integers(800, 4000, (n_steps, INNER))
    step_len = (dur + gap).sum(axis=1) + 3000
    step_start = start + np.concatenate(([0], np.cumsum(step_len)[:-1]))
    inner0 = step_start[:, None] + 1000 + np.cumsum(dur + gap, axis=1) - dur
    inner1 = inner0 + dur
    outer0, outer1 = step_start, inner1[:, -1] + 1000
    load0 = step_start[:, None] + (rng.random((n_steps, LOADER)) * step_len[:, None]).astype(
        np.int64)
    load1 = load0 + rng.integers(5_000, 60_000, (n_steps, LOADER))
    t0 = np.concatenate((outer0[:, None], inner0, load0), axis=1).ravel()
    t1 = np.concatenate((outer1[:, None], inner1, load1), axis=1).ravel()
    site = np.tile(np.concatenate(([0], 1 + np.arange(INNER), 45 + np.arange(LOADER))), n_steps)
    tid = np.tile(np.array([MAIN_TID] * (1 + INNER) + [LOADER_TID] * LOADER, np.uint64), n_steps)
    n = t0.size
    status = (rng.random(n) < 1e-4).astype(np.uint8)  # raised now and then
    sized = rng.random(n) < 1e-3
    in_bytes = np.where(sized, rng.integers(1 << 10, 1 << 26, n), -1)
    order = np.argsort(t1, kind="stable")
    return {"site": site[order].astype(np.int32), "t_start_ns": t0[order], "t_end_ns": t1[order],
            "tid": tid[order], "status": status[order], "in_bytes": in_bytes[order],
            "out_bytes": np.where(sized[order], in_bytes[order] // 2, -1)}


def batches(n_calls: int, seed: int = 7, sender: int = 0,
            per_batch: int | None = None) -> Iterator[tuple[bytes, int, int]]:
    """(encoded batch, first ns, last ns) of a run of about `n_calls` calls, as process number
    `sender` sends them: 0.2 s of the run each (the probe's flush period), or `per_batch` calls
    each (a faster program's 0.2 s: the probe flushes on time or on size)."""
    rng = np.random.default_rng(seed)
    per_step, start, made, seq = 1 + INNER + LOADER, T0, 0, 0
    sites = [f"train.py:{10 + s}:8" for s in range(SITES)]
    while made < n_calls:
        cols = steps(rng, min(2_000, (n_calls - made) // per_step + 1), start)
        if per_batch:
            cut = np.append(np.arange(per_batch, cols["site"].size, per_batch), cols["site"].size)
        else:
            cut = np.searchsorted(cols["t_end_ns"], np.arange(
                start + FLUSH_NS, int(cols["t_end_ns"][-1]) + FLUSH_NS, FLUSH_NS))
        for a, b in zip(np.concatenate(([0], cut[:-1])), cut, strict=True):
            if a == b:
                continue
            part = tuple(np.ascontiguousarray(cols[name][a:b]).astype(dtype).tobytes()
                         for name, dtype, _ in batch_codec.COLUMNS)
            seq += 1
            meta = {"rep": 1, "pid": 4242 + sender, "proc": f"bench{sender}", "seq": seq,
                    "total": made + int(b)}
            yield (batch_codec.encode(meta, sites, part), int(cols["t_start_ns"][a]),
                   int(cols["t_end_ns"][b - 1]))
        made += int(cols["site"].size)
        start = int(cols["t_end_ns"].max()) + 5000


def _sensors(store: Store, run: int) -> dict[str, int]:
    common = {"provenance": "estimated", "model": "cpu-util-linear"}
    return {
        "cpu": store.add_sensor(run, name="est:cpu-package", domain="cpu-package", unit="W",
                                kind="power", period_s=0.1, **common),
        "dram": store.add_sensor(run, name="est:dram", domain="dram", unit="W", kind="power",
                                 period_s=0.1, **common),
        "rss": store.add_sensor(run, name="proc:rss", domain="process-memory", unit="B",
                                kind="gauge", provenance="measured", period_s=0.005),
    }


def _samples(ids: dict[str, int], t_from: int, t_to: int, rng: np.random.Generator) -> list:
    power = np.arange(t_from - t_from % POWER_NS + POWER_NS, t_to, POWER_NS, dtype=np.int64)
    rss = np.arange(t_from - t_from % RSS_NS + RSS_NS, t_to, RSS_NS, dtype=np.int64)
    rows = [(ids["cpu"], t, 30.0 + 10 * rng.random()) for t in power.tolist()]
    rows += [(ids["dram"], t, 4.0 + rng.random()) for t in power.tolist()]
    rows += [(ids["rss"], t, 1.5e9 + 1e6 * rng.random()) for t in rss.tolist()]
    return rows


def build(path: Path, n_calls: int) -> tuple[int, float, int]:
    """(run id, events/s through decode + add_batch, calls stored)."""
    rng = np.random.default_rng(3)
    store = Store(path)
    manifest = {f"train.py:{10 + s}:8": {"file": "train.py", "line": 10 + s, "col": 8,
                                         "api": f"torch.api_{s:02d}", "written": f"api_{s:02d}",
                                         "function": "step", "source": f"y = api_{s:02d}(x)"}
                for s in range(SITES)}
    run = store.create_run(program="train.py", status="running", settings={"repeat": 1},
                           machine={"cpu_model": "synthetic", "cpu_logical": 2},
                           idle={"est:cpu-package": 20.0, "est:dram": 3.0}, manifest=manifest)
    ids = _sensors(store, run)
    ingest_s, stored, first, last, pending = 0.0, 0, None, T0, []
    for body, a, b in batches(n_calls):
        first = a if first is None else first
        t = time.perf_counter()
        header, columns = batch_codec.decode(body, require_id=True)
        stored += store.add_batch(run, header, columns, manifest)
        ingest_s += time.perf_counter() - t
        pending.append((last, b))
        if b - pending[0][0] >= 500_000_000:  # the server's writer commits every 0.5 s
            store.add_samples(_samples(ids, pending[0][0], b, rng))
            pending = []
        last = b
    store.add_samples(_samples(ids, T0 - 2_000_000_000, T0, rng))
    store.upsert_repetition(run, 1, t_start_ns=T0 - 500_000_000, t_end_ns=last,
                            tail_end_ns=last, exit_code=0,
                            gate={"passed": True, "gated": True, "waited_s": 0.0})
    store.update_run(run, status="finished", exit_code=0, t_start_ns=T0 - 2_000_000_000,
                     t_end_ns=last)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return run, stored / ingest_s, stored


def table_bytes(path: Path) -> dict[str, int]:
    """Bytes on disk per table and index (SQLite's dbstat), or the whole file without it."""
    db = sqlite3_connect(path)
    try:
        return dict(db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
    except Exception:  # noqa: BLE001 - dbstat is an optional SQLite module
        return {}
    finally:
        db.close()


def sqlite3_connect(path: Path) -> Any:
    import sqlite3

    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def http_ingest(folder: Path, n_calls: int, senders: int,
                per_batch: int | None) -> tuple[float, float]:
    """(events/s, the server's CPU ns per event) a live server stores from `senders` processes
    posting at once, each its batches one after another on one kept-alive connection, as the
    probe's sender does (`runtime/sender.py`): from the first post to the last stored. The CPU
    time is the server process's own (user + system), which the machine's load moves far less
    than the rate."""
    import multiprocessing

    from fecomlite.server.client import ensure_server

    home = folder / "http-home"
    os.environ["FECOMLITE_HOME"] = str(home)
    client = ensure_server(home)
    try:
        run, token = client.create_run("train.py", [], "method", {})
        server_pid = int(client.status()["pid"])
        context = multiprocessing.get_context("fork")
        ready, go, out = context.Barrier(senders + 1), context.Event(), context.Queue()
        procs = [context.Process(target=_send, args=(out, client.url, run, token,
                                                     n_calls // senders, k, per_batch, ready, go))
                 for k in range(senders)]
        for proc in procs:
            proc.start()
        ready.wait()  # every sender has made its batches: only posting is timed
        cpu = _cpu_s(server_pid)
        go.set()
        spans = [out.get(timeout=600) for _ in procs]
        cpu = _cpu_s(server_pid) - cpu
        for proc in procs:
            proc.join()
        if any(isinstance(span, str) for span in spans):
            raise RuntimeError(next(span for span in spans if isinstance(span, str)))
        stored = sum(n for n, _, _ in spans)
        rate = stored / (max(t1 for _, _, t1 in spans) - min(t0 for _, t0, _ in spans))
        client.finish_run(run, "finished", 0)
    finally:
        client.shutdown()
    return rate, cpu / stored * 1e9


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _send(out: Any, url: str, run: int, token: str, n_calls: int, sender: int,
          per_batch: int | None, ready: Any, go: Any) -> None:
    """One sender process: puts (events stored, time of its first post, time its last was
    answered), or what went wrong, on `out`."""
    import http.client
    import urllib.parse

    bodies = [body for body, _, _ in batches(n_calls, seed=sender, sender=sender,
                                             per_batch=per_batch)]
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    headers = {"Content-Type": batch_codec.CONTENT_TYPE, "X-Fecomlite-Token": token}
    ready.wait()
    go.wait()
    stored, t0 = 0, time.perf_counter()
    for body in bodies:
        conn.request("POST", f"/api/runs/{run}/events", body=body, headers=headers)
        response = conn.getresponse()
        reply = json.loads(response.read())
        if response.status != 200:
            out.put(f"the server refused a batch: {reply}")
            return
        stored += int(reply["stored"])
    out.put((stored, t0, time.perf_counter()))
    conn.close()


def exponent(a: float, b: float, n_a: int, n_b: int) -> float:
    return math.log(b / a) / math.log(n_b / n_a) if a > 0 and b > 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--huge", action="store_true", help="add 100 M calls (long)")
    parser.add_argument("--report-max", type=int, default=100_000_000,
                        help="run `fecomlite report` only on runs up to this many calls")
    parser.add_argument("--stream-above", type=int, default=0,
                        help="the report analyses a run of more calls than this streamed "
                             "(FECOMLITE_STREAM_ABOVE; 0: every size, as a long run is)")
    parser.add_argument("--http", type=int, default=1_000_000,
                        help="calls to post through a live server (0: none)")
    parser.add_argument("--senders", type=int, default=1,
                        help="processes posting to the server at once (threads here)")
    parser.add_argument("--batch-calls", type=int,
                        help="calls per posted batch (default: 0.2 s of the synthetic run, "
                             "~3,800; 40000 is a 200 k calls/s program's 0.2 s)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--keep", type=Path, help="build the stores here and keep them")
    parser.add_argument("--real", type=int, default=5_000_000,
                        help="calls of a real instrumented run, end to end "
                             "(`real_training_run.py`; 0: none)")
    args = parser.parse_args()
    sizes = sorted(set(args.sizes + ([100_000_000] if args.huge else [])))
    folder = (args.keep or Path(tempfile.mkdtemp(prefix="fecomlite-long-training-"))).resolve()
    args.json = args.json and args.json.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)  # children (`-m`) import fecomlite from PYTHONPATH, not from a checkout here
    env_py = os.environ.get("PYTHONPATH", "")
    print(f"fecomlite from {Path(batch_codec.__file__).parents[2]} (PYTHONPATH={env_py}); "
          f"load {os.getloadavg()[0]:.2f}")
    figures: list[dict[str, Any]] = []
    try:
        for n in sizes:
            path = folder / f"store-{n}.sqlite"
            path.unlink(missing_ok=True)
            t = time.perf_counter()
            run, rate, stored = build(path, n)
            row: dict[str, Any] = {
                "calls": stored, "build_s": time.perf_counter() - t, "ingest_events_per_s": rate,
                "file_bytes": path.stat().st_size, "load": os.getloadavg()[0]}
            parts = table_bytes(path)
            event_parts = {k: v for k, v in parts.items()
                           if k.startswith(("event", "batches", "sqlite_autoindex_batches"))}
            row["bytes_per_call"] = row["file_bytes"] / stored
            row["event_bytes_per_call"] = (sum(event_parts.values()) / stored
                                           if event_parts else None)
            row["tables"] = parts
            if n <= args.report_max:
                out = folder / f"report-{n}"
                os.environ["FECOMLITE_STREAM_ABOVE"] = str(args.stream_above)
                measured = real_training_run.measured([
                    sys.executable, "-m", "fecomlite.cli", "report", str(run), "--store",
                    str(path), "-o", str(out), "-f", "json"])
                row["report_s"], row["report_peak_rss"], row["report_cpu_s"] = measured
                row["report_load"] = os.getloadavg()[0]
            figures.append(row)
            ebc = row["event_bytes_per_call"]
            print(f"{stored:>12,} calls: file {row['file_bytes'] / 1e6:8.1f} MB = "
                  f"{row['bytes_per_call']:5.1f} B/call (events + batch ids "
                  f"{'?' if ebc is None else f'{ebc:.1f}'} B/call); store ingest "
                  f"{rate / 1e6:5.2f} M events/s; report "
                  + (f"{row['report_s']:6.1f} s ({row['report_cpu_s']:.1f} s CPU), peak RSS "
                     f"{row['report_peak_rss'] / 1e6:6.0f} MB (load {row['report_load']:.2f} after)"
                     if "report_s" in row else "not run")
                  + f"; load {row['load']:.2f}", flush=True)
            if args.keep is None:
                path.unlink()
        for a, b in zip(figures, figures[1:], strict=False):
            grow = {k: exponent(a[k], b[k], a["calls"], b["calls"])
                    for k in ("file_bytes", "report_s", "report_cpu_s", "report_peak_rss")
                    if k in a and k in b}
            print(f"growth {a['calls']:,} -> {b['calls']:,} calls (exponent; 1 = linear, "
                  "0 = constant): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in grow.items()))
        if args.http:
            rate, cpu_ns = http_ingest(folder, args.http, args.senders, args.batch_calls)
            shape = f"{args.batch_calls:,}-call" if args.batch_calls else "0.2 s"
            print(f"server HTTP ingest, {args.senders} sender(s) posting {shape} batches: "
                  f"{rate / 1e6:.2f} M events/s, server CPU {cpu_ns:.0f} ns/event "
                  f"({args.http:,} calls); load {os.getloadavg()[0]:.2f}")
            figures.append({"http_calls": args.http, "senders": args.senders,
                            "batch_calls": args.batch_calls, "http_events_per_s": rate,
                            "server_cpu_ns_per_event": cpu_ns})
        if args.real:
            os.environ.pop("FECOMLITE_STREAM_ABOVE", None)  # the real run reported as a user's
            real = real_training_run.real_run(args.real, folder / "real")
            print(real_training_run.printed(real), flush=True)
            figures.append(real)
    finally:
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
