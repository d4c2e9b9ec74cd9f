"""Collective communication as APIs of its own: DDP's bucketed all-reduce inside `backward`
(`fecomlite.runtime.comm_hooks`, with --trace-layers) and the program's own collectives,
`kind: "collective"`, per rank, in report.json and the OpenMetrics export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from run_helpers import fecomlite_run, report_json

ROOT = Path(__file__).resolve().parents[1]
BUCKET_API = "torch.distributed.all_reduce (DDP gradient bucket)"

# Two ranks, each on its own half of the data: DDP's averaged gradients must give the weights a
# single process gets from the whole batch, so the program checks the all-reduce it ran.
DDP_PROGRAM = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    reference.load_state_dict(net.state_dict())
    model = DDP(net, bucket_cap_mb=0.001)  # a bucket per layer or so: several all-reduces
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    steps = 4
    for step in range(steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(x[rank * 4:(rank + 1) * 4]).pow(2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ((reference(x[:4]).pow(2).mean() + reference(x[4:]).pow(2).mean()) / 2).backward()
        ref_opt.step()
    same = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(net.parameters(), reference.parameters()))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank}: averaged as one process: {same}, sum {total.item():g}", flush=True)
    model(x[:4]).sum().backward()  # and the end right after a backward (docs: "Exit safety")
    dist.destroy_process_group()
"""  # noqa: E501


def test_ddp_bucketed_all_reduce_is_its_own_api_under_backward_on_every_rank(home, tmp_path):
    script = tmp_path / "ddp" / "train.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(DDP_PROGRAM))
    result = fecomlite_run(tmp_path, home, script, "--nproc-per-node", "2", "--trace-layers")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):  # the program's gradients were averaged exactly as without fecomlite
        assert f"rank {rank}: averaged as one process: True, sum 3" in result.stdout

    data = report_json(tmp_path, home)
    apis = {a["api"]: a for a in data["apis"]}
    bucket, backward = apis[BUCKET_API], apis["torch.Tensor.backward"]
    assert bucket["kind"] == "collective"
    assert bucket["parent_api"] == "torch.Tensor.backward"  # launched inside backward
    assert sum(bucket["calls_by_rank"].values()) == bucket["calls"]
    assert set(bucket["calls_by_rank"]) == {"0", "1"}
    for rank in ("0", "1"):  # at least one bucket per DDP backward, and in flight inside it
        # 4 + 1 backwards through DDP, and the reference's 4 (on a sum: decided at run time)
        assert backward["calls_by_rank"][rank] == 4 + 1 + 4
        assert bucket["calls_by_rank"][rank] >= 4 + 1
        # a bucket ends in the callback of the future DDP waits on before backward returns, and
        # starts once the previous one ended: the buckets' time lies inside the backwards' time
        assert 0 < bucket["time_by_rank"][rank] <= backward["time_by_rank"][rank]
    own = apis["torch.distributed.all_reduce"]  # the program's own collective
    assert own["kind"] == "collective" and own["calls_by_rank"] == {"0": 1, "1": 1}
    assert apis["torch.optim.SGD.step"].get("kind") != "collective"

    store = str(home / "store.sqlite")
    export = run_cli(tmp_path, "export", "--store", store, "--format", "openmetrics", "--out", "-")
    assert export.returncode == 0, export.stdout + export.stderr
    families = {f.name: f for f in text_string_to_metric_families(export.stdout)}
    by_rank = {
        (s.labels["node"], s.labels["rank"]): s.value
        for s in families["fecomlite_api_calls"].samples
        if s.labels["api"] == BUCKET_API
    }
    assert by_rank == {("0", r): bucket["calls_by_rank"][r] for r in ("0", "1")}
    info = {s.labels["rank"]: s.labels for s in families["fecomlite_rank"].samples}
    assert {r: (i["node"], i["device"]) for r, i in info.items()} == {
        "0": ("0", "cpu"),
        "1": ("0", "cpu"),
    }


# One process (a world of one, gloo): what the timer does to a DDP's hook slot.
HOOK_PROGRAM = """
    import json, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from fecomlite.runtime.comm_hooks import CommTimer

    events = []
    CommTimer(torch, lambda site, t0, t1, raised: events.append((site, t0, t1))).install()
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    ddp = DDP(torch.nn.Linear(6, 3))
    seen = []

    def user_hook(state, bucket):
        seen.append(bucket.index())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def step():
        ddp.zero_grad()
        ddp(torch.ones(5, 6)).pow(2).sum().backward()

    if sys.argv[2] == "before":
        ddp.register_comm_hook(None, user_hook)
    step()
    if sys.argv[2] == "after":  # our default holds the reducer's one slot by now
        ddp.register_comm_hook(None, user_hook)
    step()
    try:
        ddp.register_comm_hook(None, user_hook)
        twice = "accepted"
    except RuntimeError as exc:
        twice = str(exc)
    print(json.dumps({"events": [e[0] for e in events], "seen": seen, "twice": twice,
                      "ordered": all(t0 <= t1 for _, t0, t1 in events)}))
    dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    "when,expected",
    [
        ("after", [BUCKET_API, "__main__.user_hook (DDP comm hook)"]),
        ("before", ["__main__.user_hook (DDP comm hook)"] * 2),
    ],
)
def test_a_program_s_own_comm_hook_runs_timed_whenever_it_is_registered(tmp_path, when, expected):
    """Registered before the first forward, the program's hook is wrapped; after it (our default
    took the reducer's one slot), it replaces ours. Either way it runs on every bucket, and a
    second registration fails as DDP makes it fail."""
    program = tmp_path / "hooks.py"
    program.write_text(textwrap.dedent(HOOK_PROGRAM))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(program), str(tmp_path / "rendezvous"), when],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [e.removeprefix("collective:") for e in result["events"]] == expected
    assert result["seen"] == [0] * (2 if when == "before" else 1)
    assert result["ordered"]
    assert (
        result["twice"]
        == "register_comm_hook or register_builtin_comm_hook can only be called once."
    )


# One process (a world of one, gloo). Its comm hook's future completes on another thread, as
# gloo's worker completes a collective's, and the bucket's event records slowly there, as a probe
# on a busy machine may.
ORDER_PROGRAM = """
    import json, sys, threading, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from fecomlite.runtime.comm_hooks import CommTimer

    ends = []

    def record(site, t0, t1, raised):
        time.sleep(0.2)  # GIL released: the program's thread may go on, were it not waiting
        ends.append(t1)

    CommTimer(torch, record).install()
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 3)))

    def later(state, bucket):
        fut = torch.futures.Future()
        threading.Timer(0.05, fut.set_result, (bucket.buffer(),)).start()
        return fut

    ddp.register_comm_hook(None, later)
    returns = []
    for _ in range(3):
        ddp(torch.ones(5, 6)).pow(2).sum().backward()
        returns.append((len(ends), time.monotonic_ns()))
    print(json.dumps({"returns": returns, "ends": ends}), flush=True)
    dist.destroy_process_group()
"""


def test_every_bucket_is_recorded_before_the_backward_that_launched_it_returns(tmp_path):
    """The bucket's event ends in the callback of the future DDP waits on, so nothing of ours
    runs on the communication thread once backward has returned: a program ending right after
    it never races that thread (docs/distributed.md, "Exit safety")."""
    program = tmp_path / "order.py"
    program.write_text(textwrap.dedent(ORDER_PROGRAM))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(program), str(tmp_path / "rendezvous")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    counts = [n for n, _ in result["returns"]]
    assert 0 < counts[0] < counts[1] < counts[2]  # each backward's buckets, by its return
    assert len(result["ends"]) == counts[-1]  # none recorded after the last backward returned
    for n, returned in result["returns"]:
        assert all(end < returned for end in result["ends"][:n])
