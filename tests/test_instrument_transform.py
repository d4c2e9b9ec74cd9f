"""The source rewrite: golden files per construct, and the invariants every rewrite keeps.

Golden pairs live in tests/instrument_cases/golden/<case>.py.in / .py.out (reviewed by hand;
they are not linted, since wrapped lines run long). Roots: the test stand-in `fakeapi`, and
`tensorflow` for the graph-compiled case (resolved statically; TensorFlow is not imported).
"""

from __future__ import annotations

import ast
import tokenize
from io import StringIO
from pathlib import Path

import pytest

from fecomlite.instrument import transform
from fecomlite.instrument.names import Roots
from fecomlite.instrument.transform import (
    IMPORT,
    SourceError,
    instrument_source,
    split_lines,
)

GOLDEN = Path(__file__).parent / "instrument_cases" / "golden"
CASES = sorted(p.name.removesuffix(".py.in") for p in GOLDEN.glob("*.py.in"))
ROOTS = Roots(["fakeapi", "tensorflow"])


def _comments(text: str) -> list[str]:
    tokens = tokenize.generate_tokens(StringIO(text).readline)
    return [t.string for t in tokens if t.type == tokenize.COMMENT]


def test_golden_cases_are_present() -> None:
    assert len(CASES) >= 20, CASES


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    source = (GOLDEN / f"{case}.py.in").read_text()
    expected = (GOLDEN / f"{case}.py.out").read_text()
    result = instrument_source(source, "t.py", ROOTS)
    assert result.text == expected


@pytest.mark.parametrize("case", CASES)
def test_rewrite_keeps_lines_comments_and_parses(case: str) -> None:
    source = (GOLDEN / f"{case}.py.in").read_text()
    result = instrument_source(source, "t.py", ROOTS)
    assert result.text is not None
    ast.parse(result.text)
    shifted = any("line numbers shift" in note for note in result.notes)
    assert len(split_lines(result.text)) == len(split_lines(source)) + (1 if shifted else 0)
    assert _comments(result.text) == _comments(source)
    assert result.text.count(IMPORT) == 1
    for site in result.sites:  # every key sits on the line it names
        line = int(str(site["key"]).split(":")[1].split("#")[0]) + (1 if shifted else 0)
        assert f'"{site["key"]}"' in split_lines(result.text)[line - 1] or (
            f"'{site['key']}'" in split_lines(result.text)[line - 1]
        )


def test_outside_the_wrapped_calls_the_text_is_unchanged() -> None:
    source = "import fakeapi as fa\nx  =  fa.g( 1 ,2 )   # spacing kept\n"
    result = instrument_source(source, "t.py", ROOTS)
    assert result.text == (
        f"{IMPORT}; import fakeapi as fa\n"
        'x  =  __fecomlite__.call("t.py:2:6", fa.g,  1 ,2 )   # spacing kept\n'
    )


def test_calls_outside_roots_builtins_and_super_are_not_wrapped() -> None:
    source = (
        "import json\nimport fakeapi as fa\n\n\nclass A(fa.Layer):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        print(len(json.dumps([fa.g()])))\n"
    )
    result = instrument_source(source, "t.py", ROOTS)
    assert [s["written"] for s in result.sites] == ["super().__init__", "fa.g"]


def test_a_file_that_imports_no_root_is_left_alone() -> None:
    assert instrument_source("import os\nos.getcwd()\n", "t.py", ROOTS).text is None
    assert instrument_source("", "t.py", ROOTS).text is None


def test_instrumenting_instrumented_code_is_refused() -> None:
    once = instrument_source("import fakeapi as fa\nfa.g()\n", "t.py", ROOTS).text
    assert once is not None
    with pytest.raises(SourceError, match="already instrumented"):
        instrument_source(once, "t.py", ROOTS)


def test_syntax_errors_carry_line_and_column() -> None:
    with pytest.raises(SourceError) as caught:
        instrument_source("import fakeapi\n\ndef f(:\n    pass\n", "t.py", ROOTS)
    assert (caught.value.line, caught.value.col) == (3, 7)


def test_same_position_keys_count_from_the_innermost_call() -> None:
    result = instrument_source("import fakeapi as fa\nfa.f(1)(2)(3)\n", "t.py", ROOTS)
    keys = {str(s["key"]): s["source"] for s in result.sites}
    assert set(keys) == {"t.py:2:0", "t.py:2:0#2", "t.py:2:0#3"}
    # the innermost call, fa.f(1), evaluated first, keeps the plain key
    assert result.text is not None
    assert '__fecomlite__.call("t.py:2:0", fa.f, 1)' in result.text


def test_non_ascii_lines_get_character_columns() -> None:
    source = "import fakeapi as fa\nx = ('é', fa.g())\n"
    result = instrument_source(source, "t.py", ROOTS)
    assert [s["key"] for s in result.sites] == ["t.py:2:10"]
    assert result.text is not None and "'é', __fecomlite__.call(" in result.text


def test_crlf_line_endings_are_kept() -> None:
    source = "if True:\r\n    import fakeapi as fa\r\n    fa.g()\r\n"  # the import needs a line
    result = instrument_source(source, "t.py", ROOTS)
    assert result.text is not None
    assert result.text.count("\r\n") == 4 and "\n" not in result.text.replace("\r\n", "")


@pytest.mark.parametrize("case", CASES)
def test_libcst_positions_give_the_same_rewrite(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """When CPython's and libcst's calls do not pair up, libcst's own positions are used."""
    source = (GOLDEN / f"{case}.py.in").read_text()
    monkeypatch.setattr(transform, "_spans_from_ast", lambda *args: None)
    assert instrument_source(source, "t.py", ROOTS).text == (GOLDEN / f"{case}.py.out").read_text()


@pytest.mark.parametrize("case", CASES)
def test_cpython_positions_pair_up(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path: CPython's calls (``_ast_calls``) pair one-to-one with libcst's, so
    libcst's position pass is never needed on these sources."""
    source = (GOLDEN / f"{case}.py.in").read_text()

    def refuse(*args: object) -> None:
        raise AssertionError("fell back to libcst's positions")

    monkeypatch.setattr(transform, "_spans_from_libcst", refuse)
    assert instrument_source(source, "t.py", ROOTS).text == (GOLDEN / f"{case}.py.out").read_text()
