"""An exception raised in a wrapped call reaches the user as without fecomlite: the same
exception object (type, args, cause, context, groups), a traceback with the user's frames only,
and carets (`^^^^`, `~~~^^^`) under the same characters of the user's line.

The two-file program below raises deep inside wrapped calls: on the sized path (first calls of
a site) and the fast path, awaited (`acall`), chained, grouped, uncaught in a thread and at the
end. It runs
as the original and as the instrumented copy, each in its own process with the real probe (no
server: events go to a spool file), with the C hot path, without it (the pure-Python fallback)
and with GPU synchronisation (its own entry point).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import traceback
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

import fecomlite.runtime.probe as probe
from fecomlite.instrument.project import MANIFEST, ORIGINALS, instrument_path
from fecomlite.runtime import positions as probe_positions

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 120

DEEP = """
    import asyncio
    import math


    def inner(v):
        return {"a": 1}["b"] if v < 0 else math.sqrt(v)


    def checked(v):
        try:
            return inner(v)
        except KeyError as error:
            raise ValueError("bad value", v) from error


    async def fetch(v):
        await asyncio.sleep(0)
        return checked(v)


    def group(v):
        raise ExceptionGroup("many", [ValueError(v), TypeError(v)])


    def tricky(v):
        return math.sqrt(v) / math.floor(v) + 1


    def indexed(v):
        return [math.sqrt(v)][math.floor(v) + 2]


    def multi(v):
        return math.log(
            v,
            math.floor(v))
    """

MAIN = """
    import asyncio
    import math
    import threading
    import traceback

    from deep import checked, fetch, group, indexed, multi, tricky


    def show(error):
        print("".join(traceback.format_exception(error)))
        print(repr(error.args), repr(error.__cause__), repr(error.__context__))


    def run_sync():
        for attempt in range(5):  # the sized path first, then the fast path
            try:
                total = 1.0 + math.prod(map(checked, [2.0, -1.0]))
            except ValueError as error:
                show(error)
            try:
                print(math.floor(math.sqrt(-1.0)))
            except ValueError as error:
                show(error)
            try:
                math.prod(map(group, [1]))
            except ExceptionGroup as error:
                show(error)
            for fn in (tricky, indexed, multi):
                try:
                    math.fsum(map(fn, [0.5]))
                except Exception as error:
                    show(error)


    async def run_async():
        for attempt in range(4):
            try:
                await asyncio.wait_for(fetch(-2.0), timeout=5)
            except ValueError as error:
                show(error)


    def in_thread():
        return math.floor(math.sqrt(-4.0))


    worker = threading.Thread(target=in_thread, name="worker")  # uncaught there
    worker.start()
    worker.join()
    run_sync()
    asyncio.run(run_async())
    x = 1 + math.sqrt(-3.0)
    """

# The program started through `-c`, so that the probe can be imported without its C extension
# first; the original runs the same way (the same runpy frames in both uncaught tracebacks).
START = (
    "import runpy, sys; {prelude}"
    "sys.argv = ['main.py']; runpy.run_path('main.py', run_name='__main__')"
)
MODES = {
    "native": ("", {}),
    "python": ("sys.modules['fecomlite.runtime._fastprobe'] = None; ", {}),
    "gpu-sync": ("", {"FECOMLITE_SYNC": "1"}),
}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tracebacks")
    src = root / "src"
    src.mkdir()
    (src / "deep.py").write_text(dedent(DEEP).lstrip())
    (src / "main.py").write_text(dedent(MAIN).lstrip())
    result = instrument_path(src, root / "copy", ["math", "asyncio"])
    assert result.ok and result.sites, result.failures
    return src, result.out


def _run(folder: Path, mode: str) -> tuple[int, str]:
    prelude, env = MODES[mode]
    process = subprocess.run(
        [sys.executable, "-c", START.format(prelude=prelude)],
        cwd=folder,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(REPO),
            "HOME": str(folder),
            "FECOMLITE_SPOOL": str(folder / "spool.bin"),
            **env,
        },
        text=True,
        capture_output=True,
        timeout=RUN_TIMEOUT_S,
    )
    return process.returncode, process.stdout + process.stderr


@pytest.mark.skipif(sys.version_info < (3, 11), reason="groups and carets are Python 3.11+")
@pytest.mark.parametrize("mode", MODES)
def test_tracebacks_are_the_originals_line_for_line_and_caret_for_caret(
    program: tuple[Path, Path], mode: str
) -> None:
    src, copy = program
    assert "__fecomlite__.acall(" in (copy / "main.py").read_text()
    assert "__fecomlite__.call(" in (copy / "deep.py").read_text()
    original = _run(src, mode)
    code, text = _run(copy, mode)
    instrumented = (code, text.replace(str(copy), str(src)))
    assert original[0] == 1 and "ValueError: math domain error" in original[1]
    assert "~~~~~~~~~~~~~^~~~~~~~~~~~~~~" in original[1]  # carets that name one operator
    assert "^" in original[1] and "ExceptionGroup: many" in original[1]
    assert "Exception in thread worker:" in original[1]
    assert "fecomlite" not in instrumented[1]
    assert instrumented == original


def _user(entry: Any, fn: Any, *args: Any) -> Any:
    return entry("t.py:1:0", fn, *args)


def _deep(v: float) -> float:
    try:
        return {"a": 1.0}["b"]
    except KeyError as error:
        raise ValueError("bad", v) from error


def _frames(error: BaseException) -> list[str]:
    return [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)]


ENTRIES = {
    "call": probe.call,
    "python": probe._python_call,
    "dcall": probe.dcall,  # decided at run time: passed through or probed
    "python-dcall": probe._python_dcall,
}


@pytest.mark.parametrize("entry", ENTRIES.values(), ids=list(ENTRIES))
@pytest.mark.parametrize("fast", [False, True], ids=["sized", "fast"])
def test_the_probes_frames_leave_the_traceback_and_the_exception_is_untouched(
    entry: Any, fast: bool
) -> None:
    if fast:
        probe._fast.add("t.py:1:0")
    else:
        probe._fast.discard("t.py:1:0")
    raised: list[BaseException] = []

    def keep(v: float) -> float:
        try:
            return _deep(v)
        except ValueError as error:
            raised.append(error)
            raise

    try:
        with pytest.raises(ValueError) as caught:
            _user(entry, keep, 2.0)
        assert caught.value is raised[0] and caught.value.args == ("bad", 2.0)
        assert isinstance(caught.value.__cause__, KeyError)
        assert caught.value.__context__ is caught.value.__cause__
        assert _frames(caught.value)[1:] == ["_user", "keep", "_deep"]  # [0]: this test
        with pytest.raises(ZeroDivisionError) as builtin:  # a C callee: no frame of its own
            _user(entry, divmod, 1, 0)
        assert _frames(builtin.value)[1:] == ["_user"]
    finally:
        probe._fast.discard("t.py:1:0")


def test_an_awaited_call_shows_the_awaited_frames_only() -> None:
    async def fetch() -> None:
        await asyncio.sleep(0)
        _deep(3.0)

    async def user() -> None:
        await probe.acall("t.py:2:0", fetch)

    with pytest.raises(ValueError) as caught:
        asyncio.run(user())
    assert _frames(caught.value)[-3:] == ["user", "fetch", "_deep"]
    assert "acall" not in _frames(caught.value)
    assert caught.value.args == ("bad", 3.0) and isinstance(caught.value.__cause__, KeyError)


def _fake_copy(root: Path, original: str, copy: str) -> Path:
    (root / MANIFEST).parent.mkdir(parents=True)
    (root / MANIFEST).write_text("{}")
    (root / ORIGINALS).mkdir(parents=True)
    (root / ORIGINALS / "m.py").write_text(original)
    (root / "m.py").write_text(copy)
    return root / "m.py"


def _formatted(path: Path) -> str:
    namespace: dict[str, Any] = {"__fecomlite__": probe}
    try:
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    except ZeroDivisionError as error:
        return "".join(traceback.format_exception(error))
    raise AssertionError("the program did not raise")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="carets are Python 3.11+")
def test_carets_are_absent_where_the_copy_is_not_the_original_with_wrapped_calls(
    tmp_path: Path,
) -> None:
    probe_positions.serve_original_positions()
    path = _fake_copy(
        tmp_path,
        "import math\nx = 1 + math.floor(0.5) + 2\ny = 1 / math.floor(0.5) + 3\n",
        'import math\nx = 1 + __fecomlite__.call("m.py:2:8", math.floor, 0.5) + 2\n'
        "y = 1 / (2 - 2) + 3\n",  # not the original's expression: no column can be trusted
    )
    text = _formatted(path)
    assert "y = 1 / math.floor(0.5) + 3\n" in text  # the user's line...
    assert "^" not in text and "~" not in text  # ...without markers rather than wrong ones


@pytest.mark.skipif(sys.version_info < (3, 11), reason="carets are Python 3.11+")
def test_a_wrapped_calls_positions_are_the_original_calls(tmp_path: Path) -> None:
    probe_positions.serve_original_positions()
    path = _fake_copy(
        tmp_path,
        "import math\ny = 1 / math.floor(0.5) + 3\n",
        'import math\ny = 1 / __fecomlite__.call("m.py:2:8", math.floor, 0.5) + 3\n',
    )
    mapping = probe_positions.file_map(str(path))
    assert mapping is not None
    assert mapping.positions((2, 2, 8, 55)) == (2, 2, 8, 23)  # the whole call
    assert mapping.positions((2, 2, 39, 49)) == (2, 2, 8, 18)  # its callee
    assert mapping.positions((2, 2, 8, 21)) == (2, 2, None, None)  # inside inserted text
    assert mapping.positions((1, 1, 0, 11)) == (1, 1, 0, 11)  # a line left alone
    carets = "    y = 1 / math.floor(0.5) + 3\n        ~~^~~~~~~~~~~~~~~~~\n"  # under `1 / …`
    assert carets in _formatted(path)
