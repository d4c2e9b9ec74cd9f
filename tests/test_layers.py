"""fecomlite.runtime.layers without a framework: site keys, facts, the import watcher, stack
repair."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from fecomlite.runner.settings import RunSettings
from fecomlite.runtime.layers import facts, layer_env, on_import
from fecomlite.runtime.layers.keras_hooks import _own_scope
from fecomlite.runtime.layers.spans import nest
from fecomlite.runtime.layers.tf_graph import Scopes, op_spans, profiler_logs_dropped
from fecomlite.runtime.layers.torch_hooks import _Backward
from fecomlite.store import _site_from_key


def test_site_keys_name_model_path_and_class_and_parse_back():
    key = facts.site_key(facts.BACKWARD, "Net", "encoder.layers.0.self_attn", "MultiheadAttention")
    assert key == "layer-backward:Net/encoder.layers.0.self_attn (MultiheadAttention)"
    assert facts.parse(key) == {
        "phase": "backward",
        "model": "Net",
        "path": "encoder.layers.0.self_attn",
        "class": "MultiheadAttention",
    }
    assert facts.parse("region:epoch") is None
    assert facts.parse("train.py:3:4") is None


def test_a_keras_layer_s_key_names_its_driving_call():
    key = facts.site_key(facts.FORWARD, "sequential", "block/dense", "Dense", "evaluate")
    assert key == "layer:sequential/block/dense (Dense) in evaluate"
    assert facts.parse(key) == {"phase": "forward", "model": "sequential",
                                "path": "block/dense", "class": "Dense", "driver": "evaluate"}
    back = facts.driven("layer-backward:sequential/dense (Dense)", "fit")
    assert facts.parse(back)["driver"] == "fit" and facts.parse(back)["class"] == "Dense"
    assert facts.driven("layer:m/d (Dense)", None) == "layer:m/d (Dense)"
    assert _site_from_key(key)["written"] == "block/dense (Dense) in evaluate"


def test_store_names_layer_sites_as_layers():
    row = _site_from_key("layer:functional/dense_1 (Dense)")
    assert row == {
        "api": "layer:functional/dense_1 (Dense)",
        "written": "dense_1 (Dense)",
        "kind": "layer",
    }
    assert _site_from_key("layer-backward:Net/head (Linear)")["written"] == "head (Linear) backward"
    assert _site_from_key("train.py:1:0") == {"api": "train.py:1:0"}


def test_facts_are_sent_when_they_change_and_maxima_only_grow():
    table = facts.FactsTable()
    site = "layer:Net/fc (Linear)"
    table.update(site, params=10, saved_bytes_max=100, compiled=None)
    first = table.take_changed()
    assert first == {
        site: {
            "phase": "forward",
            "model": "Net",
            "path": "fc",
            "class": "Linear",
            "params": 10,
            "saved_bytes_max": 100,
        }
    }
    table.update(site, params=10, saved_bytes_max=50)
    assert table.take_changed() == {}
    table.update(site, saved_bytes_max=400)
    assert table.take_changed()[site]["saved_bytes_max"] == 400


def test_merge_keeps_maxima_across_batches_and_ignores_foreign_keys():
    stored = facts.merge({}, {"layer:M/a (A)": {"saved_bytes_max": 300, "params": 4}})
    stored = facts.merge(
        stored,
        {"layer:M/a (A)": {"saved_bytes_max": 200, "params": 4}, "train.py:1:0": {"params": 1}},
    )
    assert stored == {"layer:M/a (A)": {"saved_bytes_max": 300, "params": 4}}


def test_overlapping_backward_spans_are_made_to_nest():
    """As recorded from nn.TransformerEncoder: one graph node's pre-hooks end layers.1 (t=100)
    just after layers.0 and its norm2 began (t=99); layers.0 has no span end of its own."""
    encoder = _Backward("layer-backward:M/encoder (E)", None, 1, begin=1, end=1)
    layer1 = _Backward("layer-backward:M/encoder.layers.1 (L)", encoder, 2, begin=2, end=100)
    layer0 = _Backward("layer-backward:M/encoder.layers.0 (L)", encoder, 2, begin=120)
    norm2 = _Backward("layer-backward:M/encoder.layers.0.norm2 (N)", layer0, 3, begin=99, end=130)
    attn = _Backward(
        "layer-backward:M/encoder.layers.0.self_attn (A)", layer0, 3, begin=140, end=200
    )
    spans = nest([encoder, layer1, layer0, norm2, attn])
    assert_stack(spans)
    got = {s.site.split("/")[1].split(" ")[0]: (s.begin, s.end) for s in spans}
    assert got["encoder.layers.0"] == (100, 200) and got["encoder.layers.0.norm2"] == (100, 130)
    assert got["encoder"] == (1, 200)


def test_a_sibling_s_backward_inside_another_s_is_cut_out_of_it_not_nested_in_it():
    """Parallel branches: the gradient reaches branch b (t=30..60) while a's span (0..100) is
    open; a layer of a ran inside b's time too. Each instant goes to one layer."""
    root = _Backward("layer-backward:M/root (R)", None, 0, begin=0, end=120)
    a = _Backward("layer-backward:M/root.a (A)", root, 1, begin=0, end=100)
    a_fc = _Backward("layer-backward:M/root.a.fc (L)", a, 2, begin=20, end=70)
    b = _Backward("layer-backward:M/root.b (B)", root, 1, begin=30, end=60)
    spans = nest([root, a, a_fc, b])
    assert_stack(spans)
    got = sorted((s.site.split("/")[1].split(" ")[0], s.begin, s.end) for s in spans)
    assert got == [
        ("root", 0, 120),
        ("root.a", 0, 30),
        ("root.a", 60, 100),
        ("root.a.fc", 20, 30),
        ("root.a.fc", 60, 70),
        ("root.b", 30, 60),
    ]
    pieces = [s for s in spans if s.site.endswith("fc (L)")]
    assert all(p.parent.site.endswith("root.a (A)") for p in pieces)
    assert pieces[0].parent is not pieces[1].parent  # each in the piece of a that holds it


def assert_stack(spans) -> None:
    """Each span inside its parent; two spans nest only when one is the other's ancestor, else
    they are disjoint (a call stack on one thread, and the model's tree)."""

    def ancestors(s):
        up = s.parent
        while up is not None:
            yield up
            up = up.parent

    for s in spans:
        assert s.begin <= s.end
        if s.parent is not None:
            assert any(p is s.parent for p in spans), s.site
            assert s.parent.begin <= s.begin and s.end <= s.parent.end
        for other in spans:
            if other is s or any(up is other for up in ancestors(s)):
                continue
            if any(up is s for up in ancestors(other)):
                continue
            assert s.end <= other.begin or other.end <= s.begin, (s.site, other.site)


def graph_scopes() -> Scopes:
    """As Keras traces `net` = first (Dense) → block (Block: a, b) in a compiled step."""
    scopes = Scopes()
    scopes.add("net_1", "net", "", "Functional", 100)
    scopes.add("net_1/first_1", "net", "first", "Dense", 10)
    scopes.add("net_1/block_1", "net", "block", "Block", 80)
    scopes.add("net_1/block_1/a_1", "net", "block/a", "Dense", 40)
    scopes.add("net_1/block_1/b_1", "net", "block/b", "Dense", 40)
    return scopes


FIRST, BLOCK = "layer:net/first (Dense)", "layer:net/block (Block)"
A, B = "layer:net/block/a (Dense)", "layer:net/block/b (Dense)"


def test_op_names_map_to_the_layers_they_ran_in_and_gradient_ops_to_backward():
    scopes = graph_scopes()
    chain = scopes.chain
    assert chain("StatefulPartitionedCall/net_1/first_1/Relu:_FusedMatMul") == (FIRST,)
    assert chain("StatefulPartitionedCall/net_1/block_1/a_1/MatMul:MatMul") == (BLOCK, A)
    assert chain("net_1/block_1/Relu:Relu") == (BLOCK,)  # the block's own op
    assert chain(
        "StatefulPartitionedCall/gradient_tape/net_1/block_1/b_1/MatMul/MatMul_1:MatMul"
    ) == (
        "layer-backward:net/block (Block)",
        "layer-backward:net/block/b (Dense)",
    )
    assert chain("StatefulPartitionedCall/adam/Sqrt_4:Sqrt") == ()
    assert chain("StatefulPartitionedCall/compile_loss/mse/Mean:Mean") == ()
    assert chain("net_1/block_1_2/Relu:Relu") == ()  # another scope, not this block's


def test_a_layer_s_consecutive_ops_form_one_span_nested_in_its_parent_s():
    """Two executor threads: ops of neighbouring layers overlap, optimizer ops interleave."""
    ops = [
        (0, 10, (FIRST,)),
        (8, 12, (FIRST,)),  # overlaps the first op: same span
        (11, 20, (BLOCK, A)),  # starts before first ended
        (13, 14, ()),  # an optimizer op neither ends nor joins a span
        (21, 22, (BLOCK,)),
        (23, 30, (BLOCK, B)),
        (29, 35, (BLOCK, B)),
        (40, 50, (FIRST,)),  # the next step
    ]
    spans = op_spans(ops)
    assert [s.site for s in spans] == [FIRST, BLOCK, A, B, FIRST]
    assert_stack(spans)
    first, block, a, b, again = spans
    assert (first.begin, first.end) == (0, 12)
    assert a.parent is block and b.parent is block and block.parent is None
    assert (block.begin, block.end) == (12, 35)  # starts where first ended
    assert (b.begin, b.end) == (23, 35) and (again.begin, again.end) == (40, 50)


BACK = {name: name.replace("layer:", "layer-backward:") for name in (FIRST, BLOCK, A, B)}


def test_gradient_ops_of_two_layers_run_at_once_give_spans_that_do_not_nest():
    """Two inter-op threads: b's gradient op (0..100) runs while first's (30..60) and a's
    (70..90) do; first is no part of block, so its span may not nest in block's."""
    ops = [
        (0, 100, (BACK[BLOCK], BACK[B])),
        (30, 60, (BACK[FIRST],)),
        (70, 90, (BACK[BLOCK], BACK[A])),
        (110, 120, (BACK[FIRST],)),
    ]
    spans = op_spans(ops)
    assert_stack(spans)
    got = sorted((s.site, s.begin, s.end) for s in spans)
    assert got == sorted(
        [
            (BACK[BLOCK], 0, 30),
            (BACK[B], 0, 30),
            (BACK[FIRST], 30, 60),
            (BACK[BLOCK], 60, 70),
            (BACK[B], 60, 70),
            (BACK[BLOCK], 70, 90),  # a's ops began a span of block's of their own
            (BACK[A], 70, 90),
            (BACK[BLOCK], 90, 100),
            (BACK[B], 90, 100),
            (BACK[FIRST], 110, 120),
        ]
    )


CHAINS = [(FIRST,), (BLOCK,), (BLOCK, A), (BLOCK, B), (BACK[FIRST],), (BACK[BLOCK], BACK[B]), ()]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 200), st.integers(0, 60), st.sampled_from(CHAINS)), max_size=25
    )
)
def test_graph_spans_form_the_model_s_tree_and_hold_every_layer_op(raw):
    """Any op events, however they overlap: spans nest only in their layers' ancestors, never
    overlap otherwise (so no instant counts twice), and every instant a layer op ran is in a
    top-level span."""
    ops = [(t0, t0 + dt, chain) for t0, dt, chain in raw]
    spans = op_spans(ops)
    assert_stack(spans)
    tops = [s for s in spans if s.parent is None]
    for t0, t1, chain in ops:
        for t in range(t0, t1) if chain else ():
            assert any(s.begin <= t < s.end for s in tops), (t, chain)
    for s in spans:
        assert s.parent is None or s.parent.site in CHAINS_PARENT[s.site]


CHAINS_PARENT = {chain[-1]: {chain[-2]} if len(chain) > 1 else set() for chain in CHAINS if chain}


def test_a_traced_layer_s_scope_is_read_from_its_output_op():
    def out(name):
        return SimpleNamespace(name=name)

    assert _own_scope("", "net", out("net_1/head_1/BiasAdd:0")) == "net_1"
    assert _own_scope("net_1", "dense", [out("net_1/dense_1/Relu:0")]) == "net_1/dense_1"
    assert _own_scope("net_1", "dense_1", out("net_1/dense_1_2/BiasAdd:0")) == "net_1/dense_1_2"
    assert _own_scope("net_1/block_1", "a", {"y": out("net_1/block_1/a_1/MatMul:0")}) == (
        "net_1/block_1/a_1"
    )
    # a layer that returns its input (or another layer's tensor) has no op of its own
    assert _own_scope("net_1", "dropout", out("net_1/dense_1/Relu:0")) is None
    assert _own_scope("net_1", "dense", out("other/dense_1/Relu:0")) is None
    assert _own_scope("net_1", "dense", 3.0) is None


def test_only_the_profiler_s_log_lines_are_dropped_from_stderr(capfd):
    import os
    import threading

    lines = [
        b"I0000 00:00:1796105114.280292   24583 profiler_session.cc:132] Profiler session.\n",
        b"the program's own line\n",
        b"W0000 00:00:1796105135.583533   25312 session_manager.cc:55] host_tracer_level expects\n",
        b"I0000 00:00:1796105095.773083   24583 cpu_feature_guard.cc:227] This TensorFlow binary\n",
    ]
    with profiler_logs_dropped():
        os.write(2, lines[0])
        other = threading.Thread(target=os.write, args=(2, lines[1] * 5000))  # > a pipe's 64 KiB
        other.start()
        other.join()
        os.write(2, lines[2] + lines[3])
    assert capfd.readouterr().err.encode() == lines[1] * 5000 + lines[3]


def test_watcher_runs_the_callback_after_the_module_executed(tmp_path, monkeypatch):
    (tmp_path / "fakeframework.py").write_text("READY = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    on_import.when_imported({"fakeframework": lambda m: seen.append(m.READY)})
    try:
        assert seen == []
        module = importlib.import_module("fakeframework")
        assert seen == [True]
        assert not isinstance(module.__spec__.loader, on_import._Loader)
        assert not any(isinstance(f, on_import._Watcher) for f in sys.meta_path)
    finally:
        sys.modules.pop("fakeframework", None)


def test_a_spec_looked_up_without_importing_does_not_use_up_the_callback(tmp_path, monkeypatch):
    """TensorFlow calls `importlib.util.find_spec("keras")` before it imports Keras."""
    (tmp_path / "fakeframework3.py").write_text("X = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    on_import.when_imported({"fakeframework3": lambda m: seen.append(m.X)})
    try:
        assert importlib.util.find_spec("fakeframework3") is not None
        assert seen == []
        importlib.import_module("fakeframework3")
        assert seen == [3]
        assert not any(isinstance(f, on_import._Watcher) for f in sys.meta_path)
    finally:
        sys.modules.pop("fakeframework3", None)


def test_a_failing_callback_does_not_fail_the_import(tmp_path, monkeypatch):
    (tmp_path / "fakeframework2.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(module):
        raise RuntimeError("tracer bug")

    on_import.when_imported({"fakeframework2": broken})
    try:
        assert importlib.import_module("fakeframework2").X == 1
    finally:
        sys.modules.pop("fakeframework2", None)


def test_the_setting_reaches_the_program_only_at_method_level():
    assert layer_env(RunSettings()) == {}
    assert layer_env(RunSettings(trace_layers=True)) == {"FECOMLITE_TRACE_LAYERS": "1"}
    assert layer_env(RunSettings(trace_layers=True, level="project")) == {}
