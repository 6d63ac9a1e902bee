"""The closed-form two-player TrueSkill update gives what the `trueskill` package's factor graph gives.

Checked over generated ratings and configurations, for wins and draws (errors relative, or in units of the
player's sigma):
- against the package with the scipy backend (exact normal functions, like ours) to 1e-9, within 10 standard
  deviations of the performance difference (beyond that the direct formulas lose digits, the package's first);
- against its default backend, whose erfc approximation has ~1e-7 relative error, for wins within 2 standard
  deviations to 1e-6 (the cancellations in w of a narrow draw margin or a deep upset amplify that error);
- against the same formulas in 60-digit arithmetic (mpmath) everywhere, the far tails included, where the
  package gives up (FloatingPointError) or loses its digits, to 1e-6.
"""

from __future__ import annotations

import math

import pytest
import trueskill
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from league_service.config import EloConfig, TrueSkillConfig
from league_service.messages import Outcome
from league_service.ratings import _TAIL, RatingBook, TrueSkill1vs1, _vw_draw, _vw_win, trueskill_1vs1

mus = st.floats(min_value=-50.0, max_value=100.0)
sigmas = st.floats(min_value=0.05, max_value=20.0)
configs = st.builds(
    TrueSkillConfig,
    mu=st.just(25.0),
    sigma=st.just(25.0 / 3),
    beta=st.floats(min_value=0.5, max_value=10.0),
    tau=st.floats(min_value=0.0, max_value=1.0),
    draw_probability=st.floats(min_value=0.01, max_value=0.9),
)


def _package(cfg: TrueSkillConfig, backend: str | None) -> trueskill.TrueSkill:
    return trueskill.TrueSkill(
        mu=cfg.mu,
        sigma=cfg.sigma,
        beta=cfg.beta,
        tau=cfg.tau,
        draw_probability=cfg.draw_probability,
        backend=backend,
    )


def _sds_apart(cfg: TrueSkillConfig, first, second) -> float:
    """How many standard deviations of the performance difference the two means are apart."""
    return abs(first[0] - second[0]) / math.sqrt(
        2 * cfg.beta**2 + first[1] ** 2 + second[1] ** 2 + 2 * cfg.tau**2
    )


def _assert_close(got, want, priors, tol: float) -> None:
    for (mu, sigma), (want_mu, want_sigma), (_, sigma0) in zip(got, want, priors, strict=True):
        assert mu == pytest.approx(want_mu, rel=tol, abs=tol * (1.0 + sigma0))
        assert sigma == pytest.approx(want_sigma, rel=tol, abs=tol * (1.0 + sigma0))


def _check(cfg: TrueSkillConfig, first, second, drawn: bool, backend: str | None, tol: float) -> None:
    if backend == "scipy":
        pytest.importorskip("scipy")
    env = _package(cfg, backend)
    assume(_sds_apart(cfg, first, second) <= (2.0 if backend is None else 10.0))
    try:
        want = trueskill.rate_1vs1(
            env.create_rating(*first), env.create_rating(*second), drawn=drawn, env=env
        )
    except FloatingPointError:
        assume(False)  # the package gives up this far in a tail; covered by test_far_tails_stay_finite
    got = trueskill_1vs1(TrueSkill1vs1.from_config(cfg), first, second, drawn=drawn)
    _assert_close(got, [(r.mu, r.sigma) for r in want], (first, second), tol)


@settings(max_examples=150, deadline=None)
@given(cfg=configs, mu1=mus, s1=sigmas, mu2=mus, s2=sigmas, drawn=st.booleans())
def test_matches_the_package_with_exact_normal_functions(cfg, mu1, s1, mu2, s2, drawn):
    _check(cfg, (mu1, s1), (mu2, s2), drawn, "scipy", 1e-9)


@settings(max_examples=150, deadline=None)
@given(cfg=configs, mu1=mus, s1=sigmas, mu2=mus, s2=sigmas)
def test_wins_match_the_package_with_its_default_backend(cfg, mu1, s1, mu2, s2):
    _check(cfg, (mu1, s1), (mu2, s2), False, None, 1e-6)


def _precise(cfg: TrueSkillConfig, first, second, drawn: bool):
    """The two-player update in 60-digit arithmetic, straight from the textbook formulas."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(60):
        beta, tau2 = mp.mpf(cfg.beta), mp.mpf(cfg.tau) ** 2
        margin = 2 * beta * mp.erfinv(mp.mpf(cfg.draw_probability))  # ppf((p + 1) / 2) * sqrt(2) * beta
        var1, var2 = mp.mpf(first[1]) ** 2 + tau2, mp.mpf(second[1]) ** 2 + tau2
        c2 = 2 * beta**2 + var1 + var2
        c = mp.sqrt(c2)
        t, eps = (mp.mpf(first[0]) - second[0]) / c, margin / c
        if drawn:
            a, b = eps - abs(t), -eps - abs(t)
            denom = mp.ncdf(a) - mp.ncdf(b)
            v = (mp.npdf(b) - mp.npdf(a)) / denom
            w = v * v + (a * mp.npdf(a) - b * mp.npdf(b)) / denom
            v = -v if t < 0 else v
        else:
            x = t - eps
            v = mp.npdf(x) / mp.ncdf(x)
            w = v * (v + x)
        return [
            (float(first[0] + var1 / c * v), float(mp.sqrt(var1 * (1 - var1 / c2 * w)))),
            (float(second[0] - var2 / c * v), float(mp.sqrt(var2 * (1 - var2 / c2 * w)))),
        ]


@settings(max_examples=100, deadline=None)
@given(cfg=configs, mu1=mus, s1=sigmas, mu2=mus, s2=sigmas, drawn=st.booleans())
def test_matches_precise_arithmetic_everywhere(cfg, mu1, s1, mu2, s2, drawn):
    first, second = (mu1, s1), (mu2, s2)
    got = trueskill_1vs1(TrueSkill1vs1.from_config(cfg), first, second, drawn=drawn)
    _assert_close(got, _precise(cfg, first, second, drawn), (first, second), 1e-6)


def test_the_draw_margin_is_the_packages():
    cfg = TrueSkillConfig(beta=3.0, draw_probability=0.25)
    assert TrueSkill1vs1.from_config(cfg).draw_margin == pytest.approx(
        trueskill.calc_draw_margin(0.25, 2, _package(cfg, "scipy")), rel=1e-12
    )


@pytest.mark.parametrize("side", [-1.0, 1.0])
def test_the_tail_formulas_continue_the_direct_ones(side):
    """At the switch to the asymptotic series, both ways agree (v and w are smooth there)."""
    below, above = -_TAIL * (1 + 1e-9), -_TAIL * (1 - 1e-9)
    for a, b in zip(_vw_win(below), _vw_win(above), strict=True):
        assert a == pytest.approx(b, rel=1e-7)
    eps = 0.3
    t_below, t_above = side * (_TAIL + eps) * (1 + 1e-9), side * (_TAIL + eps) * (1 - 1e-9)
    for a, b in zip(_vw_draw(t_below, eps), _vw_draw(t_above, eps), strict=True):
        assert a == pytest.approx(b, rel=1e-7)


@settings(max_examples=100, deadline=None)
@given(gap=st.floats(min_value=100.0, max_value=1e6), drawn=st.booleans())
def test_far_tails_stay_finite(gap, drawn):
    """An upset (or draw) 100+ skill points apart: finite, the pair moves together, sigma shrinks."""
    params = TrueSkill1vs1.from_config(TrueSkillConfig())
    (mu_low, s_low), (mu_high, s_high) = trueskill_1vs1(params, (0.0, 1.0), (gap, 1.0), drawn=drawn)
    assert all(math.isfinite(x) for x in (mu_low, s_low, mu_high, s_high))
    assert mu_low > 0.0 and mu_high < gap
    assert 0.0 < s_low <= math.sqrt(1.0 + params.tau**2) and 0.0 < s_high <= math.sqrt(1.0 + params.tau**2)


@settings(max_examples=50, deadline=None)
@given(outcomes=st.lists(st.sampled_from([Outcome.WIN, Outcome.DRAW, Outcome.LOSS]), min_size=1, max_size=20))
def test_the_book_rates_a_batch_like_the_package_episode_by_episode(outcomes):
    cfg = TrueSkillConfig()
    book = RatingBook(EloConfig(), cfg)
    book.add_player("a")
    book.add_player("b")
    book.commit(book.compute([("a", "b", o) for o in outcomes]))
    env = _package(cfg, "scipy")
    a, b = env.create_rating(), env.create_rating()
    for o in outcomes:
        if o is Outcome.LOSS:
            b, a = trueskill.rate_1vs1(b, a, env=env)
        else:
            a, b = trueskill.rate_1vs1(a, b, drawn=o is Outcome.DRAW, env=env)
    for got, want in ((book.get("a"), a), (book.get("b"), b)):
        assert (got.mu, got.sigma) == (pytest.approx(want.mu, rel=1e-9), pytest.approx(want.sigma, rel=1e-9))
        assert got.games == len(outcomes)
