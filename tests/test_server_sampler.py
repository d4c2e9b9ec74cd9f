"""The sampler alone: schedules, threads, recording windows and what reaches the store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from test_server_support import FakeSensorForTests

from fecomlite.sensors._files import KernelFile
from fecomlite.sensors.base import GAUGE, BaseSensor
from fecomlite.server import capture
from fecomlite.server.sampler import Sampler, SamplingRates
from fecomlite.store import Store


def counts(store_path: Path, run_id: int) -> dict[str, int]:
    with Store(store_path) as store:
        rows = store.db.execute(
            "SELECT s.name, count(x.t_ns) FROM sensors s LEFT JOIN samples x ON x.sensor_id=s.id "
            "WHERE s.run_id=? GROUP BY s.name", (run_id,))
        return {name: n for name, n in rows}


def new_run(folder: Path) -> tuple[Path, int]:
    """A store in `folder` with one run in it."""
    path = folder / "store.sqlite"
    with Store(path) as store:
        return path, store.create_run(program="p")


def record_for(sampler: Sampler, run: int, seconds: float) -> None:
    """Start the sampler, record `run` for `seconds`, then close it."""
    sampler.start()
    try:
        sampler.record(run)
        time.sleep(seconds)
        sampler.stop_recording(run)
    finally:
        sampler.close()


def test_intervals_follow_each_sensors_update_period_within_caps():
    rates = SamplingRates()
    nvml_energy = FakeSensorForTests("e", kind="counter", unit="J", period_s=0.1)
    rapl = FakeSensorForTests("r", kind="counter", unit="J", period_s=0.001)
    rss = FakeSensorForTests("m", domain="process-memory", unit="B", kind="gauge",
                             period_s=0.002)
    slow_temp = FakeSensorForTests("t", domain="temperature", unit="C", kind="gauge",
                                   period_s=5.0)
    assert rates.interval(nvml_energy) == 0.05  # twice per update
    assert rates.interval(rapl) == rates.min_interval_s == 0.01  # capped at 100 Hz
    assert rates.interval(rss) == 0.005  # process memory: capped at 200 Hz instead
    assert rates.interval(slow_temp) == 0.5


def test_samples_are_stored_only_while_a_run_records(tmp_path: Path):
    path, run = new_run(tmp_path)
    power = FakeSensorForTests("p", value=lambda t: 10.0 + t)
    sampler = Sampler([power], path, flush_s=0.05)
    sampler.start()
    try:
        time.sleep(0.2)
        assert power.reads == 0  # parked: nothing records
        sampler.record(run)
        time.sleep(0.3)
        sampler.stop_recording(run)  # flushes first
        stored = counts(path, run)["p"]
        assert 15 <= stored <= 40  # ~0.3 s at 100 Hz (period 20 ms: read every 10 ms)
        time.sleep(0.2)
        assert counts(path, run)["p"] == stored
    finally:
        sampler.close()
    with Store(path) as store:
        row = store.sensors(run)[0]
        assert (row["name"], row["domain"], row["unit"], row["kind"], row["period_s"]) == (
            "p", "cpu-package", "W", "power", 0.02)
        rows = store.db.execute("SELECT t_ns, value FROM samples ORDER BY t_ns").fetchall()
    t, v = [r[0] for r in rows], [r[1] for r in rows]
    assert v == sorted(v)  # the values the sensor gave, in time order
    gaps = sorted(b - a for a, b in zip(t, t[1:], strict=False))
    assert 8e6 <= gaps[len(gaps) // 2] <= 13e6  # on a 10 ms grid


def test_a_slow_sensor_reads_on_its_own_thread_and_does_not_delay_the_others(tmp_path: Path):
    path, run = new_run(tmp_path)

    def slow_read(t: float) -> float:
        time.sleep(0.02)  # like NVML's energy counter (~4 ms), only worse
        return t

    slow = FakeSensorForTests("nvml:0:energy", kind="counter", unit="J", period_s=0.02,
                              slow=True, value=slow_read)
    rss = FakeSensorForTests("proc:rss", domain="process-memory", unit="B", kind="gauge",
                             period_s=0.005)
    record_for(Sampler([slow, rss], path, flush_s=0.05), run, 0.4)
    assert len(slow.read_threads) == len(rss.read_threads) == 1
    assert slow.read_threads != rss.read_threads
    n = counts(path, run)
    assert n["proc:rss"] >= 50  # ~80 at 200 Hz, whatever the slow sensor does
    assert 8 <= n["nvml:0:energy"] <= 22


def test_a_new_process_group_replaces_the_old_and_the_reader_closes_it(tmp_path: Path):
    path, run = new_run(tmp_path)
    machine = FakeSensorForTests("util:cpu", domain="utilisation", unit="%", kind="gauge")
    first = FakeSensorForTests("proc:rss", domain="process-memory", unit="B", kind="gauge",
                               value=lambda t: 1.0)
    second = FakeSensorForTests("proc:rss", domain="process-memory", unit="B", kind="gauge",
                                value=lambda t: 2.0)
    sampler = Sampler([machine], path, flush_s=0.05)
    sampler.start()
    try:
        sampler.record(run)
        sampler.set_group("process", [first])
        time.sleep(0.15)
        sampler.set_group("process", [second])
        time.sleep(0.15)
        sampler.flush()
        assert first.closed_in in first.read_threads  # closed by its reader, not by this thread
        assert first.closed_in != threading.get_ident()
        reads_after_close = first.reads
        time.sleep(0.05)
        assert first.reads == reads_after_close
        sampler.stop_recording(run)
    finally:
        sampler.close()
    with Store(path) as store:
        values = {v for (v,) in store.db.execute(
            "SELECT DISTINCT value FROM samples JOIN sensors ON sensors.id=sensor_id "
            "WHERE name='proc:rss'")}
        assert values == {1.0, 2.0}  # one sensors row, both processes' samples
        assert [s["name"] for s in store.sensors(run)].count("proc:rss") == 1
    assert second.closed_in is not None  # closed at the end


def test_a_failing_sensor_is_counted_and_the_others_go_on(tmp_path: Path):
    path, run = new_run(tmp_path)

    def broken(t: float) -> float:
        raise OSError("gone")

    bad = FakeSensorForTests("bad", value=broken)
    good = FakeSensorForTests("good")
    sampler = Sampler([bad, good], path, flush_s=0.05)
    sampler.start()
    try:
        sampler.record(run)
        time.sleep(0.15)
        sampler.stop_recording(run)
    finally:
        sampler.close()
    assert sampler.errors["bad"] >= 3
    assert counts(path, run)["good"] >= 3


def test_sensors_due_together_are_read_in_one_wake_up_on_a_fixed_grid(tmp_path: Path):
    path, run = new_run(tmp_path)
    fast_times: list[float] = []
    slow_times: list[float] = []
    fast = FakeSensorForTests("proc:rss", domain="process-memory", unit="B", kind="gauge",
                              period_s=0.005, value=lambda t: fast_times.append(time.monotonic()))
    slow = FakeSensorForTests("temp", domain="temperature", unit="C", kind="gauge",
                              period_s=0.1, value=lambda t: slow_times.append(time.monotonic()))
    record_for(Sampler([fast, slow], path, flush_s=0.05), run, 1.0)
    assert 120 <= len(fast_times) <= 210  # 200 Hz: the tick (a loaded machine skips some)
    gaps = sorted(b - a for a, b in zip(slow_times, slow_times[1:], strict=False))
    assert 0.045 <= gaps[len(gaps) // 2] <= 0.06  # every 10th tick: its 50 ms interval
    # each slow read follows a fast read of the same tick (reads at their own times would lie
    # 1.25 ms from the nearest fast read, in the median)
    nearest = sorted(min(abs(t - f) for f in fast_times) for t in slow_times)
    assert nearest[len(nearest) // 2] < 0.0005


def test_the_writer_commits_while_a_run_records_without_being_asked(tmp_path: Path):
    path, run = new_run(tmp_path)
    sampler = Sampler([FakeSensorForTests("p")], path, flush_s=0.1)
    sampler.start()
    try:
        sampler.record(run)
        deadline = time.monotonic() + 2.0  # flushes every 0.1 s: the live view reads these
        while not counts(path, run).get("p") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counts(path, run).get("p", 0) > 0
    finally:
        sampler.close()


class RateSensorForTests(BaseSensor):
    """Work counted in a file (a regular file standing for /proc/stat) since the previous read,
    as a utilisation is: the tick thread may read it."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="rate", domain="utilisation", unit="%", kind=GAUGE,
                         device="machine", nominal_period_s=0.02, watch_period=False)
        self.file = KernelFile(path, size=16)
        self.last = self.file.read_int()

    def _read(self) -> float:
        now = self.file.read_int()
        value, self.last = now - self.last, now
        return float(value)

    def restart(self) -> None:
        self.last = self.file.read_int()

    def kernel_files(self) -> list[KernelFile]:
        return [self.file]


@pytest.mark.parametrize("use_ticker", [True, False], ids=["tick thread", "python tick"])
def test_no_rate_reading_spans_the_pause_between_two_runs(tmp_path: Path, use_ticker: bool):
    if use_ticker and not capture.AVAILABLE:
        pytest.skip("fecomlite.server._ticker is not built")
    counter = tmp_path / "work"
    counter.write_text("0")
    path, first = new_run(tmp_path)
    with Store(path) as store:
        second = store.create_run(program="p")
    sampler = Sampler([RateSensorForTests(counter)], path, flush_s=0.05, use_ticker=use_ticker)
    sampler.start()
    try:
        sampler.record(first)
        time.sleep(0.3)
        sampler.stop_recording(first)
        time.sleep(0.3)  # parked
        counter.write_text("1000")  # work done between the runs
        sampler.record(second)
        time.sleep(0.3)
        sampler.stop_recording(second)
    finally:
        sampler.close()
    with Store(path) as store:
        (sensor,) = store.sensors(second)
        values = [v for _, v in store.samples(sensor["id"])]
    assert values and set(values) == {0.0}  # the 1000 was done before the run began
