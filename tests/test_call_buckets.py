"""Bounded storage (`fecomlite run --keep`): calls past the detail window folded into per-site
buckets agree with the same run kept call by call within the buckets' resolution; the store does
not grow with the calls past the window; a run still recording is folded as it goes and can be
reported meanwhile."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_cli
from test_server_support import FakeSensorForTests, encode_batch, serving

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.export.perfetto import trace
from fecomlite.runner.settings import SettingsError, resolve
from fecomlite.server.folding import Folder, KeepError, parse_keep
from fecomlite.server.monitor import RunView
from fecomlite.store import Store

S = 1_000_000_000
SITES = {"t.py:1:0": "torch.nn.Module.__call__", "t.py:2:0": "torch.nn.functional.linear",
         "t.py:3:0": "torch.relu", "t.py:4:0": "torch.Tensor.backward",
         "t.py:5:0": "torch.from_numpy"}
T0 = 10 * S


def _steps(seconds: float, middle_per_s: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """A training's calls: a step of a forward (two nested calls) and a backward on thread 1, a
    loader call on thread 2; 10 steps a second in the first and last 20 s, `middle_per_s`
    between. (site, tid, start, end)"""
    rows = []
    t = T0
    while t < T0 + seconds * S:
        middle = T0 + 20 * S <= t < T0 + (seconds - 20) * S
        step = S // (middle_per_s if middle else 10)
        f = rng.uniform(0.6, 1.0)
        half = t + int(step * 0.5 * f)
        rows += [(0, 1, t, half), (1, 1, t + step // 1000, t + int(step * 0.2 * f)),
                 (2, 1, t + int(step * 0.25 * f), t + int(step * 0.3 * f)),
                 (3, 1, half + step // 1000, t + int(step * 0.9 * f)),
                 (4, 2, t + step // 100, t + step // 100 + int(rng.uniform(0.01, 0.3) * step))]
        t += step
    return rows


def _store(path: Path, seconds: float = 120, middle_per_s: int = 10,
           outer: bool = False) -> tuple[Store, int]:
    """A generated run (`_steps`; with `outer`, one call around all of them), sent as the probe
    sends it: 0.2 s batches of calls by end; a 10 Hz power sensor that varies in time."""
    rng = np.random.default_rng(7)
    store = Store(path)
    run = store.create_run(program="t.py", idle={"est:cpu-package": 20.0})
    ids = store.site_ids(run, SITES, {k: {"api": v} for k, v in SITES.items()})
    site_ids = [ids[k] for k in SITES]
    sensor = store.add_sensor(run, name="est:cpu-package", domain="cpu-package", unit="W",
                              kind="power", period_s=0.1, provenance="estimated",
                              model="cpu-util-linear")
    end = T0 + int(seconds * S) + 2 * S
    store.add_samples([(sensor, t, 30.0 + 10 * np.sin(t / 7e9) + 3 * rng.random())
                       for t in range(5 * S, end, S // 10)])
    rows = _steps(seconds, middle_per_s, rng)
    if outer:
        rows.append((0, 1, T0 - S // 1000, T0 + int(seconds * S)))
    ev = np.array(rows, np.int64)
    ev = ev[np.argsort(ev[:, 3], kind="stable")]
    store.upsert_repetition(run, 1, t_start_ns=T0 - S // 10, t_end_ns=int(ev[:, 3].max()) + 1,
                            tail_end_ns=int(ev[:, 3].max()) + S, exit_code=0)
    cuts = np.searchsorted(ev[:, 3], np.arange(T0, end + S // 5, S // 5))
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        if b > a:
            c = ev[a:b]
            store.add_events(run, 1, 7, {
                "site_id": np.array(site_ids)[c[:, 0]], "tid": c[:, 1], "t_start_ns": c[:, 2],
                "t_end_ns": c[:, 3], "status": np.zeros(b - a, np.int64),
                "in_bytes": np.full(b - a, -1), "out_bytes": np.full(b - a, -1)})
    return store, run


def _folded_copy(store: Store, run: int, tmp_path: Path, keep: str) -> Store:
    store.checkpoint()
    shutil.copy(store.path, tmp_path / "kept.sqlite")
    kept = Store(tmp_path / "kept.sqlite")
    Folder(parse_keep(keep), lambda: Store(kept.path)).finish(run)
    return kept


def _by_key(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in rows}


@pytest.mark.parametrize("outer", [False, True])
def test_a_bounded_run_agrees_with_full_detail_within_the_buckets_resolution(tmp_path, outer):
    """120 s of steps, the first and last 20 s kept in detail, 10 s buckets between: counts,
    times and the run's figures are the same; each site's energy within 4 % (the buckets spread
    a call's energy over 10 s of readings); with a call around all the others (a `fit`) kept
    in detail, its self energy leaves the folded calls out as in detail."""
    store, run = _store(tmp_path / "full.sqlite", outer=outer)
    full = analyse_run(store, run, "overlap", compare_levels=False, stream_above=0)
    kept = _folded_copy(store, run, tmp_path, "20s/10s")
    assert kept.folded_calls(run) > 0.5 * sum(r["calls"] for r in full.sites)
    got = analyse_run(kept, run, "overlap", compare_levels=False)
    assert any("bounded storage" in n and "10 s" in n for n in got.notes)
    for mine, theirs in zip(got.domains, full.domains, strict=True):
        assert mine["above_idle_J"] == pytest.approx(theirs["above_idle_J"], rel=1e-9)
        assert mine["in_calls_J"] == pytest.approx(theirs["in_calls_J"], rel=0.01)
    full_sites, got_sites = _by_key(full.sites, "key"), _by_key(got.sites, "key")
    assert full_sites.keys() == got_sites.keys()
    for key, theirs in full_sites.items():
        mine = got_sites[key]
        assert (mine["calls"], mine["raised"]) == (theirs["calls"], theirs["raised"])
        assert mine["total_time_s"] == pytest.approx(theirs["total_time_s"], rel=1e-9)
        assert 0 < mine["bucketed_calls"] < mine["calls"] and mine["bucket_s"] == 10.0
        e, f = mine["energy"]["cpu-package"], theirs["energy"]["cpu-package"]
        for figure in ("above_idle_J", "self_J", "total_J"):
            assert e[figure] == pytest.approx(f[figure], rel=0.04), (key, figure)
        assert e["per_call"]["stdev"] == pytest.approx(f["per_call"]["stdev"], rel=0.25), key
    store.close()
    kept.close()


def test_a_bounded_runs_medians_and_timeline_are_its_detail_windows(tmp_path):
    """The calls kept in detail get the whole-run analysis of their own: each per-call median is
    the median of the same calls' energies in the full-detail run (the power varies in time, so
    it is the window's median, not the run's), `median_calls` says how many, and their columns
    (timeline, layer contexts) are there while `calls` stays empty (a streamed run)."""
    store, run = _store(tmp_path / "full.sqlite")
    full = analyse_run(store, run, "overlap", compare_levels=False, stream_above=10**9)
    kept = _folded_copy(store, run, tmp_path, "20s/10s")
    got = analyse_run(kept, run, "overlap", compare_levels=False)
    detail = got.call_columns()
    assert got.calls["call"].size == 0 and detail is got.detail_calls
    assert any("are those of the 2,010 calls kept in detail" in n for n in got.notes)
    where = {k: i for i, k in enumerate(zip(full.calls["site_id"].tolist(),
                                            full.calls["t_start_ns"].tolist(), strict=True))}
    same = np.array([where[k] for k in zip(detail["site_id"].tolist(),
                                           detail["t_start_ns"].tolist(), strict=True)])
    energy = full.calls["energy_J"]["cpu-package"][same]
    for row in got.sites:
        mine = detail["site"] == got.site_keys.index(row["key"])
        assert row["median_calls"] == int(mine.sum()) < row["calls"]
        assert row["energy"]["cpu-package"]["per_call"]["median"] == pytest.approx(
            float(np.median(energy[mine])), rel=1e-9)
    store.close()
    kept.close()


def test_storage_does_not_grow_with_the_calls_past_the_window(tmp_path):
    """The same 120 s with 4× the steps between the detail windows: the same bucket rows and
    the same detailed events, so the same bytes, though 4× the calls were folded."""
    sizes = []
    for dense in (10, 40):
        store, run = _store(tmp_path / f"full{dense}.sqlite", middle_per_s=dense)
        kept = _folded_copy(store, run, tmp_path / "", "20s/10s")
        db = kept.db
        rows = db.execute("SELECT count(*) FROM call_buckets").fetchone()[0]
        chunk_bytes = db.execute("SELECT sum(length(data)) FROM event_chunks").fetchone()[0]
        sizes.append((kept.folded_calls(run), kept.event_count(run), rows, chunk_bytes))
        store.close()
        kept.close()
        (tmp_path / "kept.sqlite").unlink()
    (few, detailed_few, rows_few, bytes_few), (many, detailed_many, rows_many, bytes_many) = sizes
    assert many > 3.5 * few
    assert rows_many == rows_few
    edge_chunks = 2 * 40 * 5 // 5  # a 0.2 s chunk of the dense steps at each window's edge
    assert abs(detailed_many - detailed_few) <= edge_chunks
    assert bytes_many < 1.1 * bytes_few


def test_keep_values_are_read_or_refused_in_one_line():
    assert parse_keep("10m").window_s == 600 and parse_keep("10m").bucket_s == 60
    assert (parse_keep("2h/30s").window_s, parse_keep("2h/30s").bucket_s) == (7200, 30)
    assert parse_keep(90).text() == "90s/1m"
    for bad in ("ten minutes", "10m/0.5s", "30s/1m", "-5m", ""):
        with pytest.raises(KeepError):
            parse_keep(bad)
    assert resolve({"keep": "600"}, {}).keep == "10m/1m"  # the config key, stored normalised
    with pytest.raises(SettingsError, match="keep"):
        resolve({}, {"keep": "1x"})


def test_the_server_folds_as_the_run_goes_and_a_running_run_reports(tmp_path):
    """Batches of a run with `keep` 20s/5s, 90 s of calls posted: before the run ends the calls
    between its first 20 s and its latest 20 s are in buckets; its report meanwhile is marked
    partial and bucketed; at the end, the last 20 s are left in detail."""
    from fecomlite.report.build import build_report
    from fecomlite.report.render import write_report

    sensors = [FakeSensorForTests("fake:package", value=lambda _: 30.0)]
    site = {"t.py:1:0": {"api": "pkg.alpha", "written": "alpha", "file": "t.py", "line": 1}}
    with serving(tmp_path / "home", sensors) as (server, client):
        run, token = client.create_run("t.py", [], "method", {"keep": "20s/5s"},
                                       manifest={"sites": site})
        for second in range(90):
            t = T0 + second * S
            calls = [("t.py:1:0", t + k * S // 10, t + k * S // 10 + S // 20, 1, 0, -1, -1)
                     for k in range(10)]
            assert client.post_batch(run, token, encode_batch(1, 9, calls)) == 10
        worker = server.service._runs[run].folder.worker  # it folds on a thread of its own
        worker.join(timeout=60)
        store = Store(server.service.store_path, readonly=True)
        folded = store.folded_calls(run)
        assert 400 <= folded <= 500  # ~50 s of 10 calls between 20 s and the latest 20 s
        assert store.event_count(run) + folded == 900
        report = build_report(store, run)
        assert report.context["header"]["partial"] and report.context["header"]["keep"]
        (row,) = report.analysis.sites
        assert row["calls"] == 900 and row["bucketed_calls"] == folded
        assert "calls kept in detail only" in trace(store, run)["otherData"]["folded_calls"]
        late = RunView(store, run)  # a live viewer who comes now counts the folded calls too
        late.update(store, time.monotonic_ns(), {}, [])
        assert late.total_calls == 900
        written = write_report(report, tmp_path / "out", ("html", "json", "csv"))
        html = next(p for p in written if p.name == "index.html").read_text()
        assert "bounded storage: 20s/5s" in html and "from buckets" in html
        client.finish_run(run, "finished", 0)
        assert store.folded_calls(run) + store.event_count(run) == 900
        assert store.event_count(run) == pytest.approx(400, abs=30)  # first and last 20 s
        store.close()


def test_a_store_from_before_keep_is_read_and_gets_the_table_from_a_writer(tmp_path):
    """A schema-3 store written before `--keep` has no `call_buckets` table: a reader finds no
    folded call, a writer opening it adds the table (then folding works)."""
    store, run = _store(tmp_path / "old.sqlite", seconds=60)
    store.db.execute("DROP TABLE call_buckets")
    store.close()
    with Store(tmp_path / "old.sqlite", readonly=True) as reader:
        assert reader.folded_calls(run) == 0 and reader.call_buckets(run) is None
    with Store(tmp_path / "old.sqlite") as writer:
        Folder(parse_keep("20s/10s"), lambda: Store(writer.path)).finish(run)
        assert writer.folded_calls(run) > 0


def test_fecomlite_run_keep_folds_a_real_program_and_its_summary_says_so(home, tmp_path):
    """`fecomlite run --keep 1s/1s` on a 3 s numpy loop: every call is counted, those past the
    first and the last second are in buckets, and the summary marks them."""
    script = tmp_path / "loop.py"
    script.write_text("import time\nimport numpy as np\n\na = np.ones((32, 32))\n"
                      "for _ in range(600):\n    np.matmul(a, a)\n    time.sleep(0.005)\n")
    result = run_cli(tmp_path, "run", "--home", str(home), "--api", "numpy", "--repeat", "1",
                     "--idle", "0.5", "--tail", "0.3", "--no-gate", "--keep", "1s/1s",
                     str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "600 ~" in result.stdout and "~ : some of the API's calls" in result.stdout
    with Store(home / "store.sqlite", readonly=True) as store:
        run = max(r["id"] for r in store.runs())
        assert store.run(run)["settings"]["keep"] == "1s/1s"
        assert 0 < store.folded_calls(run) < 600
        assert store.folded_calls(run) + store.event_count(run) == 601  # and np.ones
