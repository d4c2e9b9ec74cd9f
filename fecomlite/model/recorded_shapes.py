"""From the shapes the probe recorded at a call site (`capture.call_shapes`) to the
arguments of `features.api_features`: which operand is the input, which the weights, in which
layout. Conventions of each framework, stated so a figure can be checked:

- dense/linear: input (..., in) with every leading dimension counted as batch; torch `weight` is
  (out, in), Keras `kernel` (in, out); `torch.nn.functional.linear(x, weight, bias)` passes it;
- matmul: the two operands (a tensor method's bound tensor first); a 1-D operand is a row
  (left) or a column (right) vector, as numpy and torch treat it;
- conv2d: torch NCHW input with `weight` (out, in, kh, kw); Keras NHWC (channels_last) with
  `kernel` (kh, kw, in, out); the padding is read off the output size (same or valid), stride
  must be equal in both directions;
- embedding: every id of the input is a token; torch `weight` / Keras `embeddings` is
  (vocabulary, dim).

Shapes that do not fit (an unknown dimension, another layout) raise FeatureError with the reason.
"""

from __future__ import annotations

import math
from typing import Any

from fecomlite.model.features import DTYPE_BYTES, ApiFeatures, FeatureError, api_features, api_kind


def features_from_shapes(api: str, record: dict[str, Any]) -> ApiFeatures:
    """The features of one call of `api` from one recorded shape record."""
    kind = api_kind(api)
    if kind is None:
        return api_features(api)  # known=False, with the note saying why
    tensors = _operands(record)
    weights = record.get("weights") or {}
    if not tensors:
        raise FeatureError(f"{api}: no tensor argument was recorded")
    dtype_bytes = tensors[0].get("itemsize") or DTYPE_BYTES
    shape = _dims(tensors[0])
    if kind == "dense":
        return api_features(api, **_dense(shape, tensors, weights), dtype_bytes=dtype_bytes)
    if kind == "matmul":
        if len(tensors) < 2:
            raise FeatureError(f"{api}: needs two operands, {len(tensors)} recorded")
        a, b = shape, _dims(tensors[1])
        a = [1, *a] if len(a) == 1 else a
        b = [*b, 1] if len(b) == 1 else b
        return api_features(api, a_shape=a, b_shape=b, dtype_bytes=dtype_bytes)
    if kind == "conv2d":
        return api_features(api, **_conv2d(shape, record, weights), dtype_bytes=dtype_bytes)
    table = weights.get("weight") or weights.get("embeddings")
    if table is None or len(_dims(table)) != 2:
        raise FeatureError(f"{api}: the embedding table's shape was not recorded")
    vocabulary, dim = _dims(table)
    return api_features(api, tokens=math.prod(shape), vocabulary=vocabulary, dim=dim,
                        dtype_bytes=(table.get("itemsize") or DTYPE_BYTES))


def _operands(record: dict[str, Any]) -> list[dict[str, Any]]:
    bound = [record["self"]] if record.get("self") else []
    named = list((record.get("kwargs") or {}).values())
    return [t for t in (*bound, *(record.get("args") or []), *named) if t]


def _dims(tensor: dict[str, Any]) -> list[int]:
    dims = tensor.get("shape")
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        raise FeatureError(f"a shape with unknown dimensions: {dims}")
    return dims


def _dense(
    shape: list[int], tensors: list[dict[str, Any]], weights: dict[str, Any]
) -> dict[str, Any]:
    if "kernel" in weights:
        in_features, out_features = _dims(weights["kernel"])[-2:]
    elif "weight" in weights or len(tensors) >= 2:  # a module, or F.linear(x, weight, bias)
        weight = weights.get("weight") or tensors[1]
        out_features, in_features = _dims(weight)[-2:]
    else:
        raise FeatureError("the layer's weight shape was not recorded")
    if not shape or shape[-1] != in_features:
        raise FeatureError(f"input {shape} does not match {in_features} input features")
    bias = bool(weights.get("bias")) if weights else len(tensors) >= 3
    return {"batch": math.prod(shape[:-1]), "in_features": in_features,
            "out_features": out_features, "bias": bias}


def _conv2d(shape: list[int], record: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
    result = next((r for r in record.get("result") or [] if r), None)
    if len(shape) != 4 or result is None or len(_dims(result)) != 4:
        raise FeatureError("a 2-D convolution needs a 4-D input and output")
    out = _dims(result)
    if "kernel" in weights and weights.get("data_format", "channels_last") == "channels_last":
        kh, kw, _, out_channels = _dims(weights["kernel"])
        batch, height, width, in_channels = shape
        oh, ow = out[1], out[2]
        stride = weights.get("strides", [1, 1])
    elif "weight" in weights:
        out_channels, _, kh, kw = _dims(weights["weight"])
        batch, in_channels, height, width = shape
        oh, ow = out[2], out[3]
        stride = weights.get("stride", [1, 1])
    else:
        raise FeatureError("the layer's kernel shape (or a channels_last layout) was not recorded")
    stride = [stride, stride] if isinstance(stride, int) else list(stride)
    if stride[0] != stride[1]:
        raise FeatureError(f"unequal strides {stride} are not modelled")
    s = stride[0]
    if (oh, ow) == (math.ceil(height / s), math.ceil(width / s)):
        padding = "same"
    elif (oh, ow) == ((height - kh) // s + 1, (width - kw) // s + 1):
        padding = "valid"
    else:
        raise FeatureError(
            f"output {oh}×{ow} is neither same nor valid padding of {height}×{width}")
    return {"batch": batch, "height": height, "width": width, "in_channels": in_channels,
            "out_channels": out_channels, "kernel": (kh, kw), "stride": s, "padding": padding,
            "bias": bool(weights.get("bias"))}
