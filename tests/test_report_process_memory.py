"""Every run's report shows its process memory: a `watch` run (no calls) gets the tree's RSS
timeline and peak in report.json, memory.csv and the HTML."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from fecomlite.report.build import build_report
from fecomlite.report.process_memory import process_memory
from fecomlite.report.render import write_report
from fecomlite.server.client import live_client
from fecomlite.server.watch import watch_command
from fecomlite.store import Store

MB = 1_000_000
S = 1_000_000_000

ALLOCATE = ("import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
            "time.sleep(1.0)")


def _run(store: Store) -> int:
    """Two repetitions of a process whose RSS is read outside them too (baseline, tail, and
    the 0 a process that has exited reads)."""
    run_id = store.create_run(program="p.py", argv=["p.py"], level="process", kind="watch",
                              status="finished", t_start_ns=0, t_end_ns=10 * S)
    rss = store.add_sensor(run_id, name="proc:rss", domain="process-memory", unit="B",
                           kind="gauge", provenance="measured", period_s=0.1)
    readings = {0: 900e6, 1 * S: 100e6, 2 * S: 250e6, 3 * S: 0.0, 5 * S: 120e6, 6 * S: 180e6,
                8 * S: 990e6}
    store.add_samples([(rss, t, v) for t, v in readings.items()])
    store.upsert_repetition(run_id, 1, t_start_ns=1 * S, t_end_ns=3 * S)
    store.upsert_repetition(run_id, 2, t_start_ns=5 * S, t_end_ns=7 * S)
    return run_id


def test_memory_is_read_over_the_repetitions_only(tmp_path: Path):
    with Store(tmp_path / "s.sqlite") as store:
        run_id = _run(store)
        memory = process_memory(store, store.run(run_id), store.repetitions(run_id))
    assert memory is not None
    (rss,) = memory["sensors"]
    assert (rss["first_B"], rss["peak_B"], memory["peak_B"]) == (100e6, 250e6, 250e6)
    assert [(r["rep"], r["peak_B"]) for r in rss["per_rep"]] == [(1, 250e6), (2, 180e6)]
    assert rss["timeline"]["t_s"] == [1.0, 2.0, 5.0, 6.0]  # no baseline, tail, nor exited 0


def test_a_run_without_memory_readings_has_no_memory_section(tmp_path: Path):
    with Store(tmp_path / "s.sqlite") as store:
        run_id = store.create_run(program="p.py", argv=[], level="process", kind="watch",
                                  status="finished", t_start_ns=0, t_end_ns=S)
        store.upsert_repetition(run_id, 1, t_start_ns=0, t_end_ns=S)
        assert process_memory(store, store.run(run_id), store.repetitions(run_id)) is None


def test_watch_of_a_300_mb_allocation_reports_its_peak(tmp_path: Path):
    app = typer.Typer()
    app.command()(watch_command)
    home = tmp_path / "home"
    try:
        result = CliRunner().invoke(app, ["--home", str(home), "--no-live", "--",
                                          sys.executable, "-c", ALLOCATE])
    finally:
        server = live_client(home.resolve())
        if server is not None:
            server.shutdown()
    assert result.exit_code == 0, result.output
    with Store(home / "store.sqlite", create=False) as store:
        (run,) = store.runs()
        written = write_report(build_report(store, run["id"]), tmp_path / "report")
    files = {p.name: p for p in written}
    memory = json.loads(files["report.json"].read_text())["process_memory"]
    assert memory["peak_B"] >= 300 * MB
    with files["memory.csv"].open() as f:
        rows = [r for r in csv.DictReader(f) if r["sensor"] == "proc:rss"]
    assert max(float(r["bytes"]) for r in rows) >= 300 * MB
    html = files["index.html"].read_text()
    shown = html.split('data-figure="memory:peak">', 1)[1].split("<", 1)[0]
    number, unit = shown.split()
    assert unit == "MB" and float(number) >= 300
