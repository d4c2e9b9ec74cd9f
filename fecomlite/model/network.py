"""The networks the model speaks about: a sweep configuration, or a model summary from a script.

A `NetworkConfig` is one fully connected network of the sweep (width, depth, shape) with how it is
trained (batch size, dataset size, epochs, optimiser). A *summary* is the same information for
any Keras/PyTorch model, as JSON (format `fecomlite-summary/1`), written by the sweep's program
or by `summary_from_keras` in a user's script, and read by `fecomlite model predict --summary`.
Both become a list of per-layer `ApiFeatures`, from which `features.training_step` works.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fecomlite.model.features import (
    OPTIMIZERS,
    ApiFeatures,
    FeatureError,
    conv2d,
    dense,
    embedding,
)

SHAPES = ("rectangle", "funnel", "exponential", "wide_first")
SUMMARY_FORMAT = "fecomlite-summary/1"
# layers that move no data of their own or are elementwise (not counted, features.py)
UNCOUNTED_LAYERS = frozenset({
    "InputLayer", "Flatten", "Reshape", "Activation", "ReLU", "Softmax", "Dropout", "Tanh",
    "Sigmoid",
})


class ConfigError(ValueError):
    """A network configuration or summary that cannot describe a network."""


@dataclass(frozen=True)
class NetworkConfig:
    """One fully connected network and how it is trained.

    width is the widest hidden layer; shape says how the others follow it:
    rectangle (all `width`), funnel (narrowing linearly towards the outputs), exponential
    (halving layer after layer), wide_first (first `width`, the others half of it).
    Each epoch runs dataset_size // batch_size full steps (a partial batch would retrace).
    """

    width: int
    depth: int
    shape: str = "rectangle"
    batch_size: int = 32
    dataset_size: int = 4096
    epochs: int = 1
    inputs: int = 32
    outputs: int = 10
    optimizer: str = "adam"

    def __post_init__(self) -> None:
        for name in ("width", "depth", "batch_size", "dataset_size", "epochs", "inputs",
                     "outputs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, not {value!r}")
        if self.shape not in SHAPES:
            raise ConfigError(f"unknown shape {self.shape!r}; known: {', '.join(SHAPES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"unknown optimizer {self.optimizer!r}; known: {', '.join(OPTIMIZERS)}"
            )
        if self.dataset_size < self.batch_size:
            raise ConfigError(
                f"dataset size {self.dataset_size} is smaller than batch size "
                f"{self.batch_size}: not one full training step"
            )

    def hidden_widths(self) -> list[int]:
        w, d = self.width, self.depth
        if self.shape == "rectangle":
            return [w] * d
        if self.shape == "funnel":
            return [max(1, round(w + (self.outputs - w) * i / d)) for i in range(d)]
        if self.shape == "exponential":
            return [max(1, w >> i) for i in range(d)]
        return [w] + [max(1, w // 2)] * (d - 1)  # wide_first

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def key(self) -> str:
        return (f"{self.shape}-w{self.width}-d{self.depth}-b{self.batch_size}"
                f"-n{self.dataset_size}-e{self.epochs}")

    def layer_sizes(self) -> list[int]:
        return [self.inputs, *self.hidden_widths(), self.outputs]

    def layers(self) -> list[ApiFeatures]:
        sizes = self.layer_sizes()
        return [dense(self.batch_size, a, b, api="keras.layers.Dense")
                for a, b in zip(sizes, sizes[1:], strict=False)]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NetworkConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"incomplete configuration: {exc}") from exc


@dataclass(frozen=True)
class Training:
    """How a summarised network is trained: what turns one step into a run."""

    batch_size: int
    steps: int
    optimizer: str = "adam"


def summary_of(config: NetworkConfig, framework: str = "keras") -> dict[str, Any]:
    """The summary a sweep configuration's network has (what fc_program writes from its model)."""
    sizes = config.layer_sizes()
    layers = [
        {"type": "Dense", "input_shape": [a], "output_shape": [b], "params": a * b + b}
        for a, b in zip(sizes, sizes[1:], strict=False)
    ]
    return _summary(framework, layers, config.batch_size, config.dataset_size, config.epochs,
                    config.optimizer)


def _summary(
    framework: str, layers: list[dict[str, Any]], batch_size: int, dataset_size: int,
    epochs: int, optimizer: str,
) -> dict[str, Any]:
    return {
        "format": SUMMARY_FORMAT, "framework": framework, "optimizer": optimizer,
        "batch_size": batch_size, "dataset_size": dataset_size, "epochs": epochs,
        "layers": layers,
    }


def summary_from_keras(
    model: Any, batch_size: int, dataset_size: int, epochs: int, optimizer: str = "adam"
) -> dict[str, Any]:
    """The summary of a built Keras model (duck-typed: imports no framework)."""
    layers = []
    for layer in model.layers:
        config = layer.get_config()
        entry: dict[str, Any] = {
            "type": type(layer).__name__,
            "input_shape": _drop_batch(layer.input.shape),
            "output_shape": _drop_batch(layer.output.shape),
            "params": int(layer.count_params()),
        }
        for key in ("kernel_size", "strides", "padding", "input_dim", "use_bias"):
            if key in config:
                entry[key] = config[key]
        layers.append(entry)
    return _summary("keras", layers, batch_size, dataset_size, epochs, optimizer)


def _drop_batch(shape: Sequence[Any]) -> list[int | None]:
    return [None if d is None else int(d) for d in list(shape)[1:]]


def read_summary(path: Path) -> dict[str, Any]:
    """Read and check a summary file; ConfigError says what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read summary {path}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT:
        raise ConfigError(f"{path} is not a {SUMMARY_FORMAT} summary")
    if not isinstance(data.get("layers"), list) or not data["layers"]:
        raise ConfigError(f"{path}: a summary needs a non-empty list of layers")
    return data


def training_of(summary: dict[str, Any], **overrides: int | str | None) -> Training:
    """Batch size, steps and optimiser of a summary, each overridable (None keeps the summary's)."""
    merged = {**summary, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        batch, size, epochs = (int(merged[k]) for k in ("batch_size", "dataset_size", "epochs"))
    except KeyError as exc:
        raise ConfigError(f"the summary does not say {exc.args[0]}; give it as an option") from exc
    if min(batch, size, epochs) < 1:
        raise ConfigError("batch size, dataset size and epochs must be positive")
    if size < batch:
        raise ConfigError(f"dataset size {size} is smaller than batch size {batch}")
    optimizer = str(merged.get("optimizer", "adam"))
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    return Training(batch, epochs * (size // batch), optimizer)


def layers_from_summary(summary: dict[str, Any], batch_size: int) -> list[ApiFeatures]:
    """One ApiFeatures per summarised layer; layers without a FLOP model are marked unknown."""
    return [_layer_features(i, layer, batch_size) for i, layer in enumerate(summary["layers"])]


def _layer_features(i: int, layer: dict[str, Any], batch: int) -> ApiFeatures:
    kind = str(layer.get("type", ""))
    api = f"layer {i} ({kind or 'no type'})"
    if kind in UNCOUNTED_LAYERS:
        return ApiFeatures(api, True, note="elementwise or a view: not counted")
    if kind not in ("Dense", "Conv2D", "Embedding"):
        return ApiFeatures(api, False, note=f"no FLOP model for {kind} layers")
    try:
        return _counted_layer(kind, api, layer, batch)
    except FeatureError as exc:
        raise ConfigError(f"{api}: {exc}") from exc
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"{api}: incomplete layer description ({exc!r})") from exc


def _counted_layer(kind: str, api: str, layer: dict[str, Any], batch: int) -> ApiFeatures:
    inp = [int(d) for d in layer["input_shape"]]
    out = [int(d) for d in layer["output_shape"]]
    bias = bool(layer.get("use_bias", True))
    if kind == "Dense":
        return dense(batch * math.prod(inp[:-1]), inp[-1], out[-1], bias=bias, api=api)
    if kind == "Conv2D":
        strides = layer.get("strides", 1)
        stride = strides if isinstance(strides, int) else int(strides[0])
        return conv2d(batch, inp[0], inp[1], inp[2], out[2], layer["kernel_size"], stride=stride,
                      padding=str(layer.get("padding", "valid")), bias=bias, api=api)
    return embedding(batch * math.prod(inp), int(layer["input_dim"]), out[-1], api=api)
