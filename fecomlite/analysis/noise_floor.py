"""Energy is never shown below zero: how an estimate that noise took below zero is reported.

An above-idle estimate is the measured energy less the idle baseline's share, so on a noisy
machine it can come out below zero. Such a figure is not energy the program used:
- below zero by at most NOISE_SIGMAS × its noise (1σ): it is zero within noise, shown as 0 and
  read "≈ 0 (noise ± y)";
- below zero by more: the baseline was above the machine's level while the calls ran (other load
  during the baseline, an idle level that drifted), so the figure is not shown at all (NaN) and
  its domain is flagged unreliable with that reason.
The raw estimate is kept beside the shown figure (`raw_*`) so that sums can still be checked.
"""

from __future__ import annotations

import math

# 3σ, not 2σ: a report has tens of per-API figures, and at 2σ one in 44 pure-noise figures
# would land beyond it and flag its domain unreliable by chance alone (one in 740 at 3σ)
NOISE_SIGMAS = 3.0
ROUNDING_J = 1e-9  # below any sensor's resolution: a difference of sums this small is rounding
WITHIN_NOISE = "within_noise"
BEYOND_NOISE = "beyond_noise"


def below_zero(value: float, sigma: float) -> str | None:
    """None for a figure at or above zero (or missing); else WITHIN_NOISE or BEYOND_NOISE."""
    if not math.isfinite(value) or value >= 0:
        return None
    noise = max(sigma if math.isfinite(sigma) and sigma > 0 else 0.0, ROUNDING_J)
    return WITHIN_NOISE if -value <= NOISE_SIGMAS * noise else BEYOND_NOISE


def shown(value: float, sigma: float) -> float:
    """The figure as reported: itself when ≥ 0, 0 when below zero within noise, else NaN."""
    state = below_zero(value, sigma)
    if state is None:
        return value
    return 0.0 if state == WITHIN_NOISE else math.nan
