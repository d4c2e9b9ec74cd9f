"""`fecomlite watch -- COMMAND` measures the whole tree below the command: a wrapper that stays
(here `bash -c "...; true"`, like `time`, `uv run` or `torchrun`) does not hide the program's
memory, and the summary names the processes the tree's RSS counted."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from conftest import run_cli

ALLOC = """\
import time
block = bytearray(300 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(1.5)
"""


def test_a_wrapper_command_shows_the_trees_memory(home, tmp_path):
    (tmp_path / "alloc.py").write_text(ALLOC)
    command = f"{sys.executable} alloc.py; true"  # `; true`: bash cannot exec it in its place
    result = run_cli(tmp_path, "watch", "--home", str(home), "--no-live", "--", "bash", "-c",
                     command, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    tree = re.search(r"tree RSS: first → peak [│| ]*"
                     r"[\d.]+ [kMG]?B → ([\d.]+) ([kMG]?B)", text)
    assert tree is not None, text
    peak = float(tree[1]) * {"kB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1}[tree[2]]
    assert peak >= 300 * 1024 * 1024
    assert re.search(r"the tree's RSS counted \d+ process\(es\): .*\bbash -c\b", text)
    assert f"{Path(sys.executable).name} alloc.py" in text
