"""Bytes per call with and without `--keep` (bounded storage), side by side on the same
generated training, and what the report of each costs.

The run is `long_training.py`'s (50 sites, steps of 45 nested calls and 5 loader calls, ~20 k
calls/s, 10 Hz power, 200 Hz RSS), stored as the server stores it: each 0.2 s batch through
`Store.add_batch`; with `--keep` each stored batch then goes to the server's `Folder` as
`MeasurementService.post_events` hands it over (folding as the run goes; the build waits for
each fold, as a run in real time leaves it the 0.2 s between batches), and the run's end folds
the rest (`Folder.finish`). Printed per size: the store file's bytes per call (after a WAL
checkpoint; pages freed by folding are reused, never returned; the sensors' samples are most of
it once calls are folded), the calls' bytes per call (event chunks and buckets, with their
indexes: SQLite's dbstat), the calls left in detail, and `fecomlite report`'s seconds.

    python benchmarks/keep_storage.py [--sizes 1000000 4000000] [--keep 5s/1s] [--report]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from long_training import T0, _samples, _sensors, batches, measured, table_bytes  # noqa: E402

from fecomlite.runtime import batch_codec  # noqa: E402
from fecomlite.server.folding import Folder, parse_keep  # noqa: E402
from fecomlite.store import Store  # noqa: E402


def build(path: Path, n_calls: int, keep: str | None) -> tuple[int, int, float]:
    """(run id, calls stored, seconds of the run) in a store at `path`."""
    rng = np.random.default_rng(3)
    store = Store(path)
    manifest = {f"train.py:{10 + s}:8": {"file": "train.py", "line": 10 + s, "col": 8,
                                         "api": f"torch.api_{s:02d}", "written": f"api_{s:02d}",
                                         "function": "step"} for s in range(50)}
    settings = {"repeat": 1, **({"keep": keep} if keep else {})}
    run = store.create_run(program="train.py", status="running", settings=settings,
                           idle={"est:cpu-package": 20.0, "est:dram": 3.0}, manifest=manifest)
    ids = _sensors(store, run)
    folder = Folder(parse_keep(keep), lambda: Store(path)) if keep else None
    stored, last = 0, T0
    for body, _, b in batches(n_calls):
        header, columns = batch_codec.decode(body, require_id=True)
        stored += store.add_batch(run, header, columns, manifest)
        if folder is not None:
            folder.after_batch(run, 1, columns["t_start_ns"], columns["t_end_ns"])
            if folder.worker is not None:  # a real run's 0.2 s between batches: time to fold
                folder.worker.join()
        store.add_samples(_samples(ids, last, b, rng))
        last = b
    if folder is not None:
        folder.finish(run)
    store.upsert_repetition(run, 1, t_start_ns=T0 - 500_000_000, t_end_ns=last,
                            tail_end_ns=last, exit_code=0)
    store.update_run(run, status="finished", exit_code=0, t_start_ns=T0 - 10**9, t_end_ns=last)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return run, stored, (last - T0) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--keep", default="5s/1s")
    parser.add_argument("--report", action="store_true", help="also time `fecomlite report`")
    args = parser.parse_args()
    print(f"{'calls':>10} {'run s':>7} {'store':<13} {'file B/call':>11} {'calls B/call':>12} "
          f"{'chunks B':>11} {'buckets B':>10} {'free B':>10} {'in detail':>10} "
          f"{'report s':>9} {'peak RSS':>9}")
    for n in args.sizes:
        for keep in (None, args.keep):
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "store.sqlite"
                t = time.perf_counter()
                run, calls, seconds = build(path, n, keep)
                build_s = time.perf_counter() - t
                tables = table_bytes(path)
                with Store(path) as store:
                    detail = store.event_count(run)
                    free = (store.db.execute("PRAGMA freelist_count").fetchone()[0]
                            * store.db.execute("PRAGMA page_size").fetchone()[0])
                report_s, rss = (measured([sys.executable, "-m", "fecomlite.cli", "report",
                                           str(run), "--store", str(path), "-o",
                                           str(Path(folder) / "out"), "-f", "json"])
                                 if args.report else (float("nan"), 0))
                buckets = sum(v for k, v in tables.items() if "call_buckets" in k)
                chunks = sum(v for k, v in tables.items() if "event_chunks" in k)
                label = f"--keep {keep}" if keep else "every call"
                print(f"{calls:>10,} {seconds:>7.1f} {label:<13} "
                      f"{path.stat().st_size / calls:>11.2f} {(chunks + buckets) / calls:>12.2f} "
                      f"{chunks:>11,} {buckets:>10,} {free:>10,} "
                      f"{detail:>10,} {report_s:>9.1f} {rss / 2**20:>8.0f}M   (built in "
                      f"{build_s:.0f} s)")


if __name__ == "__main__":
    main()
