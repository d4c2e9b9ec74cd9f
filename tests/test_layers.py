"""fecomlite.runtime.layers without a framework: site keys, facts, the import watcher, stack
repair."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import SimpleNamespace

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
    spans = [encoder, layer1, layer0, norm2, attn]
    nest(spans)
    assert_stack(spans)
    assert (layer0.begin, layer0.end) == (100, 200) and (norm2.begin, norm2.end) == (100, 130)
    assert (encoder.begin, encoder.end) == (1, 200)


def assert_stack(spans) -> None:
    """Each span inside its parent; any two disjoint or nested (a call stack on one thread)."""
    for s in spans:
        assert s.begin <= s.end
        if s.parent is not None:
            assert s.parent.begin <= s.begin and s.end <= s.parent.end
        for other in spans:
            disjoint = s.end <= other.begin or other.end <= s.begin
            nested = (s.begin <= other.begin and other.end <= s.end) or (
                other.begin <= s.begin and s.end <= other.end
            )
            assert disjoint or nested, (s.site, other.site)


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
