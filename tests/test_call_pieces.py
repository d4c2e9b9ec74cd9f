"""A call recorded in pieces (a layer's span cut apart where other layers' work ran) counts
once: the probe marks every piece after the first, the runtime marks them, and the analysis
counts, averages and totals calls, not pieces."""

from __future__ import annotations

import threading
from array import array

import numpy as np
import pytest

from fecomlite.analysis import run_analysis as an
from fecomlite.analysis.pieces import call_heads
from fecomlite.runtime.batch_codec import CONTINUES, RAISED
from fecomlite.runtime.layers.spans import nest
from fecomlite.runtime.layers.tf_graph import _Span, steps
from fecomlite.runtime.layers.torch_hooks import _Backward
from fecomlite.store import Store

MS = 1_000_000
LAYER = "layer:sequential/dense (Dense)"
OTHER = "layer:sequential/dense_1 (Dense)"
FIT = "region:fit"


def add_events(store: Store, run_id: int, events: list[tuple[str, int, int, int]]) -> None:
    names = sorted({e[0] for e in events})
    n = len(events)
    store.add_batch(
        run_id,
        {"sites": names, "rep": 1, "pid": 4242},
        {
            "site": np.array([names.index(e[0]) for e in events]),
            "t_start_ns": np.array([e[1] for e in events]),
            "t_end_ns": np.array([e[2] for e in events]),
            "tid": np.full(n, 7, np.uint64),
            "status": np.array([e[3] for e in events], np.uint8),
            "in_bytes": np.full(n, -1),
            "out_bytes": np.full(n, -1),
        },
    )


def test_a_call_in_pieces_is_one_call_its_time_and_energy_summed(tmp_path):
    """Three steps under `fit`; in each, `dense` ran in two pieces around `dense_1` (the second
    marked CONTINUES), and in the last step its second piece raised. 2 W throughout."""
    with Store(tmp_path / "s.sqlite") as store:
        run_id = store.create_run(program="train.py", level="method", idle={})
        sensor = store.add_sensor(
            run_id,
            name="est:cpu-process",
            domain="cpu-process",
            unit="W",
            kind="power",
            provenance="estimated",
            model="process-cpu-share",
            period_s=0.1,
        )
        start, end = 1_000 * MS, 5_000 * MS
        grid = np.arange(start, end + 1_000 * MS, 100 * MS)
        store.add_samples([(sensor, int(t), 2.0) for t in grid])
        store.upsert_repetition(
            run_id, 1, t_start_ns=start, t_end_ns=end, tail_end_ns=end + 500 * MS, exit_code=0
        )
        events = [(FIT, 1_000 * MS, 4_900 * MS, 0)]
        for step, (a, b) in enumerate(((200, 200), (400, 200), (600, 400))):
            t = (1_100 + 1_200 * step) * MS  # dense a ms, dense_1 300 ms, dense again b ms
            last = RAISED if step == 2 else 0
            events += [
                (LAYER, t, t + a * MS, 0),
                (OTHER, t + a * MS, t + (a + 300) * MS, 0),
                (LAYER, t + (a + 300) * MS, t + (a + 300 + b) * MS, CONTINUES | last),
            ]
        add_events(store, run_id, events)
        result = an.analyse_run(store, run_id, method="overlap")
    row = next(r for r in result.apis if r["api"] == LAYER)
    assert row["calls"] == 3 and row["raised"] == 1
    assert row["total_time_s"] == pytest.approx(0.4 + 0.6 + 1.0)
    assert row["mean_time_s"] == pytest.approx((0.4 + 0.6 + 1.0) / 3)
    per_call = row["energy"]["cpu-process"]["per_call"]
    assert per_call["mean"] == pytest.approx(2.0 * 2.0 / 3, rel=0.02)  # 2 W × the calls' time
    assert per_call["median"] == pytest.approx(2.0 * 0.6, rel=0.02)  # of calls, not pieces
    assert next(r for r in result.apis if r["api"] == OTHER)["calls"] == 3
    # the pieces stay events of their own: each nests under fit, and fit holds them all
    dense = np.flatnonzero(result.calls["api"] == result.api_names.index(LAYER))
    assert dense.size == 6 and all(
        result.api_names[result.calls["api"][p]] == FIT for p in result.calls["parent"][dense]
    )


def test_a_continuation_joins_the_call_before_it_of_its_site_and_thread_only():
    # rows: site 0 thread 1 (call, piece), site 0 thread 2 (a piece with no call before it on
    # its thread: a call), site 1 thread 1 (call), site 0 thread 1 (call, piece); by start
    rep = np.ones(7, np.int64)
    pid = np.ones(7, np.int64)
    tid = np.array([1, 2, 1, 1, 1, 1, 1])
    site = np.array([0, 0, 0, 1, 0, 0, 1])
    t0 = np.arange(7)
    status = np.array([0, CONTINUES, CONTINUES, 0, 0, CONTINUES, CONTINUES])
    assert call_heads(rep, pid, tid, site, t0, status).tolist() == [0, 1, 0, 3, 4, 4, 3]


def test_a_sibling_cut_out_of_a_span_leaves_pieces_after_the_first_marked():
    root = _Backward("layer-backward:M/root (R)", None, 0, begin=0, end=120)
    a = _Backward("layer-backward:M/root.a (A)", root, 1, begin=0, end=100)
    a_fc = _Backward("layer-backward:M/root.a.fc (L)", a, 2, begin=20, end=70)
    b = _Backward("layer-backward:M/root.b (B)", root, 1, begin=30, end=60)
    got = [
        (s.site.split("/")[1].split(" ")[0], s.begin, s.continues) for s in nest([root, a, a_fc, b])
    ]
    assert sorted(got) == [
        ("root", 0, False),
        ("root.a", 0, False),
        ("root.a", 60, True),
        ("root.a.fc", 20, False),
        ("root.a.fc", 60, True),
        ("root.b", 30, False),
    ]


def test_a_layer_s_spans_in_one_step_are_one_call_whatever_ran_between():
    """Steps (outermost function runs, one nested in another) at 0..100 and 200..300; a span
    at 150 lies in no step (its run's event was lost where two profiler windows meet)."""
    spans = [
        _Span(LAYER, None, 0, 10, 20),
        _Span(OTHER, None, 0, 20, 30),
        _Span(LAYER, None, 0, 40, 50),  # same step: continues
        _Span(LAYER, None, 0, 150, 160),  # between steps: a call of its own
        _Span(LAYER, None, 0, 170, 180),  # the same gap: continues
        _Span(LAYER, None, 0, 210, 220),  # the next step
        _Span(LAYER, None, 0, 280, 290),
    ]
    marked = steps(spans, [(0, 100), (5, 95), (200, 300)])
    assert [(s.begin, s.continues) for s in marked if s.site == LAYER] == [
        (10, False),
        (40, True),
        (150, False),
        (170, True),
        (210, False),
        (280, True),
    ]
    assert [s.continues for s in marked if s.site == OTHER] == [False]


def test_the_probe_records_a_span_on_the_thread_it_is_given():
    from fecomlite.runtime import _fastprobe
    from fecomlite.runtime.probe import _PythonBuffer

    python = _PythonBuffer()
    for record, drain in ((python.record, python.drain), (_fastprobe.record, _fastprobe.drain)):
        record("a", 1, 2)
        record("b", 3, 4, CONTINUES, -1, -1, 77)
        record("c", 5, 6, tid=99)
        columns = drain()
        assert columns[0] == ["a", "b", "c"]
        assert array("Q", columns[4]).tolist() == [threading.get_ident(), 77, 99]
        assert list(columns[5]) == [0, CONTINUES, 0]


def test_a_profiler_window_is_cut_between_steps_never_inside_one():
    """A cut asked for while a step runs waits for its end; a step that begins meanwhile waits
    for the cut (so no step's ops fall between two profiler sessions)."""
    from fecomlite.runtime.layers.tf_graph import StepGate

    gate = StepGate()
    release, order = threading.Event(), []

    def running_step():
        order.append("step begins")
        release.wait()
        order.append("step ends")

    first = threading.Thread(target=gate.step, args=(running_step,))
    first.start()
    while gate.running == 0:  # the step is in
        release.wait(0.001)
    cut = threading.Thread(target=gate.cut, args=(lambda: order.append("cut"),))
    cut.start()
    while not gate.cutting:  # the cut is waiting for the step
        release.wait(0.001)
    second = threading.Thread(target=gate.step, args=(lambda: order.append("next step"),))
    second.start()
    release.set()
    for thread in (first, cut, second):
        thread.join()
    assert order == ["step begins", "step ends", "cut", "next step"]


def test_continuations_pass_the_batch_check_and_count_as_no_call_live_or_in_perfetto(tmp_path):
    from fecomlite.export.perfetto import trace
    from fecomlite.runtime import batch_codec
    from fecomlite.runtime.probe import _PythonBuffer

    python = _PythonBuffer()
    python.record(LAYER, 10, 20)
    python.record(LAYER, 30, 40, CONTINUES | RAISED)
    names, *columns = python.drain()
    header, cols = batch_codec.decode(batch_codec.encode({"rep": 1, "pid": 1}, names, columns))
    assert cols["status"].tolist() == [0, CONTINUES | RAISED]
    python.record(LAYER, 10, 20, 4)  # no such bit
    names, *columns = python.drain()
    with pytest.raises(batch_codec.BatchError):
        batch_codec.decode(batch_codec.encode({"rep": 1, "pid": 1}, names, columns))

    with Store(tmp_path / "s.sqlite") as store:
        run_id = store.create_run(program="train.py", level="method", idle={})
        add_events(
            store,
            run_id,
            [
                (LAYER, 10, 20, 0),
                (LAYER, 30, 40, CONTINUES),
                (LAYER, 50, 60, CONTINUES),
                (LAYER, 70, 80, 0),
            ],
        )
        ((_, _, calls, ns),) = store.new_calls_by_site_and_process(run_id, 0, 10**9)
        assert (calls, ns) == (2, 40)  # the live view's count: calls; its time: every piece's
        slices = [e for e in trace(store, run_id)["traceEvents"] if e.get("name") == LAYER]
    assert [e["args"].get("piece") for e in slices] == [None, 2, 3, None]
    assert [e["args"].get("call_ts") for e in slices[1:3]] == [slices[0]["ts"]] * 2
