"""Cheap honest runs: a recent idle baseline reused when a check agrees, a tail that ends when
power is back at the baseline (estimates of CPU time: once they cover none of the program), and
a gate that counts the quiet time before it began."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
from test_server_support import FakeSensorForTests, served

from fecomlite.runner import experiment
from fecomlite.runner.experiment import measure_idle
from fecomlite.runner.settings import RunSettings
from fecomlite.server import baseline as bl
from fecomlite.server.series import Series
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
        # a careful run asking for 10 s of baseline does not reuse a 5 s (`--quick`-like) one
        assert bl.latest_baseline(store, this, max_age_s=600, min_seconds=10.0) is None
        assert bl.latest_baseline(store, this, max_age_s=600, min_seconds=5.0)[0] == recent


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


def power(name: str, t_s: list[float], watts: list[float], kind: str = "power") -> Series:
    return Series(
        name,
        "cpu-package",
        "W" if kind == "power" else "J",
        kind,
        "measured",
        None,
        np.array([int(t * 1e9) for t in t_s], dtype=np.int64),
        np.array(watts, float),
    )


def test_the_tail_is_back_at_the_baseline_on_readings_after_the_program_only():
    baseline = {"sensors": {"cpu": stats(10.0)}}  # allowed: ± 0.5 W (5 %)
    settle = {"cpu": int(0.1e9)}  # the first readings after the end may cover the program
    ended = int(1e9)
    # the reading 0.05 s after the end still shows the program: not judged
    series = [power("cpu", [1.05, 1.15, 1.25, 1.35], [30.0, 10.1, 10.0, 9.9])]
    assert bl.back_since(series, baseline, ended, settle) == int(1.15e9)
    # judged, it would have kept the tail going
    assert bl.back_since(series, baseline, ended, {"cpu": 0}) is None
    # below the baseline (other work that ran during it has stopped): nothing above idle left
    quieter = [power("cpu", [1.2, 1.3, 1.4, 1.5], [7.0, 7.0, 7.0, 7.0])]
    assert bl.back_since(quieter, baseline, ended, settle) == int(1.2e9)
    # still busy after the end: not back
    busy = [power("cpu", [1.2, 1.3, 1.4, 1.5], [10.0, 14.0, 14.0, 14.0])]
    assert bl.back_since(busy, baseline, ended, settle) is None
    # decaying power: judged on the newest readings (0.3 s), back once those are
    decaying = [power("cpu", [1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8], [20, 15, 12, 10, 10, 10, 10])]
    assert bl.back_since(decaying, baseline, ended, settle) == int(1.5e9)


def test_the_tail_needs_readings_of_every_baseline_sensor_over_a_span():
    baseline = {"sensors": {"cpu": stats(10.0), "dram": stats(3.0)}}
    ended, settle = 0, {}
    cpu = power("cpu", [0.1, 0.2, 0.3], [10.0, 10.0, 10.0])
    assert bl.back_since([cpu], baseline, ended, settle) is None  # DRAM not read yet
    dram = power("dram", [0.1, 0.15], [3.0, 3.0])
    assert bl.back_since([cpu, dram], baseline, ended, settle) is None  # two readings: too few
    dram = power("dram", [0.1, 0.12, 0.14], [3.0, 3.0, 3.0])
    assert bl.back_since([cpu, dram], baseline, ended, settle) is None  # 40 ms: too short
    dram = power("dram", [0.1, 0.2, 0.3], [3.0, 3.0, 3.0])
    assert bl.back_since([cpu, dram], baseline, ended, settle) == int(0.1e9)
    # a counter: its power from the energy it counted (10 J/s), not its readings' values
    counter = power("cpu", [0.1, 0.2, 0.3, 0.4], [100.0, 101.0, 102.0, 103.0], kind="counter")
    assert bl.back_since([counter, dram], baseline, ended, settle) == int(0.1e9)
    assert not bl.back_since([counter, dram], {"sensors": {}}, ended, settle)


def test_a_tail_ends_once_power_is_back_at_the_idle_baseline(tmp_path: Path):
    watts = {"now": 10.0}
    sensor = FakeSensorForTests("fake:cpu", value=lambda t: watts["now"], period_s=0.05)
    with served(tmp_path, [sensor]) as client:
        run, _ = client.create_run("a.py", [], "method", {})
        client.idle(run, 1.0)  # 10 W, no noise: back is within 0.5 W of it
        client.rep_start(run, 1)
        watts["now"] = 30.0  # the program, and the heat it leaves
        client.rep_end(run, 1, 0)
        replies: list[dict[str, object]] = []
        tail = threading.Thread(
            target=lambda: replies.append(client.tail(run, 1, 60.0, until_baseline=True))
        )
        tail.start()
        tail.join(timeout=1.5)
        assert tail.is_alive()  # 30 W: not back (it would take the whole 60 s)
        watts["now"] = 10.0
        back_from = time.monotonic_ns()
        tail.join(timeout=40.0)
        assert not tail.is_alive() and replies
        ended = replies[0]
        assert back_from <= ended["back_since_ns"] <= ended["tail_end_ns"]
        with Store(tmp_path / "store.sqlite") as store:
            rep = store.repetitions(run)[0]
        assert rep["tail_end_ns"] == ended["tail_end_ns"]
        assert rep["tail_end_ns"] - rep["t_end_ns"] < 45e9  # ended by the power, not at 60 s
        plain = client.tail(run, 1, 0.3)  # without until_baseline: sampled the whole time
        assert plain["back_since_ns"] is None
        client.finish_run(run, "finished", 0)


def test_a_tail_of_estimates_of_cpu_time_lasts_only_until_they_cover_none_of_the_program():
    def sensor(name: str, model: str | None, kind: str = "power") -> FakeSensorForTests:
        return FakeSensorForTests(name, kind=kind, model=model, provenance="estimated")

    settle = {"cpu": int(0.2e9), "dram": int(0.3e9), "rss": int(5e9), "rapl": int(0.1e9)}
    cpu, dram = sensor("cpu", "cpu-util-linear"), sensor("dram", "dram-gib-util-linear")
    rss = sensor("rss", None, kind="gauge")  # memory: no power, no tail of its own
    assert bl.lagless_tail_ns([cpu, dram, rss], settle) == int(0.3e9)
    rapl = FakeSensorForTests("rapl", kind="counter")  # measured power may decay: the baseline
    assert bl.lagless_tail_ns([cpu, rapl], settle) is None
    assert bl.lagless_tail_ns([rss], settle) is None  # no power at all: as before


def test_a_tail_of_cpu_time_estimates_ends_when_they_cover_none_of_the_program(tmp_path: Path):
    busy = FakeSensorForTests("fake:est", value=lambda t: 30.0, period_s=0.05,
                              provenance="estimated", model="cpu-util-linear")
    with served(tmp_path, [busy]) as client:
        run, _ = client.create_run("a.py", [], "method", {})
        client.idle(run, 0.5)
        client.rep_start(run, 1)
        client.rep_end(run, 1, 0)
        # other processes keep the estimate at 30 W, above its own idle: not the program's
        ended = client.tail(run, 1, 60.0, until_baseline=True)
        client.finish_run(run, "finished", 0)
    with Store(tmp_path / "store.sqlite") as store:
        rep = store.repetitions(run)[0]
        readings = store.samples(store.sensors(run)[0]["id"], rep["t_end_ns"], None)
    assert ended["back_since_ns"] is None and rep["tail_end_ns"] == ended["tail_end_ns"]
    assert rep["tail_end_ns"] - rep["t_end_ns"] < 30e9  # by the settle, not the 60 s
    assert any(t >= rep["t_end_ns"] for t, _ in readings)  # read after the program ended


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


class FakeNvmlForTests:
    """pynvml with one GPU, counting the calls made to it."""

    def __init__(self) -> None:
        self.calls = 0

    def nvmlInit(self) -> None:  # noqa: N802  pynvml's names
        self.calls += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass


def test_without_nvidias_driver_no_gpu_is_looked_for(monkeypatch, tmp_path: Path):
    nvml = FakeNvmlForTests()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(experiment.sys, "platform", "linux")
    monkeypatch.setattr(experiment, "NVIDIA_DRIVER_PATHS", (str(tmp_path / "no-driver"),))
    assert experiment.gpu_present() is False and nvml.calls == 0
    assert not experiment.sync_enabled(RunSettings(sync="auto"))
    assert experiment.sync_enabled(RunSettings(sync="on"))
    monkeypatch.setattr(experiment, "NVIDIA_DRIVER_PATHS", (str(tmp_path),))  # a driver
    assert experiment.gpu_present() is True and nvml.calls == 1
