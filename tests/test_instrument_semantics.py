"""Instrumented code behaves exactly like the original.

* every sample script of tests/instrument_cases/scripts and every project's train.py: the
  original and the instrumented copy, each run in its own process with the real probe, print
  the same stdout, exit the same way, raise the same exception from the same user lines;
* generated call expressions (hypothesis): every argument is evaluated once, in the original
  order, and every framework call goes through the probe exactly once, just before it runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fecomlite.instrument.names import Roots
from fecomlite.instrument.project import instrument_path
from fecomlite.instrument.transform import instrument_source

REPO = Path(__file__).resolve().parents[1]
CASES = Path(__file__).parent / "instrument_cases"
SCRIPTS = sorted((CASES / "scripts").glob("*.py"))
PROJECT_SCRIPTS = sorted((REPO / "projects").glob("*/train.py"))
FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$', re.M)
RUN_TIMEOUT_S = 240


def _start(script: Path, cwd: Path, spool: Path) -> subprocess.Popen[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{CASES}:{REPO}",
        "PYTHONHASHSEED": "0",
        "FECOMLITE_SPOOL": str(spool),
        "HOME": str(cwd),
        "OMP_NUM_THREADS": "1",  # two runs share the CPUs: no oversubscription
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _run_both(original: Path, instrumented: Path, tmp: Path) -> tuple[tuple[int, str, str], ...]:
    """Both runs at once (each project takes seconds), each in its own working folder."""
    runs = []
    for name, script in (("original", original), ("instrumented", instrumented)):
        cwd = tmp / f"work-{name}"
        cwd.mkdir()
        runs.append(_start(script, cwd, tmp / f"{name}.spool"))
    results = []
    for process in runs:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
        results.append((process.returncode, stdout, stderr))
    return tuple(results)


def _user_frames(stderr: str, script: Path) -> list[tuple[str, str]]:
    """(line, function) of the traceback frames in the user's script itself."""
    return [
        (m["line"], m["func"])
        for m in FRAME.finditer(stderr)
        if Path(m["file"]).name == script.name
    ]


def _last_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else ""


def _check_same_behaviour(script: Path, copy_root: Path, source_root: Path, tmp: Path) -> None:
    copy = copy_root / script.relative_to(source_root)
    (code, out, err), (code_i, out_i, err_i) = _run_both(script, copy, tmp)
    assert code_i == code, err_i
    assert out_i == out
    if code != 0:
        assert _last_line(err_i) == _last_line(err)
        assert _user_frames(err_i, script) == _user_frames(err, script)


def test_sample_scripts_exist() -> None:
    assert {p.name for p in SCRIPTS} >= {"constructs.py", "objects.py", "uncaught.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_sample_script_behaves_the_same(script: Path, tmp_path: Path) -> None:
    result = instrument_path(script.parent, tmp_path / "copy", ["fakeapi", "math", "json"])
    assert result.ok, result.failures
    _check_same_behaviour(script, result.out, script.parent, tmp_path)
    if any(site["file"] == script.name for site in result.sites.values()):
        assert (tmp_path / "instrumented.spool").stat().st_size > 0  # the real probe ran


def test_traceback_points_at_the_users_lines(tmp_path: Path) -> None:
    script = CASES / "scripts" / "uncaught.py"
    result = instrument_path(script, tmp_path / "copy", ["fakeapi"])
    (code, _, err), (code_i, _, err_i) = _run_both(script, result.out / script.name, tmp_path)
    assert code == code_i == 1
    assert _last_line(err_i) == _last_line(err) == "ValueError: boom 6"
    assert (
        _user_frames(err_i, script)
        == _user_frames(err, script)
        == [("18", "<module>"), ("14", "level_one"), ("7", "level_two")]
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", PROJECT_SCRIPTS, ids=lambda p: p.parent.name)
def test_project_behaves_the_same(script: Path, tmp_path: Path) -> None:
    result = instrument_path(script.parent, tmp_path / "copy")
    assert result.ok, result.failures
    assert any(site["file"] == script.name for site in result.sites.values())
    _check_same_behaviour(script, result.out, script.parent, tmp_path)


# ----------------------------------------------------------------------------- evaluate once

PROGRAM = """\
import fakeapi as fa


def t(value):
    TRACE.append(f"t({{value!r}})")  # TRACE: the log, given by the test (not an API name)
    return value


def body():
    return {expression}


try:
    RESULT = repr(body())
except Exception as error:
    RESULT = f"{{type(error).__name__}}: {{error}}"
"""
DIRECT_CALL = re.compile(r"^(f|g|boom|Thing\[\d+\]\.m|Thing\[\d+\]\(\))\(")


def expressions() -> st.SearchStrategy[str]:
    leaves = st.sampled_from(["t(1)", "t(2)", "'s'", "[t(3)]", "None"])

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        args = st.lists(inner, max_size=3)
        api = st.sampled_from(["fa.f", "fa.g"])
        return st.one_of(
            st.builds(lambda fn, a: f"{fn}({', '.join(a)})", api, args),
            st.builds(lambda fn, a, k: f"{fn}({a}, key={k})", api, inner, inner),
            st.builds(lambda a, b: f"fa.f({a}).m({b})", inner, inner),
            st.builds(lambda a, b: f"fa.f({a})({b})", inner, inner),
            st.builds(lambda a: f"[fa.g({a}, i) for i in range(2)]", inner),
            st.builds(lambda a: f"(lambda q: fa.g(q, {a}))(t(5))", inner),
            st.builds(lambda a, b: f"({a} if t(0) else {b})", inner, inner),
            st.builds(lambda a: f"(w := fa.g({a}))", inner),
            st.builds(lambda a, b, c: f"fa.g(*[{a}, {b}], **{{'k': {c}}})", inner, inner, inner),
            st.builds(lambda a: f"fa.f(x for x in [{a}, t(4)])", inner),
            st.builds(lambda a: f"fa.boom({a})", inner),
            st.builds(lambda a: f'f"{{fa.g({a})!r}}"', inner),
        )

    return st.recursive(leaves, extend, max_leaves=8)


def _probe_stand_in(log: list[str]) -> types.ModuleType:
    """Replaces the real probe in this process only: records which site ran, then calls."""
    module = types.ModuleType("ProbeStandInForTests")

    def call(site, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        log.append(f"probe {site}")
        return fn(*args, **kwargs)

    def dcall(site, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        """As the real one: `call` for the framework's callee, the plain call for others."""
        if getattr(fn, "__module__", None) == "fakeapi":
            return call(site, fn, *args, **kwargs)
        return fn(*args, **kwargs)

    module.call = call  # type: ignore[attr-defined]
    module.dcall = dcall  # type: ignore[attr-defined]
    return module


@contextmanager
def _stand_in(log: list[str]) -> Iterator[None]:
    """The stand-in is what `import fecomlite.runtime.probe as __fecomlite__` finds, both in
    sys.modules and as the package's attribute; both are put back after."""
    import fecomlite.runtime as runtime

    saved = sys.modules.get("fecomlite.runtime.probe"), runtime.__dict__.get("probe")
    stand_in = _probe_stand_in(log)
    sys.modules["fecomlite.runtime.probe"] = stand_in
    runtime.probe = stand_in  # type: ignore[attr-defined]
    sys.path.insert(0, str(CASES))
    try:
        yield
    finally:
        sys.path.remove(str(CASES))
        if saved[0] is None:
            sys.modules.pop("fecomlite.runtime.probe", None)
        else:
            sys.modules["fecomlite.runtime.probe"] = saved[0]
        if saved[1] is None:
            runtime.__dict__.pop("probe", None)
        else:
            runtime.probe = saved[1]  # type: ignore[attr-defined]


def _execute(source: str, log: list[str]) -> str:
    import fakeapi

    fakeapi.LOG, fakeapi.CALLS[0] = log, 0
    namespace: dict[str, object] = {"__name__": "generated", "TRACE": log}
    exec(compile(source, "generated.py", "exec"), namespace)  # noqa: S102
    return str(namespace["RESULT"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions())
def test_each_expression_is_evaluated_once_in_order(expression: str) -> None:
    source = PROGRAM.format(expression=expression)
    try:
        compile(source, "generated.py", "exec")
    except SyntaxError:
        assume(False)  # e.g. a walrus inside a comprehension's iterable
    rewrite = instrument_source(source, "generated.py", Roots(["fakeapi"]))
    named = [site for site in rewrite.sites if site["kind"] != "call"]  # not run-time decided
    assert bool(named) == ("fa." in expression)
    original_log: list[str] = []
    instrumented_log: list[str] = []
    with _stand_in(original_log):
        original = _execute(source, original_log)
    with _stand_in(instrumented_log):
        instrumented = _execute(rewrite.text or source, instrumented_log)
    assert instrumented == original
    assert [e for e in instrumented_log if not e.startswith("probe ")] == original_log
    # every framework call went through the probe once, just before it ran
    calls = [e for e in instrumented_log if e.startswith("probe ") or DIRECT_CALL.match(e)]
    assert calls[0::2] == [e for e in calls if e.startswith("probe ")]
    assert all(DIRECT_CALL.match(e) for e in calls[1::2]) and len(calls) % 2 == 0
    keys = {str(site["key"]) for site in rewrite.sites}
    assert {e.removeprefix("probe ") for e in calls[0::2]} <= keys
