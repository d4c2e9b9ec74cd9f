"""The server's rolling estimate of the machine's idle power between runs: kept while no run
records, reused by a run whose machine state matches it (saying so, with its age), refused when
the state changed; and the first gate counting the same readings."""

from __future__ import annotations

import time

from test_server_support import FakeSensorForTests, served

from fecomlite.analysis.baseline_text import described
from fecomlite.runner import experiment
from fecomlite.runner.experiment import measure_idle
from fecomlite.runner.settings import RunSettings
from fecomlite.server.idlewatch import IdleWatch
from fecomlite.store import Store

FAST = 0.02  # a reading every 20 ms: the unit tests' windows take half a second


def machine(power=lambda t: 20.0, util=lambda t: 3.0, temp=None) -> list[FakeSensorForTests]:
    """A fake machine: measured power (W), CPU utilisation (%) and, if given, a temperature."""
    sensors = [
        FakeSensorForTests("fake:cpu", value=power),
        FakeSensorForTests(
            "fake:util", domain="utilisation", unit="%", kind="gauge", value=util, device="machine"
        ),
    ]
    if temp is not None:
        sensors.append(
            FakeSensorForTests(
                "fake:temp", domain="temperature", unit="C", kind="gauge", value=temp
            )
        )
    return sensors


def watching(sensors: list[FakeSensorForTests], seconds: float, paused=lambda: False) -> IdleWatch:
    watch = IdleWatch(sensors, paused, period_s=FAST)
    watch.start()
    time.sleep(seconds)
    return watch


def test_a_quiet_stable_machine_gives_an_estimate_with_its_age():
    watch = watching(machine(), 0.8)
    try:
        found = watch.estimate(0.5, max_age_s=60, began_ns=time.monotonic_ns())
    finally:
        watch.close()
    assert "refused" not in found, found
    assert found["sensors"]["fake:cpu"]["mean_w"] == 20.0
    assert 0.45 <= found["seconds"] <= 0.55 and found["readings"] >= 10  # 25 on an idle CPU
    assert 0 <= found["age_s"] < 0.5  # the machine is still quiet: the newest window
    assert found["conditions"]["utilisation_pct"]["fake:util"] == 3.0


def test_a_busy_machine_gives_no_estimate():
    watch = watching(machine(util=lambda t: 55.0), 0.8)
    try:
        found = watch.estimate(0.5, max_age_s=60, began_ns=time.monotonic_ns())
    finally:
        watch.close()
    assert "quiet and stable" in found["refused"]


def test_a_warmer_machine_refuses_the_estimate_of_a_cooler_one():
    busy = lambda t: 40.0 if 0.6 <= t < 0.8 else 3.0  # noqa: E731  a burst of other work
    watch = watching(machine(util=busy, temp=lambda t: 45.0 if t < 0.7 else 52.0), 1.1)
    try:
        found = watch.estimate(0.4, max_age_s=60, began_ns=time.monotonic_ns())
    finally:
        watch.close()
    assert "state changed" in found["refused"] and "fake:temp" in found["refused"]


def test_the_clients_own_start_up_is_not_judged_as_the_machines_state():
    watch = watching(machine(util=lambda t: 60.0 if t >= 0.8 else 3.0), 1.0)
    try:
        now = time.monotonic_ns()
        t, util = watch.series(0, now)["fake:util"]
        started = int(t[util > 50][0])  # the client's process started here, taking a CPU
        assert "refused" in watch.estimate(0.4, max_age_s=60, began_ns=now)
        found = watch.estimate(0.4, max_age_s=60, began_ns=now, until_ns=started)
    finally:
        watch.close()
    assert "refused" not in found, found
    assert found["t_end_ns"] < started
    assert found["age_s"] >= round((now - started) / 1e9, 1) - 0.05  # counted to the run's start


def test_readings_stop_while_a_run_records_and_a_stretch_never_spans_one():
    recording = [False]
    watch = watching(machine(), 0.8, paused=lambda: recording[0])
    try:
        recording[0] = True
        time.sleep(0.3)
        stopped = time.monotonic_ns()
        assert not watch.series(stopped - 2 * 10**8, stopped)["fake:cpu"][0].size
        later = watch.estimate(0.4, max_age_s=60, began_ns=stopped + 3 * 10**9)
        assert "no readings" in later["refused"]  # a run beginning then: nothing known of now
        recording[0] = False
        time.sleep(0.2)  # too little for a new window: the old stretch's estimate serves
        found = watch.estimate(0.4, max_age_s=60, began_ns=time.monotonic_ns())
        assert "refused" not in found, found
        assert found["t_end_ns"] < stopped and found["age_s"] >= 0.2
    finally:
        watch.close()


def test_a_run_reuses_the_servers_rolling_estimate_and_its_first_gate_passes_at_once(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(experiment, "start_up_began_ns", lambda: None)  # pytest's age varies
    with served(tmp_path, machine(), watch_sensors=machine()) as client:
        time.sleep(6.0)  # 5 s of readings at the server's 4 per second, between runs
        run, _ = client.create_run("a.py", [], "method", {})
        baseline = measure_idle(client, run, RunSettings(idle_s=5.0))
        assert "rolling" in baseline, baseline
        assert baseline["sensors"]["fake:cpu"]["mean_w"] == 20.0
        assert baseline["rolling"]["age_s"] < 2.0
        assert "rolling estimate" in described(baseline)
        assert f"ending {baseline['rolling']['age_s']:g} s before" in described(baseline)
        gate = client.gate(run, rep=1, lookback_s=6.0, max_wait_s=0.0, window=20)
        assert gate["passed"] and gate["readings_before_run"] >= 15
        assert not any(c["pending"] for c in gate["checked"])
        client.finish_run(run, "finished", 0)
        with Store(client.store_path) as store:
            assert store.run(run)["idle"] == {"fake:cpu": 20.0}
            assert store.result(run, "idle_baseline")["rolling"]["readings"] >= 20


def test_a_changed_machine_state_refuses_the_estimate_and_the_run_measures(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "start_up_began_ns", lambda: None)
    watched = machine(power=lambda t: 20.0 if t < 7.0 else 30.0)  # e.g. a device woke up
    with served(tmp_path, machine(power=lambda t: 30.0), watch_sensors=watched) as client:
        time.sleep(9.0)
        run, _ = client.create_run("a.py", [], "method", {})
        refused = client.idle_estimate(run, 5.0, 600)
        assert "power differs" in refused["refused"]
        baseline = measure_idle(client, run, RunSettings(idle_s=5.0))
        assert "rolling" not in baseline and baseline["seconds"] == 5.0  # measured instead
        assert baseline["sensors"]["fake:cpu"]["mean_w"] == 30.0
        client.finish_run(run, "finished", 0)
        with Store(client.store_path) as store:
            assert "power differs" in store.result(run, "rolling_idle")["refused"]
