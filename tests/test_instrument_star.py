"""Star imports: which module a never-bound name comes from, read from the modules' own source.

Hermetic: the framework packages are written into a temporary folder on sys.path; nothing is
imported (a module that ran would leave a marker file, and the test checks there is none).
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from fecomlite.instrument.names import Roots
from fecomlite.instrument.star import star_names
from fecomlite.instrument.transform import instrument_source

PACKAGES = {
    "starfw/__init__.py": """
        open(__file__ + ".ran", "w").close()  # importing this package would leave a marker
        from .layers import *
        from .ops import matmul as mm
        def top(): ...
        _hidden = 1
        if True:
            Picked = 1
        else:
            Other = 2
    """,
    "starfw/layers/__init__.py": """
        __all__ = ["Dense", "Conv"]
        class Dense: ...
        class Conv: ...
        class NotExported: ...
    """,
    "starfw/ops.py": "def matmul(a, b): ...\n",
    "starfw/grown.py": "__all__ = ['a']\n__all__ += ['b']\n",
    "starfw/lazy.py": "def __getattr__(name): ...\n",
    "starfw/made.py": "globals()['made'] = 1\n",
    "starfw/partly.py": "from starfw.lazy import *\ndef own(): ...\n",
    "otherfw/__init__.py": "from .nn import *\n",
    "otherfw/nn.py": "class Linear: ...\nclass Dense: ...\n",
}


@pytest.fixture()
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in PACKAGES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    assert not list(tmp_path.rglob("*.ran")), "a package was imported"


def test_names_from_all_or_from_top_level_bindings_following_star_imports(packages: Path):
    assert star_names("starfw.layers") == {"Dense", "Conv"}  # __all__ decides
    assert star_names("starfw") == {"Dense", "Conv", "mm", "top", "Picked", "Other"}
    assert star_names("starfw.ops") == {"matmul"}


@pytest.mark.parametrize("module", ["starfw.grown", "starfw.lazy", "starfw.made",
                                    "starfw.partly", "starfw.missing", "nosuchfw.layers"])
def test_modules_that_make_names_at_run_time_or_cannot_be_read_are_unknown(packages, module):
    assert star_names(module) is None


def apis(source: str) -> dict[str, str]:
    """written → api of the calls named statically (not those decided at run time)."""
    result = instrument_source(dedent(source), "t.py", Roots(["starfw", "otherfw", "lazyfw"]))
    return {str(s["written"]): str(s["api"]) for s in result.sites if s["kind"] != "call"}


def test_of_two_star_imports_the_last_that_defines_the_name_wins(packages: Path):
    assert apis("""
        from otherfw.nn import *
        from starfw.layers import *
        Dense(1)
        Linear(2)
        NotExported()
    """) == {"Dense": "starfw.layers.Dense", "Linear": "otherfw.nn.Linear"}


def test_a_module_that_cannot_be_read_keeps_pythons_last_wins_order(packages: Path):
    assert apis("""
        from lazyfw.layers import *
        from starfw.layers import *
        Dense(1)
        Anything(2)
    """) == {"Dense": "starfw.layers.Dense", "Anything": "lazyfw.layers.Anything"}
    assert apis("""
        from starfw.layers import *
        from lazyfw.layers import *
        Dense(1)
    """) == {"Dense": "lazyfw.layers.Dense"}  # lazyfw may define Dense too: Python's order
