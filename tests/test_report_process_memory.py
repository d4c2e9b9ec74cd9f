"""Every run's report shows its process memory: a `watch` run (no calls) gets the tree's RSS
timeline and peak in report.json, memory.csv and the HTML."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import typer
from typer.testing import CliRunner

from fecomlite.report.build import build_report
from fecomlite.report.process_memory import MAX_POINTS, process_memory
from fecomlite.report.render import write_report
from fecomlite.report.timeline import peak_per_bin
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
    assert rss["timeline"]["rep_starts"] == [2]  # 5.0 s begins repetition 2


def test_the_memory_line_stops_between_repetitions_in_chromium(tmp_path: Path):
    """No process of the program exists between two repetitions (the gate, a baseline): the
    drawn line stops at the first's last reading and starts again at the second's first."""
    from playwright.sync_api import sync_playwright
    from test_live_browser import ARGS, CHROMIUM

    with Store(tmp_path / "s.sqlite") as store:
        run_id = _run(store)
        written = write_report(build_report(store, run_id), tmp_path / "report", ["html"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(written[0].as_uri())
            drawn = page.locator('[data-chart="process-memory"] path.fc-line')
            paths = [drawn.nth(i).get_attribute("d") for i in range(drawn.count())]
        finally:
            browser.close()
    (d,) = paths
    assert d.count("M") == 2 and d.count("L") == 2  # two segments of two readings each


def test_a_long_gauge_is_read_chunk_by_chunk_with_the_figures_of_a_whole_read(tmp_path: Path):
    """3,000 readings over two repetitions, more than the timeline's points: read 7 at a time,
    the peaks per bin (a bin spanning two chunks included), per repetition and overall are
    those of the whole series binned at once."""
    rng = np.random.default_rng(3)
    with Store(tmp_path / "s.sqlite") as store:
        run_id = store.create_run(program="p.py", argv=[], level="process", kind="watch",
                                  status="finished", t_start_ns=0, t_end_ns=40 * S)
        rss = store.add_sensor(run_id, name="proc:rss", domain="process-memory", unit="B",
                               kind="gauge", provenance="measured", period_s=0.01)
        t = np.arange(3000) * (S // 100)
        v = rng.uniform(100e6, 900e6, t.size)
        store.add_samples([(rss, int(a), float(b)) for a, b in zip(t, v, strict=True)])
        store.upsert_repetition(run_id, 1, t_start_ns=1 * S, t_end_ns=12 * S)
        store.upsert_repetition(run_id, 2, t_start_ns=15 * S, t_end_ns=28 * S)
        whole = store.sample_chunks
        store.sample_chunks = lambda *a, **k: whole(*a, **{**k, "chunk": 7})  # type: ignore
        (got,) = process_memory(store, store.run(run_id), store.repetitions(run_id))["sensors"]
    inside = ((t >= 1 * S) & (t <= 12 * S)) | ((t >= 15 * S) & (t <= 28 * S))
    starts, peaks = peak_per_bin(t[inside], v[inside], np.linspace(
        t[inside][0], t[inside][-1] + 1, MAX_POINTS + 1).astype(np.int64))
    assert got["timeline"]["B"] == peaks.tolist() and inside.sum() > MAX_POINTS
    assert got["timeline"]["t_s"] == (starts / 1e9).round(4).tolist()
    assert got["peak_B"] == v[inside].max()
    assert [r["first_B"] for r in got["per_rep"]] == [v[t == 1 * S][0], v[t == 15 * S][0]]


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
