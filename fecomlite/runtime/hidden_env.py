"""fecomlite's variables in a measured program's environment, kept out of the program's sight.

`fecomlite run` hands the program its settings (FECOMLITE_URL, FECOMLITE_HOOK, ...) through the
environment, but the program must see the environment `python script.py` would give it
(`fecomlite.instrument.hookview`). They are taken out of `os.environ`'s view at start-up and
kept here, for fecomlite's own readers in the program (`fecomlite.measure()`'s carbon
intensity); the process's C-level environment keeps them, for the children it starts.
"""

from __future__ import annotations

import os

_hidden: dict[str, str] = {}


def keep(name: str, value: str) -> None:
    _hidden[name] = value


def hidden() -> dict[str, str]:
    """The variables taken out of the program's view, with their values."""
    return dict(_hidden)


def environment() -> dict[str, str]:
    """The process's environment as fecomlite set it: the program's view and what it hides."""
    return {**_hidden, **os.environ}
