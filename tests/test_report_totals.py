"""Tables say whether they show totals over the repetitions or means per repetition."""

from __future__ import annotations

from report_helpers import build_run
from rich.console import Console

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.build import build_report
from fecomlite.report.render import render_page
from fecomlite.report.summary import summary_table
from fecomlite.store import Store


def test_the_terminal_and_html_tables_say_they_hold_totals_over_the_repetitions(tmp_path):
    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store, reps=2)
        a = analyse_run(store, run)
        report = build_report(store, run)
    # what the label says is so: the APIs' calls add up to the calls of both repetitions
    assert sum(r["calls"] for r in a.apis) == sum(p["calls"] for p in a.per_rep)
    assert len(a.per_rep) == 2 and min(p["calls"] for p in a.per_rep) > 0
    console = Console(record=True, width=200)
    console.print(summary_table(a))
    assert "totals over 2 repetitions" in console.export_text()
    html = render_page("report.html.j2", report.context, report.charts)
    apis = html.split('id="apis"', 1)[1].split("</section>", 1)[0]
    assert "totals over all 2 repetitions" in apis
