"""Validate fecomlite's GPU figures against known work on an NVIDIA GPU (PyTorch + NVML).

Runs bursts of bf16 matrix products of known size and count under `fecomlite run` (method level,
NVML, GPU synchronised at probe boundaries) and prints:
  (a) per-call GPU energy + energy outside calls against the NVML counter's total for the run;
  (b) each call's above-idle energy per FLOP against the long calls (>= 300 ms) of the same size,
      for calls shorter and longer than 100 ms;
  (c) the probe and GPU-sync overhead: the workload's wall time original vs measured, and the
      measured run with sync on vs off;
  (d) every sensor the server read (NVML's among them): update period, read cost, interval;
  (e) `--trace-layers` on CUDA: a layer of known GPU work timed by the CUDA events of the layer
      hooks against the same layer timed with CUDA events by the program itself, its backward,
      the clock the report names, and the attribution's invariant (self + children = energy).
  (f) a 1-rank NCCL DDP run under `fecomlite run --nproc-per-node 1 --trace-layers` that ends
      right after a backward: its exit code, the rank's device as fecomlite names it against the
      GPU whose NVML process list holds the rank's pid (and its per-process NVML figures), the
      DDP bucket API (launch only with NCCL) against backward, and per-rank figures summing up.
Needs only PyTorch, nvidia-ml-py and fecomlite; finishes within 4 minutes on an H200.

    python benchmarks/gpu_validate.py              # on a machine with an NVIDIA GPU
    python benchmarks/gpu_validate.py --device cpu --quick   # a smoke run of the pipeline on CPU

A burst is one call of `gpuwork.burst(n, reps)`: the module lives outside the measured project, so
its products are not wrapped one by one, and `--api gpuwork` makes each burst one measured call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import _results
import numpy as np

GPUWORK = """
import torch

_cache = {}


def setup(device, sizes):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for n in sizes:
        _cache[n] = (torch.randn(n, n, device=device, dtype=dtype),
                     torch.randn(n, n, device=device, dtype=dtype))
    if device == "cuda":
        torch.cuda.synchronize()


def burst(n, reps):
    a, b = _cache[n]
    for _ in range(reps):
        c = torch.matmul(a, b)
    return c.shape[0]
"""

WORKLOAD = """
import json, sys, time
import gpuwork

plan = json.loads(sys.argv[1])
device = sys.argv[2]
gpuwork.setup(device, sorted({n for n, _, _ in plan}))
start = time.perf_counter()
for n, reps, gap in plan:
    gpuwork.burst(n, reps)
    time.sleep(gap)
print("workload_s", time.perf_counter() - start)
"""


LAYERS = """
import statistics, sys, torch, torch.nn as nn

device, n, reps, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dtype = torch.bfloat16 if device == "cuda" else torch.float32


class Heavy(nn.Module):
    \"\"\"`reps` products of an n x n matrix: known GPU work in one layer.\"\"\"

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n, device=device, dtype=dtype) / n**0.5)

    def forward(self, x):
        for _ in range(reps):
            x = x @ self.w
        return x


torch.manual_seed(0)
net = nn.Sequential(Heavy(), nn.ReLU(), nn.Linear(n, n, device=device, dtype=dtype))
x = torch.randn(n, n, device=device, dtype=dtype)
for step in range(steps):
    net(x).float().mean().backward()
if sys.argv[5] == "reference" and device == "cuda":  # the heavy layer timed by the program
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        net[0](x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    print("heavy_s", statistics.median(times))
"""


def plain_env() -> dict[str, str]:
    """This environment without fecomlite's settings: a child `fecomlite run` sets its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FECOMLITE_")}


def validate_layers(root: Path, device: str, quick: bool) -> dict:
    """(e): the heavy layer's forward spans from `--trace-layers` against its CUDA-event time
    measured by the program itself (on CPU: its median span only, a smoke run)."""
    from fecomlite.analysis.run_analysis import analyse_run
    from fecomlite.store import Store

    n, reps, steps = (256, 4, 5) if device == "cpu" or quick else (8192, 20, 20)
    project = root / "layers"
    project.mkdir()
    (project / "layers.py").write_text(textwrap.dedent(LAYERS))
    args = [device, str(n), str(reps), str(steps)]
    reference = None
    out = subprocess.run(
        [sys.executable, str(project / "layers.py"), *args, "reference"],
        check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("heavy_s"):
            reference = float(line.split()[-1])
    home = root / "layers-home"
    env = plain_env()
    subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", "run", "--home",
         str(home), "--trace-layers", "--sync", "off", "--repeat", "1", "--idle", "3",
         "--tail", "1.5", "--gate-max-wait", "15", str(project / "layers.py"), *args, "traced"],
        check=True, env=env, stdout=subprocess.DEVNULL,
    )
    with Store(home / "store.sqlite") as store:
        run_id = store.latest_run_id()
        a = analyse_run(store, run_id)
        clocks = {k: v.get("clock") for k, v in (store.result(run_id, "layers") or {}).items()}
    heavy, back = "layer:Sequential/0 (Heavy)", "layer-backward:Sequential/0 (Heavy)"

    def durations(api: str) -> np.ndarray:
        if api not in a.api_names:
            return np.zeros(0)
        return a.calls["duration_s"][a.calls["api"] == a.api_names.index(api)]

    parent = a.calls["parent"]
    nested = parent >= 0
    worst = 0.0
    for d in a.domains:
        energy, own = a.calls["energy_J"][d["domain"]], a.calls["self_energy_J"][d["domain"]]
        kids = np.bincount(parent[nested], weights=energy[nested], minlength=energy.size)
        worst = max(worst, float(np.max(np.abs(energy - own - kids), initial=0.0)))
    fwd, bwd = durations(heavy), durations(back)
    return {
        "reference_s": reference,
        "forward_s": float(np.median(fwd)) if fwd.size else None,
        "backward_s": float(np.median(bwd)) if bwd.size else None,
        "spans": (int(fwd.size), int(bwd.size)),
        "clock": (clocks.get(heavy), clocks.get(back)),
        "invariant_gap_J": worst,
    }


DDP_NCCL = """
import json, os
import pynvml
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
net = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096))
model = DDP(net.cuda(), device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(512, 4096, device="cuda")
for _ in range(40):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
torch.cuda.synchronize()
pynvml.nvmlInit()
seen = {}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            seen[i] = {"used_MiB": (p.usedGpuMemory or 0) / 2**20}
            try:
                stats = pynvml.nvmlDeviceGetAccountingStats(h, p.pid)
                seen[i]["accounting"] = {"gpu_util_%": stats.gpuUtilization,
                                         "max_memory_MiB": stats.maxMemoryUsage / 2**20,
                                         "time_ms": stats.time}
            except pynvml.NVMLError as exc:  # accounting mode off (needs root to turn on)
                seen[i]["accounting"] = str(exc)
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
print("nvml", json.dumps({"pid": os.getpid(), "gpus": seen, "visible": visible}), flush=True)
model(x).square().mean().backward()  # the end right after a backward (docs: "Exit safety")
dist.destroy_process_group()
"""


def validate_ddp(root: Path) -> list[str]:
    """(f): one NCCL rank under `fecomlite run --nproc-per-node 1 --trace-layers`."""
    project = root / "ddp"
    project.mkdir()
    (project / "ddp_nccl.py").write_text(textwrap.dedent(DDP_NCCL))
    home, out = root / "ddp-home", root / "ddp-report"
    env = plain_env()
    run = subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", "run", "--home", str(home), "--repeat", "1",
         "--idle", "3", "--tail", "1", "--no-gate", "--nproc-per-node", "1", "--trace-layers",
         str(project / "ddp_nccl.py")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = [f"(f) 1-rank NCCL DDP: exit code {run.returncode} (0 expected: it ends right after a "
             "backward)"]  # fmt: skip
    nvml = next((ln for ln in run.stdout.splitlines() if 'nvml {"pid"' in ln), None)
    if run.returncode != 0 or nvml is None:
        return [*lines, run.stdout[-2000:], run.stderr[-2000:]]
    seen = json.loads(nvml[nvml.index("{") :])  # torchrun may prefix a rank's lines
    subprocess.run(
        [sys.executable, "-m", "fecomlite.cli", "report", "--store", str(home / "store.sqlite"),
         "--out", str(out)], env=env, capture_output=True, timeout=300, check=True,
    )  # fmt: skip
    data = json.loads((out / "report.json").read_text())
    rank = data["ranks"][0]
    listed = sorted(f"gpu:{i}" for i in seen["gpus"])
    lines.append(
        f"    rank 0: pid {rank['pid']} device {rank['device']} (CUDA_VISIBLE_DEVICES "
        f"{seen['visible'] or 'unset'}); NVML lists pid {seen['pid']} on {listed or 'no GPU'} "
        f"{'OK' if listed == [rank['device']] and seen['pid'] == rank['pid'] else 'MISMATCH'}"
        + ("" if listed else " (NVML may list the pids of another PID namespace: a container)")
    )
    for index, figures in seen["gpus"].items():
        lines.append(f"    NVML per-process figures on gpu:{index}: {figures}")
    apis = {a["api"]: a for a in data["apis"]}
    bucket = apis.get("torch.distributed.all_reduce (DDP gradient bucket)")
    backward = apis.get("torch.Tensor.backward")
    if bucket is None or backward is None:
        return [*lines, f"    bucket API missing: {sorted(apis)[:20]}"]
    per_call = {n: a["time_by_rank"]["0"] / a["calls_by_rank"]["0"] * 1e3
                for n, a in (("bucket", bucket), ("backward", backward))}  # fmt: skip
    lines.append(
        f"    buckets {bucket['calls']} for {backward['calls']} backwards; mean bucket "
        f"{per_call['bucket']:.3f} ms vs backward {per_call['backward']:.3f} ms (NCCL: the "
        "launch only, the reduction's GPU time stays in backward)"
    )
    sums = [sum(a["calls_by_rank"].values()) == a["calls"] for a in data["apis"]]
    lines.append(f"    calls_by_rank sums to calls for {sum(sums)} of {len(sums)} APIs")
    for a in (backward, bucket):  # one rank: its GPU energy is the API's, on its own GPU only
        by_rank = {d: v for d, v in a.get("energy_by_rank", {}).items() if d.startswith("gpu:")}
        lines.append(f"    {a['api']}: GPU energy by rank {by_rank} (only {rank['device']})")
    return lines


def make_plan(device: str, quick: bool, seed: int = 1) -> list[tuple[int, int, float]]:
    """(size, products, idle gap after) per burst: short and long bursts of each size."""
    rng = random.Random(seed)
    if device == "cpu":
        sizes = {256: [2, 8, 40, 200]} if quick else {512: [2, 8, 40, 150]}
    else:  # ~0.2 ms per 4096³ and ~1.6 ms per 8192³ bf16 product on an H200
        sizes = {4096: [10, 50, 200, 2000, 4000], 8192: [3, 10, 40, 250, 500]}
    plan = [(n, reps, rng.uniform(0.05, 0.3)) for n, counts in sizes.items() for reps in counts]
    rng.shuffle(plan)
    return plan


def fecomlite_run(home: Path, project: Path, plan: list, device: str, *extra: str) -> int:
    env = plain_env()
    env["PYTHONPATH"] = os.pathsep.join([str(project.parent / "lib"), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-m", "fecomlite.cli", "run",
        "--home", str(home), "--api", "gpuwork", "--idle", "3", "--tail", "1.5",
        "--gate-max-wait", "15", *extra, str(project / "workload.py"), json.dumps(plan), device,
    ]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    from fecomlite.store import Store

    with Store(home / "store.sqlite") as store:
        return store.latest_run_id()


def original_seconds(project: Path, plan: list, device: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(project.parent / "lib")}
    out = subprocess.run(
        [sys.executable, str(project / "workload.py"), json.dumps(plan), device],
        check=True, env=env, capture_output=True, text=True,
    ).stdout
    return float(out.split()[-1])


def workload_seconds(log: Path) -> float:
    """The workload's own timing line from a repetition's log."""
    for line in log.read_text().splitlines():
        if line.startswith("workload_s"):
            return float(line.split()[-1])
    raise RuntimeError(f"{log} has no workload_s line")


def validate(home: Path, run_id: int, plan: list) -> dict:
    from fecomlite.analysis.run_analysis import analyse_run
    from fecomlite.store import Store

    with Store(home / "store.sqlite") as store:
        analysis = analyse_run(store, run_id)
        reps = store.repetitions(run_id)
    gpu = [d for d in analysis.domains if d["domain"].startswith("gpu:")]
    domain = gpu[0] if gpu else analysis.domains[0]
    name = domain["domain"]
    calls = analysis.calls
    api_of = {row["key"]: row["api"] for row in analysis.sites}
    burst = [i for i, k in enumerate(analysis.site_keys) if api_of.get(k) == "gpuwork.burst"]
    mask = np.isin(calls["site"], burst)
    flop_of = np.array([2.0 * n**3 * reps for n, reps, _ in plan])
    size_of = np.array([n for n, _, _ in plan])
    out: dict = {"domain": name, "provenance": domain["provenance"], "sensor": domain["sensor"]}
    out["a_conservation"] = {
        "in_calls_J": domain["in_calls_J"],
        "outside_calls_J": domain["outside_calls_J"],
        "above_idle_J": domain["above_idle_J"],
        "total_J": domain["total_J"],
        "relative_gap": (domain["in_calls_J"] + domain["outside_calls_J"]) / domain["above_idle_J"]
        - 1 if domain["above_idle_J"] else float("nan"),
    }
    errors: dict[str, list[float]] = {"short (<100 ms)": [], "long (>=100 ms)": []}
    per_size_long: dict[int, float] = {}
    rows = []
    for rep in sorted({r["rep"] for r in reps}):
        idx = np.flatnonzero(mask & (calls["rep"] == rep))
        idx = idx[np.argsort(calls["t_start_ns"][idx])]
        if len(idx) != len(plan):
            continue
        energy = calls["energy_J"][name][idx]
        duration = calls["duration_s"][idx]
        for n in set(size_of.tolist()):
            long_ = (size_of == n) & (duration >= 0.3)
            if long_.any():
                per_size_long[n] = float(np.median(energy[long_] / flop_of[long_]))
        for j in range(len(plan)):
            reference = per_size_long.get(int(size_of[j]))
            if reference is None or duration[j] >= 0.3:
                continue
            error = energy[j] / (flop_of[j] * reference) - 1
            errors["short (<100 ms)" if duration[j] < 0.1 else "long (>=100 ms)"].append(error)
            rows.append((rep, int(size_of[j]), duration[j] * 1e3, energy[j], error))
    out["b_pj_per_flop_long"] = {n: v * 1e12 for n, v in per_size_long.items()}
    out["b_errors"] = {
        k: {"calls": len(v), "median_abs": statistics.median(map(abs, v)) if v else None}
        for k, v in errors.items()
    }
    out["b_rows"] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="a short plan (smoke test)")
    _results.add_option(parser, "gpu_validate")
    args = parser.parse_args()
    started = time.perf_counter()
    plan = make_plan(args.device, args.quick)
    root = Path(tempfile.mkdtemp(prefix="fecomlite-gpu-"))
    (root / "lib").mkdir()
    (root / "lib" / "gpuwork.py").write_text(textwrap.dedent(GPUWORK))
    project = root / "project"
    project.mkdir()
    (project / "workload.py").write_text(textwrap.dedent(WORKLOAD))
    home = root / "home"

    plain = original_seconds(project, plan, args.device)
    run_sync = fecomlite_run(home, project, plan, args.device, "--repeat", "2", "--sync", "on")
    fecomlite_run(home, project, plan, args.device, "--repeat", "1", "--sync", "off")
    result = validate(home, run_sync, plan)

    logs = sorted((home / "logs").glob("*"))
    sync_s = statistics.median(workload_seconds(log) for log in logs[0].glob("rep-*.log"))
    nosync_s = statistics.median(workload_seconds(log) for log in logs[1].glob("rep-*.log"))
    print(f"fecomlite GPU validation on {args.device}: {len(plan)} bursts, domain "
          f"{result['domain']} ({result['provenance']}, sensor {result['sensor']})")
    a = result["a_conservation"]
    print(f"(a) calls {a['in_calls_J']:.1f} J + outside {a['outside_calls_J']:.1f} J vs "
          f"counter above idle {a['above_idle_J']:.1f} J (total {a['total_J']:.1f} J): "
          f"gap {a['relative_gap']:+.2%}")
    print("(b) long-call reference pJ/FLOP by size:",
          {n: round(v, 3) for n, v in result["b_pj_per_flop_long"].items()})
    for label, err in result["b_errors"].items():
        median = "n/a" if err["median_abs"] is None else f"{err['median_abs']:.1%}"
        print(f"    {label}: {err['calls']} calls, median |error| {median}")
    for rep, n, ms, joules, error in result["b_rows"]:
        print(f"      rep {rep} n={n:5d} {ms:8.1f} ms {joules:8.3f} J  error {error:+.1%}")
    print(f"(c) workload time (the program's own timer): original {plain:.3f} s, measured with "
          f"GPU sync {sync_s:.3f} s ({sync_s / plain - 1:+.2%}), without sync {nosync_s:.3f} s "
          f"({nosync_s / plain - 1:+.2%}); {len(plan)} wrapped bursts per repetition")
    print("(d) the server's sensors, as measured at its start (period: how often the value "
          "changed; read: median cost of one read; interval: how often it is read, and by whom):")
    print(sensor_table(home))
    e = validate_layers(root, args.device, args.quick)
    ratio = (
        f"{e['forward_s'] / e['reference_s']:.3f}x"
        if e["forward_s"] and e["reference_s"] else "n/a"
    )
    print(f"(e) --trace-layers: the heavy layer's forward span median {e['forward_s']} s vs its "
          f"CUDA-event time in the program {e['reference_s']} s ({ratio}; expect ~1.00x on a "
          f"GPU), backward {e['backward_s']} s, spans (forward, backward) {e['spans']}, clock "
          f"{e['clock']} (expect ('cuda', 'cuda') on a GPU), self + children vs energy: largest "
          f"gap {e['invariant_gap_J']:.2e} J")
    ddp = validate_ddp(root) if args.device == "cuda" else []
    if ddp:
        print("\n".join(ddp))
    print(f"finished in {time.perf_counter() - started:.0f} s")
    _results.write(args.json, "gpu_validate", {
        "device": args.device, "quick": args.quick, "bursts": len(plan), "validation": result,
        "workload_s": {"original": plain, "sync": sync_s, "no_sync": nosync_s},
        "layers": e, "ddp": ddp, "seconds": time.perf_counter() - started})


def sensor_table(home: Path) -> str:
    """Every sensor of the server that measured the runs (then shut it down)."""
    from fecomlite.server.client import live_client

    server = live_client(home.resolve())
    if server is None:
        return "    (the server is gone)"
    try:
        sensors = server.status()["sensors"]
    finally:
        server.shutdown()
    lines = []
    for s in sensors:
        cost = s.get("read_cost_s")
        lines.append(
            f"    {s['name']:28s} {s['kind']:8s} period {s['period_s'] * 1e3:8.2f} ms "
            f"({s.get('period_source', '?')}), read "
            f"{'n/a' if cost is None else f'{cost * 1e6:9.1f} us'}, "
            f"interval {s['sample_interval_s'] * 1e3:6.1f} ms by {s.get('reader', '?')}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
