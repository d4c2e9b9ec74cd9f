"""The live view in real headless Chromium (Debian's /usr/bin/chromium through Playwright) during
a real run: the server with this machine's sensors, a child Python process that grows its memory
in steps and burns CPU through the real probe. The page must load from the server alone, and its
numbers must change as the run goes. A screenshot goes to test-artifacts/."""

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

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
STEP = 30 * 2**20


def _run(client: Any, folder: Path, done: dict[str, Any]) -> None:
    """What `fecomlite run` does for one repetition of two: baseline, gate, the program."""
    run, token = client.create_run("grower.py", ["30MB", "x6"], "method", {"repeat": 2},
                                   manifest={"sites": GROWER_SITES})
    done["run"] = run
    client.idle(run, 0.8)
    client.gate(run, max_wait_s=0.5, window=2, poll_s=0.1)
    client.rep_start(run, 1)
    command = grower_command(folder, STEP, 6, 0.4, probe=True)
    proc = subprocess.Popen(command, env=probe_env(client, run, token, folder / "rep-1.spool"))
    client.watch(run, proc.pid)
    done["code"] = proc.wait()
    client.rep_end(run, 1, done["code"])
    client.finish_run(run, "finished", done["code"])


def _values(page: Page, selector: str) -> list[float]:
    return [float(v) for v in page.eval_on_selector_all(
        selector, "els => els.map(e => e.dataset.v).filter(v => v !== '')")]


def test_the_live_view_follows_a_real_run(tmp_path: Path):
    sensors, process_sensors = real_sensors()
    with serving(tmp_path / "home", sensors, process_sensors=process_sensors) as (server, client), \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
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
        updates0, t0 = int(page.locator("body").get_attribute("data-updates")), time.monotonic()
        while worker.is_alive() and time.monotonic() - t0 < 30:
            stages.add(page.locator("#stage").get_attribute("data-stage"))
            seen_gate.add(page.locator("#gate").get_attribute("data-state"))
            rss += _values(page, "#memory-cards [data-key='proc:rss']")
            power += _values(page, "#power-cards .big")
            if not shot and len(set(rss)) >= 3 and page.locator("#apis-table tbody tr").count():
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "live-view.png"), full_page=True)
                shot = True
            time.sleep(0.25)
        updates1, t1 = int(page.locator("body").get_attribute("data-updates")), time.monotonic()
        worker.join(timeout=10)
        page.wait_for_selector("#stage[data-stage='finished']", timeout=5000)
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
    assert len(set(rss)) >= 3 and max(rss) - min(rss) >= 4 * STEP  # the steps, as they came
    assert len(set(power)) >= 2  # power changed
    assert "grower.grow" in apis and "grower.burn" in apis
    assert call.startswith("grower.")
    assert progress.startswith("1 of 2")
    assert lines >= 2
