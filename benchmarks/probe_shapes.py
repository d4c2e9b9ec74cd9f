"""Microseconds the probe's shape capture adds to a sized call, beside the call itself.

Shapes are taken on the first sized call of each site per resample window (every few seconds),
so their cost is paid once per site per window, never on the fast path. Prints, for a numpy
matmul and (when torch is installed) a torch nn.Linear call: the call, the sizes the sized path
always takes (`nbytes_of`), and `call_shapes`, with the ratio of the capture to the call.

    python benchmarks/probe_shapes.py [--repeat N]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import _results
import numpy as np

from fecomlite.runtime.capture import call_shapes, nbytes_of


def cases() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    a, b = np.ones((64, 256), np.float32), np.ones((256, 128), np.float32)
    found: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
        ("numpy.matmul 64×256 @ 256×128", np.matmul, (a, b))]
    try:
        import torch
    except ImportError:
        return found
    found.append(("torch.nn.Linear(256, 128) on 64×256", torch.nn.Linear(256, 128),
                  (torch.ones(64, 256),)))
    return found


def micros(func: Callable[[], Any], repeat: int) -> float:
    return min(timeit.repeat(func, number=repeat, repeat=5)) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    _results.add_option(parser, "probe_shapes")
    options = parser.parse_args()
    n, figures = options.repeat, {}
    print(f"{'call':40} {'call µs':>9} {'sizes µs':>9} {'shapes µs':>10} {'shapes÷call':>12}")
    for name, fn, args in cases():
        result = fn(*args)
        call = micros(lambda fn=fn, args=args: fn(*args), n)
        sizes = micros(lambda args=args, r=result: (nbytes_of(args, {}), nbytes_of((r,), {})), n)
        shapes = micros(lambda fn=fn, args=args, r=result: call_shapes(fn, args, {}, r), n)
        print(f"{name:40} {call:9.2f} {sizes:9.2f} {shapes:10.2f} {shapes / call:12.2f}")
        figures[name] = {"call_us": call, "sizes_us": sizes, "shapes_us": shapes,
                         "shapes_to_call": shapes / call}
    _results.write(options.json, "probe_shapes", {"repeat": n, "calls": figures})


if __name__ == "__main__":
    main()
