"""CO2e: the arithmetic, the bundled table, and the figures in report.json, the CSVs and HTML."""

from __future__ import annotations

import csv
import io
import json

import pytest
from report_helpers import build_run, html_tables

from fecomlite.analysis import carbon
from fecomlite.analysis.run_analysis import ADDITIVE_DOMAINS
from fecomlite.report.build import build_report
from fecomlite.report.render import write_report
from fecomlite.runner.settings import SettingsError, resolve
from fecomlite.store import Store


def test_grams_are_kwh_times_pue_times_intensity():
    intensity = carbon.Intensity(400.0, "given", pue=1.2)
    assert intensity.grams(3.6e6) == pytest.approx(480.0)  # 1 kWh × 1.2 × 400 g/kWh
    assert intensity.grams(0.0) == 0.0
    assert intensity.label() == "estimated at 400 gCO2e/kWh (given, PUE 1.2)"


def test_the_table_is_dated_sourced_and_looked_up_by_code_or_name():
    header = carbon.TABLE.read_text().splitlines()[:6]
    assert any("Ember" in line for line in header) and any("Our World in Data" in x for x in header)
    rows = carbon.table()
    assert len(rows) > 150 and all(g > 0 and 2000 < year <= 2030 for _, g, year in rows.values())
    france = carbon.for_region("fra")
    assert france == carbon.for_region("France")
    assert france.g_per_kwh == rows["FRA"][1] and str(rows["FRA"][2]) in france.label()
    assert rows["POL"][1] > 5 * rows["FRA"][1]  # coal against nuclear: the table is not noise
    with pytest.raises(carbon.CarbonError, match="no grid intensity"):
        carbon.for_region("XXX")


def test_a_number_wins_over_a_region_and_bad_values_are_refused():
    assert carbon.resolve(100.0, "FRA", None).g_per_kwh == 100.0
    assert carbon.resolve(None, None, None) is None
    with pytest.raises(carbon.CarbonError):
        carbon.resolve(-1.0, None, None)
    with pytest.raises(carbon.CarbonError):
        carbon.resolve(100.0, None, 0.9)


def test_settings_take_carbon_from_the_project_and_refuse_unknown_regions():
    settings = resolve({"region": "DEU", "pue": 1.3}, {"carbon_intensity": None})
    assert settings.region == "DEU" and settings.pue == 1.3
    assert carbon.from_settings(settings.to_json()).g_per_kwh == carbon.table()["DEU"][1]
    with pytest.raises(SettingsError, match="no grid intensity"):
        resolve({"region": "Atlantis"}, {})


def test_the_environment_round_trip_keeps_the_region():
    intensity = carbon.for_region("SWE", pue=1.1)
    back = carbon.from_environment(carbon.environment(intensity))
    assert back == intensity


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("co2e")
    with Store(folder / "store.sqlite") as store:
        run = build_run(store)
        report = build_report(store, run, intensity=carbon.Intensity(250.0, "given"))
    write_report(report, folder / "out", ["html", "json", "csv"])
    return report, folder / "out"


def test_report_json_has_run_api_and_site_grams_labelled(report):
    rep, out = report
    data = json.loads((out / "report.json").read_text())
    block = data["co2e"]
    assert block["provenance"] == "estimated" and block["g_per_kwh"] == 250.0
    assert "estimated at 250 gCO2e/kWh" in block["label"]
    run_J = sum(
        e["total_J"]
        for r in data["per_rep"]
        for d, e in r["energy"].items()
        if d in ADDITIVE_DOMAINS or d.startswith("gpu:")
    )
    assert run_J > 0 and block["run_co2e_g"] == pytest.approx(run_J / 3.6e6 * 250.0)
    for row in data["apis"] + data["sites"]:
        joules = row["all_domains"]["above_idle_J"]
        assert row["co2e_g"] == pytest.approx(joules / 3.6e6 * 250.0)
    assert sum(r["co2e_g"] for r in data["apis"]) <= block["run_co2e_g"]


def test_csv_and_html_show_the_same_grams_with_the_label(report):
    rep, out = report
    data = json.loads((out / "report.json").read_text())
    by_api = {r["api"]: r["co2e_g"] for r in data["apis"]}
    rows = list(csv.DictReader(io.StringIO((out / "apis.csv").read_text())))
    assert {r["api"]: float(r["co2e_g"]) for r in rows} == pytest.approx(by_api)
    assert {r["co2e_label"] for r in rows} == {data["co2e"]["label"]}
    html = (out / "index.html").read_text()
    assert "CO2e" in html and data["co2e"]["label"] in html
    table = html_tables(html)["apis-table"]
    column, ident = table["columns"].index("co2e_g"), table["columns"].index("api")
    shown = {cells[ident]["v"]: float(cells[column]["v"]) for cells in table["rows"]}
    assert shown == pytest.approx(by_api, rel=1e-9)


def test_without_an_intensity_nothing_changes(tmp_path):
    with Store(tmp_path / "store.sqlite") as store:
        rep = build_report(store, build_run(store))
    assert rep.json["co2e"] is None and "co2e_g" not in rep.csv["apis"]
    assert all("co2e_g" not in row for row in rep.json["apis"])


def test_co2e_from_unreliable_energy_carries_the_mark(tmp_path):
    """The package's above-idle energy flagged unreliable (a busy machine): the CO2e made from
    it says so in report.json, the CSV and the HTML, with the domain's reason."""
    from fecomlite.analysis.run_analysis import analyse_run

    with Store(tmp_path / "store.sqlite") as store:
        run = build_run(store)
        a = analyse_run(store, run)
        package = next(d for d in a.domains if d["domain"] == "cpu-package")
        package.update(reliable=False, unreliable=["other processes used the CPUs"])
        rep = build_report(store, run, analysis=a, intensity=carbon.Intensity(250.0, "given"))
        written = write_report(rep, tmp_path / "out", ["html", "json", "csv"])
    files = {p.name: p for p in written}
    block = json.loads(files["report.json"].read_text())["co2e"]
    assert block["reliable"] is False
    assert block["unreliable"] == ["cpu-package: other processes used the CPUs"]
    rows = list(csv.DictReader(io.StringIO(files["apis.csv"].read_text())))
    assert {r["co2e_reliable"] for r in rows} == {"False"}
    html = files["index.html"].read_text()
    assert "CO2e (unreliable)" in html and "other processes used the CPUs" in html
    with Store(tmp_path / "store.sqlite") as store:  # the same run, nothing flagged
        fine = build_report(store, run, intensity=carbon.Intensity(250.0, "given"))
    assert fine.json["co2e"]["reliable"] is True and fine.json["co2e"]["unreliable"] == []
