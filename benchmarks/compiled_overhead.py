"""What instrumentation costs a torch.compile'd model: graphs compiled and time per step.

The model of `projects/torch_compile` (its `model.py`, where every torch call is wrapped) is
instrumented into a temporary copy; the original and the instrumented module are both loaded in
this one process, built with the same seed and compiled with the same backend. Each is warmed up
on the two batch sizes the project uses (a static and a dynamic-shape graph), then training
steps (forward, loss, backward) alternate between the two in rounds, so that machine noise hits
both alike. Prints the graphs each compiled (counted by the backend dynamo hands them to), the
median time per step, and the median of the per-round ratios with their range. (Compile times
are not compared: the model compiled first also pays AOTAutograd's one-time start.)

    python benchmarks/compiled_overhead.py [--backend aot_eager] [--steps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import _results

os.environ.pop("FECOMLITE_URL", None)  # no server: events are spooled, as a standalone run does
os.environ["FECOMLITE_SPOOL"] = os.path.join(tempfile.mkdtemp(), "bench.spool")

import torch  # noqa: E402 - after the environment is set
import torch.nn.functional as F  # noqa: E402

from fecomlite.instrument.project import instrument_path  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1] / "projects" / "torch_compile"
FEATURES, WIDTH, CLASSES, DEPTH = 16, 64, 4, 2
BATCHES = (256, 192)


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Compiled:
    """One model compiled with a backend that counts the graphs dynamo hands it."""

    def __init__(self, module: ModuleType, backend: str) -> None:
        torch.manual_seed(0)
        self.model = module.ResidualMLP(FEATURES, WIDTH, CLASSES, DEPTH)
        self.graphs = 0
        inner = torch._dynamo.lookup_backend(backend)

        def counting(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]):
            self.graphs += 1
            return inner(gm, inputs)

        self.compiled = torch.compile(self.model, backend=counting)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = F.cross_entropy(self.compiled(x), y)
        loss.backward()
        self.model.zero_grad(set_to_none=True)

    def warm_up(self) -> float:
        start = time.perf_counter()
        for batch in BATCHES:
            for _ in range(2):
                self.step(*data(batch))
        return time.perf_counter() - start

    def timed(self, steps: int) -> float:
        x, y = data(BATCHES[0])
        start = time.perf_counter_ns()
        for _ in range(steps):
            self.step(x, y)
        return (time.perf_counter_ns() - start) / steps / 1e6


def data(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, FEATURES, generator=generator)
    return x, torch.randint(0, CLASSES, (batch,), generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=15)
    _results.add_option(parser, "compiled_overhead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    copy = Path(tempfile.mkdtemp()) / "copy"
    result = instrument_path(PROJECT, copy)
    assert result.ok and "__fecomlite__.call(" in (copy / "model.py").read_text()
    models = {
        "original": Compiled(load(PROJECT / "model.py", "model_original"), args.backend),
        "instrumented": Compiled(load(copy / "model.py", "model_instrumented"), args.backend),
    }
    for model in models.values():
        model.warm_up()
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            times[name].append(model.timed(args.steps))
    ratios = [b / a for a, b in zip(times["original"], times["instrumented"], strict=True)]
    print(f"backend {args.backend}, {args.rounds} rounds of {args.steps} training steps")
    print(f"{'':14}{'graphs':>8}{'median ms/step':>16}{'range':>18}")
    for name, model in models.items():
        low, high = min(times[name]), max(times[name])
        median = statistics.median(times[name])
        print(f"{name:14}{model.graphs:>8}{median:>16.3f}{f'{low:.2f}-{high:.2f}':>18}")
    print(
        f"instrumented/original: graphs {models['instrumented'].graphs}/"
        f"{models['original'].graphs}, step time median of per-round ratios "
        f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})"
    )
    _results.write(args.json, "compiled_overhead", {
        "backend": args.backend, "steps": args.steps, "rounds": args.rounds,
        "graphs": {name: model.graphs for name, model in models.items()},
        "median_ms_per_step": {name: statistics.median(t) for name, t in times.items()},
        "ratio_median": statistics.median(ratios), "ratios": ratios})


if __name__ == "__main__":
    main()
