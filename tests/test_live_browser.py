"""The live view in real headless Chromium (Debian's /usr/bin/chromium through Playwright) on a
1280-px screen during a real run: the server with this machine's sensors, a child Python process
that grows its memory in steps and burns CPU for a second at a time through the real probe. The
page must load from the server alone, its numbers must change as the run goes, the call in
progress must show while it runs, nothing may overflow sideways, and every figure shown must be
the one the stream sent (the analysis' model, computed by the server). A screenshot goes to
test-artifacts/."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright
from test_live_support import (
    GROWER_SITES,
    grower_command,
    probe_env,
    real_sensors,
)
from test_server_support import serving

from fecomlite.analysis.run_analysis import domain_role

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
STEP = 30 * 2**20
STEPS, PAUSE_S = 4, 1.0
# a long canonical name, as deep framework paths are: it must wrap, not widen the page
LONG_API = "grower.instrumented.module.path.that.goes.on.and.on.GrowingBufferFactory.burn"
SITES = {**GROWER_SITES, "grower.py:21:8": {**GROWER_SITES["grower.py:21:8"], "api": LONG_API}}
# What the page was sent: the stream's latest message, kept beside the page's own listener
# (added first, so when the page has drawn a message this holds that message).
KEEP_MESSAGES = """
  (() => {
    const Original = window.EventSource;
    window.EventSource = function (url, options) {
      const source = new Original(url, options);
      source.addEventListener("update", (e) => { window.__lastMessage = e.data; });
      return source;
    };
  })();
"""
# The figures on the page and the message they came from, read in one go (between messages).
SHOWN = """() => ({
  message: JSON.parse(window.__lastMessage),
  rows: [...document.querySelectorAll("#apis-table tbody tr")].map((tr) => ({
    api: tr.dataset.api,
    cells: Object.fromEntries([...tr.querySelectorAll("td[data-domain]")]
      .map((td) => [td.dataset.domain, td.dataset.v])),
  })),
  heads: [...document.querySelectorAll("#apis-head th[data-domain]")]
    .map((th) => th.dataset.domain),
  cards: Object.fromEntries([...document.querySelectorAll("#figure-cards [data-key]")]
    .map((e) => [e.dataset.key, e.dataset.v === undefined ? e.textContent : e.dataset.v])),
  roles: Object.fromEntries([...document.querySelectorAll("#figure-cards .domain")]
    .map((c) => [c.dataset.domain, (c.querySelector(".role") || {}).dataset?.role])),
  unreliable: [...document.querySelectorAll("#figure-cards .domain")]
    .filter((c) => c.querySelector(".name .badge.bad")).map((c) => c.dataset.domain),
  overflow: [document.documentElement, ...document.querySelectorAll(".table-wrap, .card")]
    .filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.id || e.className),
})"""


def _run(client: Any, folder: Path, done: dict[str, Any]) -> None:
    """What `fecomlite run` does for one repetition of two: baseline, gate, the program."""
    run, token = client.create_run("grower.py", ["30MB", "x4"], "method", {"repeat": 2},
                                   manifest={"sites": SITES})
    done["run"] = run
    client.idle(run, 0.8)
    client.gate(run, max_wait_s=0.5, window=2, poll_s=0.1)
    client.rep_start(run, 1)
    command = grower_command(folder, STEP, STEPS, PAUSE_S, probe=True)
    proc = subprocess.Popen(command, env=probe_env(client, run, token, folder / "rep-1.spool"))
    client.watch(run, proc.pid)
    done["code"] = proc.wait()
    client.rep_end(run, 1, done["code"])
    client.finish_run(run, "finished", done["code"])


def _values(page: Page, selector: str) -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(
        selector, "els => els.map(e => e.dataset.v).filter(v => v !== '')")]


def _same_figures(shown: dict[str, Any]) -> int:
    """Every figure on the page is the one in the message it came from; how many were
    compared."""
    m = shown["message"]
    compared = 0
    top = {a["api"]: a for a in m["calls"]["top"]}
    for row in shown["rows"]:
        sent = top[row["api"]]
        for domain, value in row["cells"].items():
            expected = (sent["all_domains"]["above_idle_J"] if domain == "all"
                        else sent["energy"].get(domain))
            assert (float(value) if value else None) == expected, (row["api"], domain)
            compared += 1
    for d in m["figures"]["domains"]:
        for key in ("program_J", "in_calls_J", "outside_calls_J", "tail_J", "other_J"):
            if key in d:
                assert float(shown["cards"][f"{d['domain']}:{key}"]) == d[key]
                compared += 1
        if "in_calls_text" in d:
            assert shown["cards"][f"{d['domain']}:in_calls_text"] == d["in_calls_text"]
        assert shown["roles"][d["domain"]] == domain_role(d["domain"])["role"]
    every = m["figures"]["all_domains"]
    assert shown["unreliable"] == [d["domain"] for d in m["figures"]["domains"]
                                   if not d["reliable"]] + (  # a busy machine is named
        ["all"] if len(every["domains"]) > 1 and not every["reliable"] else [])
    if len(every["domains"]) > 1:
        assert float(shown["cards"]["all:program_J"]) == every["program_J"]
        assert "all" in shown["heads"]
    assert every["domains"] == sorted(d["domain"] for d in m["figures"]["domains"]
                                      if domain_role(d["domain"])["addable"] and "program_J" in d)
    return compared


def test_the_live_view_follows_a_real_run(tmp_path: Path):
    sensors, process_sensors = real_sensors()
    with serving(tmp_path / "home", sensors, process_sensors=process_sensors) as (server, client), \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.add_init_script(KEEP_MESSAGES)
        errors: list[str] = []
        requests: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(f"{server.url}/?token={server.view_token}")  # as `fecomlite run` prints it
        page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        assert page.locator("#stage").get_attribute("data-stage") == "waiting"

        done: dict[str, Any] = {}
        worker = threading.Thread(target=_run, args=(client, tmp_path, done), daemon=True)
        worker.start()
        stages, rss, power, seen_gate, shot = set(), [], [], set(), False
        in_progress: dict[str, list[float]] = {}
        overflow: set[str] = set()
        compared = 0
        updates0, t0 = int(page.locator("body").get_attribute("data-updates")), time.monotonic()
        while worker.is_alive() and time.monotonic() - t0 < 40:
            stages.add(page.locator("#stage").get_attribute("data-stage"))
            seen_gate.add(page.locator("#gate").get_attribute("data-state"))
            rss += _values(page, "#memory-cards [data-key='proc:rss']")
            power += _values(page, "#power-cards .big")
            for item in page.eval_on_selector_all(
                    "#in-progress li", "els => els.map(e => [e.querySelector('.api')"
                    ".textContent, e.querySelector('.elapsed').dataset.v])"):
                in_progress.setdefault(item[0], []).append(float(item[1]))
            shown = page.evaluate(SHOWN)
            overflow.update(shown["overflow"])
            compared += _same_figures(shown)
            if not shot and len(set(rss)) >= 3 and page.locator("#apis-table tbody tr").count() \
                    and page.locator("#in-progress li").count():
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "live-view.png"), full_page=True)
                shot = True
            time.sleep(0.25)
        updates1, t1 = int(page.locator("body").get_attribute("data-updates")), time.monotonic()
        worker.join(timeout=10)
        page.wait_for_selector("#stage[data-stage='finished']", timeout=5000)
        page.wait_for_timeout(3000)  # the last steps settle (SETTLE_S)
        compared += _same_figures(page.evaluate(SHOWN))
        overflow.update(page.evaluate(SHOWN)["overflow"])
        apis = page.locator("#apis-table").inner_text()
        call = page.locator("#call").inner_text()
        progress = page.locator("#progress-text").inner_text()
        lines = page.locator("#timeline path.fc-line").count()
        browser.close()

    assert done.get("code") == 0
    assert errors == []
    assert all(url.startswith(server.url + "/") for url in requests), requests
    assert (updates1 - updates0) / (t1 - t0) >= 2.0  # pushed at least twice a second
    assert {"idle", "run"} <= stages
    assert seen_gate & {"passed", "failed"}  # the gate's verdict was shown
    assert len(set(rss)) >= 3 and max(rss) - min(rss) >= (STEPS - 1) * STEP  # steps, as they came
    assert len(set(power)) >= 2  # power changed
    assert "grower.grow" in apis and LONG_API in apis
    assert call.startswith("grower.")
    assert progress.startswith("1 of 2")
    assert lines >= 2
    # the one-second burns were shown while they ran, with how long they had run
    burning = in_progress.get(LONG_API, [])
    assert len(burning) >= 2 and max(burning) >= 0.5, in_progress
    assert overflow == set()  # nothing wider than a 1280-px screen
    assert compared >= 20
