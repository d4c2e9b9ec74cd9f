"""Instrumenting on the tree rebuilt from ``ast`` gives exactly what libcst's own parse gives."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fecomlite.instrument import astcst, transform
from fecomlite.instrument.names import DEFAULT_ROOTS, Roots

REPO = Path(__file__).resolve().parents[1]
CASES = Path(__file__).parent / "instrument_cases"
SOURCES = sorted(
    [
        *CASES.rglob("*.py"),
        *(CASES / "golden").glob("*.py.in"),
        *(REPO / "projects").glob("*/*.py"),
        *(REPO / "fecomlite" / "instrument").glob("*.py"),
    ]
)
ROOTS = Roots([*DEFAULT_ROOTS, "numpy", "fakeapi", "math", "json"])
# What the rebuilt tree must tell apart as libcst does: quotes of f-strings written in parts,
# a generator as a call's only argument (the rewrite parenthesises it) or not, interleaved
# starred and keyword arguments, positional-only and keyword-only parameters, numbers as written.
CONSTRUCTS = r'''
import math, json as js
from math import *
print(f"{math.sqrt(2)}" ' and ' f'{js.dumps([1])}' rf"""{math.floor(3.5)}""")
total = math.fsum(math.sqrt(x) for x in range(3)) + math.fsum((math.sqrt(x) for x in [1]))
def f(a, /, b=math.pi, *args, c=js.loads("1"), **kw) -> "math.pi":
    return math.hypot(*args, c, **kw, d=1)
for epoch in range(0x0, EPOCHS):
    for step in range(1, steps + 1):
        floor(math.e)
values = {**kw, "k": [*args, math.tau]}
x = lambda y=math.cos(0): math.sin(y)
'''


def _both(text: str, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    tree = transform.parse_check(text, name)
    rebuilt = transform.instrument_source(text, name, ROOTS, None, tree)
    with monkeypatch.context() as patched:

        def refuse(tree: ast.Module, text: str) -> None:
            raise astcst.Unsupported("libcst's own parse")

        patched.setattr(transform, "module_from_ast", refuse)
        parsed = transform.instrument_source(text, name, ROOTS, None, tree)
    return rebuilt, parsed


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_rewrite_is_libcsts(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = path.read_text(encoding="utf-8")
    if transform.PROBE in text:
        pytest.skip("refused either way")
    try:
        astcst.module_from_ast(transform.parse_check(text, path.name), text)
    except astcst.Unsupported as refused:  # (the fixture of nested f-strings)
        pytest.skip(f"not rebuilt: {refused}")
    rebuilt, parsed = _both(text, path.name, monkeypatch)
    assert rebuilt == parsed


def test_constructs_rewrite_as_with_libcst(monkeypatch: pytest.MonkeyPatch) -> None:
    astcst.module_from_ast(ast.parse(CONSTRUCTS), CONSTRUCTS)  # rebuilt, not refused
    rebuilt, parsed = _both(CONSTRUCTS, "constructs.py", monkeypatch)
    assert rebuilt == parsed
    assert rebuilt.text is not None
    assert "for x in range(3)))" in rebuilt.text  # the bare generator, parenthesised
    assert "math.fsum, ((" not in rebuilt.text  # the one in its own parentheses, not again


def test_what_it_cannot_rebuild_is_refused() -> None:
    for text in ("match x:\n    case 1: pass\n", "ﬁle = 1\n", "f'{f\"{x}\"}'\n"):
        with pytest.raises(astcst.Unsupported):
            astcst.module_from_ast(ast.parse(text), text)
