"""This user's running servers on this machine, whatever their home: `fecomlite server status`
lists them and `fecomlite server stop --all` stops them.

Each server links `<registry>/<pid>` to its home while it serves; the registry is
`$XDG_RUNTIME_DIR/fecomlite/servers` (per user, emptied at logout), else
`~/.cache/fecomlite/servers`. A link whose server has gone is removed when read.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from fecomlite.server.state import pid_alive, read_state


def registry_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.expanduser("~/.cache")
    return Path(base) / "fecomlite" / "servers"


def register(pid: int, home: Path) -> Path:
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    link = folder / str(pid)
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(home.resolve())
    return link


def unregister(pid: int) -> None:
    with contextlib.suppress(OSError):
        (registry_dir() / str(pid)).unlink()


def registered_homes() -> list[Path]:
    """The homes of this user's live servers (stale links are removed on the way)."""
    folder = registry_dir()
    homes = []
    for link in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            pid, home = int(link.name), Path(os.readlink(link))
        except (ValueError, OSError):
            continue
        state = read_state(home)
        if state is not None and state.pid == pid and pid_alive(pid):
            homes.append(home)
        else:
            with contextlib.suppress(OSError):
                link.unlink()
    return homes
