"""What a framework call and a training step do: FLOPs, parameters, bytes moved, working set.

The energy model's inputs, computed from shapes alone (no framework import), for the APIs whose
cost follows from their shapes: dense/linear layers, matrix products, 2-D convolutions and
embeddings. Any other API is reported as unknown, never guessed.

Counting conventions (an approximation, stated so a figure can be checked by hand):
- a multiply-add is 2 FLOPs; a bias add is 1 FLOP per output element; activations are not counted;
- a training step is forward + backward + optimiser update. Backward costs two forwards for
  products and convolutions (input and weight gradients), one add per output element for an
  embedding (a scatter-add). The optimiser costs `flops_per_param` per parameter;
- each tensor is counted once per pass in which it is read or written (framework temporaries,
  fusion and the loss are ignored). Forward reads weights and input and writes the output;
  backward reads the output gradient, weights and input and writes the input and weight
  gradients; the optimiser reads weights, gradients and its state and writes weights and state;
- a layer's working set is its weights, their gradients and optimiser state, and its input and
  output (and their gradients) for one batch. All bytes a layer moves in a step are charged to
  the cache level its working set fits in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fecomlite.model.cache import MemoryHierarchy

DTYPE_BYTES = 4  # float32, what the sweep trains in
INDEX_BYTES = 8  # int64 token ids


class FeatureError(ValueError):
    """Shapes that make no sense for an API (a zero or negative size, a missing dimension)."""


@dataclass(frozen=True)
class Optimizer:
    name: str
    flops_per_param: float
    state_per_param: int  # tensors of the parameters' size the optimiser keeps


OPTIMIZERS: dict[str, Optimizer] = {
    "adam": Optimizer("adam", 12.0, 2),  # two moment updates, bias correction, sqrt, divide
    "sgd": Optimizer("sgd", 2.0, 0),
}


@dataclass(frozen=True)
class ApiFeatures:
    """One forward call of a framework API (a layer applied to a batch, a product, ...)."""

    api: str
    known: bool
    flops: float = 0.0
    backward_flops: float = 0.0
    params: int = 0
    weight_bytes: float = 0.0  # weights the call reads (an embedding: only the rows it gathers)
    input_bytes: float = 0.0
    output_bytes: float = 0.0
    note: str = ""

    @property
    def bytes_read(self) -> float:
        return self.weight_bytes + self.input_bytes

    @property
    def bytes_written(self) -> float:
        return self.output_bytes

    @property
    def working_set(self) -> float:
        return self.weight_bytes + self.input_bytes + self.output_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "api": self.api, "known": self.known, "flops": self.flops,
            "backward_flops": self.backward_flops, "params": self.params,
            "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
            "working_set": self.working_set, "note": self.note,
        }


def _positive(**sizes: Any) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FeatureError(f"{name} must be a positive integer, not {value!r}")


def dense(
    batch: int, in_features: int, out_features: int, *, bias: bool = True,
    dtype_bytes: int = DTYPE_BYTES, api: str = "dense",
) -> ApiFeatures:
    """A fully connected layer on a batch: y = x·W (+ b)."""
    _positive(batch=batch, in_features=in_features, out_features=out_features)
    product = 2.0 * batch * in_features * out_features
    params = in_features * out_features + (out_features if bias else 0)
    return ApiFeatures(
        api, True,
        flops=product + (batch * out_features if bias else 0),
        backward_flops=2 * product + (batch * out_features if bias else 0),
        params=params,
        weight_bytes=params * dtype_bytes,
        input_bytes=batch * in_features * dtype_bytes,
        output_bytes=batch * out_features * dtype_bytes,
    )


def matmul(
    a_shape: Sequence[int], b_shape: Sequence[int], *, dtype_bytes: int = DTYPE_BYTES,
    api: str = "matmul",
) -> ApiFeatures:
    """A (batched) matrix product (..., m, k) @ (..., k, n); leading dimensions broadcast."""
    a, b = [int(d) for d in a_shape], [int(d) for d in b_shape]
    if len(a) < 2 or len(b) < 2:
        raise FeatureError(f"matmul needs two matrices, got shapes {a} and {b}")
    _positive(**{f"dimension {i} of a": d for i, d in enumerate(a)},
              **{f"dimension {i} of b": d for i, d in enumerate(b)})
    (m, k), (k2, n) = a[-2:], b[-2:]
    if k != k2:
        raise FeatureError(f"matmul inner dimensions differ: {a} @ {b}")
    lead_a, lead_b = a[:-2], b[:-2]
    width = max(len(lead_a), len(lead_b))
    lead = []
    for da, db in zip([1] * (width - len(lead_a)) + lead_a, [1] * (width - len(lead_b)) + lead_b,
                      strict=True):
        if da != db and 1 not in (da, db):
            raise FeatureError(f"matmul batch dimensions do not broadcast: {a} @ {b}")
        lead.append(max(da, db))
    batch = math.prod(lead)
    flops = 2.0 * batch * m * k * n
    return ApiFeatures(
        api, True, flops=flops, backward_flops=2 * flops,
        input_bytes=(math.prod(a) + math.prod(b)) * dtype_bytes,
        output_bytes=batch * m * n * dtype_bytes,
    )


def conv2d(
    batch: int, height: int, width: int, in_channels: int, out_channels: int,
    kernel: int | Sequence[int], *, stride: int = 1, padding: str = "same", bias: bool = True,
    dtype_bytes: int = DTYPE_BYTES, api: str = "conv2d",
) -> ApiFeatures:
    """A 2-D convolution of a batch of height × width × in_channels images."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else (int(kernel[0]), int(kernel[1]))
    _positive(batch=batch, height=height, width=width, in_channels=in_channels,
              out_channels=out_channels, kernel_height=kh, kernel_width=kw, stride=stride)
    if padding == "same":
        oh, ow = math.ceil(height / stride), math.ceil(width / stride)
    elif padding == "valid":
        oh, ow = (height - kh) // stride + 1, (width - kw) // stride + 1
        if oh < 1 or ow < 1:
            raise FeatureError(f"a {kh}×{kw} kernel does not fit a {height}×{width} image")
    else:
        raise FeatureError(f"padding must be 'same' or 'valid', not {padding!r}")
    outputs = batch * oh * ow * out_channels
    product = 2.0 * outputs * in_channels * kh * kw
    params = kh * kw * in_channels * out_channels + (out_channels if bias else 0)
    return ApiFeatures(
        api, True,
        flops=product + (outputs if bias else 0),
        backward_flops=2 * product + (outputs if bias else 0),
        params=params,
        weight_bytes=params * dtype_bytes,
        input_bytes=batch * height * width * in_channels * dtype_bytes,
        output_bytes=outputs * dtype_bytes,
    )


def embedding(
    tokens: int, vocabulary: int, dim: int, *, dtype_bytes: int = DTYPE_BYTES,
    api: str = "embedding",
) -> ApiFeatures:
    """A table lookup of `tokens` ids: no arithmetic forward, a scatter-add backward."""
    _positive(tokens=tokens, vocabulary=vocabulary, dim=dim)
    return ApiFeatures(
        api, True,
        flops=0.0,
        backward_flops=float(tokens * dim),
        params=vocabulary * dim,
        weight_bytes=min(tokens, vocabulary) * dim * dtype_bytes,
        input_bytes=tokens * INDEX_BYTES,
        output_bytes=tokens * dim * dtype_bytes,
    )


_KINDS = {"dense": dense, "matmul": matmul, "conv2d": conv2d, "embedding": embedding}
_ALIASES = {"linear": "dense", "mm": "matmul", "bmm": "matmul"}
_METHOD_SUFFIXES = ("__call__", "call", "forward")


def api_kind(api: str) -> str | None:
    """dense | matmul | conv2d | embedding for a canonical API name, None when unknown."""
    parts = api.split(".")
    while len(parts) > 1 and parts[-1] in _METHOD_SUFFIXES:
        parts.pop()
    kind = _ALIASES.get(parts[-1].lower(), parts[-1].lower())
    return kind if kind in _KINDS else None


def api_features(api: str, **shapes: Any) -> ApiFeatures:
    """Features of one call of `api` from its shapes (the arguments of `dense`, `matmul`, ...).

    An API without a FLOP model comes back with known=False and a note saying so.
    """
    kind = api_kind(api)
    if kind is None:
        return ApiFeatures(api, False, note=f"no FLOP model for {api}; fecomlite knows "
                           "dense/linear, matmul, conv2d and embedding")
    try:
        return _KINDS[kind](**shapes, api=api)
    except TypeError as exc:
        raise FeatureError(f"{api} ({kind}): {exc}") from exc


@dataclass(frozen=True)
class StepFeatures:
    """One training step of a whole network (all layers, one batch)."""

    flops: float
    params: int
    weight_bytes: float  # the parameters
    activation_bytes: float  # every layer's input and output for one batch
    bytes_moved: float  # read and written in the step
    bytes_by_level: dict[str, float]  # bytes_moved split by the level each layer's set fits in
    max_working_set: float
    unknown: tuple[str, ...] = field(default=())  # calls without a FLOP model

    def to_json(self) -> dict[str, Any]:
        return {
            "flops": self.flops, "params": self.params, "weight_bytes": self.weight_bytes,
            "activation_bytes": self.activation_bytes, "bytes_moved": self.bytes_moved,
            "bytes_by_level": dict(self.bytes_by_level), "max_working_set": self.max_working_set,
            "unknown": list(self.unknown),
        }


def training_step(
    calls: Sequence[ApiFeatures], hierarchy: MemoryHierarchy, optimizer: str = "adam",
    dtype_bytes: int = DTYPE_BYTES,
) -> StepFeatures:
    """Forward, backward and optimiser update of every call, with bytes split by cache level."""
    if optimizer not in OPTIMIZERS:
        raise FeatureError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    opt = OPTIMIZERS[optimizer]
    by_level = dict.fromkeys(hierarchy.level_names, 0.0)
    flops = moved = activations = weights = largest = 0.0
    params = 0
    for call in calls:
        if not call.known:
            continue
        param_bytes = call.params * dtype_bytes
        forward = call.bytes_read + call.bytes_written
        backward = call.output_bytes + call.weight_bytes + call.input_bytes \
            + call.input_bytes + call.weight_bytes
        update = (2 + opt.state_per_param) * param_bytes + (1 + opt.state_per_param) * param_bytes
        working_set = (2 + opt.state_per_param) * param_bytes \
            + 2 * (call.input_bytes + call.output_bytes)
        layer_bytes = forward + backward + update
        by_level[hierarchy.level_of(working_set)] += layer_bytes
        flops += call.flops + call.backward_flops + opt.flops_per_param * call.params
        moved += layer_bytes
        activations += call.input_bytes + call.output_bytes
        weights += param_bytes
        params += call.params
        largest = max(largest, working_set)
    return StepFeatures(
        flops=flops, params=params, weight_bytes=weights, activation_bytes=activations,
        bytes_moved=moved, bytes_by_level=by_level, max_working_set=largest,
        unknown=tuple(call.api for call in calls if not call.known),
    )


def run_features(
    flops_per_step: float, params: int, bytes_by_level: dict[str, float], steps: int
) -> dict[str, float]:
    """A whole training run's features, the model's columns: step totals × steps, and `fixed`
    (1: one run, for the set-up cost every training call has whatever its size)."""
    values = {
        "flops": flops_per_step * steps,
        "params_steps": float(params * steps),
        "steps": float(steps),
        "fixed": 1.0,
    }
    values.update({f"bytes_{level}": b * steps for level, b in bytes_by_level.items()})
    return values
