"""The pytest plugin (`pytest --fecomlite`), run on small suites through pytester."""

from __future__ import annotations

import json
import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest

# Loaded here, before pytester's in-process runs (which unload what each run imported, and numpy
# cannot be loaded twice in one process).
import fecomlite.pytest_plugin.instrumentation  # noqa: F401
from fecomlite.pytest_plugin.output import md
from fecomlite.pytest_plugin.settings import SettingsError, parse_fail

pytest_plugins = ["pytester"]

HOOKS = "fecomlite.pytest_plugin.hooks"
# Installed (`pip install -e .`), the entry point loads the plugin; from a checkout, -p does.
PLUGIN = [] if any(e.value == HOOKS for e in entry_points(group="pytest11")) else ["-p", HOOKS]

MODEL = """
import numpy


def features(n):
    return numpy.ones(n)
"""

TESTS = """
import pytest

from mypkg.model import features


def test_features():
    x = features({size})
    assert x.sum() > 0


@pytest.mark.parametrize("k", [1, 2])
def test_small(k):
    assert sum(range(100 * k)) > 0
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path_factory):
    """A project (its package and tests) with a tmp fecomlite home; `size` sets the array."""
    monkeypatch.setenv("FECOMLITE_HOME", str(tmp_path_factory.mktemp("home")))
    pytester.makepyprojecttoml("[tool.fecomlite]\napi = ['numpy']\n")  # numpy calls named
    pytester.mkpydir("mypkg")
    pytester.path.joinpath("mypkg", "model.py").write_text(MODEL)

    def write(size: int) -> pytest.Pytester:
        pytester.makepyfile(test_demo=TESTS.format(size=size))
        return pytester

    return write


def rows(path) -> dict[str, dict]:
    return {t["nodeid"]: t for t in json.loads(path.read_text())["tests"]}


def test_a_tensor_grown_4x_fails_the_memory_gate_naming_the_test_and_the_api(suite):
    pytester = suite(2_000_000)  # 16 MB
    result = pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-save=base.json")
    assert result.ret == 0
    pytester = suite(8_000_000)
    result = pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-compare=base.json",
                                "--fecomlite-fail=memory:5%", "--fecomlite-markdown=sum.md",
                                "--fecomlite-json=now.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # every test passed: the gate failed
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "costlier: 1",
        "*test_demo.py::test_features: host memory peak *APIs: numpy.ones +*",
        "gate memory:5%: FAILED",
    ])
    summary = (pytester.path / "sum.md").read_text()
    assert "**Gate memory:5%: failed**" in summary
    assert "test\\_demo.py::test\\_features" in summary and "numpy.ones" in summary
    now = rows(pytester.path / "now.json")
    peak = now["test_demo.py::test_features"]["memory"]["host_peak_B"][0]
    assert peak > 60e6  # 64 MB of float64
    apis = {a["api"] for a in now["test_demo.py::test_features"]["apis"]}
    assert "numpy.ones" in apis


def test_an_unchanged_suite_measured_twice_passes_with_no_verdict_beyond_noise(suite):
    pytester = suite(2_000_000)
    assert pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-save=again").ret == 0
    result = pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-compare=again",
                                "--fecomlite-fail=memory:5%,energy:10%",
                                "--fecomlite-json=now.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["costlier: none", "cheaper: none", "*passed"])
    comparison = json.loads((pytester.path / "now.json").read_text())["comparison"]
    assert len(comparison["tests"]) == 3 and comparison["failures"] == []
    for test in comparison["tests"]:
        verdicts = [v["verdict"] for v in [*test["memory"].values(), *test["energy"].values()]]
        assert "higher" not in verdicts and "lower" not in verdicts
        energy = test["energy"][test["energy_lead"]]
        assert energy["verdict"] == "no verdict" or "too few" in energy["verdict"]
        assert energy.get("why")  # the reason is said


def test_xdist_workers_give_the_same_rows(suite):
    pytest.importorskip("xdist")
    pytester = suite(1_000_000)
    alone = pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-json=alone.json")
    split = pytester.runpytest(*PLUGIN, "-n", "2", "--fecomlite", "--fecomlite-json=split.json")
    assert alone.ret == split.ret == 0
    a, b = rows(pytester.path / "alone.json"), rows(pytester.path / "split.json")
    assert sorted(a) == sorted(b) == [
        "test_demo.py::test_features", "test_demo.py::test_small[1]", "test_demo.py::test_small[2]"]
    assert {r["repetitions"] for r in b.values()} == {1}
    assert [x["api"] for x in b["test_demo.py::test_features"]["apis"]][:1] == ["numpy.ones"]


def test_a_suite_without_the_option_is_untouched(suite):
    pytester = suite(1000)
    pytester.makepyfile(test_plain="""
        import sys

        def test_nothing_of_fecomlite_runs():
            assert "fecomlite.pytest_plugin.recorder" not in sys.modules
            assert not any("ImportHook" in type(f).__name__ for f in sys.meta_path)
            assert "__fecomlite__" not in globals()
    """)
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    said = [line for line in result.outlines if not line.startswith("plugins:")]
    assert not any("fecomlite" in line for line in said)  # the header lists it, nothing more
    assert not (pytester.path / ".fecomlite").exists()
    assert list(Path(os.environ["FECOMLITE_HOME"]).iterdir()) == []  # no rewrite cache either


def test_only_marked_tests_are_measured_without_the_option(pytester: pytest.Pytester,
                                                           monkeypatch, tmp_path):
    monkeypatch.setenv("FECOMLITE_HOME", str(tmp_path))
    pytester.makepyfile("""
        import pytest

        @pytest.mark.fecomlite
        def test_marked():
            pass

        def test_unmarked():
            pass
    """)
    result = pytester.runpytest(*PLUGIN, "--fecomlite-json=out.json")
    assert result.ret == 0
    assert list(rows(pytester.path / "out.json")) == ["test_only_marked_tests_are_measured_"
                                                      "without_the_option.py::test_marked"]


@pytest.mark.parametrize("text", ["energy", "cpu:5%", "memory:five%", "energy:-1%"])
def test_a_bad_gate_is_one_clear_line(text):
    with pytest.raises(SettingsError, match="--fecomlite-fail"):
        parse_fail(text)


def test_a_gate_is_read_as_fractions():
    assert parse_fail("energy:10%,memory:5") == {"energy": 0.10, "memory": 0.05}


def test_a_missing_baseline_stops_the_session_before_any_test(pytester: pytest.Pytester,
                                                              monkeypatch, tmp_path):
    monkeypatch.setenv("FECOMLITE_HOME", str(tmp_path))
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-compare=nothing")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: no baseline at */pytest-baselines/nothing.json*"])


def test_user_strings_render_as_themselves_in_markdown():
    assert md("test_x[a|b]\x1b[2J <img>") == "test\\_x\\[a\\|b\\]\\[2J &lt;img&gt;"


def test_repetitions_are_measured_and_one_that_fails_leaves_the_outcome(
        pytester: pytest.Pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("FECOMLITE_HOME", str(tmp_path))
    pytester.makepyfile("""
        calls = []

        def test_steady():
            pass

        def test_second_call_fails():
            calls.append(1)
            assert len(calls) == 1
    """)
    result = pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-repeat", "3",
                                "--fecomlite-json=out.json")
    result.assert_outcomes(passed=2)
    by_name = {k.rpartition("::")[2]: v for k, v in rows(pytester.path / "out.json").items()}
    assert by_name["test_steady"]["repetitions"] == 3
    assert len(by_name["test_steady"]["memory"]["host_peak_B"]) == 3
    assert by_name["test_second_call_fails"]["repetitions"] == 1
    assert by_name["test_second_call_fails"]["notes"] == [
        "repetition 2 raised AssertionError: later repetitions skipped"]


def test_an_instrumented_test_module_keeps_pytests_assert_messages(suite):
    pytester = suite(10)
    pytester.makepyfile(test_fails="""
        import numpy

        def test_sum():
            total = numpy.ones(2).sum()
            assert total == 3
    """)
    result = pytester.runpytest(*PLUGIN, "--fecomlite", "--fecomlite-json=out.json",
                                "test_fails.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E       assert *2.0* == 3"])
    [row] = rows(pytester.path / "out.json").values()
    assert row["outcome"] == "failed"
    assert {a["api"] for a in row["apis"]} == {"numpy.ones", "numpy.ndarray.sum"}
