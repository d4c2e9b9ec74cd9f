"""The program a sweep measures: train one fully connected network on synthetic data.

    python fc_program.py --config '{"width": 64, "depth": 2, ...}' [--framework keras|torch]
    python fc_program.py --config ... --summary FILE     # write the model's summary, no training
    python fc_program.py --pilot '[{...}, ...]'           # CPU seconds a step of each, as JSON

`--threads N` sets the framework's intra- and inter-op threads before any work (the sweep passes
its `--threads`): on a machine with few CPUs the default pool, one thread per CPU, fights the
measurement server and other processes for them, and one configuration's repetitions then vary
tenfold and more.

Seeds are fixed (data, weights, shuffling), so a configuration does the same work every time.
One warm-up step runs first, outside the measured span: it builds the model and traces the
training function, a one-off cost that is not the network's per-step cost. The training proper
is the region `train` (`fecomlite.region`), which the sweep reads; the sweep runs this program at
project level, so the whole process is also measured, as `<program>`.
Runs on the CPU (tensorflow-cpu; PyTorch is kept on the CPU too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a script: import from this checkout
    sys.path[0] = str(Path(__file__).resolve().parents[2])

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import fecomlite  # noqa: E402
from fecomlite.model.network import NetworkConfig, summary_from_keras  # noqa: E402

SEED = 1234
LEARNING_RATE = 1e-3
REGION = "train"
PILOT_S = 0.25  # a pilot times doubling numbers of steps until they take this much CPU time


def synthetic_data(config: NetworkConfig) -> tuple[np.ndarray, np.ndarray]:
    """Exactly steps_per_epoch full batches of Gaussian inputs and random class labels."""
    rng = np.random.default_rng(SEED)
    n = config.steps_per_epoch * config.batch_size
    x = rng.standard_normal((n, config.inputs), dtype=np.float32)
    y = rng.integers(0, config.outputs, size=n).astype(np.int64)
    return x, y


def keras_model(config: NetworkConfig) -> Any:
    """A compiled Keras Dense stack (keras is imported here: the torch path never loads it)."""
    import keras

    keras.utils.set_random_seed(SEED)
    layers = [keras.Input(shape=(config.inputs,))]
    layers += [keras.layers.Dense(w, activation="relu") for w in config.hidden_widths()]
    layers.append(keras.layers.Dense(config.outputs))
    model = keras.Sequential(layers)
    optimizer = (keras.optimizers.Adam(LEARNING_RATE) if config.optimizer == "adam"
                 else keras.optimizers.SGD(LEARNING_RATE))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def train_keras(config: NetworkConfig) -> tuple[float, int, float, float]:
    """(final loss, optimiser steps taken in the measured region, its wall and CPU seconds)."""
    x, y = synthetic_data(config)
    model = keras_model(config)
    b = config.batch_size
    model.fit(x[:b], y[:b], batch_size=b, epochs=1, verbose=0)  # warm-up: build and trace
    before = int(model.optimizer.iterations)
    start, cpu = time.perf_counter(), time.process_time()
    with fecomlite.region(REGION):
        history = model.fit(x, y, batch_size=b, epochs=config.epochs, shuffle=True, verbose=0)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return float(history.history["loss"][-1]), int(model.optimizer.iterations) - before, wall, cpu


def train_torch(config: NetworkConfig) -> tuple[float, int, float, float]:
    import torch

    torch.manual_seed(SEED)
    sizes = config.layer_sizes()
    modules: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        modules.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules)
    params = model.parameters()
    optimizer = (torch.optim.Adam(params, lr=LEARNING_RATE) if config.optimizer == "adam"
                 else torch.optim.SGD(params, lr=LEARNING_RATE))
    loss_fn = torch.nn.CrossEntropyLoss()
    x_np, y_np = synthetic_data(config)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    generator = torch.Generator().manual_seed(SEED)
    b = config.batch_size

    def step(xb: torch.Tensor, yb: torch.Tensor) -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    step(x[:b], y[:b])  # warm-up, as for Keras
    loss, steps = float("nan"), 0
    began, cpu = time.perf_counter(), time.process_time()
    with fecomlite.region(REGION):
        for _ in range(config.epochs):
            order = torch.randperm(x.shape[0], generator=generator)
            for start in range(0, x.shape[0], b):
                idx = order[start:start + b]
                loss = step(x[idx], y[idx])
                steps += 1
    return loss, steps, time.perf_counter() - began, time.process_time() - cpu


def set_threads(framework: str, threads: int) -> None:
    """The framework's intra- and inter-op thread pools, before it has done any work."""
    if framework == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(threads)
    else:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def threads_used(framework: str) -> int:
    """The intra-op threads the framework trains with (0: TensorFlow's own choice)."""
    if framework == "torch":
        import torch

        return int(torch.get_num_threads())
    import tensorflow as tf

    return int(tf.config.threading.get_intra_op_parallelism_threads())


def cpu_seconds_per_step(config: NetworkConfig, framework: str) -> float:
    """A configuration's training CPU seconds per step, from doubling short trainings (each
    pays its warm-up step outside the timed part). CPU time, not wall time: on a loaded
    machine a 1-thread pilot's wall time per step read 10× its CPU time and the trainings it
    planned ran 0.9 s for 2 s planned; its CPU time was the same loaded or not."""
    train = train_keras if framework == "keras" else train_torch
    batches = 4
    while True:
        trial = replace(config, dataset_size=batches * config.batch_size, epochs=1)
        _, steps, _, cpu = train(trial)
        if cpu >= PILOT_S or batches >= config.steps:
            return cpu / max(steps, 1)
        batches *= 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="the NetworkConfig as JSON")
    parser.add_argument("--framework", choices=("keras", "torch"), default="keras")
    parser.add_argument("--summary", type=Path, help="write the model's summary here and stop")
    parser.add_argument("--threads", type=int, help="the framework's intra- and inter-op threads")
    parser.add_argument("--pilot", help="a JSON list of configurations: print seconds per step")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be at least 1")
        set_threads(args.framework, args.threads)
    if args.pilot:
        configs = [NetworkConfig.from_json(c) for c in json.loads(args.pilot)]
        print(json.dumps({c.key: cpu_seconds_per_step(c, args.framework) for c in configs}))
        return 0
    if not args.config:
        parser.error("--config is required")
    config = NetworkConfig.from_json(json.loads(args.config))
    if args.summary:
        if args.framework != "keras":
            parser.error("--summary is written from the Keras model")
        summary = summary_from_keras(keras_model(config), config.batch_size,
                                     config.dataset_size, config.epochs, config.optimizer)
        args.summary.write_text(json.dumps(summary, indent=1), encoding="utf-8")
        return 0
    train = train_keras if args.framework == "keras" else train_torch
    loss, steps, wall, cpu = train(config)
    print(json.dumps({"config": config.key, "framework": args.framework, "steps": steps,
                      "final_loss": loss, "training_s": wall, "training_cpu_s": cpu,
                      "threads": threads_used(args.framework)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
