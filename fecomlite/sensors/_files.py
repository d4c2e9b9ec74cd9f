"""Cheap repeated reads of small kernel files (sysfs, procfs): open once, `pread` at offset 0.

Re-opening a file costs several syscalls and a path walk; `pread` on a kept descriptor is one
syscall, and sysfs/procfs regenerate the content on every read at offset 0.
"""

from __future__ import annotations

import os


class KernelFile:
    """One small kernel file kept open for repeated reads."""

    def __init__(self, path: str | os.PathLike[str], size: int = 4096) -> None:
        self.path = os.fspath(path)
        self.size = size
        self.fd = -1
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def read_bytes(self) -> bytes:
        return os.pread(self.fd, self.size, 0)

    def read_int(self) -> int:
        return int(self.read_bytes())

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


def read_text(path: str | os.PathLike[str]) -> str:
    """A whole small file, stripped; for one-off reads at discovery time."""
    with open(path) as f:
        return f.read().strip()
