"""Issue 30: calls compared call by call. Two runs of the same code pair the k-th call of each
site in A with its k-th call in B; between-call differences cancel, calls only one run made are
left out, and the repetitions carry the run-to-run spread. On generated runs: a 1.5× change of
one API's per-call energy is seen, identical code gives no verdict, and a run with a shorter loop
(fewer cheap calls after the same costly first one) is not called "higher"."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from fecomlite.analysis.paired_calls import SAMPLE_PER_SITE, pair_runs, typical_spread
from fecomlite.report.compare import across_repetitions

DOMAIN = "cpu-process"


def generated(rng: np.random.Generator, calls_per_rep: dict[str, int], *, reps: int = 3,
              scale: dict[str, float] | None = None, first: float = 1.0,
              call_noise: float = 0.2, rep_noise: float = 0.05) -> SimpleNamespace:
    """An analysis-like run: one site per API, each call 1 J (its first `first` J) × the
    repetition's factor × its own noise; `scale` multiplies an API's calls in this run."""
    keys = [f"p.py:{i + 1}:0" for i in range(len(calls_per_rep))]
    columns: dict[str, list] = {"site": [], "rep": [], "t_start_ns": [], "energy": []}
    t = 0
    for rep in range(reps):
        factor = 1 + rep_noise * rng.standard_normal()
        for site, (api, n) in enumerate(calls_per_rep.items()):
            base = np.ones(n)
            base[0] = first
            energy = base * factor * (1 + call_noise * rng.standard_normal(n)).clip(0.1)
            energy *= (scale or {}).get(api, 1.0)
            columns["site"] += [site] * n
            columns["rep"] += [rep] * n
            columns["t_start_ns"] += list(range(t, t + n))
            columns["energy"] += energy.tolist()
            t += n
    n = len(columns["site"])
    calls = {"call": np.arange(n), "site": np.array(columns["site"]),
             "rep": np.array(columns["rep"]), "t_start_ns": np.array(columns["t_start_ns"]),
             "energy_J": {DOMAIN: np.array(columns["energy"])}}
    return SimpleNamespace(calls=calls, site_keys=keys,
                           repetitions=[{"rep": r} for r in range(reps)],
                           sites=[{"key": k, "api": a} for k, a in zip(keys, calls_per_rep,
                                                                     strict=True)])


def verdicts(a: SimpleNamespace, b: SimpleNamespace) -> dict[str, dict]:
    """Each API's verdict as `report A B` gives it: over the repetitions' mean energy per
    paired call, each API's spread moderated by the domain's typical one."""
    pairs = pair_runs(a, b, [DOMAIN])
    prior = typical_spread(pairs, DOMAIN)
    return {api: across_repetitions(p["reps_a"].mean(), p["reps_b"].mean(), p["reps_a"],
                                    p["reps_b"], 0.0, 0.0, len(pairs), prior)
            for (api, _), p in pairs.items()}


def test_a_15x_change_of_one_api_is_seen_and_identical_code_gives_no_verdict():
    rng = np.random.default_rng(40)
    apis = {f"api{i}": 200 for i in range(20)}
    found, false = [], []
    for trial in range(3):
        a = generated(rng, apis)
        same = verdicts(a, generated(rng, apis))
        false += [v["verdict"] for v in same.values() if v["verdict"] != "within noise"]
        changed = verdicts(a, generated(rng, apis, scale={f"api{trial}": 1.5}))
        found.append(changed[f"api{trial}"]["verdict"])
        assert changed[f"api{trial}"]["min_detectable_rel"] < 0.5
        false += [v["verdict"] for api, v in changed.items()
                  if api != f"api{trial}" and v["verdict"] != "within noise"]
    assert found == ["higher"] * 3
    assert false == []


def test_a_shorter_loop_is_compared_on_the_calls_both_runs_made():
    """A costly first call (first use) then cheap ones: 20 per repetition in A, 10 in B. Over
    all calls B's mean per call is 31 % higher; over the paired first ten, the same."""
    rng = np.random.default_rng(41)
    a = generated(rng, {"step": 20}, first=10.0, call_noise=0.02, rep_noise=0.01)
    b = generated(rng, {"step": 10}, first=10.0, call_noise=0.02, rep_noise=0.01)
    unpaired = [float(np.mean(x.calls["energy_J"][DOMAIN])) for x in (a, b)]
    assert unpaired[1] / unpaired[0] > 1.25
    pair = pair_runs(a, b, [DOMAIN])[("step", DOMAIN)]
    assert pair["calls"] == 10
    assert abs(pair["reps_b"].mean() / pair["reps_a"].mean() - 1) < 0.05
    assert abs(pair["per_call_change"][1]) < 0.05  # the median paired call: unchanged
    assert verdicts(a, b)["step"]["verdict"] == "within noise"


def test_sites_only_one_run_has_are_not_paired_and_the_sample_is_capped():
    rng = np.random.default_rng(42)
    a = generated(rng, {"x": 5, "y": 5}, reps=2)
    b = generated(rng, {"x": 5}, reps=2)
    pairs = pair_runs(a, b, [DOMAIN])
    assert set(pairs) == {("x", DOMAIN)}  # y: only in A, compared unpaired
    long = generated(rng, {"x": SAMPLE_PER_SITE + 10}, reps=2, call_noise=0.0, rep_noise=0.0)
    pair = pair_runs(long, long, [DOMAIN])[("x", DOMAIN)]
    assert pair["calls"] == SAMPLE_PER_SITE + 10 and pair["per_call_change"] == [0.0] * 3


def test_streamed_runs_are_paired_from_the_store(tmp_path):
    """Runs analysed streamed keep no call's columns: `report A B` reads their paired calls
    chunk by chunk (a call's energy its time × its API's power in the repetition). Two
    replays of one trace pair every call, agree with the whole-run pairing within 10 %, give
    no verdict; the same trace drawing 30 % more reads higher."""
    from report_helpers import build_run

    from fecomlite.analysis.run_analysis import analyse_run
    from fecomlite.report.compare import compare_runs
    from fecomlite.store import Store

    with Store(tmp_path / "s.sqlite") as store:
        ids = [build_run(store, reps=3), build_run(store, reps=3),
               build_run(store, reps=3, energy_scale=1.3)]
        streamed = [analyse_run(store, r, "overlap", stream_above=0) for r in ids]
        whole = [analyse_run(store, r, "overlap") for r in ids]
        same = compare_runs(streamed[0], streamed[1], store=store).json
        changed = compare_runs(streamed[0], streamed[2], store=store).json
        unpaired = compare_runs(streamed[0], streamed[1]).json  # no store: nothing to read
    reference = pair_runs(whole[0], whole[1], ["gpu:0"])
    for row in same["apis"]:
        got = row["energy"]["gpu:0"]["per_call"]
        assert got["pairing"]["paired"] and got["verdict"] == "within noise"
        exact = reference[(row["api"], "gpu:0")]["reps_a"].mean()
        assert abs(got["a"] / exact - 1) < 0.10, (row["api"], got["a"], exact)
    assert {r["energy"]["gpu:0"]["per_call"]["verdict"] for r in changed["apis"]} == {"higher"}
    assert not any(r["energy"]["gpu:0"]["per_call"]["pairing"]["paired"]
                   for r in unpaired["apis"])
