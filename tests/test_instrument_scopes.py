"""The fast scope analysis gives exactly what libcst's own providers give."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from fecomlite.instrument import scopes
from fecomlite.instrument.cstwalk import children

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        *(Path(__file__).parent / "instrument_cases").rglob("*.py"),
        *(Path(__file__).parent / "instrument_cases" / "golden").glob("*.py.in"),
        *(REPO / "projects").glob("*/*.py"),
        *(REPO / "fecomlite" / "instrument").glob("*.py"),
    ]
)
# Every kind of target and binding the context rules tell apart.
TARGETS = r"""
import os.path as osp, json
from a import (b as c, d)
a, (b, *c) = [d, e] = f[g:h, i] = j.k = l
m: n[o] = p
q += r.s[t]
del u, v.w, x[y]
for (z, *aa) in bb: pass
async def cc(dd, /, ee: ff = gg, *hh, ii=jj, **kk) -> ll:
    async for mm in nn: pass
    async with oo as (pp, qq), rr as ss.tt: pass
    return [uu for vv, ww in xx if (yy := zz)]
class Aa(Bb, metaclass=Cc):
    global Dd
    def ee(self): g = lambda ff=gg: ff
try: pass
except (Hh, Ii) as jj: pass
match kk:
    case [ll, *mm] if nn: pass
    case {"oo": pp, **qq}: pass
    case Rr(ss=tt) as uu: pass
print(f"{vv!r:>{ww}}", *xx, yy=zz, **aaa)
"""
# Calls whose arguments libcst reads as type hints (the only calls it names while walking).
TYPING = """
import typing as t
from typing import NewType, TypeVar, cast as c
UserId = NewType("UserId", "Model")
T = TypeVar("T", bound="Model")
x = c("Model", y)
z = t.cast("list[Model]", [])
class Model: pass
"""
CASES = [*(p.read_text() for p in SOURCES), TARGETS, TYPING]
IDS = [*(p.name for p in SOURCES), "targets", "typing"]


def _own_nodes(node: cst.CSTNode, found: set[int]) -> set[int]:
    found.add(id(node))
    for child in children(node):
        _own_nodes(child, found)
    return found


def _summary(module: cst.Module, mapping: object) -> list[tuple[object, ...]]:
    """Every node's scope kind, and every access with the assignments it sees.

    Only nodes of the module's own tree count (inside annotations libcst parses string
    contents into new nodes on each run, which no two runs share), trivia left out (it holds
    no names, and the fast analysis does not walk it)."""
    own = _own_nodes(module, set())
    table = {node: scope for node, scope in dict(mapping).items() if id(node) in own}  # type: ignore[call-overload]
    kinds = sorted((id(node), type(scope).__name__) for node, scope in table.items())
    accesses = []
    for scope in {id(s): s for s in table.values() if s is not None}.values():
        for access in scope.accesses:
            if id(access.node) not in own:
                continue
            seen = sorted((r.name, id(getattr(r, "node", None))) for r in access.referents)
            accesses.append((id(access.node), access.node.value, tuple(seen)))
    return [tuple(kinds), tuple(sorted(accesses))]


@pytest.mark.parametrize("source", CASES, ids=IDS)
def test_same_scopes_as_libcst(source: str) -> None:
    module = cst.parse_module(source)
    stock = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    assert _summary(module, scopes.resolve_scopes(module, source)) == _summary(module, stock)


def test_falls_back_to_libcst_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    module = cst.parse_module("import torch\n\ndef f(x):\n    return torch.ones(x)\n")
    fast = _summary(module, scopes.resolve_scopes(module))
    monkeypatch.setattr(scopes, "ScopeVisitor", None)
    assert _summary(module, scopes.resolve_scopes(module)) == fast
