"""`fecomlite run --nproc-per-node 2`: a real 2-rank DDP program (gloo, CPU) under torchrun."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from run_helpers import fecomlite_run, report_json, stop_tree

from fecomlite.runner.launch import LaunchError, resolve_launch
from fecomlite.runtime.identity import cuda_device, rank_fields

DDP_PROGRAM = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
    for _ in range(rank + 2):  # outside collectives, calls may differ by rank
        torch.zeros(3)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank} of {dist.get_world_size()}: sum {total.item():g}", flush=True)
    dist.destroy_process_group()
"""


def test_two_ranks_under_nproc_per_node_print_as_torchrun_and_report_both_ranks(home, tmp_path):
    script = tmp_path / "ddp" / "train.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(DDP_PROGRAM))
    result = fecomlite_run(tmp_path, home, script, "--nproc-per-node", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    # the program's own output, as torchrun shows it: each rank's line, all-reduced 1 + 2
    assert "rank 0 of 2: sum 3" in result.stdout
    assert "rank 1 of 2: sum 3" in result.stdout

    data = report_json(tmp_path, home)
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    assert [ranks[r]["local_rank"] for r in (0, 1)] == [0, 1]
    assert {r["device"] for r in ranks.values()} == {"cpu"}
    apis = {a["api"]: a for a in data["apis"]}
    for row in apis.values():
        assert sum(row["calls_by_rank"].values()) == row["calls"], row["api"]
    assert sum(r["calls"] for r in ranks.values()) == sum(a["calls"] for a in apis.values())
    assert apis["torch.distributed.all_reduce"]["calls_by_rank"] == {"0": 1, "1": 1}
    assert apis["torch.zeros"]["calls_by_rank"] == {"0": 2, "1": 3}
    step = apis["torch.optim.SGD.step"]
    assert step["calls_by_rank"] == {"0": 2, "1": 2}
    assert step["rank_time"]["sum"] == pytest.approx(sum(step["time_by_rank"].values()))
    html = (tmp_path / "report" / "index.html").read_text()
    assert 'id="ranks"' in html and 'data-rank="1"' in html


def test_a_launcher_named_by_the_user_keeps_its_options_and_runs_the_script_given():
    launch = resolve_launch(
        Path("torchrun"),
        ["--nnodes=2", "--nproc-per-node", "4", "--rdzv-backend=c10d", "train.py", "--lr", "1"],
        None,
    )
    assert launch.prefix == [
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node",
        "4",
        "--rdzv-backend=c10d",
    ]
    assert launch.script == Path("train.py")
    assert launch.args == ["--lr", "1"]
    module = resolve_launch(Path(sys.executable), ["-m", "torch.distributed.run", "t.py"], None)
    assert module.prefix == [sys.executable, "-m", "torch.distributed.run"]
    assert module.script == Path("t.py")
    plain = resolve_launch(Path("t.py"), ["--x"], None)
    assert (plain.prefix, plain.script, plain.args) == ([sys.executable], Path("t.py"), ["--x"])
    with pytest.raises(LaunchError):
        resolve_launch(Path("torchrun"), ["-m", "pkg.train"], None)
    with pytest.raises(LaunchError):
        resolve_launch(Path("torchrun"), ["t.py"], 2)


def test_rank_fields_come_from_the_launchers_environment():
    env = {"RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "2", "TORCHELASTIC_RUN_ID": "job7"}
    fields = rank_fields(env)
    assert (fields["rank"], fields["local_rank"], fields["node"], fields["job"]) == (
        5,
        1,
        2,
        "job7",
    )
    assert rank_fields({}) == {}
    assert cuda_device(1, {"CUDA_VISIBLE_DEVICES": "4,6"}) == "gpu:6"
    assert cuda_device(1, {"CUDA_VISIBLE_DEVICES": "3"}) == "gpu:3"  # one GPU per task
    assert cuda_device(2, {}) == "gpu:2"


def test_a_stopped_run_leaves_no_process_even_one_in_a_session_of_its_own():
    """What the distributed tests rely on when a run hangs: torchrun starts each rank with
    `start_new_session`, out of reach of a kill of the launcher's process group."""
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
        "start_new_session=True); print(c.pid, flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    rank = psutil.Process(int(proc.stdout.readline()))
    stop_tree(proc)
    assert proc.returncode is not None
    with contextlib.suppress(psutil.NoSuchProcess):  # gone and reaped, or else a zombie
        assert rank.status() == psutil.STATUS_ZOMBIE


def test_the_clock_offset_comes_from_the_read_not_paused_between_its_clocks(monkeypatch):
    """merge aligns the nodes by these offsets: a read paused for 10 ms between its clocks
    (a busy machine) must not make the node's calls 10 ms off."""
    from fecomlite.runtime import identity

    wall = 1_000_000_000_000  # wall clock − monotonic is this, truly
    mono = iter([100, 10_000_100, 20_000_000, 20_000_050, 30_000_000, 30_000_900])
    reads: list[int] = []

    def monotonic_ns() -> int:
        reads.append(next(mono))
        return reads[-1]

    monkeypatch.setattr(identity.time, "monotonic_ns", monotonic_ns)
    monkeypatch.setattr(identity.time, "time_ns", lambda: wall + reads[-1])  # read right after
    assert identity.clock_offset_ns() == wall - 25  # the 50 ns bracket, halved: within it
