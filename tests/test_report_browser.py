"""The report in real headless Chromium (Debian's /usr/bin/chromium through Playwright, opened
from file:// with no network): it loads cleanly, its tables sort and filter, its charts draw and
answer the mouse, user strings stay text. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from report_helpers import build_run, hostile_sites

from fecomlite.analysis import units
from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.build import build_report
from fecomlite.report.compare import compare_runs
from fecomlite.report.render import write_comparison, write_report
from fecomlite.store import Store

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """index.html of: a run, a run with hostile names, and two runs compared."""
    folder = tmp_path_factory.mktemp("browser")
    out: dict[str, Path] = {}
    with Store(folder / "store.sqlite") as store:
        run = build_run(store)
        write_report(build_report(store, run), folder / "run", ["html", "json"])
        out["run"] = folder / "run" / "index.html"
        evil = build_run(store, sites=hostile_sites(), program="<script>alert(1)</script>.py")
        write_report(build_report(store, evil), folder / "evil", ["html"])
        out["evil"] = folder / "evil" / "index.html"
        slower = build_run(store, energy_scale=1.3)
        write_comparison(compare_runs(analyse_run(store, run), analyse_run(store, slower)),
                         folder / "compare", ["html"])
        out["compare"] = folder / "compare" / "index.html"
    return out


class Opened:
    """A page with every console error, uncaught exception, request and dialog recorded."""

    def __init__(self, browser: Browser, path: Path) -> None:
        self.page: Page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", self._dialog)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=10_000)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()


@pytest.fixture
def opened(browser: Browser, pages: dict[str, Path]) -> Iterator[Any]:
    made: list[Opened] = []

    def open_(name: str) -> Opened:
        made.append(Opened(browser, pages[name]))
        return made[-1]

    yield open_
    for o in made:
        o.page.close()


def _column(page: Page, table: str, col: str) -> list[str]:
    index = page.locator(f"#{table} thead th[data-col='{col}']").get_attribute("data-index")
    return page.eval_on_selector_all(
        f"#{table} tbody tr:not([hidden])",
        f"rows => rows.map(r => r.cells[{index}].dataset.v)")


def test_loads_cleanly_lists_the_apis_and_is_kept_as_a_screenshot(opened: Any) -> None:
    o = opened("run")
    assert o.errors == []
    assert all(url.startswith("file://") for url in o.requests)
    assert sorted(_column(o.page, "apis-table", "api")) == ["torch.Tensor.matmul", "torch.matmul"]
    assert len(_column(o.page, "sites-table", "site")) == 3
    ARTIFACTS.mkdir(exist_ok=True)
    o.page.screenshot(path=str(ARTIFACTS / "report-run.png"), full_page=True)
    assert (ARTIFACTS / "report-run.png").stat().st_size > 50_000


def test_clicking_a_header_sorts(opened: Any) -> None:
    page = opened("run").page
    calls = page.locator("#sites-table thead th[data-col='calls']")
    calls.click()
    first = [int(v) for v in _column(page, "sites-table", "calls")]
    assert first == sorted(first, reverse=True) and calls.get_attribute("aria-sort") == "descending"
    calls.click()
    second = [int(v) for v in _column(page, "sites-table", "calls")]
    assert second == sorted(second) and second != first
    page.locator("#sites-table thead th[data-col='api']").click()  # text: A to Z
    apis = _column(page, "sites-table", "api")
    assert apis == sorted(apis, key=str.lower)


def test_the_filter_hides_rows(opened: Any) -> None:
    page = opened("run").page
    box = page.locator("input[data-filter-for='apis-table']")
    box.fill("tensor")
    assert _column(page, "apis-table", "api") == ["torch.Tensor.matmul"]
    assert page.locator("#apis-table-count").inner_text() == "1 of 2"
    box.fill("th.matmul")  # a written name finds its API
    assert _column(page, "apis-table", "api") == ["torch.matmul"]
    box.fill("")
    assert len(_column(page, "apis-table", "api")) == 2


SIZES = """host => Array.from(host.querySelectorAll(SELECTOR)).map(e => {
    const b = e.getBBox(); return [b.width, b.height]; })"""


def _sizes(page: Page, chart: str, selector: str) -> list[list[float]]:
    return page.eval_on_selector(f"[data-chart='{chart}']",
                                 SIZES.replace("SELECTOR", repr(selector)))


def test_every_chart_draws(opened: Any) -> None:
    page = opened("run").page
    charts = page.eval_on_selector_all("[data-chart]", "hs => hs.map(h => h.dataset.chart)")
    assert {"bars", "timeline", "scatter", "tail-0", "tail-1"} <= set(charts)
    assert page.eval_on_selector_all("[data-chart]", "hs => hs.every(h => h.dataset.drawn)")
    bars = _sizes(page, "bars", "rect.fc-bar")
    outside = page.evaluate("JSON.parse(document.getElementById('fecom-data').textContent)"
                            ".charts.bars.items.filter(i => i.label.startsWith('(program'))"
                            ".map(i => Object.values(i.values).filter(v => v > 0).length)")
    # 2 APIs × 2 domains, and the program outside calls in the domains where it drew energy
    assert len(bars) == 4 + sum(outside) and all(w > 0 and h > 0 for w, h in bars)
    lines = _sizes(page, "timeline", "path.fc-line")
    assert len(lines) == 4 and all(w > 500 for w, _ in lines)  # 2 power + 2 memory series
    spans = _sizes(page, "timeline", "rect.fc-span")
    assert len(spans) >= 20 and all(w >= 1 for w, _ in spans)
    assert len(_sizes(page, "scatter", "circle.fc-dot")) == 4
    for tail in ("tail-0", "tail-1"):
        assert len(_sizes(page, tail, "path.fc-line")) == 2  # one line per repetition


def _tip(page: Page, chart: str) -> str:
    tip = page.locator(f"[data-chart='{chart}'] .fc-tip")
    tip.wait_for(state="visible", timeout=2000)
    return tip.inner_text()


def test_hover_shows_values(opened: Any) -> None:
    page = opened("run").page
    page.locator("[data-chart='bars'] rect.fc-bar").first.hover()
    text = _tip(page, "bars")
    assert "matmul" in text and "GPU 0 (measured): " in text and " kJ" in text
    svg = page.locator("[data-chart='timeline'] svg")
    svg.scroll_into_view_if_needed()
    box = svg.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + 100)
    text = _tip(page, "timeline")
    assert text.startswith("t = ") and "GPU 0 (measured): " in text and " W" in text
    assert "process RSS (measured, proc:rss): " in text and " MB" in text
    page.locator("[data-chart='scatter'] circle.fc-dot").first.hover()
    assert "energy per call above idle: " in _tip(page, "scatter")


def test_timeline_zooms_by_drag_and_wheel_and_resets(opened: Any) -> None:
    page = opened("run").page
    host = page.locator("[data-chart='timeline']")
    host.scroll_into_view_if_needed()
    box = host.locator("svg").bounding_box()
    assert box is not None
    y = box["y"] + 100

    def ticks() -> list[str]:
        return host.locator("svg text.fc-tick").all_inner_texts()

    before = ticks()
    page.mouse.move(box["x"] + 300, y)
    page.mouse.down()
    page.mouse.move(box["x"] + 500, y, steps=5)
    page.mouse.up()
    lo, hi = (float(v) for v in host.get_attribute("data-view").split(","))
    assert 0 < hi - lo < 10  # of a 35 s run
    assert ticks() != before
    page.mouse.move(box["x"] + 400, y)
    page.mouse.wheel(0, -300)
    lo2, hi2 = (float(v) for v in host.get_attribute("data-view").split(","))
    assert hi2 - lo2 < hi - lo
    host.locator("button.fc-reset").click()
    lo3, hi3 = (float(v) for v in host.get_attribute("data-view").split(","))
    assert hi3 - lo3 > 30 and ticks() == before


def test_hostile_names_render_as_text(opened: Any) -> None:
    o = opened("evil")
    page = o.page
    for bar in page.locator("[data-chart='bars'] rect.fc-bar").all():
        bar.hover()
    page.locator("input[data-filter-for='sites-table']").fill("script")
    assert o.dialogs == [] and o.errors == []
    assert page.locator("h1").inner_text() == "<script>alert(1)</script>.py"
    apis = page.locator("#apis-table").inner_text()
    assert "torch.<script>alert(1)</script>" in apis and "torch.Tensor.</script>matmul" in apis
    assert "<img src=x onerror=alert(3)>" in apis
    sources = page.locator("#sites-table").text_content() or ""  # a column hidden at first
    assert "y = f('<script>alert(1)</script>') # </script>" in sources
    labels = page.locator("[data-chart='bars'] text.fc-label").all_text_contents()
    assert any("<script>" in t or "</script>" in t for t in labels)
    assert page.locator("img").count() == 0 and page.locator("b", has_text="bold").count() == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-escaping.png"), full_page=True)


def test_comparison_page(opened: Any) -> None:
    o = opened("compare")
    page = o.page
    assert o.errors == []
    assert sorted(_column(page, "compare-table", "api")) == ["torch.Tensor.matmul", "torch.matmul"]
    assert _column(page, "compare-table", "gpu:0:rep_verdict") == ["higher", "higher"]
    assert "higher" in page.locator("#domains").inner_text()
    assert len(_sizes(page, "bars", "rect.fc-bar")) == 8  # 2 APIs × 2 domains × runs A and B
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-compare.png"), full_page=True)


def test_chart_numbers_read_like_the_tables(opened: Any) -> None:
    page = opened("run").page
    cases = [(0.0123, "J"), (1234.5, "J"), (0.9996, "J"), (9.996, "J"), (0.06, "W"),
             (0.0016, "s"), (300.0, "s"), (9000.0, "s"), (1.5e9, "B"), (-2.5e6, "B"),
             (0.0, "J"), (9.09e-12, "J"), (123456.0, "B")]
    got = page.evaluate("cases => cases.map(([v, u]) => FecomCharts.fmt(v, u))", cases)
    assert got == [units.scaled(v, u) for v, u in cases]
    shares = [0.523, 1.0, 0.000123, 0.0]
    got = page.evaluate("vs => vs.map(v => FecomCharts.fmt(v, '%'))", shares)
    assert got == [units.percent(v) for v in shares]


def test_the_top_apis_chart_reads_like_report_json(opened: Any, pages: dict[str, Path]) -> None:
    # issue 13: the chart stacked cpu-process on the package (29.9 J where the tables said 14.6)
    page = opened("run").page
    data = page.evaluate(
        "JSON.parse(document.getElementById('fecom-data').textContent).charts.bars")
    report = json.loads((pages["run"].parent / "report.json").read_text())
    addable = {d["domain"] for d in report["domains"] if d["addable"]}
    assert {s["key"] for s in data["series"]} <= addable
    rows = {r["api"]: r for r in report["apis"]}
    for item in data["items"]:
        for key, value in item["values"].items():
            # the program outside calls: a negative figure is noise, drawn as no bar
            expected = (rows[item["label"]]["energy"][key]["self_J"] if item["label"] in rows else
                        max(0.0, next(d["outside_calls_J"] for d in report["domains"]
                                      if d["domain"] == key)))
            assert value == pytest.approx(expected)
    labels = page.locator("[data-chart='bars'] text").all_text_contents()
    first = data["items"][0]
    # the bar's total label: the sum of its disjoint domains (estimated when a part is)
    assert units.scaled(sum(first["values"].values()), "J") + " (estimated)" in labels


def test_the_api_table_fits_1280_px_and_the_column_chooser_shows_more(
    browser: Browser, pages: dict[str, Path],
) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(pages["run"].as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        wrap = page.locator("#apis .table-wrap")
        assert wrap.evaluate("w => w.scrollWidth <= w.clientWidth + 1")
        total = page.locator("#apis-table thead th[data-col='gpu:0:total']")
        assert total.is_hidden()
        page.locator("#apis details.columns summary").click()
        page.locator("#apis details.columns input").nth(
            int(total.get_attribute("data-index") or 0)).check()
        assert total.is_visible()
        assert page.locator("#apis-table tbody tr").first.locator(
            f"td[data-c='{total.get_attribute('data-index')}']").is_visible()
        assert page.locator("[data-chart='memory']").get_attribute("data-drawn") == "1"
    finally:
        page.close()
