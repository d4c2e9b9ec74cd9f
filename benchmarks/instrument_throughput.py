"""Lines per second of `fecomlite instrument`, end to end, on a generated project.

Generates a project of realistic deep-learning files (Keras models, PyTorch modules and training
loops, tf.data pipelines, plus plain helper modules that import no framework) and instruments it,
each measurement in a fresh process: `instrument_path` (walk, read, analyse, rewrite, write,
manifest) with one process and with one per CPU, and the whole command
(`python -m fecomlite.cli instrument`, start-up and imports included). Rounds alternate, and
`--against CHECKOUT` runs the same measurements with another checkout's fecomlite in the same
rounds (before/after side by side on one machine and load). The rates of libcst's own building
blocks on the same files follow (parse + code generation, scope analysis, qualified names).

    python benchmarks/instrument_throughput.py [--lines 24000] [--framework-only]
        [--rounds 3] [--against /path/to/other/checkout] [--no-reference]

"seconds" is wall-clock time end to end (the median of the rounds); "CPU s" the CPU time it took
(workers included). On a shared machine other processes take CPU too: CPU s well below
processes × seconds means the processes waited for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results
import libcst as cst
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, ScopeProvider

REPO = Path(__file__).resolve().parents[1]
# One measurement, in a fresh process of the checkout under test.
MEASURE = """
import json, resource, sys, time
from pathlib import Path
from fecomlite.instrument import project
root, out, workers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
if workers > 1:
    project.PARALLEL_MIN_BYTES = 0
def cpu():
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
before = cpu()
result = project.instrument_path(root, out, workers=workers)
assert result.ok and result.workers == workers, (result.failures, result.workers)
print(json.dumps({"seconds": result.seconds, "cpu": cpu() - before, "sites": len(result.sites),
                  "lines": result.lines}))
"""

KERAS = '''"""Model {i}: a small CNN, trained with Keras."""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers


def load_data_{i}(batch_size: int = 32):
    x = np.random.default_rng({i}).normal(size=(256, 28, 28, 1)).astype("float32")
    y = np.arange(256) % 10
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256).batch(batch_size)
    return ds.prefetch(tf.data.AUTOTUNE), (x[:32], y[:32])


def build_model_{i}(num_classes=10, width={w}):
    model = keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            layers.Conv2D(width, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(width * 2, kernel_size=(3, 3), activation="relu"),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


class Residual{i}(keras.layers.Layer):
    def __init__(self, units):
        super().__init__()
        self.dense = layers.Dense(units)
        self.norm = layers.LayerNormalization()

    def call(self, x):
        return self.norm(x + self.dense(x))


@tf.function
def train_step_{i}(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = loss_fn(y, logits)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def evaluate_{i}(model, data):
    x, y = data
    scores = model.evaluate(x, y, verbose=0)
    preds = model.predict(x[:10], verbose=0)
    best = [int(tf.argmax(p)) for p in preds]
    print(f"loss {{scores[0]:.3f}} acc {{scores[1]:.3f}} first {{best}}")
    return {{"loss": float(scores[0]), "acc": float(scores[1])}}


def main_{i}(epochs=2):
    ds, test = load_data_{i}()
    model = build_model_{i}()
    optimizer = tf.keras.optimizers.Adam(learning_rate=1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    for epoch in range(epochs):
        for step, (x, y) in enumerate(ds):
            loss = train_step_{i}(model, optimizer, loss_fn, x, y)
            if step % 100 == 0:
                print(epoch, step, float(loss))
    history = model.fit(ds, epochs=1, verbose=0)
    return evaluate_{i}(model, test), history
'''

TORCH = '''"""Model {i}: a PyTorch CNN with its training loop."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net{i}(nn.Module):
    def __init__(self, width={w}):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3)
        self.conv2 = nn.Conv2d(width, width * 2, 3)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(width * 2 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = self.dropout(torch.flatten(x, 1))
        return self.fc2(F.relu(self.fc1(x)))


def make_data_{i}(n=512, seed={i}):
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (n,), generator=generator)
    return TensorDataset(images, labels)


def evaluate_{i}(model, loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            logits = model(images)
            correct += (logits.argmax(dim=1) == labels).sum().item()
            total += labels.numel()
    return correct / max(total, 1)


def train_{i}(epochs=2, lr=0.05):
    torch.manual_seed({i})
    loader = DataLoader(make_data_{i}(), batch_size=64, shuffle=True)
    model = Net{i}()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        for images, labels in loader:
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {{epoch}} loss {{loss.item():.4f}}")
    compiled = torch.compile(model)
    return evaluate_{i}(model, loader), compiled
'''

HELPERS = '''"""Helpers {i}: configuration, logging and bookkeeping (no framework)."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class Config{i}:
    name: str = "run-{i}"
    epochs: int = {w}
    learning_rate: float = 1e-3
    tags: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_file(cls, path: Path) -> "Config{i}":
        data = json.loads(Path(path).read_text())
        return cls(**data)


class Timer{i}:
    def __init__(self, label: str) -> None:
        self.label = label
        self.started = 0.0

    def __enter__(self) -> "Timer{i}":
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.started
        log.info("%s took %.3f s", self.label, elapsed)


def moving_average_{i}(values, window=5):
    out = []
    for index in range(len(values)):
        chunk = values[max(0, index - window + 1) : index + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def summarise_{i}(history: dict[str, list[float]]) -> dict[str, float]:
    return {{key: min(values) if "loss" in key else max(values) for key, values in history.items()}}
'''


def generate(root: Path, lines: int, framework_only: bool) -> int:
    """Write a project of at least ``lines`` lines; return its exact line count."""
    templates = [KERAS, TORCH] if framework_only else [KERAS, TORCH, HELPERS]
    total = index = 0
    while total < lines:
        template = templates[index % len(templates)]
        package = root / f"pkg{index // 20}"
        package.mkdir(parents=True, exist_ok=True)
        text = template.format(i=index, w=8 + index % 24)
        (package / f"module_{index}.py").write_text(text)
        total += text.count("\n")
        index += 1
    (root / "README.md").write_text("generated\n")
    return total


def libcst_reference(root: Path) -> dict[str, float]:
    """Seconds libcst's building blocks take over the same files, on one core."""
    sources = [p.read_text() for p in sorted(root.rglob("*.py"))]
    timings = {}
    started = time.perf_counter()
    for source in sources:
        cst.parse_module(source).code  # noqa: B018 - code generation is the point
    timings["libcst parse + codegen"] = time.perf_counter() - started
    for label, provider in (
        ("libcst parse + scope analysis", ScopeProvider),
        ("libcst parse + qualified names", QualifiedNameProvider),
    ):
        started = time.perf_counter()
        for source in sources:
            MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True).resolve(provider)
        timings[label] = time.perf_counter() - started
    return timings


def measure(checkout: Path, root: Path, out: Path, workers: int) -> dict[str, float]:
    """One run of ``instrument_path`` with ``checkout``'s fecomlite, in a fresh process (run
    outside every checkout: ``python -c`` and ``-m`` put the working folder first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-c", MEASURE, str(root), str(out), str(workers)]
    done = subprocess.run(
        command, env=env, cwd=out.parent, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def measure_cli(checkout: Path, root: Path, out: Path) -> dict[str, float]:
    """The whole command, interpreter start-up and imports included."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = _cpu_seconds()
    started = time.perf_counter()
    command = [sys.executable, "-m", "fecomlite.cli", "instrument", str(root), "--out", str(out)]
    subprocess.run(command, env=env, cwd=out.parent, capture_output=True, check=True)
    return {"seconds": time.perf_counter() - started, "cpu": _cpu_seconds() - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=24_000)
    parser.add_argument("--framework-only", action="store_true",
                        help="every file imports a framework (no helper modules)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", type=Path, action="append", default=[],
                        help="another checkout to measure in the same rounds")  # fmt: skip
    parser.add_argument("--no-reference", action="store_true",
                        help="leave out libcst's building blocks")  # fmt: skip
    _results.add_option(parser, "instrument_throughput")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    checkouts = {"this checkout": REPO, **{str(path): path.resolve() for path in args.against}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "project"
        lines = generate(root, args.lines, args.framework_only)
        files = len(list(root.rglob("*.py")))
        kind = "framework files only" if args.framework_only else "framework and helper files"
        print(f"generated project: {lines} lines in {files} files ({kind}); {cpus} CPUs")
        runs: dict[str, list[dict[str, float]]] = {}
        sites: dict[str, int] = {}
        loads = []
        for round_ in range(args.rounds):
            for name, checkout in checkouts.items():
                for workers in sorted({1, cpus}):
                    out = Path(tmp) / f"out-{round_}-{len(runs)}"
                    figures = measure(checkout, root, out, workers)
                    sites[name] = int(figures["sites"])
                    label = f"{name}: instrument_path, {workers} process" + "es" * (workers > 1)
                    runs.setdefault(label, []).append(figures)
                out = Path(tmp) / f"cli-{round_}-{len(runs)}"
                runs.setdefault(f"{name}: the CLI command", []).append(
                    measure_cli(checkout, root, out)
                )
            loads.append(os.getloadavg()[0])
        rows = {label: (statistics.median(r["seconds"] for r in found),
                        statistics.median(r["cpu"] for r in found))
                for label, found in runs.items()}  # fmt: skip
        print(f"sites wrapped: {sites}")
        if not args.no_reference:
            for label, seconds in libcst_reference(root).items():
                rows[label] = (seconds, seconds)
        width = max(map(len, rows))
        print(f"{'':{width}s} {'seconds':>8s} {'lines/s':>9s} {'CPU s':>7s} {'lines/CPU s':>11s}")
        for label, (seconds, cpu) in rows.items():
            print(f"{label:{width}s} {seconds:8.2f} {lines / seconds:9,.0f} {cpu:7.2f}"
                  f" {lines / cpu:11,.0f}")  # fmt: skip
        load = ", ".join(f"{value:.1f}" for value in loads)
        print(f"1-min load after each round: {load} (other processes take CPU from these figures)")
    _results.write(
        args.json,
        "instrument_throughput",
        {
            "lines": lines,
            "files": files,
            "framework_only": args.framework_only,
            "sites": sites,
            "rounds": args.rounds,
            "loads": loads,
            "rows": {
                label: {"seconds": seconds, "lines_per_s": lines / seconds, "cpu_s": cpu}
                for label, (seconds, cpu) in rows.items()
            },
        },
    )


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the worker processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
