"""Table cells: a negative energy within its noise reads "≈ 0", never as negative energy."""

from __future__ import annotations

from fecomlite.report import tables


def test_negative_energy_within_its_noise_reads_as_zero() -> None:
    col = tables.Column("x", "above idle", "J", ("e",), "e", noise=("u",))
    assert tables.cell(col, {"e": -0.003, "u": 0.002}).text == "≈ 0"
    assert tables.cell(col, {"e": -0.003, "u": 0.0011}).text == "≈ 0"  # within 3σ
    assert tables.cell(col, {"e": 0.003, "u": 0.01}).text == "3.00 mJ"  # positive: as it is
    cell = tables.cell(col, {"e": -0.003, "u": 0.002})
    assert cell.data == repr(-0.003)  # the raw figure stays for sorting


def test_a_figure_the_analysis_floored_at_zero_says_so() -> None:
    # analysis.noise_floor: 0 within noise, not shown (None) beyond it; `b` says which
    col = tables.Column("x", "above idle", "J", ("e",), "e", noise=("u",), below=("b",))
    within = tables.cell(col, {"e": 0.0, "u": 0.002, "b": "within_noise"})
    assert (within.text, within.ci) == ("≈ 0", "(noise ± 2.00 mJ)")
    assert tables.cell(col, {"e": None, "u": 0.001, "b": "beyond_noise"}).text == "below idle"
    assert tables.cell(col, {"e": None, "u": 0.001, "b": None}).text == "–"  # no reading
    assert tables.cell(col, {"e": 0.0, "u": 0.001, "b": None}).text == "0 J"  # a true zero


def test_the_api_table_shows_each_apis_own_memory_and_hides_the_process_peak() -> None:
    domains = [{"domain": "cpu-package", "provenance": "estimated", "model": "m", "sensor": "s"}]
    cols = {c.key: c for c in tables.api_columns(domains, gpu_memory=False)}
    assert cols["rss_above"].shown and cols["rss_delta"].shown
    assert not cols["rss_peak"].shown  # the whole process's peak ranks nothing
    assert not cols["cpu-package:total"].shown
