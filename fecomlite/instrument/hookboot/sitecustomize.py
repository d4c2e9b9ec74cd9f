"""Put on a measured program's PYTHONPATH by `fecomlite run`: every Python the program starts
installs the project's import hook (`fecomlite.instrument.importhook`), then runs the
`sitecustomize` this one hides, if any (e.g. a distribution's own); then leaves the program's
sight (`fecomlite.instrument.hookview`)."""

import importlib
import os
import sys


def _install_hook() -> None:
    try:
        from fecomlite.instrument.importhook import install_from_environment

        install_from_environment()
    except Exception:  # never stop the program from starting: it runs as written
        pass


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    kept = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if mine is not None:
            sys.modules["sitecustomize"] = mine
    finally:
        sys.path[:] = kept


def _hide() -> None:
    try:
        from fecomlite.instrument.hookview import hide

        hide(os.path.dirname(os.path.abspath(__file__)))
    except Exception:  # never stop the program from starting
        pass


_install_hook()
_chain()
_hide()  # after the chained sitecustomize: the program sees the path Python gives it
