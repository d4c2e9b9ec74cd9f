"""The server state file: how a client finds the running server and proves it may administer it.

`<home>/server.json` holds {pid, port, admin_token, store, view_token}; it is written with mode
0600 (the tokens are secrets) and atomically (a reader never sees half a file).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_NAME = "server.json"


@dataclass(frozen=True)
class ServerState:
    pid: int
    port: int
    admin_token: str
    store: str
    view_token: str = ""  # reads run data (the live view); the admin token does too

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def view_url(self) -> str:
        """The live view's address with its token, as `fecomlite run` prints it."""
        return f"{self.url}/?token={self.view_token}"


def state_path(home: Path) -> Path:
    return home / STATE_NAME


def write_state(home: Path, state: ServerState) -> Path:
    """Write the state file readable by its owner only, replacing any older one atomically."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state_path(home)
    tmp = path.with_name(f".{STATE_NAME}.{state.pid}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(state), f)
    os.chmod(tmp, 0o600)  # an older temp file may have had other bits
    os.replace(tmp, path)
    return path


def read_state(home: Path) -> ServerState | None:
    """The state file's content, or None when it is missing or unreadable (a stale half-write)."""
    try:
        data = json.loads(state_path(home).read_text())
        return ServerState(
            pid=int(data["pid"]), port=int(data["port"]),
            admin_token=str(data["admin_token"]), store=str(data["store"]),
            view_token=str(data.get("view_token", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_state(home: Path, pid: int) -> None:
    """Remove the state file if it still names this server (a newer server may have replaced it)."""
    state = read_state(home)
    if state is not None and state.pid == pid:
        state_path(home).unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
