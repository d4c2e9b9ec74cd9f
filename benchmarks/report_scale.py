"""Seconds `fecomlite report` takes on a run with 1,000,000 call events (target: ≤ 20 s).

The run is synthetic where it must be and replayed where it can be: 200 call sites of 40 APIs
called in random order with log-normal durations (median 0.3 ms), two repetitions, a few
`region:` events around them (so calls nest); the GPU energy counter replays the power of the
real H200 trace in tests/fixtures/h200-nvml-mixed (its ~100 ms update intervals, tiled) read
every 4 ms as NVML is; an estimated CPU power series every 100 ms and an RSS gauge every 50 ms.
Prints the time of each phase and of the whole command, against the target, and the size of
the page.

    python benchmarks/report_scale.py [--events N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from pathlib import Path

import _results
import numpy as np

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.build import build_report
from fecomlite.report.command import report_command
from fecomlite.report.render import write_report
from fecomlite.report.timeline import busy_per_bin
from fecomlite.store import Store

TARGET_S = 20.0
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200-nvml-mixed"
SITES, APIS, REPS = 200, 40, 2
READ_NS, CPU_NS, RSS_NS = 4_000_000, 100_000_000, 50_000_000


def fixture_power() -> tuple[np.ndarray, np.ndarray]:
    """(interval lengths ns, power W) between the recorded counter's updates."""
    path = FIXTURE / "gpu_samples_energy.csv"
    with path.open() as f:
        rows = list(csv.reader(f))[1:]
    t = np.array([int(r[0]) for r in rows], np.int64)
    e = np.array([float(r[1]) for r in rows]) / 1000.0
    change = np.flatnonzero(np.diff(e) != 0) + 1
    lengths = np.diff(t[change])
    return lengths, np.diff(e[change]) / (lengths / 1e9)


def make_calls(rng: np.random.Generator, n: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    dur = np.clip(rng.lognormal(np.log(300e3), 1.0, n), 20e3, 50e6).astype(np.int64)
    gap = rng.exponential(120e3, n).astype(np.int64) + 5_000
    t0 = start + np.cumsum(gap + dur) - dur
    return t0, t0 + dur


def counter_reads(t_from: int, t_to: int, lengths: np.ndarray, power: np.ndarray,
                  offset: float) -> tuple[np.ndarray, np.ndarray]:
    """A counter updated at the fixture's instants (tiled), read every READ_NS."""
    reps = int((t_to - t_from) / lengths.sum()) + 2
    edges = t_from + np.concatenate(([0], np.cumsum(np.tile(lengths, reps))))
    energy = offset + np.concatenate(([0.0], np.cumsum(np.tile(power * lengths / 1e9, reps))))
    reads = np.arange(t_from, t_to, READ_NS, dtype=np.int64)
    return reads, energy[np.searchsorted(edges, reads, "right") - 1]


def build_store(path: Path, events: int) -> int:
    rng = np.random.default_rng(7)
    lengths, power = fixture_power()
    store = Store(path)
    run = store.create_run(program="train.py", status="finished", exit_code=0,
                           settings={"repeat": REPS}, idle={"nvml:0:energy": 124.0},
                           machine={"cpu_model": "synthetic", "cpu_logical": 2})
    ids = {
        "gpu": store.add_sensor(run, name="nvml:0:energy", domain="gpu:0", unit="J",
                                kind="counter", provenance="measured", period_s=0.1),
        "cpu": store.add_sensor(run, name="est:cpu-package", domain="cpu-package", unit="W",
                                kind="power", provenance="estimated", model="cpu-util-linear",
                                period_s=0.1),
        "rss": store.add_sensor(run, name="proc:rss", domain="process-memory", unit="B",
                                kind="gauge", provenance="measured", period_s=0.05),
    }
    manifest = {f"train.py:{10 + s}:4": {"file": "train.py", "line": 10 + s, "col": 4,
                                         "api": f"torch.api_{s % APIS:02d}",
                                         "written": f"api_{s % APIS:02d}", "function": "step",
                                         "source": f"y = api_{s % APIS:02d}(x)"}
                for s in range(SITES)}
    site_ids = store.site_ids(run, manifest.keys(), manifest)
    region_ids = store.site_ids(run, ["region:epoch"], {})
    sid = np.array([site_ids[f"train.py:{10 + s}:4"] for s in range(SITES)], np.int64)
    per_rep, start, counter = events // REPS, 10_000_000_000, 0.0
    for rep in range(1, REPS + 1):
        t0, t1 = make_calls(rng, per_rep, start)
        sites = sid[rng.integers(0, SITES, per_rep)]
        # five epochs, each a region event enclosing its calls
        cut = np.linspace(0, per_rep, 6).astype(int)
        r0, r1 = t0[cut[:-1]] - 1000, t1[cut[1:] - 1] + 1000
        end = int(t1[-1])
        tail_end = end + 2_000_000_000
        reads, values = counter_reads(start - 3_000_000_000, tail_end, lengths, power, counter)
        counter = float(values[-1])
        grid = np.arange(start - 3_000_000_000, tail_end, CPU_NS, dtype=np.int64)
        busy = busy_per_bin(t0, t1, np.concatenate(([grid[0] - CPU_NS], grid)))
        rss_t = np.arange(start - 3_000_000_000, tail_end, RSS_NS, dtype=np.int64)
        rss = 1.2e9 + np.cumsum(rng.normal(0, 2e6, rss_t.size))
        with store.transaction():
            store.db.executemany("INSERT INTO samples VALUES (?, ?, ?)", zip(
                [ids["gpu"]] * reads.size, reads.tolist(), values.tolist(), strict=True))
            store.db.executemany("INSERT INTO samples VALUES (?, ?, ?)", zip(
                [ids["cpu"]] * grid.size, grid.tolist(), (20 + 25 * busy).tolist(), strict=True))
            store.db.executemany("INSERT INTO samples VALUES (?, ?, ?)", zip(
                [ids["rss"]] * rss_t.size, rss_t.tolist(), rss.tolist(), strict=True))
            site_ids = np.concatenate((sites, np.full(r0.size, region_ids["region:epoch"])))
            starts, ends = np.concatenate((t0, r0)), np.concatenate((t1, r1))
            n = site_ids.size
            store.add_events(run, rep, 4242, {
                "site_id": site_ids, "tid": np.ones(n, np.int64), "t_start_ns": starts,
                "t_end_ns": ends, "status": np.zeros(n, np.int64),
                "in_bytes": np.full(n, -1), "out_bytes": np.full(n, -1)})
        store.upsert_repetition(run, rep, t_start_ns=start - 500_000_000, t_end_ns=end,
                                tail_end_ns=tail_end, exit_code=0,
                                gate={"passed": True, "gated": True, "waited_s": 0.0})
        start = tail_end + 3_000_000_000
    store.update_run(run, t_start_ns=10_000_000_000 - 3_000_000_000, t_end_ns=start)
    store.close()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="build the store and reports here, keep them")
    _results.add_option(parser, "report_scale")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="fecomlite-report-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "store.sqlite"
    path.unlink(missing_ok=True)
    t = time.perf_counter()
    run = build_store(path, args.events)
    print(f"store with {args.events:,} call events built in {time.perf_counter() - t:.1f} s "
          f"({path.stat().st_size / 1e6:.0f} MB)")

    # the command as a user runs it: analysis, report data, files
    t = time.perf_counter()
    report_command(runs=[run], out=folder / "report", formats=None, store=path, method="auto")
    total = time.perf_counter() - t

    # the same work again, phase by phase
    with Store(path, create=False) as store:
        t = time.perf_counter()
        analysis = analyse_run(store, run)
        t_analysis = time.perf_counter() - t
        t = time.perf_counter()
        report = build_report(store, run, analysis=analysis)
        t_build = time.perf_counter() - t
    t = time.perf_counter()
    write_report(report, folder / "report-phases")
    t_render = time.perf_counter() - t
    html = (folder / "report" / "index.html").stat().st_size
    print(f"  analyse_run (attribution, aggregates) {t_analysis:6.2f} s")
    print(f"  build_report (timeline, tables)       {t_build:6.2f} s")
    print(f"  render and write (HTML, JSON, CSV)    {t_render:6.2f} s")
    print(f"fecomlite report: {total:.2f} s   target {TARGET_S:.0f} s   "
          f"ratio {total / TARGET_S:.2f} of the budget")
    print(f"index.html {html / 1e3:.0f} kB; report.json "
          f"{(folder / 'report' / 'report.json').stat().st_size / 1e3:.0f} kB")
    _results.write(args.json, "report_scale", {
        "events": args.events, "report_s": total, "analyse_run_s": t_analysis,
        "build_report_s": t_build, "render_s": t_render, "index_html_bytes": html,
        "report_json_bytes": (folder / "report" / "report.json").stat().st_size})
    if args.keep is None:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
