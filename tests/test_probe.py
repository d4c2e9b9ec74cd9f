"""The probe runtime alone: behaviour preserved, events recorded, spooled without a server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fecomlite.runtime.probe as probe
from fecomlite.runtime import batch_codec
from fecomlite.runtime.capture import DataSizeHandler, nbytes_of

CALLS = [probe.call, probe._python_call]
IDS = ["native" if probe._native is not None else "native-missing", "python"]


def drained() -> tuple[list[str], dict[str, np.ndarray]]:
    names, *columns = probe.drain_columns()
    batch = batch_codec.encode({"rep": 0, "pid": 0}, names, tuple(columns))
    header, cols = batch_codec.decode(batch)
    return header["sites"], cols


@pytest.fixture(autouse=True)
def _empty_buffer():
    probe.drain_columns()
    yield
    probe.drain_columns()


def test_native_hot_path_was_built():
    assert probe._native is not None, "the C hot path did not build: pip install -e . needs gcc"


@pytest.mark.parametrize("call", CALLS, ids=IDS)
def test_returns_what_the_function_returns_and_passes_every_argument(call):
    def f(*args, **kwargs):
        return args, kwargs

    for _ in range(5):  # sized calls first, then the fast path; keywords named like the probe's
        assert call("t:1:0", f, 1, 2, fn="x", site="y") == ((1, 2), {"fn": "x", "site": "y"})


@pytest.mark.parametrize("call", CALLS, ids=IDS)
def test_exceptions_propagate_unchanged_and_are_recorded(call):
    error = KeyError("boom")

    def fail():
        raise error

    for _ in range(5):
        with pytest.raises(KeyError) as caught:
            call("t:2:0", fail)
        assert caught.value is error
    sites, cols = drained()
    assert sites == ["t:2:0"]
    assert cols["status"].tolist() == [1] * 5


@pytest.mark.parametrize("call", CALLS, ids=IDS)
def test_events_carry_site_thread_and_monotonic_interval(call):
    before = probe._now()
    for i in range(10):
        call("t:3:0", abs, -i)
    after = probe._now()
    sites, cols = drained()
    assert sites == ["t:3:0"] and len(cols["site"]) == 10
    assert (cols["t_start_ns"] >= before).all() and (cols["t_end_ns"] <= after).all()
    assert (cols["t_end_ns"] >= cols["t_start_ns"]).all()
    assert np.all(np.diff(cols["t_start_ns"]) >= 0)
    import threading

    assert set(cols["tid"].tolist()) == {threading.get_ident()}


def test_first_calls_of_a_site_are_sized_then_timestamps_only():
    array = np.zeros((100, 10), dtype=np.float32)
    for _ in range(probe.SLOW_CALLS_PER_SITE + 3):
        probe.call("t:4:0", np.add, array, array)
    _, cols = drained()
    n = probe.SLOW_CALLS_PER_SITE
    assert cols["in_bytes"][:n].tolist() == [8000] * n
    assert cols["out_bytes"][:n].tolist() == [4000] * n
    assert cols["in_bytes"][n:].tolist() == [-1] * 3


def test_sizes_come_from_shape_and_dtype_of_each_framework():
    torch = pytest.importorskip("torch")
    assert nbytes_of((torch.zeros(8, 4, dtype=torch.float64),), {}) == 256
    assert nbytes_of(([np.zeros(3, np.int16), np.zeros(5, np.int8)],), {"k": np.zeros(2)}) == 27


def test_data_size_cut_keeps_the_first_fraction_of_rows():
    handler = DataSizeHandler(0.25)
    x = np.arange(40).reshape(20, 2)
    args, kwargs = handler.before(None, (x, 3), {"y": np.arange(20)})
    assert args[0].shape == (5, 2) and args[1] == 3 and kwargs["y"].tolist() == [0, 1, 2, 3, 4]


def test_malformed_batches_are_refused():
    names, *columns = (["a"], *(b"" for _ in range(7)))
    good = batch_codec.encode({"rep": 1}, names, tuple(columns))
    assert batch_codec.decode(good)[0]["n"] == 0
    for bad in (b"", b"\xff\xff\xff\xff{}", good[:-1] + b"x" + b"\0" * 3, good + b"\0"):
        with pytest.raises(batch_codec.BatchError):
            batch_codec.decode(bad)


def run_script(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    full_env.update(FECOMLITE_SPOOL=str(tmp_path / "events.spool"), **env)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def spooled(tmp_path: Path) -> tuple[list[dict], int]:
    headers, total = [], 0
    with open(tmp_path / "events.spool", "rb") as f:
        for record in batch_codec.read_records(f):
            header, cols = batch_codec.decode(record)
            headers.append(header)
            total += len(cols["site"])
    return headers, total


def test_without_a_server_events_are_spooled_and_the_program_finishes(tmp_path):
    result = run_script(
        tmp_path,
        """
        import math
        import fecomlite.runtime.probe as __fecomlite__
        print(sum(__fecomlite__.call("prog.py:3:0", math.sqrt, i) for i in range(1000)))
    """,
        FECOMLITE_URL="http://127.0.0.1:9",
        FECOMLITE_RUN="7",
        FECOMLITE_TOKEN="tok",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(sum(__import__("math").sqrt(i) for i in range(1000)))
    headers, total = spooled(tmp_path)
    assert total == 1000
    assert {h["run"] for h in headers} == {"7"}
    assert not any("token" in h for h in headers)  # a spool never carries the run's token


def test_an_uncaught_exception_keeps_the_events_before_it(tmp_path):
    result = run_script(
        tmp_path,
        """
        import fecomlite.runtime.probe as __fecomlite__
        for i in range(50):
            __fecomlite__.call("prog.py:3:0", abs, i)
        raise RuntimeError("halfway")
    """,
    )
    assert result.returncode == 1 and "RuntimeError: halfway" in result.stderr
    assert spooled(tmp_path)[1] == 50


def test_sigterm_flushes_before_the_process_dies(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent("""
        import sys, time
        import fecomlite.runtime.probe as __fecomlite__
        __fecomlite__.FLUSH_EVERY_S = 3600
        for i in range(20):
            __fecomlite__.call("prog.py:4:0", abs, i)
        print("ready", flush=True)
        time.sleep(60)
    """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env["FECOMLITE_SPOOL"] = str(tmp_path / "events.spool")
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert spooled(tmp_path)[1] == 20


def test_region_records_only_inside_a_run(tmp_path):
    body = """
        import fecomlite
        with fecomlite.region("epoch"):
            pass
        @fecomlite.region("load")
        def load():
            return 5
        print(load())
    """
    outside = run_script(tmp_path, body)
    assert outside.stdout.strip() == "5" and not (tmp_path / "events.spool").exists()
    inside = run_script(tmp_path, body, FECOMLITE_RUN="3")
    assert inside.stdout.strip() == "5"
    headers, total = spooled(tmp_path)
    assert total == 2 and set(headers[0]["sites"]) == {"region:epoch", "region:load"}


def test_an_awaited_call_is_timed_to_the_end_of_its_await(tmp_path):
    result = run_script(
        tmp_path,
        """
        import asyncio
        import fecomlite.runtime.probe as __fecomlite__

        async def nap(seconds, value):
            await asyncio.sleep(seconds)
            return value

        async def fail():
            await asyncio.sleep(0.01)
            raise KeyError("late")

        async def main():
            print(await __fecomlite__.acall("prog.py:12:0", nap, 0.05, value="done"))
            try:
                await __fecomlite__.acall("prog.py:14:0", fail)
            except KeyError as exc:
                print("caught", exc)

        asyncio.run(main())
    """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["done", "caught 'late'"]
    with open(tmp_path / "events.spool", "rb") as f:
        (header, cols), = [batch_codec.decode(r) for r in batch_codec.read_records(f)]
    spans = {header["sites"][s]: (e - b, status)
             for s, b, e, status in zip(cols["site"], cols["t_start_ns"], cols["t_end_ns"],
                                        cols["status"], strict=True)}
    assert spans["prog.py:12:0"][0] >= 50e6 and spans["prog.py:12:0"][1] == 0  # the whole await
    assert spans["prog.py:14:0"][0] >= 10e6 and spans["prog.py:14:0"][1] == 1
