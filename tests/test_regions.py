"""`fecomlite.region` inside a run: spans recorded per thread, nested, recursive, raised; with
the C hot path and without it (the pure-Python stack)."""

from __future__ import annotations

import pytest
from test_probe import run_script

from fecomlite.runtime import batch_codec

WITHOUT_C = "import sys; sys.modules['fecomlite.runtime._fastprobe'] = None\n"
PATHS = {"c": "", "python": WITHOUT_C}


def spans(tmp_path) -> list[tuple[str, int, int, int, int]]:
    """(site, t0, t1, thread, status) of every spooled event, by end time."""
    out = []
    with open(tmp_path / "events.spool", "rb") as f:
        for record in batch_codec.read_records(f):
            header, cols = batch_codec.decode(record)
            for i in range(len(cols["site"])):
                out.append(
                    (
                        header["sites"][int(cols["site"][i])],
                        int(cols["t_start_ns"][i]),
                        int(cols["t_end_ns"][i]),
                        int(cols["tid"][i]),
                        int(cols["status"][i]),
                    )
                )
    return sorted(out, key=lambda e: e[2])


def run_in_a_run(tmp_path, body: str, path: str):
    result = run_script(tmp_path, PATHS[path] + body, FECOMLITE_RUN="1")
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("path", PATHS)
def test_one_object_entered_inside_itself_records_nested_spans(tmp_path, path):
    run_in_a_run(
        tmp_path,
        """
import time, fecomlite
from fecomlite.runtime import regions
r = fecomlite.region("r")
with r:
    time.sleep(0.01)
    with r:
        time.sleep(0.01)
    time.sleep(0.01)
""",
        path,
    )
    events = [e for e in spans(tmp_path) if e[0] == "region:r"]
    assert len(events) == 2
    inner, outer = events  # the inner one ends first
    assert outer[1] < inner[1] < inner[2] < outer[2]
    assert (inner[2] - inner[1]) / 1e9 >= 0.01 and (outer[2] - outer[1]) / 1e9 >= 0.03


@pytest.mark.parametrize("path", PATHS)
def test_one_object_on_two_threads_keeps_each_threads_start(tmp_path, path):
    """A enters, then B; A leaves while B is inside: A's span must start at A's start."""
    run_in_a_run(
        tmp_path,
        """
import threading, time, fecomlite
r = fecomlite.region("reused")
b_inside, a_left = threading.Event(), threading.Event()
def a():
    with r:
        time.sleep(0.02)
        threading.Thread(target=b).start()
        b_inside.wait()
    a_left.set()
def b():
    with r:
        b_inside.set()
        a_left.wait()
        time.sleep(0.01)
t = threading.Thread(target=a); t.start(); t.join()
time.sleep(0.1)
""",
        path,
    )
    first, second = [e for e in spans(tmp_path) if e[0] == "region:reused"]
    assert first[3] != second[3], "the two spans must be on two threads"
    assert first[1] < second[1] < first[2] < second[2]  # A: [a0, a1], B: [b0, b1], a0<b0<a1<b1


@pytest.mark.parametrize("path", PATHS)
def test_a_raised_exception_propagates_and_is_recorded(tmp_path, path):
    result = run_in_a_run(
        tmp_path,
        """
import fecomlite
@fecomlite.region("load")
def load(x):
    if x < 0:
        raise ValueError(x)
    return x * 2
print(load(4))
try:
    with fecomlite.region("block"):
        load(-1)
except ValueError as exc:
    print("caught", exc)
""",
        path,
    )
    assert result.stdout.split() == ["8", "caught", "-1"]
    status = {(e[0], e[4]) for e in spans(tmp_path)}
    assert status == {("region:load", 0), ("region:load", 1), ("region:block", 1)}


def test_the_c_region_is_used_when_built(tmp_path):
    result = run_in_a_run(
        tmp_path, "import fecomlite\nprint(type(fecomlite.region('x')).__mro__[1])", "c"
    )
    assert "fecomlite.runtime._fastprobe.Region" in result.stdout


def test_outside_a_run_a_region_costs_nothing_and_records_nothing(tmp_path):
    result = run_script(
        tmp_path,
        """
import sys, fecomlite
with fecomlite.region("r"):
    pass
print("fecomlite.runtime.probe" in sys.modules, "fecomlite.runtime._fastprobe" in sys.modules)
""",
    )
    assert result.stdout.split() == ["False", "False"]
    assert not (tmp_path / "events.spool").exists()
