"""The measured process and its descendants, with one kept-open /proc file per member.

`fecomlite run` starts the user's program as a child, and the program may start its own
workers (data loaders, multiprocessing): memory and CPU time are summed over that tree. Children
are found through `/proc/<pid>/task/<tid>/children` (one small read per thread) and re-listed at
most every `refresh_s`, so a worker that lives shorter than that may be missed; between
refreshes a read is one `pread` per member. Descriptors stay bound to the process they were opened
for: a reused pid never mixes in an unrelated process.
"""

from __future__ import annotations

import os

from fecomlite.sensors._files import KernelFile, monotonic

DEFAULT_REFRESH_S = 0.5
_HAS_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid`, parents before children."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        kids = _children(parent)
        found.extend(kids)
        todo.extend(kids)
    return found


def _children(pid: int) -> list[int]:
    if not _HAS_CHILDREN_FILES:  # kernel built without CONFIG_PROC_CHILDREN: psutil scans /proc
        import psutil  # only here: every summary imports this module, and psutil costs ~40 ms

        try:
            return [p.pid for p in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:  # a child belongs to the thread that forked it
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids.extend(int(k) for k in f.read().split())
        except OSError:
            continue
    return kids


class ProcessTree:
    """The pids of a process and (optionally) its descendants, re-listed at most every refresh_s.

    Not thread-safe: each sensor keeps its own.
    """

    def __init__(
        self, pid: int, *, include_children: bool = True, refresh_s: float = DEFAULT_REFRESH_S
    ) -> None:
        self.pid = pid
        self.include_children = include_children
        self.refresh_s = refresh_s
        self._pids = [pid]
        self._next_refresh = 0.0

    def pids(self) -> list[int]:
        """The root first; descendants as of the last refresh."""
        now = monotonic()
        if self.include_children and now >= self._next_refresh:
            self._next_refresh = now + self.refresh_s
            self._pids = [self.pid, *descendants(self.pid)]
        return self._pids


class ProcessFiles:
    """One open `/proc/<pid>/<filename>` per member of a process tree, kept in step with it."""

    def __init__(
        self, pid: int, filename: str, *, include_children: bool = True,
        refresh_s: float = DEFAULT_REFRESH_S, size: int = 4096,
    ) -> None:
        self.pid = pid
        self.filename = filename
        self.size = size
        self.tree = ProcessTree(pid, include_children=include_children, refresh_s=refresh_s)
        self._files: dict[int, KernelFile] = {}
        self._listed: list[int] = []
        self._open(pid)  # raises if the root process does not exist or is unreadable

    def contents(self) -> list[bytes]:
        """The current content of the file of every live member (the root first)."""
        pids = self.tree.pids()
        if pids is not self._listed:  # the tree was re-listed: open files of new members
            self._listed = pids
            for pid in pids:
                if pid not in self._files:
                    try:
                        self._open(pid)
                    except OSError:
                        continue
        out: list[bytes] = []
        for pid, f in list(self._files.items()):
            try:
                data = f.read_bytes()
            except OSError:  # the process exited
                data = b""
            if data:
                out.append(data)
            elif pid != self.pid:
                self._files.pop(pid).close()
        return out

    def kernel_files(self) -> list[KernelFile]:
        """The open files, for the sampler's tick thread."""
        return list(self._files.values())

    def pids(self) -> list[int]:
        """Members whose file is open now."""
        return list(self._files)

    def _open(self, pid: int) -> None:
        self._files[pid] = KernelFile(f"/proc/{pid}/{self.filename}", size=self.size)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
