"""PFSP weightings: the probabilities they give, and that they never give NaN."""

from __future__ import annotations

import numpy as np
import pytest

from league_service.pfsp import WEIGHTINGS, pfsp


def test_squared_prefers_the_opponents_we_lose_to():
    p = pfsp([0.25, 0.5, 1.0], "squared")
    np.testing.assert_allclose(p, np.array([0.5625, 0.25, 0.0]) / 0.8125)


def test_variance_prefers_opponents_of_our_level():
    p = pfsp([0.0, 0.5, 0.9], "variance")
    np.testing.assert_allclose(p, np.array([0.0, 0.25, 0.09]) / 0.34)


def test_linear_and_uniform():
    np.testing.assert_allclose(pfsp([0.25, 0.75], "linear"), [0.75, 0.25])
    # AlphaStar's league exploiters: every opponent beaten less than half the time weighs the same.
    np.testing.assert_allclose(pfsp([0.1, 0.4, 0.75], "linear_capped"), np.array([0.5, 0.5, 0.25]) / 1.25)
    np.testing.assert_allclose(pfsp([0.1, 0.7, 0.9], "uniform"), [1 / 3] * 3)


@pytest.mark.parametrize("weighting", sorted(WEIGHTINGS))
@pytest.mark.parametrize("value", [0.0, 1.0])
def test_all_equal_extreme_win_rates_give_uniform_never_nan(weighting, value):
    p = pfsp([value] * 4, weighting)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p, [0.25] * 4)


@pytest.mark.parametrize("weighting", sorted(WEIGHTINGS))
def test_probabilities_are_a_distribution(weighting):
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = pfsp(rng.uniform(size=rng.integers(1, 8)), weighting)
        assert np.all(p >= 0) and np.isclose(p.sum(), 1.0)


def test_single_candidate_is_certain():
    np.testing.assert_allclose(pfsp([1.0], "squared"), [1.0])


@pytest.mark.parametrize("bad", [[], [1.5], [-0.1], [float("nan")], [[0.5]]])
def test_bad_win_rates_raise(bad):
    with pytest.raises(ValueError, match="win_rates"):
        pfsp(bad)


def test_unknown_weighting_raises():
    with pytest.raises(ValueError, match="weighting"):
        pfsp([0.5], "cubic")
