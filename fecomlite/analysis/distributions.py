"""Student's t quantile and the χ² survival function, for whole degrees of freedom, without scipy.

The run summary needs two numbers from these distributions (a 95 % interval, the intensity fit's
Wald test); importing scipy.special for them (it brings numpy.testing, unittest and f2py through
its array-API layer) cost every `fecomlite run` a good part of a second. Both are closed forms
for whole degrees of freedom; tests hold them to scipy.stats.
"""

from __future__ import annotations

import math
from statistics import NormalDist

EXACT_T_DOF = 100  # above, Cornish–Fisher is within 1e-6 relative of the quantile (p ≤ 0.9999)


def chi2_sf(x: float, dof: int) -> float:
    """P(χ² > x) with `dof` degrees of freedom (scipy.stats.chi2.sf): the regularised upper
    incomplete gamma Q(dof/2, x/2) as its finite series (Abramowitz & Stegun 26.4.4–5)."""
    if dof < 1:
        raise ValueError("dof must be a whole number ≥ 1")
    if x <= 0:
        return 1.0
    h = x / 2
    if dof % 2 == 0:
        terms = (i * math.log(h) - math.lgamma(i + 1) - h for i in range(dof // 2))
        return min(1.0, math.fsum(math.exp(t) for t in terms))
    terms = ((j - 0.5) * math.log(h) - math.lgamma(j + 0.5) - h for j in range(1, dof // 2 + 1))
    return min(1.0, math.erfc(math.sqrt(h)) + math.fsum(math.exp(t) for t in terms))


def t_quantile(p: float, dof: int) -> float:
    """The `p` quantile of Student's t with `dof` degrees of freedom (scipy.stats.t.ppf): the
    closed-form distribution function (Abramowitz & Stegun 26.7.3–4) inverted by bisection up
    to EXACT_T_DOF, the Cornish–Fisher expansion (26.7.5) beyond."""
    if dof < 1 or not 0 < p < 1:
        raise ValueError("dof must be a whole number ≥ 1 and p within (0, 1)")
    if p < 0.5:
        return -t_quantile(1 - p, dof)
    if dof > EXACT_T_DOF:
        return _cornish_fisher(NormalDist().inv_cdf(p), dof)
    target = 2 * p - 1  # P(|T| < t)
    low, high = 0.0, 1.0
    while _two_sided(high, dof) < target:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if mid in (low, high):
            break
        low, high = (mid, high) if _two_sided(mid, dof) < target else (low, mid)
    return (low + high) / 2


def _two_sided(t: float, dof: int) -> float:
    """P(|T| < t), t ≥ 0."""
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2 == 0:  # sinθ (1 + ½cos²θ + (1·3)/(2·4)cos⁴θ + ...), dof/2 terms
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    if dof == 1:
        return 2 * theta / math.pi
    term, total = math.cos(theta), math.cos(theta)  # cosθ (1 + (2/3)cos²θ + (2·4)/(3·5)...)
    for k in range(1, (dof - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + s * total)


def _cornish_fisher(z: float, dof: int) -> float:
    v = float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )
