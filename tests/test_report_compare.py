"""Two runs compared: a change counts only when it exceeds both runs' noise."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from report_helpers import build_run, html_tables

from fecomlite.analysis.run_analysis import analyse_run
from fecomlite.report.compare import compare_runs, difference
from fecomlite.report.render import write_comparison
from fecomlite.store import Store


def test_difference_against_the_noise() -> None:
    # half-widths 3 and 4: the difference's is 5
    assert difference(100.0, 3.0, 106.0, 4.0)["verdict"] == "higher"
    assert difference(100.0, 3.0, 104.0, 4.0)["verdict"] == "within noise"
    assert difference(100.0, 3.0, 94.0, 4.0)["verdict"] == "lower"
    d = difference(100.0, 3.0, 106.0, 4.0)
    assert d["diff"] == 6.0 and d["noise"] == 5.0 and d["rel"] == pytest.approx(0.06)
    assert difference(100.0, math.nan, 150.0, 1.0)["verdict"] == "too few values"
    assert difference(math.nan, 1.0, 150.0, 1.0)["verdict"] == "missing"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int, int]:
    path = tmp_path_factory.mktemp("compare") / "store.sqlite"
    with Store(path) as store:
        before = build_run(store, reps=2)
        after = build_run(store, reps=2, energy_scale=1.3)  # the GPU draws 30 % more
        same = build_run(store, reps=2)
    return path, before, after, same


def test_a_real_change_is_found_and_an_equal_run_is_within_noise(
    runs: tuple[Path, int, int, int],
) -> None:
    path, before, after, same = runs
    with Store(path) as store:
        a, b, c = (analyse_run(store, r) for r in (before, after, same))
    changed = compare_runs(a, b).json
    gpu = next(d for d in changed["domains"] if d["domain"] == "gpu:0")
    cpu = next(d for d in changed["domains"] if d["domain"] == "cpu-package")
    assert gpu["comparable"] and gpu["verdict"] == "higher"
    # 30 % more in all is more than 30 % above the unchanged idle power
    assert 0.3 < gpu["rel"] < 0.6
    assert cpu["verdict"] == "within noise"  # the estimated CPU series did not change
    for api in changed["apis"]:
        assert api["energy"]["gpu:0"]["per_rep"]["verdict"] == "higher"
        assert api["energy"]["gpu:0"]["per_call"]["diff"] > 0
        # the same program: every call paired with its counterpart (site, call order)
        pairing = api["energy"]["gpu:0"]["per_call"]["pairing"]
        assert pairing["paired"] and pairing["calls_per_rep"] == api["calls_a"] // 2
    unchanged = compare_runs(a, c).json
    assert {d["verdict"] for d in unchanged["domains"]} == {"within noise"}
    assert {api["energy"][k]["per_call"]["verdict"] for api in unchanged["apis"]
            for k in api["energy"]} == {"within noise"}


def test_measured_and_estimated_are_not_compared(runs: tuple[Path, int, int, int]) -> None:
    path, before, after, _ = runs
    with Store(path) as store:
        store.db.execute("UPDATE sensors SET provenance='measured', model=NULL "
                         "WHERE run_id=? AND name='est:cpu-package'", (after,))
        try:
            a, b = analyse_run(store, before), analyse_run(store, after)
        finally:
            store.db.execute("UPDATE sensors SET provenance='estimated', model='cpu-util-linear'"
                             " WHERE run_id=? AND name='est:cpu-package'", (after,))
    result = compare_runs(a, b).json
    cpu = next(d for d in result["domains"] if d["domain"] == "cpu-package")
    assert not cpu["comparable"] and cpu["verdict"] == "not comparable"
    assert cpu["why"] == "estimated in A, measured in B"
    assert all(api["energy"]["cpu-package"]["verdict"] == "not comparable"
               for api in result["apis"])


def test_an_api_in_one_run_only(tmp_path: Path) -> None:
    from report_helpers import SITES

    renamed = {**SITES, "matmul_bf16_8192": ("bench.py:22:12", "torch.mm", "torch.mm",
                                             "y = torch.mm(a, b)")}
    with Store(tmp_path / "s.sqlite") as store:
        a = analyse_run(store, build_run(store, reps=1))
        b = analyse_run(store, build_run(store, reps=1, sites=renamed))
    rows = {r["api"]: r for r in compare_runs(a, b).json["apis"]}
    assert rows["torch.Tensor.matmul"]["energy"]["gpu:0"]["verdict"] == "only in A"
    assert rows["torch.mm"]["energy"]["gpu:0"]["verdict"] == "only in B"
    assert rows["torch.mm"]["calls_a"] == 0 and rows["torch.mm"]["calls_b"] == 18


def test_files_agree(runs: tuple[Path, int, int, int], tmp_path: Path) -> None:
    path, before, after, _ = runs
    with Store(path) as store:
        comparison = compare_runs(analyse_run(store, before), analyse_run(store, after))
    write_comparison(comparison, tmp_path)
    page = html_tables((tmp_path / "index.html").read_text())["compare-table"]
    text = (tmp_path / "compare.csv").read_text()
    rows = {r["api"]: r for r in csv.DictReader(io.StringIO(text))}
    data = {r["api"]: r for r in json.loads((tmp_path / "compare.json").read_text())["apis"]}
    cols = comparison.context["table"]["columns"]
    assert page["columns"] == [c.key for c in cols]
    for cells in page["rows"]:
        api = cells[0]["v"]
        for col, cell in zip(cols, cells, strict=True):
            assert cell["v"] == rows[api][col.csv], col.key
        assert cells[[c.key for c in cols].index("gpu:0:rep_verdict")]["v"] == "higher"
        assert data[api]["energy"]["gpu:0"]["per_rep"]["verdict"] == "higher"


def test_two_runs_of_an_unchanged_program_give_no_verdict_beyond_the_noise(
    tmp_path: Path,
) -> None:
    # issue 13: 85 of 114 verdicts said higher/lower for an unchanged script run 2 and 3 times
    from fecomlite.report.compare import analyse_pair

    with Store(tmp_path / "store.sqlite") as store:
        three, two, one = (build_run(store, reps=n) for n in (3, 2, 1))
        a, b, notes = analyse_pair(store, three, two)
        c, d, _ = analyse_pair(store, two, one)
    data = compare_runs(a, b, notes).json
    verdicts = [api["energy"][k]["per_call"]["verdict"] for api in data["apis"]
                for k in api["energy"]]
    assert verdicts and not {"higher", "lower"} & set(verdicts)
    assert "repetitions: 3 in A, 2 in B" in data["differences"]
    # `auto` fitted intensities in each run: both compared by overlap, with the reason
    assert {d["method"] for d in (*a.domains, *b.domains)} == {"overlap"}
    assert any("intensities are fitted per run" in n for n in data["notes"])
    # with one repetition in B there is still a spread from A's; from no repetitions, none
    single = compare_runs(c, d).json
    assert not {"higher", "lower"} & {api["energy"][k]["per_call"]["verdict"]
                                      for api in single["apis"] for k in api["energy"]}


def test_domains_attributed_by_different_methods_are_not_compared(
    runs: tuple[Path, int, int, int],
) -> None:
    path, before, _, same = runs
    with Store(path) as store:
        a, c = analyse_run(store, before, "overlap"), analyse_run(store, same, "intensity")
    domains = compare_runs(a, c).json["domains"]
    differ = [d for d in domains if d["domain"] == "gpu:0"][0]
    assert not differ["comparable"] and "attributed by overlap in A" in differ["why"]
