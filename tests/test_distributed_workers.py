"""A DataLoader-like worker (a multiprocessing child) counts for its rank and loses no event."""

from __future__ import annotations

from test_probe import run_script

from fecomlite.runtime import batch_codec

PROGRAM = """
    import math
    import multiprocessing as mp
    import fecomlite.runtime.probe as __fecomlite__

    def work(n):
        for i in range(n):
            __fecomlite__.call("prog.py:6:8", math.sqrt, i)

    if __name__ == "__main__":
        child = mp.get_context("fork").Process(target=work, args=(30,))
        child.start()
        child.join()
        work(5)
        print(child.pid, child.exitcode)
"""


def test_a_forked_worker_flushes_at_exit_and_carries_its_rank(tmp_path):
    result = run_script(tmp_path, PROGRAM, RANK="1", LOCAL_RANK="1")
    assert result.returncode == 0, result.stderr
    child_pid, code = map(int, result.stdout.split())
    assert code == 0
    events: dict[int, int] = {}
    with open(tmp_path / "events.spool", "rb") as f:
        for record in batch_codec.read_records(f):
            header, columns = batch_codec.decode(record)
            assert (header["rank"], header["local_rank"]) == (1, 1)
            events[header["pid"]] = events.get(header["pid"], 0) + len(columns["site"])
    assert events[child_pid] == 30  # the worker ended within 200 ms: only its exit flushed
    assert sum(events.values()) == 35
