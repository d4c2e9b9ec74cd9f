"""What a sweep's data can identify of the memory-aware model's per-level costs.

A fit can predict well while its coefficients mean nothing: when the bytes at each cache level
grow together with the FLOPs and the time (a grid of similar networks), many splits of the
energy among the terms fit equally, and least squares picks one of them. The per-level costs are
reported as costs only when the data identify them:
- separable: the terms are not collinear (condition number of the design with columns scaled to
  unit RMS below COND_LIMIT, every term's variance inflation factor below VIF_LIMIT);
- determined: each per-level cost exceeds twice its standard error;
- ordered: the costs per byte do not fall going away from the core (L1 ≤ L2 ≤ L3 ≤ DRAM).
Otherwise the model is presented as a time/FLOP model, with the sentence saying why.
"""

from __future__ import annotations

from typing import Any

import numpy as np

COND_LIMIT = 30.0  # condition numbers beyond ~30 mean coefficients traded against each other
VIF_LIMIT = 10.0  # the usual threshold of a variance inflation factor
SE_RATIO = 2.0  # a cost at least twice its standard error


def collinearity(x: np.ndarray, features: list[str]) -> dict[str, Any]:
    """Condition number of the design (columns scaled to unit RMS) and each term's variance
    inflation factor, for a fit through the origin (uncentred, as the model has no intercept).
    `x` is the design as the fit weighs it (a relative fit: each row over its energy)."""
    scale = np.sqrt(np.mean(x**2, axis=0))
    scale[scale == 0] = 1.0
    xs = x / scale
    gram = xs.T @ xs
    try:
        inverse = np.linalg.inv(gram)
        vif = np.diag(inverse) * np.diag(gram)
    except np.linalg.LinAlgError:
        vif = np.full(len(features), np.inf)
    cond = float(np.linalg.cond(xs)) if xs.size else float("nan")
    return {"condition_number": cond,
            "vif": {f: float(v) for f, v in zip(features, vif, strict=True)}}


def identify(x: np.ndarray, features: list[str], coef: np.ndarray, se: np.ndarray,
             levels: list[str]) -> dict[str, Any]:
    """Whether the per-level costs of a memory-aware fit (design `x` over `features`) are
    identified, and the reasons they are not, in words."""
    found = collinearity(x, features)
    per_level = [(lv, f"bytes_{lv}") for lv in levels if f"bytes_{lv}" in features]
    costs = {lv: float(coef[features.index(f)]) for lv, f in per_level}
    errors = {lv: float(se[features.index(f)]) for lv, f in per_level}
    reasons = []
    worst = max(found["vif"].items(), key=lambda kv: kv[1], default=(None, 0.0))
    separable = found["condition_number"] < COND_LIMIT and worst[1] < VIF_LIMIT
    if not separable:
        reasons.append(f"the terms are collinear (condition number "
                       f"{found['condition_number']:.3g}, largest variance inflation "
                       f"{worst[1]:.3g} for {worst[0]}): the bytes at each level grow with the "
                       "FLOPs and the time across these configurations")
    vague = [lv for lv in costs if not costs[lv] > SE_RATIO * errors[lv]]
    if vague:
        reasons.append(f"the cost per byte of {', '.join(vague)} is within "
                       f"{SE_RATIO:g} standard errors of zero")
    ordered = all(a <= b for a, b in zip(costs.values(), list(costs.values())[1:], strict=False))
    if not ordered:
        reasons.append("the fitted costs per byte are not ordered from the core outwards ("
                       + " ≤ ".join(costs) + " expected)")
    if not per_level:
        reasons.append("no configuration's bytes are charged to a cache level")
    return {"identified": not reasons, "separable": separable, "determined": not vague,
            "ordered": ordered, "reasons": reasons, **found,
            "costs_per_byte": costs, "std_errors": errors}


def sentence(check: dict[str, Any]) -> str:
    """The report's sentence for a model whose per-level costs the data do not identify."""
    return ("These configurations cannot tell the memory levels' costs apart: "
            + "; ".join(check.get("reasons") or ["not checked"])
            + ". The model is reported as a time/FLOP model (energy = cost per FLOP × FLOPs + "
            "power × time); its per-level costs are not shown, as they are not physical costs.")
