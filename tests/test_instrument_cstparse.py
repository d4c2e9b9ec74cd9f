"""The trusted parse gives libcst's tree, and leaves every other node's checks in place."""

from __future__ import annotations

import threading

import libcst as cst
import pytest

from fecomlite.instrument import cstparse

SOURCE = (
    "import torch\n\n@torch.no_grad()\n"
    "def f(x, *, y=1):  # c\n    return [torch.ones(i) for i in x]\n"
)


def test_same_tree_as_libcst() -> None:
    fast = cstparse.parse_module(SOURCE)
    assert fast.deep_equals(cst.parse_module(SOURCE))
    assert fast.code == SOURCE


def test_nodes_built_by_hand_are_still_checked() -> None:
    cstparse.parse_module(SOURCE)
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")


def test_a_failed_parse_leaves_checks_on() -> None:
    with pytest.raises(cst.ParserSyntaxError):
        cstparse.parse_module("def (:\n")
    with pytest.raises(cst.CSTValidationError):
        cst.Name("1x")


def test_other_threads_keep_their_checks_during_a_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """While one thread parses, a node another thread builds is checked."""
    errors: list[BaseException] = []
    parsing, built = threading.Event(), threading.Event()

    def other() -> None:
        parsing.wait(5)
        try:
            cst.Name("bad name")
        except cst.CSTValidationError as error:
            errors.append(error)
        built.set()

    thread = threading.Thread(target=other)
    thread.start()
    original = cst.parse_module

    def parse_while_other_builds(text: str) -> cst.Module:
        parsing.set()
        built.wait(5)  # the other thread builds its node in the middle of this parse
        return original(text)

    monkeypatch.setattr(cst, "parse_module", parse_while_other_builds)
    cstparse.parse_module(SOURCE)
    thread.join(5)
    assert len(errors) == 1
