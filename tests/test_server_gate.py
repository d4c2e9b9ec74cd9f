"""The stability gate and the power arithmetic it shares with the idle baseline, on arrays."""

from __future__ import annotations

import numpy as np
import pytest
from fakesys.nvml import H200, busy_windows, overlap

from fecomlite.sensors.replay import load_trace
from fecomlite.server.gate import GateThresholds, evaluate, wait_for_stable
from fecomlite.server.series import Series, idle_stats, mean_power, power_values


def series(name: str, values: list[float] | np.ndarray, *, domain: str = "cpu-package",
           unit: str = "W", kind: str = "power", period_ns: int = 50_000_000,
           device: str = "cpu") -> Series:
    v = np.asarray(values, dtype=float)
    t = np.arange(v.size, dtype=np.int64) * period_ns
    return Series(name, domain, unit, kind, "measured", None, t, v, device)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += max(seconds, 1e-3)


def test_counter_power_is_taken_over_bins_not_read_to_read_steps():
    # a RAPL-like counter: 130 W in 1 ms updates, read every ~10 ms with jitter, for 6 s
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.uniform(8e6, 12e6, 600)).astype(np.int64)
    e = 130.0 * (t // 1_000_000) * 1e-3  # J at the last whole-ms update before each read
    steps = np.diff(e) / (np.diff(t) / 1e9)
    assert steps.std() / steps.mean() > 0.03  # each step is 10 ± 1 updates: too noisy to gate
    p = power_values(Series("rapl", "cpu-package", "J", "counter", "measured", None, t, e))
    assert p.size == (t[-1] - t[1]) // 500_000_000  # whole 0.5 s bins from the first update
    assert np.allclose(p, 130.0, rtol=0.005)
    assert p.std() / p.mean() < 0.003


def test_a_counter_reset_starts_the_counting_afresh():
    t = np.arange(10, dtype=np.int64) * 100_000_000
    e = np.array([5.0, 15, 25, 35, 1, 11, 21, 31, 41, 51])  # 100 W, reset after the 4th read
    s = Series("c", "dram", "J", "counter", "measured", None, t, e)
    assert mean_power(s) == pytest.approx(100.0)


def test_idle_baseline_of_the_recorded_h200_counter():
    energy = load_trace(H200 / "gpu_samples_energy.csv", "energy_mJ")
    idle = (energy.t_ns - energy.t_ns[0]) < 2.5e9  # the README: 3 s of idle before the work
    stats = idle_stats(Series("e", "gpu:0", "J", "counter", "measured", None,
                              energy.t_ns[idle], energy.values[idle]))
    assert stats is not None
    assert 115 < stats["mean_w"] < 140  # the README: idle ≈ 120–130 W
    assert stats["std_w"] / stats["mean_w"] < 0.05
    assert stats["n"] == 4  # 0.5 s bins between the first and the last update seen


def test_power_cv_gates_cpu_and_gpu_at_their_own_ratios():
    rng = np.random.default_rng(1)
    wobbly = 100 * (1 + 0.02 * rng.standard_normal(20))  # cv ≈ 0.02
    checks = evaluate(
        [series("rapl:package-0", wobbly), series("nvml:0:power", wobbly, domain="gpu:0",
                                                  device="gpu:0")],
        GateThresholds(),
    )
    by_name = {c["sensor"]: c for c in checks}
    assert by_name["rapl:package-0"]["passed"]  # under 0.03
    assert not by_name["nvml:0:power"]["passed"]  # over 0.01
    assert by_name["nvml:0:power"]["limit"] == 0.01


def test_a_counter_is_not_gated_where_its_domain_has_a_power_sensor():
    t = np.arange(40, dtype=np.int64) * 50_000_000
    energy = Series("nvml:0:energy", "gpu:0", "J", "counter", "measured", None, t,
                    130.0 * (t // 100_000_000) * 0.1, "gpu:0")
    rapl = Series("rapl:package-0", "cpu-package", "J", "counter", "measured", None, t,
                  50.0 * t / 1e9, "cpu")
    power = series("nvml:0:power_instant", [130.0] * 40, domain="gpu:0", device="gpu:0")
    checked = [c["sensor"] for c in evaluate([energy, rapl, power], GateThresholds(window=3))]
    assert checked == ["rapl:package-0", "nvml:0:power_instant"]


def test_temperatures_use_the_cpu_or_gpu_limit():
    checks = evaluate([
        series("temp:cpu", [50.0], domain="temperature", unit="C", kind="gauge"),
        series("nvml:0:temperature", [42.0], domain="temperature", unit="C", kind="gauge",
               device="gpu:0"),
    ], GateThresholds())
    assert [(c["sensor"], c["passed"]) for c in checks] == [
        ("temp:cpu", True), ("nvml:0:temperature", False)]


def test_too_few_values_are_pending_not_passed():
    checks = evaluate([series("p", [100.0] * 5)], GateThresholds(window=20))
    assert checks[0]["pending"] and not checks[0]["passed"]
    assert checks[0]["n"] == 5


def test_unstable_power_fails_at_max_wait_and_says_why():
    clock = FakeClock()
    rng = np.random.default_rng(2)
    noisy = [series("p", 100 + 20 * rng.standard_normal(40))]
    th = GateThresholds(max_wait_s=7.0, poll_s=0.5)
    result = wait_for_stable(lambda: noisy, th, clock=clock, sleep=clock.sleep)
    assert not result["passed"]
    assert result["waited_s"] == pytest.approx(7.0, abs=0.01)
    assert any("power_cv" in r for r in result["reasons"])
    assert "no temperature sensor: gated on power and utilisation alone" in result["reasons"]
    assert result["checked"][0]["value"] > 0.1


def test_stable_power_passes_without_waiting():
    clock = FakeClock()
    steady = [series("p", [100.0, 100.1] * 10), series("u", [3.0] * 20, domain="utilisation",
                                                       unit="%", kind="gauge")]
    result = wait_for_stable(lambda: steady, GateThresholds(), clock=clock, sleep=clock.sleep)
    assert result["passed"] and result["gated"]
    assert result["waited_s"] == 0
    assert {c["check"] for c in result["checked"]} == {"power_cv", "utilisation_std",
                                                       "utilisation_quiet"}


def test_a_stable_but_busy_machine_is_not_quiet_and_the_gate_says_so():
    # issue 13: the idle baseline read 6.2–10 W on a 10 W model and the gate passed because
    # utilisation was *stable*; other processes kept 56 % of the CPUs busy
    clock = FakeClock()
    busy = [Series("util:cpu", "utilisation", "%", "gauge", "measured", None,
                   np.arange(20, dtype=np.int64) * 10**8, np.full(20, 56.0), "machine")]
    result = wait_for_stable(lambda: busy, GateThresholds(max_wait_s=3.0), clock=clock,
                             sleep=clock.sleep)
    assert not result["passed"]
    quiet = next(c for c in result["checked"] if c["check"] == "utilisation_quiet")
    assert quiet["value"] == 56.0 and not quiet["passed"]
    assert any("not quiet: 56 % of all CPUs" in r for r in result["reasons"])
    assert "temperature: no sensor" in result["not_checked"]


def test_the_gate_waits_until_values_arrive():
    clock = FakeClock()

    def fetch() -> list[Series]:  # one stable value every 50 ms of (fake) time
        return [series("p", [100.0] * int(clock.now / 0.05))]

    result = wait_for_stable(fetch, GateThresholds(window=20, poll_s=0.25), clock=clock,
                             sleep=clock.sleep)
    assert result["passed"]
    assert 1.0 <= result["waited_s"] <= 1.3


def test_a_silent_sensor_holds_a_pass_back_for_a_while_then_is_named():
    clock = FakeClock()
    steady = series("p", [100.0] * 20)
    silent = series("util:process", [], domain="utilisation", unit="%", kind="gauge")
    result = wait_for_stable(lambda: [steady, silent], GateThresholds(poll_s=0.5), clock=clock,
                             sleep=clock.sleep)
    assert result["passed"]
    assert result["waited_s"] == pytest.approx(2.0, abs=0.01)
    assert "util:process: no readings, not gated" in result["reasons"]


def test_nothing_to_gate_on_is_said_and_not_waited_for_long():
    clock = FakeClock()
    result = wait_for_stable(lambda: [], GateThresholds(), clock=clock, sleep=clock.sleep)
    assert result["passed"] and not result["gated"]
    assert result["waited_s"] <= 2.5
    assert "not gated" in result["reasons"][0]


def test_thresholds_from_a_request_are_checked():
    th = GateThresholds.from_mapping({"max_wait_s": 3, "window": 5, "gpu_temp_max_c": 45})
    assert (th.max_wait_s, th.window, th.gpu_temp_max_c) == (3.0, 5, 45.0)
    with pytest.raises(ValueError, match="unknown gate thresholds"):
        GateThresholds.from_mapping({"max_temp": 3})
    with pytest.raises(ValueError, match="max_wait_s"):
        GateThresholds.from_mapping({"max_wait_s": float("inf")})
    with pytest.raises(ValueError, match="window"):
        GateThresholds.from_mapping({"window": 1})


def test_the_programs_own_sensors_are_not_gated():
    """Between repetitions the measured program is not running: its CPU time reads 0 and its
    estimated power is 0 W (no σ/mean at all); the machine's state decides."""
    machine = series("rapl:package-0", [30.0] * 40)
    own_power = Series("est:cpu-process", "cpu-process", "W", "power", "estimated",
                       "process-cpu-share", np.arange(40, dtype=np.int64) * 10**8,
                       np.zeros(40), "process")
    own_util = Series("util:process", "utilisation", "%", "gauge", "measured", None,
                      np.arange(40, dtype=np.int64) * 10**8, np.zeros(40), "process")
    checks = evaluate([machine, own_power, own_util], GateThresholds())
    assert [c["sensor"] for c in checks] == ["rapl:package-0"] and checks[0]["passed"]


def test_estimated_power_is_gated_through_the_utilisation_it_comes_from():
    """est:cpu-package = idle + (max − idle) × utilisation: with 2.5 pp of background noise its
    σ/mean is ~8 %, over the RAPL ratio of 3 %, while the utilisation itself is quiet enough."""
    rng = np.random.default_rng(0)
    util = np.clip(5 + 2.5 * rng.standard_normal(40), 0, None)
    t = np.arange(40, dtype=np.int64) * 10**8
    estimate = Series("est:cpu-package", "cpu-package", "W", "power", "estimated",
                      "cpu-util-linear", t, 19 + 76 * util / 100, "cpu")
    machine_util = Series("util:cpu", "utilisation", "%", "gauge", "measured", None, t, util,
                          "machine")
    assert float(np.std(estimate.values) / np.mean(estimate.values)) > 0.03
    clock = FakeClock()
    verdict = wait_for_stable(lambda: [estimate, machine_util], GateThresholds(), clock,
                              clock.sleep)
    assert verdict["passed"] and clock.now < 1.0
    assert {c["sensor"] for c in verdict["checked"]} == {"util:cpu"}
    assert "no temperature sensor: gated on utilisation alone" in verdict["reasons"]


def recorded_gpu_processes(start_s: float, n: int = 20) -> Series:
    """nvml:0:processes_sm as NVML would give it for the recorded H200 work (gpu_calls.csv) done
    by processes other than the program: their busy share of each 0.2 s, from `start_s` on."""
    busy = busy_windows(H200 / "gpu_calls.csv")
    t0 = int(load_trace(H200 / "gpu_samples_energy.csv", "energy_mJ").t_ns[0] + start_s * 1e9)
    t = t0 + np.arange(1, n + 1, dtype=np.int64) * 200_000_000
    share = [100 * overlap(busy, int(x) - 200_000_000, int(x)) / 2e8 for x in t]
    return Series("nvml:0:processes_sm", "gpu-processes", "%", "gauge", "measured", None, t,
                  np.array(share), "gpu:0")


def test_other_processes_computing_on_a_gpu_fail_the_gate_and_it_says_which():
    clock = FakeClock()
    stable = series("nvml:0:power_instant", [130.0] * 20, domain="gpu:0", device="gpu:0")
    gpu = recorded_gpu_processes(start_s=3.0, n=4)  # inside the recorded 0.8 s burst
    result = wait_for_stable(lambda: [stable, gpu], GateThresholds(max_wait_s=3.0, window=4),
                             clock=clock, sleep=clock.sleep)
    assert not result["passed"]
    quiet = next(c for c in result["checked"] if c["check"] == "gpu_quiet")
    assert quiet["value"] > 80 and not quiet["passed"]
    assert any("nvml:0:processes_sm: not quiet: other processes used" in r
               for r in result["reasons"])
    assert not any("gpu:0" in n for n in result["not_checked"])  # it was checked


def test_a_quiet_gpu_passes_and_a_gpu_without_process_data_is_named():
    clock = FakeClock()
    stable = series("nvml:0:power_instant", [130.0] * 20, domain="gpu:0", device="gpu:0")
    idle = recorded_gpu_processes(start_s=0.0, n=14)  # the recorded idle before the work
    result = wait_for_stable(lambda: [stable, idle], GateThresholds(max_wait_s=3.0, window=14),
                             clock=clock, sleep=clock.sleep)
    assert result["passed"] and result["waited_s"] == 0
    assert next(c for c in result["checked"] if c["check"] == "gpu_quiet")["value"] == 0.0
    result = wait_for_stable(lambda: [stable], GateThresholds(max_wait_s=3.0),
                             clock=clock, sleep=clock.sleep)
    assert ("whether other processes use gpu:0: NVML gives no per-process utilisation"
            in result["not_checked"])


def test_a_machine_without_gpu_says_no_gpu():
    clock = FakeClock()
    cpu = series("rapl", [100.0] * 20)
    result = wait_for_stable(lambda: [cpu], GateThresholds(max_wait_s=3.0), clock=clock,
                             sleep=clock.sleep)
    assert "no GPU" in result["reasons"]
    assert not any("GPU" in n for n in result["not_checked"])
