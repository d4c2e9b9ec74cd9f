"""The probe's spool without a server: records written whole or not at all (a write cut short by
a file-size limit leaves no torn record), 0600, without the run's token, naming its store."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from fecomlite.runtime import batch_codec

REPO = Path(__file__).resolve().parents[1]
# batches of growing size until the file-size limit cuts one short; then small ones again
PROGRAM = textwrap.dedent("""
    import resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    import fecomlite.runtime.probe as probe
    for size in (100, 200, 400, 800, 1600, 5):
        for i in range(size):
            probe.record("loop.py:1:0", i, i + 1)
        probe.flush()
    print(probe._sender.lost)
""")


def test_a_cut_short_spool_write_leaves_whole_records_and_counts_the_rest(tmp_path: Path):
    spool = tmp_path / "home" / "logs" / "rep-1.spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}
    env.update(FECOMLITE_RUN="7", FECOMLITE_TOKEN="secret-token", FECOMLITE_SPOOL=str(spool),
               FECOMLITE_STORE="storeid", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lost = int(done.stdout)
    assert lost > 0  # the batches that did not fit
    assert "events from now on may be lost" in done.stderr
    assert stat.S_IMODE(spool.stat().st_mode) == 0o600
    for folder in (spool.parent, spool.parent.parent):  # every level it made is private
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert b"secret-token" not in spool.read_bytes()
    with open(spool, "rb") as f:
        headers = [batch_codec.decode(r, require_id=True)[0] for r in batch_codec.read_records(f)]
    # every record whole (a torn one would not decode, or would hide those after it) ...
    assert sum(h["n"] for h in headers) + lost == 3105  # ... and every event written or counted
    assert spool.stat().st_size <= 20_000
    assert headers[-1]["n"] == 5  # written after the failures: the spool goes on
    assert headers[-1]["total"] == 3105  # what the process made, so the store can tell the loss
    assert {(h["run"], h["store"]) for h in headers} == {("7", "storeid")}
