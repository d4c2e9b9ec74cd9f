"""The live view's whole-run chart (fecomlite/server/overview.py): an hour of 0.5 s bins folded
into a bounded number of buckets that keep the energy and the peaks, sent to a viewer
incrementally (only what it lacks), all again only when the bucket width doubled."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fecomlite.server import overview as ov
from fecomlite.server.monitor import BIN_NS, Track

HOUR_BINS = 7200  # an hour of 0.5 s bins


def _seq() -> int:
    return 0


def _power_track(origin: int) -> Track:
    track = Track("est:cpu-package", "cpu-package", "W", "power", "estimated", "cpu-util-linear")
    track.follow(origin)
    return track


def test_an_hour_of_power_keeps_its_energy_in_a_bounded_number_of_buckets():
    origin = 40 * BIN_NS
    track = _power_track(origin)
    rng = np.random.default_rng(5)
    watts = rng.uniform(10.0, 60.0, HOUR_BINS)
    watts[4321] = 400.0  # one spike
    for k, w in enumerate(watts):  # a read every 0.1 s, each w for the 0.1 s before it
        for j in range(5):
            track.add(origin + k * BIN_NS + j * 100_000_000, float(w), _seq)
    track.add(origin + HOUR_BINS * BIN_NS, 0.0, _seq)  # closes the last bin, adds nothing
    view = track.overview
    assert view is not None
    assert len(view.closed) <= ov.MAX_BUCKETS
    assert view.width_ns >= HOUR_BINS * BIN_NS / ov.MAX_BUCKETS
    energy = sum(b.a for b in view.closed) + (view.filling.a if view.filling else 0.0)
    assert energy == pytest.approx(track.energy_J, rel=1e-9)  # what the counter added
    points = [view.point(b) for b in view.closed]
    assert [p[0] for p in points] == sorted(p[0] for p in points)
    width_s = view.width_ns / 1e9
    # the area under the chart is the energy: mean power × width per bucket (but the first,
    # whose first read had no read before it to span)
    assert sum(v * width_s for _, v, _ in points[1:]) == pytest.approx(
        sum(b.a for b in view.closed[1:]), rel=1e-9)
    # the spike's bucket stands out: its mean holds the spike's energy
    spike_t = 4321 * 0.5
    spike = next(v for t, v, _ in points if t <= spike_t < t + width_s)
    assert spike > max(v for t, v, _ in points if not t <= spike_t < t + width_s)
    # and its highest 0.5 s step is the spike itself, which the mean flattens
    assert next(top for t, _, top in points if t <= spike_t < t + width_s) == pytest.approx(400.0)
    assert max(top for t, _, top in points if not t <= spike_t < t + width_s) <= 60.0


def test_memory_buckets_keep_the_peak():
    origin = 0
    rss = Track("proc:rss", "process-memory", "B", "gauge", "measured", None)
    rss.follow(origin)
    for k in range(3000):
        rss.add(origin + k * BIN_NS + 1, 1e9 + (5e8 if k == 1234 else 0.0), _seq)
    view = rss.overview
    assert view is not None and view.width_ns > BIN_NS
    peaks = [view.point(b)[1] for b in view.closed]
    assert all(len(view.point(b)) == 2 for b in view.closed)  # a peak needs no second figure
    assert max(peaks) == 1.5e9 and peaks.count(1.5e9) == 1
    assert min(peaks) == 1e9


def test_a_viewer_gets_what_it_lacks_and_everything_again_only_when_the_width_doubles():
    origin = 0
    track = _power_track(origin)
    seen = None
    sent_points = 0
    resets = 0
    largest = 0
    for k in range(HOUR_BINS):
        track.add(origin + k * BIN_NS + 1, 30.0, _seq)
        if k % 3 == 0:  # a refresh every 1.5 s
            view = track.overview
            assert view is not None
            part, seen = view.since(seen)
            resets += part["reset"]
            sent_points += len(part["points"])
            largest = max(largest, len(json.dumps(part)))
    # only log2(7200 / 512) + 1 full sends: the first and one per doubling
    assert resets == 1 + int(np.ceil(np.log2(HOUR_BINS / ov.MAX_BUCKETS)))
    assert sent_points < 2 * ov.MAX_BUCKETS * resets
    assert largest < 40 * ov.MAX_BUCKETS  # a full send, bounded however long the run
    _, again = track.overview.since(seen)
    part, _ = track.overview.since(seen)
    assert part["points"] == [] and not part["reset"] and again == seen


def test_a_run_followed_late_gets_its_chart_from_the_bins_kept():
    track = Track("est:dram", "dram", "W", "power", "estimated", "m")
    for k in range(40):
        track.add(k * 100_000_000, 5.0, _seq)  # 4 s before anyone followed
    track.follow(2 * BIN_NS)  # the run started at 1 s
    view = track.overview
    assert view is not None
    starts = [view.point(b)[0] for b in view.closed] + [view.point(view.filling)[0]]
    assert starts[0] == 0.0 and all(t >= 0 for t in starts)
    assert len(starts) == 5  # the track closed bins 0..6 (7 is open): 2..6 are the run's


# What the page was sent: every message's size and its chart parts, beside the page's listener.
KEEP_SIZES = """
  (() => {
    window.__sent = [];
    const Original = window.EventSource;
    window.EventSource = function (url, options) {
      const source = new Original(url, options);
      source.addEventListener("update", (e) => {
        const m = JSON.parse(e.data);
        window.__sent.push({ bytes: e.data.length, reset: m.reset, overview: m.overview });
      });
      return source;
    };
  })();
"""


@pytest.mark.browser
def test_an_hour_long_run_is_charted_whole_in_bounded_messages(tmp_path):
    """A run that has recorded for an hour (its samples written into the store as the sampler
    writes them): the first message carries its whole chart in at most MAX_BUCKETS points a
    sensor, the next ones only what is new, and Chromium draws it over the whole hour."""
    import time

    from playwright.sync_api import sync_playwright
    from test_live_browser import ARGS, CHROMIUM
    from test_server_support import serving

    from fecomlite.store import Store

    with serving(tmp_path, []) as (server, client):
        run, _ = client.create_run("train.py", [], "method", {"repeat": 1})
        now = time.monotonic_ns()
        start = now - 3600 * 10**9
        with Store(server.service.store_path) as store:
            store.update_run(run, t_start_ns=start)
            power = store.add_sensor(run, name="test:power", domain="cpu-package", unit="W",
                                     kind="power", provenance="measured", period_s=0.1)
            rss = store.add_sensor(run, name="test:rss", domain="process-memory", unit="B",
                                   kind="gauge", provenance="measured", period_s=0.1)
            t = np.arange(start, now, 100_000_000, dtype=np.int64)
            watts = 30.0 + 10.0 * np.sin(np.arange(t.size) / 3000.0)
            store.add_samples([(power, int(a), float(w)) for a, w in zip(t, watts, strict=True)]
                              + [(rss, int(a), 1e9 + a % 7 * 1e6) for a in t.tolist()])
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.add_init_script(KEEP_SIZES)
                page.goto(f"{server.url}/?token={server.view_token}")
                page.wait_for_selector("body[data-ready='1']", timeout=20_000)
                for _ in range(100):  # (wait_for_function would eval, which the page forbids)
                    if page.evaluate("() => window.__sent.length") >= 6:
                        break
                    page.wait_for_timeout(200)
                sent = page.evaluate("() => window.__sent")
                lines = page.locator("#timeline path.fc-line").count()
                ticks = page.locator("#timeline svg text").all_text_contents()
                resolution = page.locator("#chart-resolution").text_content()
                page.click("#chart-range button[data-range='recent']")
                recent = page.locator("#chart-range button[data-range='recent']").get_attribute(
                    "aria-pressed")
                recent_lines = page.locator("#timeline path.fc-line").count()
            finally:
                browser.close()
    first, *rest = sent
    assert first["reset"] and not any(m["reset"] for m in rest)
    chart = first["overview"]["test:power"]
    assert chart["reset"] and len(chart["points"]) <= ov.MAX_BUCKETS
    assert chart["points"][0][0] == 0.0 and chart["points"][-1][0] > 3500  # the whole hour
    assert chart["width_s"] == 8.0  # 0.5 s doubled until 7,200 bins fit in 512 buckets
    assert first["overview"]["test:rss"]["width_s"] == 8.0
    for m in rest:  # nothing of the hour again: at most a bucket closed since
        assert all(not o["reset"] and len(o["points"]) <= 1 for o in m["overview"].values())
        assert m["bytes"] < first["bytes"] / 4
    assert first["bytes"] < 120_000
    assert lines >= 3  # power, its highest steps faint above it, and memory drawn
    minutes = [float(x.split()[0]) for x in ticks if x.endswith(" min")]
    assert minutes and max(minutes) >= 55  # the x axis spans the hour
    assert resolution.startswith("whole run, one point per 8")
    assert recent == "true" and recent_lines >= 2
