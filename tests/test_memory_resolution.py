"""Issue 30 item 7: memory at the sampler's resolution. A call shorter than the RSS sampling
period (or with no RSS sample inside) has no retained figure of its own, so one RSS drop is not
counted twice by two short calls in the same gap; first-use work (imports on a site's first
call) stands beside the typical call's figure, not in it."""

from __future__ import annotations

import numpy as np
from report_helpers import html_tables
from test_store import make_batch

from fecomlite.analysis.run_analysis import analyse_run, below_gauge_resolution
from fecomlite.report.build import build_report
from fecomlite.report.render import render_page
from fecomlite.runtime import batch_codec
from fecomlite.store import Store

MS = 1_000_000
PERIOD = 50 * MS  # the RSS sampler's period in this recording
SITES = ["t.py:1:0", "t.py:2:0", "t.py:3:0", "t.py:4:0"]
MANIFEST = {k: {"api": api, "file": "t.py", "line": i + 1, "col": 0, "kind": "function"}
            for i, (k, api) in enumerate(zip(SITES, (
                "keras.Model.predict", "numpy.ndarray.argmax", "torch.optim.AdamW",
                "torch.optim.AdamW.step"), strict=True))}


def recorded(tmp_path):
    """predict (4 ms) and argmax (1 ms) back to back in one RSS gap that drops 48.6 MB; the
    optimizer built over 200 ms importing 77 MB of modules; three 120 ms steps that keep
    nothing after a first one that allocates 30 MB of state."""
    store = Store(tmp_path / "s.sqlite")
    run = store.create_run(program="t.py", settings={"repeat": 1})
    rss = store.add_sensor(run, name="proc:rss", domain="process-memory", unit="B",
                           kind="gauge", provenance="measured", period_s=PERIOD / 1e9)
    t = np.arange(0, 2000 * MS, PERIOD)
    level = np.full(t.size, 500e6)
    level[t >= 110 * MS] -= 48.6e6  # the drop, between the samples at 100 and 150 ms
    level[t >= 400 * MS] += 77e6  # imports while the optimizer is built (300–500 ms)
    level[t >= 700 * MS] += 30e6  # the first step's state (610–730 ms)
    store.add_samples([(rss, int(a), float(b)) for a, b in zip(t, level, strict=True)])
    rows = [(0, 105 * MS, 109 * MS, 0), (1, 109 * MS, 110 * MS, 0), (2, 300 * MS, 500 * MS, 0),
            (3, 610 * MS, 730 * MS, 0), (3, 810 * MS, 930 * MS, 0), (3, 1010 * MS, 1130 * MS, 0),
            (3, 1210 * MS, 1330 * MS, 0)]
    header, cols = batch_codec.decode(make_batch(SITES, rows))
    store.site_ids(run, SITES, MANIFEST)
    store.add_batch(run, header, cols)
    store.upsert_repetition(run, 2, t_start_ns=0, t_end_ns=1900 * MS)
    return store, run


def test_a_call_shorter_than_the_sampling_period_has_no_memory_figure(tmp_path) -> None:
    store, run = recorded(tmp_path)
    a = analyse_run(store, run)
    apis = {r["api"]: r["memory"] for r in a.apis}
    for short in ("keras.Model.predict", "numpy.ndarray.argmax"):
        assert np.isnan(apis[short]["rss_delta_mean_B"]), apis[short]
        assert apis[short]["rss_below_resolution_share"] == 1.0
    # the drop is nobody's: not counted once per call of the gap
    kept = [m["rss_delta_mean_B"] for m in apis.values() if np.isfinite(m["rss_delta_mean_B"])]
    assert all(k > -1e6 for k in kept), kept
    report = build_report(store, run, analysis=a)
    html = render_page("report.html.j2", report.context, report.charts)
    table = html_tables(html)["apis-table"]
    col = table["columns"].index("rss_delta")
    texts = {row[0]["v"]: row[col]["text"].strip() for row in table["rows"]}
    assert texts["keras.Model.predict"] == "below res."
    # the step's first call is marked: first-use work, beside the typical call's figure
    assert 'first-use" title="the first call kept 30' in html
    store.close()


def test_first_use_stands_beside_the_typical_call(tmp_path) -> None:
    store, run = recorded(tmp_path)
    a = analyse_run(store, run)
    apis = {r["api"]: r["memory"] for r in a.apis}
    step = apis["torch.optim.AdamW.step"]
    assert abs(step["rss_delta_mean_B"]) < 1e6  # the later steps keep nothing
    assert step["rss_first_call_delta_mean_B"] == 30e6  # the first step's state
    built = apis["torch.optim.AdamW"]  # one call: its only figure is its first use
    assert built["rss_first_call_delta_mean_B"] == built["rss_delta_mean_B"] == 77e6
    store.close()


def test_the_resolution_rule() -> None:
    t = np.arange(0, 10) * PERIOD
    t0 = np.array([1 * PERIOD + 1, 2 * PERIOD - 5, 3 * PERIOD])
    t1 = np.array([1 * PERIOD + 5, 4 * PERIOD, 3 * PERIOD + PERIOD // 2])
    assert below_gauge_resolution(t, t0, t1).tolist() == [True, False, True]


def test_the_memory_line_breaks_where_no_process_existed(tmp_path) -> None:
    """Between repetitions (gate waits, pauses) there is no process: the timeline's memory
    series has a gap after each repetition's end, not a line across it."""
    from report_helpers import build_run

    with Store(tmp_path / "s.sqlite") as store:
        run = build_run(store, reps=3)
        a = analyse_run(store, run)
        chart = build_report(store, run, analysis=a).charts["timeline"]
    rss = next(m for m in chart["memory"] if "RSS" in m["label"])
    gaps = [i for i, v in enumerate(rss["v"]) if v is None]
    # one gap right after the last sample before each repetition's end (build_run samples RSS
    # through the tails too, so there is one after the third as well)
    assert len(gaps) == len(a.repetitions) == 3
    for i in gaps:
        assert rss["t"][i] - rss["t"][i - 1] < 1e-6 and rss["v"][i - 1] is not None
