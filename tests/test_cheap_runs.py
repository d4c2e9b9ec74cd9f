"""Cheap honest runs: a recent idle baseline reused when a check agrees, a tail that ends when
power is back at the baseline, and a gate that counts the quiet time before it began."""

from __future__ import annotations

import time
from pathlib import Path

from test_server_support import FakeSensorForTests, served

from fecomlite.runner.experiment import measure_idle
from fecomlite.runner.settings import RunSettings
from fecomlite.server import baseline as bl
from fecomlite.store import Store


def stats(mean_w: float, std_w: float = 0.1) -> dict[str, object]:
    return {"mean_w": mean_w, "std_w": std_w, "n": 50, "provenance": "measured", "model": None}


def idle_detail(t_end_ns: int, **sensors: float) -> dict[str, object]:
    return {
        "seconds": 5.0,
        "t_start_ns": t_end_ns - 5 * 10**9,
        "t_end_ns": t_end_ns,
        "sensors": {name: stats(w) for name, w in sensors.items()},
    }


def test_the_newest_recent_baseline_of_another_run_is_found(tmp_path: Path):
    now = time.monotonic_ns()
    with Store(tmp_path / "store.sqlite") as store:
        old, recent, this = (store.create_run(created_unix=time.time()) for _ in range(3))
        store.put_result(old, "idle_baseline", idle_detail(now - 500 * 10**9, cpu=10.0))
        store.put_result(recent, "idle_baseline", idle_detail(now - 20 * 10**9, cpu=11.0))
        store.put_result(this, "idle_baseline", idle_detail(now, cpu=12.0))
        origin, found, age = bl.latest_baseline(store, this, max_age_s=600)
        assert origin == recent and found["sensors"]["cpu"]["mean_w"] == 11.0
        assert 20 <= age < 60
        assert bl.latest_baseline(store, this, max_age_s=10) is None  # too old


def test_a_reused_baseline_keeps_its_origin_and_age(tmp_path: Path):
    now = time.monotonic_ns()
    with Store(tmp_path / "store.sqlite") as store:
        first, second, third = (store.create_run(created_unix=time.time()) for _ in range(3))
        measured = idle_detail(now - 30 * 10**9, cpu=10.0, dram=3.0)
        store.put_result(first, "idle_baseline", measured)
        check = {"seconds": 1.0, "sensors": {"cpu": stats(10.2), "dram": stats(3.0)}}
        detail = bl.reuse(store, second, first, measured, 30.0, check, 0.4)
        assert store.run(second)["idle"] == {"cpu": 10.0, "dram": 3.0}
        assert detail["reused_from_run"] == first and detail["age_s"] == 30.0
        origin, found, age = bl.latest_baseline(store, third, max_age_s=600)
        assert origin == first and age >= 30  # measured then, not when it was reused


def test_agreement_is_within_five_percent_or_two_sigma():
    then = {"sensors": {"cpu": stats(10.0, std_w=0.1), "gpu": stats(50.0, std_w=2.0)}}
    same = {"sensors": {"cpu": stats(10.4), "gpu": stats(53.9)}}
    assert bl.agreement(same, then) <= 1.0  # 0.4 ≤ 5 % of 10; 3.9 ≤ 2σ = 4
    busier = {"sensors": {"cpu": stats(10.6), "gpu": stats(50.0)}}
    assert bl.agreement(busier, then) > 1.0
    missing = {"sensors": {"cpu": stats(10.0)}}
    assert bl.agreement(missing, then) is None  # a GPU gone: another machine state
    idle_extra = {"sensors": {**same["sensors"], "proc": stats(0.0)}}
    assert bl.agreement(idle_extra, then) <= 1.0  # a sensor reading nothing changes nothing


def test_measure_idle_reuses_an_agreeing_baseline_and_measures_otherwise(tmp_path: Path):
    sensor = FakeSensorForTests("fake:cpu", value=lambda t: 42.0)
    settings = RunSettings(idle_s=2.0)
    with served(tmp_path, [sensor]) as client:
        first, _ = client.create_run("a.py", [], "method", {})
        measured = measure_idle(client, first, settings)
        assert "reused_from_run" not in measured and measured["seconds"] == 2.0
        client.finish_run(first, "finished", 0)
        second, _ = client.create_run("a.py", [], "method", {})
        reused = measure_idle(client, second, settings)
        assert reused["reused_from_run"] == first
        assert reused["check"]["seconds"] == bl.CHECK_S
        client.finish_run(second, "finished", 0)
        fresh, _ = client.create_run("a.py", [], "method", {})
        again = measure_idle(client, fresh, RunSettings(idle_s=2.0, baseline_max_age_s=0))
        assert "reused_from_run" not in again  # reuse switched off: measured in full
        client.finish_run(fresh, "finished", 0)


def test_power_back_at_the_baseline_ends_the_tail(tmp_path: Path):
    with Store(tmp_path / "store.sqlite") as store:
        run = store.create_run(created_unix=time.time())
        sensor = store.add_sensor(
            run,
            name="cpu",
            domain="cpu-package",
            unit="W",
            kind="power",
            provenance="measured",
            model=None,
            period_s=0.1,
        )
        store.add_samples([(sensor, t, 30.0) for t in range(0, 10)])  # still busy
        store.add_samples([(sensor, t, 10.1) for t in range(10, 20)])  # back
        baseline = {"sensors": {"cpu": stats(10.0)}}
        assert not bl.back_at_baseline(bl.machine_power(store, run, 0), baseline)
        assert bl.back_at_baseline(bl.machine_power(store, run, 10), baseline)
        assert not bl.back_at_baseline({}, baseline)  # nothing read yet: not back


def test_the_gate_counts_quiet_time_before_it_began(tmp_path: Path):
    sensor = FakeSensorForTests(
        "fake:util",
        domain="utilisation",
        unit="%",
        kind="gauge",
        value=lambda t: 3.0,
        period_s=0.2,  # 20 readings take 4 s: more than a slow flush could ever add
    )
    with served(tmp_path, [sensor]) as client:
        run, _ = client.create_run("a.py", [], "method", {})
        client.idle(run, 5.0)  # ~25 utilisation readings, the machine left alone
        no_wait = {"max_wait_s": 0.0, "window": 20}
        at_once = client.gate(run, rep=1, lookback_s=5.0, **no_wait)
        assert at_once["passed"] and at_once["gated"]  # judged on readings from before it
        checks = {c["check"]: c for c in at_once["checked"]}
        assert set(checks) == {"utilisation_std", "utilisation_quiet"}  # stable, and quiet
        for check in checks.values():
            assert check["sensor"] == "fake:util" and check["n"] == 20 and not check["pending"]
        blind = client.gate(run, rep=2, **no_wait)  # only what comes after it began
        assert all(c["pending"] for c in blind["checked"])  # too few readings, or none yet
        client.finish_run(run, "finished", 0)
