"""What a program run in place sees: what `python script.py` gives it, not fecomlite's wiring.

`fecomlite run` starts the program with the import hook's bootstrap (`hookboot/`) on PYTHONPATH
and its settings in FECOMLITE_* variables, and children the program starts must get both. Once
the hook is installed (`hide`), the bootstrap leaves `sys.path` and those variables leave the
program's view (`os.environ`), as in coverage.py's subprocess support but invisible:
- `os.environ` loses them without `unsetenv`: the process's C-level environment keeps them, so
  every child started with the inherited environment (multiprocessing spawn and forkserver,
  DataLoader workers, `subprocess` and `os.system` without `env=`) still installs the hook;
- a child started with an environment of the program's making (`subprocess.Popen(env=...)`,
  e.g. `{**os.environ, "X": "1"}`, as torchrun does) gets them added back
  (`_with_hook`): the bootstrap before its PYTHONPATH, the hook's variables beside its own;
- variables the runner changed for itself (FECOMLITE_VIEW names them, e.g. PYTHONUNBUFFERED,
  which keeps the program's output live through the pipe) show their values from before.
fecomlite's own readers in the program read the hidden values where they keep them
(`runtime.hidden_env`); the probe reads its settings as it is imported, before they are hidden.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fecomlite.runtime import hidden_env

PREFIX = "FECOMLITE_"
VIEW_ENV = "FECOMLITE_VIEW"  # JSON {name: value before the runner set it, or null}


def hide(boot_dir: str) -> None:
    """Take the bootstrap out of `sys.path` and fecomlite's variables out of `os.environ`."""
    if os.environ.get("FECOMLITE_RUN"):  # a measured process: the probe reads them now
        # (imported later, at the first rewritten module with the variables shown for that
        # moment, it left spawned children unmeasured: tried and undone)
        import fecomlite.runtime.probe  # noqa: F401
        import fecomlite.runtime.regions  # noqa: F401
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != boot_dir]
    view = _before_the_runner()
    for name in [n for n in os.environ if n.startswith(PREFIX)]:
        hidden_env.keep(name, os.environ[name])
        _set_in_view(name, None)
    for name, value in view.items():
        _set_in_view(name, value)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p != boot_dir]
    if "PYTHONPATH" in os.environ:
        _set_in_view("PYTHONPATH", os.pathsep.join(paths) if any(paths) else None)
    _patch_subprocess(boot_dir)


def _before_the_runner() -> dict[str, str | None]:
    try:
        view = json.loads(os.environ.get(VIEW_ENV, "{}"))
    except ValueError:
        return {}
    return {str(k): v if isinstance(v, str) else None for k, v in view.items()} \
        if isinstance(view, dict) else {}


def _set_in_view(name: str, value: str | None) -> None:
    """Change what `os.environ` shows, not the C-level environment children inherit."""
    environ: Any = os.environ
    key = environ.encodekey(name)
    if value is None:
        environ._data.pop(key, None)
    else:
        environ._data[key] = environ.encodevalue(value)


def _with_hook(env: Any, boot_dir: str) -> Any:
    """An environment the program made for a child, with the hook's variables and bootstrap."""
    if env is None:
        return None  # the inherited C-level environment has them
    env = dict(env)
    for name, value in hidden_env.hidden().items():
        if name != VIEW_ENV:
            env.setdefault(name, value)
    paths = [p for p in str(env.get("PYTHONPATH", "")).split(os.pathsep) if p]
    if boot_dir not in paths:
        env["PYTHONPATH"] = os.pathsep.join([boot_dir, *paths])
    return env


def _patch_subprocess(boot_dir: str) -> None:
    import subprocess

    execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    if getattr(execute, "__fecomlite__", False):
        return

    def _execute_child(self: Any, args: Any, executable: Any, preexec_fn: Any, close_fds: Any,
                       pass_fds: Any, cwd: Any, env: Any, *rest: Any) -> Any:
        return execute(self, args, executable, preexec_fn, close_fds, pass_fds, cwd,
                       _with_hook(env, boot_dir), *rest)

    _execute_child.__fecomlite__ = True  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = _execute_child  # type: ignore[attr-defined]
