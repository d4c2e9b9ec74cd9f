"""The probe's buffer is flushed on size as well as on time: a busy loop's buffer stays bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from fecomlite.runtime import batch_codec


def test_a_full_buffer_is_flushed_before_its_time(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        import fecomlite.runtime.probe as __fecomlite__
        __fecomlite__.FLUSH_EVERY_S = 3600  # never by time in this test
        time.sleep(1)  # past the flusher's first timed wait, begun at import
        for i in range(__fecomlite__.FLUSH_EVENTS + 10):
            __fecomlite__.call("prog.py:5:0", abs, i)
        spool, deadline = os.environ["FECOMLITE_SPOOL"], time.monotonic() + 60
        while time.monotonic() < deadline and (
                __fecomlite__.pending() or not os.path.exists(spool)):
            time.sleep(0.05)
        time.sleep(1)  # the batch drained is being written
        print(__fecomlite__.pending(), flush=True)
        os._exit(0)  # no exit flush: only what the size trigger sent is spooled
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env["FECOMLITE_SPOOL"] = str(tmp_path / "events.spool")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.strip() == "0", result.stderr
    with open(tmp_path / "events.spool", "rb") as f:
        spooled = sum(batch_codec.header_of(r)["n"] for r in batch_codec.read_records(f))
    assert spooled >= 65_536, spooled
