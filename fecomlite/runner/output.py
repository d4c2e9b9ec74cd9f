"""The program's output, passed through untouched: bytes in, the same bytes out, and a copy in
the run's log.

Each of the program's stdout and stderr is a pseudo-terminal where ours is a terminal (the
program then sees `isatty()` as it would without fecomlite: colours, progress bars and line
buffering as usual) and a pipe where ours is not. The pty's own output processing is off (no
`\\n` -> `\\r\\n`), so what it receives reaches our terminal byte for byte and our terminal's own
processing applies once, as without fecomlite. The bytes are copied with `os.write` to our file
descriptors: never decoded, never parsed as markup.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pty
import termios
import threading
from typing import BinaryIO

READ_SIZE = 65536


class Output:
    """Where a program's stdout and stderr go: `child` (for Popen), then `start`, `join`."""

    def __init__(self, targets: tuple[int, int], log: BinaryIO | None) -> None:
        self.targets = targets  # our file descriptors the program's output is copied to
        self.log = log
        self.child: list[int] = []  # the program's stdout, stderr
        self._ours: list[tuple[int, int]] = []  # (read end, target)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._last: dict[int, bytes] = {}  # target -> the last byte copied there
        self._open()

    def _open(self) -> None:
        shared: dict[tuple[int, int], int] = {}  # one terminal behind both: one pty, in order
        for target in self.targets:
            if _is_terminal(target):
                stat = os.fstat(target)
                identity = (stat.st_dev, stat.st_ino)
                if identity in shared:
                    self.child.append(shared[identity])
                    continue
                read, write = pty.openpty()
                _like_terminal(target, write)
                shared[identity] = write
            else:
                read, write = os.pipe()
            self.child.append(write)
            self._ours.append((read, target))

    def start(self) -> None:
        """After the program started: our copies of its ends closed, the copying begun."""
        for fd in set(self.child):
            os.close(fd)
        for read, target in self._ours:
            thread = threading.Thread(target=self._pump, args=(read, target), daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout: float) -> None:
        """Until the program's output ends (a child it left behind may hold it: not for ever).
        A terminal it left in the middle of a line gets a newline, so that fecomlite's next
        line starts on its own (the log keeps the program's bytes alone)."""
        for thread in self._threads:
            thread.join(timeout=timeout)
        for target, last in list(self._last.items()):
            if last != b"\n" and _is_terminal(target):
                _write_all(target, b"\n")

    def close_unstarted(self) -> None:
        """The program did not start: nothing to copy."""
        for fd in {*self.child, *(read for read, _ in self._ours)}:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _pump(self, read: int, target: int) -> None:
        keep, show = self.log is not None, True
        try:
            while chunk := _read(read):
                if keep:
                    try:
                        with self._lock:
                            self.log.write(chunk)  # type: ignore[union-attr]
                    except (OSError, ValueError):  # a full disk: the output still shows
                        keep = False
                if show:
                    show = _write_all(target, chunk)  # ours closed (`| head`): log it still
                    self._last[target] = chunk[-1:]
        finally:
            with contextlib.suppress(OSError):
                os.close(read)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, READ_SIZE)
    except OSError as error:
        if error.errno == errno.EIO:  # a pty whose every writer has gone: its end
            return b""
        raise


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        return False
    return True


def _is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _like_terminal(ours: int, theirs: int) -> None:
    """The program's pty: our terminal's settings and size, without output processing."""
    with contextlib.suppress(OSError, termios.error):
        attributes = termios.tcgetattr(ours)
        attributes[1] &= ~termios.OPOST
        termios.tcsetattr(theirs, termios.TCSANOW, attributes)
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(ours, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(theirs, termios.TIOCSWINSZ, size)


def stream_fd(stream: object, default: int) -> int:
    """The file descriptor behind `stream` (sys.stdout, or what a live display put there)."""
    try:
        return int(stream.fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return default
