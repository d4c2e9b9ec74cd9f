"""Chart labels cut for room in real headless Chromium: a cut label never names another API."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from report_helpers import SITES, build_run

from fecomlite.report.build import build_report
from fecomlite.report.render import write_report
from fecomlite.store import Store

pytestmark = pytest.mark.browser

LONG_NAMES = {  # fixture API -> a long canonical name (as the probe names real callees)
    "matmul_bf16_2048": "torch.nn.functional.scaled_dot_product_attention",
    "matmul_bf16_4096": "keras.losses.SparseCategoricalCrossentropy.__call__",
    "matmul_bf16_8192": "torch.optim.lr_scheduler.CosineAnnealingWarmRestarts.step",
}


def cut_is_honest(shown: str, full: str) -> bool:
    """Whole or `…` + whole trailing components, a component that is still too long losing only
    its middle: never a start of the name, and never a fragment that reads as a name."""
    if shown == full:
        return True
    if not shown.startswith("…"):
        return False
    kept = shown[1:].split(".")
    tail = full.split(".")[-len(kept) :]
    return all(
        k == t or ("…" in k and t.startswith(k.split("…")[0]) and t.endswith(k.split("…")[1]))
        for k, t in zip(kept, tail, strict=True)
    )


def test_cut_labels_keep_the_end_of_the_name(tmp_path: Path) -> None:
    sites = {
        fixture: (key, LONG_NAMES.get(fixture, api), written, source)
        for fixture, (key, api, written, source) in SITES.items()
    }
    with Store(tmp_path / "store.sqlite") as store:
        write_report(build_report(store, build_run(store, sites=sites)), tmp_path, ["html"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 700, "height": 1400})  # little room for labels
        page.goto((tmp_path / "index.html").as_uri())
        page.wait_for_selector("svg text.fc-label")
        labels = page.eval_on_selector_all(
            "svg text.fc-label, svg text.fc-lane-label",
            "els => els.map(e => [e.firstChild.textContent, e.querySelector('title').textContent])",
        )
        browser.close()
    assert {full for _, full in labels} >= set(LONG_NAMES.values())
    assert any(shown != full for shown, full in labels)  # the room was short: labels were cut
    for shown, full in labels:
        assert cut_is_honest(shown, full), (shown, full)
