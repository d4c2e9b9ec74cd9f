"""`python -m fecomlite.instrument.hookmain SCRIPT ARGS...`: how `fecomlite run` starts the
user's script in place, rewritten by the import hook its environment names
(`importhook.child_environment`). An uncaught exception is reported from the script's own frames
(none of this module's), and ends the process as Python would: status 1, or killed by SIGINT
for a KeyboardInterrupt."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from fecomlite.instrument import hookview
from fecomlite.instrument.importhook import BOOT_DIR, install_from_environment, run_script


def _script_frames(tb):  # type: ignore[no-untyped-def]
    """The traceback from the script's first frame on (this module's and exec's dropped)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != sys.modules["__main__"].__file__:
        tb = tb.tb_next
    return tb


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m fecomlite.instrument.hookmain SCRIPT [ARGS...]")
    hook = install_from_environment()
    if hook is None:
        sys.exit("fecomlite: FECOMLITE_HOOK is not set: nothing to instrument with")
    hookview.hide(str(BOOT_DIR))  # the program sees what `python script.py` gives it
    _hide_from_orig_argv()
    script, args = sys.argv[1], sys.argv[2:]
    try:
        run_script(script, args, hook)  # a str: `./x.py` stays as typed in sys.argv[0]
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - reported as Python reports it
        tb = _script_frames(error.__traceback__) or error.__traceback__
        sys.excepthook(type(error), error.with_traceback(tb), tb)  # Python's prints the former
        if isinstance(error, KeyboardInterrupt):
            _die_of_sigint()
        sys.exit(1)


def _hide_from_orig_argv() -> None:
    """`sys.orig_argv` as `python SCRIPT ARGS` gives it: without this module's `-m` pair."""
    argv = list(sys.orig_argv)
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == __spec__.name:
            sys.orig_argv = argv[:i] + argv[i + 2:]
            return


def _die_of_sigint() -> None:
    """Python ends on an uncaught KeyboardInterrupt by SIGINT itself (a shell sees 130)."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    main()
