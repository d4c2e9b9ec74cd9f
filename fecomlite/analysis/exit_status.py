"""How a program ended, in a shell's words, for every surface that names it (terminal, report)."""

from __future__ import annotations

import signal


def exit_description(code: int) -> str:
    """How a shell would say the program ended: `exited with status 3`, `was killed by SIGSEGV`."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def shell_status(code: int) -> int:
    """Our own exit status for the program's: 128 + N for a signal, as a shell gives."""
    return 128 - code if code < 0 else (code or 1)
