"""Prioritized fictitious self-play: turn win rates against candidate opponents into choice probabilities.

Weightings (x is the win rate of the player against a candidate):
- squared:  (1 - x)^2  focus on the opponents we lose to (AlphaStar's main agents);
- variance: x (1 - x)  focus on opponents of our level (curricula);
- linear:   1 - x      a milder `squared`;
- linear_capped: min(0.5, 1 - x)  every opponent beaten less than half the time alike (AlphaStar's league
  exploiters: find what the whole league has not covered, not just the strongest);
- uniform:  1          plain fictitious self-play.
When every weight is zero (e.g. `squared` and we beat everyone) the choice falls back to uniform, so the
probabilities are never NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

WEIGHTINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "squared": lambda x: (1.0 - x) ** 2,
    "variance": lambda x: x * (1.0 - x),
    "linear": lambda x: 1.0 - x,
    "linear_capped": lambda x: np.minimum(0.5, 1.0 - x),
    "uniform": lambda x: np.ones_like(x),
}

# Below this total weight the weights carry no preference worth following.
_MIN_TOTAL_WEIGHT = 1e-12


def pfsp(win_rates: Sequence[float] | np.ndarray, weighting: str = "squared") -> np.ndarray:
    """Probabilities (summing to 1) of choosing each candidate given our win rates against them."""
    try:
        weight_fn = WEIGHTINGS[weighting]
    except KeyError:
        raise ValueError(
            f"weighting: unknown {weighting!r} (expected one of: {', '.join(WEIGHTINGS)})"
        ) from None
    x = np.asarray(win_rates, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"win_rates: expected a non-empty 1-d sequence, got shape {x.shape}")
    if not np.all(np.isfinite(x)) or np.any(x < 0.0) or np.any(x > 1.0):
        raise ValueError(f"win_rates: every value must be within [0, 1], got {x.tolist()}")
    weights = np.clip(weight_fn(x), 0.0, None)
    total = float(weights.sum())
    if not total > _MIN_TOTAL_WEIGHT:
        return np.full(x.size, 1.0 / x.size)
    return weights / total
