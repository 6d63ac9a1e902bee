"""Elo and TrueSkill ratings of every player, updated from every rated two-player episode (draws count).

Elo is the familiar single number; TrueSkill adds an uncertainty sigma that shrinks as a player plays. A
snapshot starts from its parent's rating: it is the same policy at that moment.

TrueSkill here is the closed form of the two-player case (`trueskill_1vs1`): for two players, one per team,
the `trueskill` package's factor graph reduces to one truncated-Gaussian update, and building that graph per
episode cost ~100 us, the most expensive part of a FinishJob. The unit tests check it against the package.
Not thread-safe by itself: the league calls it under its lock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from league_service.config import EloConfig, TrueSkillConfig
from league_service.league_errors import LeagueStateError, UnknownPlayerError
from league_service.messages import Outcome

_SCORE = {Outcome.WIN: 1.0, Outcome.DRAW: 0.5, Outcome.LOSS: 0.0}

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
# Beyond this many standard deviations into a tail, Phi is computed from the Mills ratio's asymptotic series
# (math.erfc underflows near 37, and the quotients below lose precision well before that).
_TAIL = 30.0
_THIN_DRAW_MARGIN = 1e-5
"""Below this draw margin (divided by c) a draw's v and w come from the narrow-interval expansion."""
_MAX_ELO_EXPONENT = 300.0  # 10**300 is still a float; 10**309 overflows


def elo_expected(rating: float, opponent: float) -> float:
    """The expected score of `rating` against `opponent`. The exponent is clamped: beyond a gap of 120,000 Elo the
    power overflows a float, and the score is 0 or 1 to float precision long before that."""
    exponent = min(max((opponent - rating) / 400.0, -_MAX_ELO_EXPONENT), _MAX_ELO_EXPONENT)
    return 1.0 / (1.0 + 10.0**exponent)


def _pdf(x: float) -> float:
    return _INV_SQRT_2PI * math.exp(-0.5 * x * x)


def _cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / _SQRT2)


def _mills(z: float) -> float:
    """(1 - Phi(z)) / phi(z) for z >= _TAIL (asymptotic series to z^-13; relative error below 1e-15 there)."""
    z2 = 1.0 / (z * z)
    series = 1.0 - 9.0 * z2 * (1.0 - 11.0 * z2)
    series = 1.0 - z2 * (1.0 - 3.0 * z2 * (1.0 - 5.0 * z2 * (1.0 - 7.0 * z2 * series)))
    return series / z


def _vw_win(x: float) -> tuple[float, float]:
    """TrueSkill's v and w of a win, at x = (mean difference - draw margin) / c."""
    if x < -_TAIL:
        v = 1.0 / _mills(-x)  # phi(x) / Phi(x)
    else:
        v = _pdf(x) / _cdf(x)
    return v, v * (v + x)


def _vw_draw(t: float, eps: float) -> tuple[float, float]:
    """TrueSkill's v and w of a draw, at mean difference t and draw margin eps (both divided by c).

    v is the mean and 1 - w the variance of a standard normal truncated to [-eps - |t|, eps - |t|] (v signed
    like t); far in the tail both are computed relative to phi(a), which would underflow.
    """
    if eps < _THIN_DRAW_MARGIN:
        # [b, a] is so narrow that Phi(a) - Phi(b) loses most of its digits to cancellation (v and w came out
        # wrong long before the difference reached 0, which divided by zero and took the coordinator down). The
        # truncated normal of a narrow interval is nearly uniform on it: its mean is the midpoint -|t| moved
        # towards 0 by eps^2 / 3 of itself, its variance eps^2 / 3 (error O(eps^4)).
        shrink = 1.0 - eps * eps / 3.0
        return -t * shrink, shrink
    a, b = eps - abs(t), -eps - abs(t)
    if a < -_TAIL:
        r = math.exp(0.5 * (a * a - b * b))  # phi(b) / phi(a)
        denom = _mills(-a) - r * _mills(-b)  # (Phi(a) - Phi(b)) / phi(a)
        top, spread = r - 1.0, a - b * r
    else:
        pa, pb = _pdf(a), _pdf(b)
        denom = _cdf(a) - _cdf(b)
        top, spread = pb - pa, a * pa - b * pb
    if not denom > 0.0:  # (not reached above _THIN_DRAW_MARGIN; kept so that no input divides by zero)
        return -t, 1.0
    v = top / denom
    w = v * v + spread / denom
    return (-v if t < 0 else v), w


@dataclass(frozen=True)
class TrueSkill1vs1:
    """What a two-player TrueSkill update needs of the configuration."""

    beta: float
    tau: float
    # In performance units: games this close are draws (the package's calc_draw_margin for 2 players).
    draw_margin: float

    @staticmethod
    def from_config(cfg: TrueSkillConfig) -> TrueSkill1vs1:
        quantile = NormalDist().inv_cdf((cfg.draw_probability + 1.0) / 2.0)
        return TrueSkill1vs1(cfg.beta, cfg.tau, draw_margin=quantile * math.sqrt(2.0) * cfg.beta)


def trueskill_1vs1(
    params: TrueSkill1vs1, first: tuple[float, float], second: tuple[float, float], drawn: bool = False
) -> tuple[tuple[float, float], tuple[float, float]]:
    """New (mu, sigma) of two players after `first` beat `second` (or they drew).

    The same update as `trueskill.rate_1vs1`: dynamics add tau^2 to each variance, the performance difference
    N(mu1 - mu2, c^2) with c^2 = 2 beta^2 + s1^2 + s2^2 is truncated by the outcome, and each player moves by
    its share of the variance: mu += -/+ s^2 / c * v, s^2 *= 1 - s^2 / c^2 * w.
    """
    (mu1, sigma1), (mu2, sigma2) = first, second
    tau2 = params.tau * params.tau
    var1 = sigma1 * sigma1 + tau2
    var2 = sigma2 * sigma2 + tau2
    c2 = 2.0 * params.beta * params.beta + var1 + var2
    c = math.sqrt(c2)
    t = (mu1 - mu2) / c
    eps = params.draw_margin / c
    v, w = _vw_draw(t, eps) if drawn else _vw_win(t - eps)
    # Numerically w lies in [0, 1]; clamping keeps a variance positive at the extremes.
    w = min(max(w, 0.0), 1.0)
    return (
        (mu1 + var1 / c * v, math.sqrt(var1 * (1.0 - var1 / c2 * w))),
        (mu2 - var2 / c * v, math.sqrt(var2 * (1.0 - var2 / c2 * w))),
    )


@dataclass(slots=True)
class _Tally:
    """A player's rating while a batch of episodes is worked through."""

    elo: float
    mu: float
    sigma: float
    games: int


@dataclass(frozen=True)
class Rating:
    elo: float
    mu: float
    sigma: float
    # Rated episodes played.
    games: int = 0


class RatingBook:
    def __init__(self, elo: EloConfig, trueskill_cfg: TrueSkillConfig) -> None:
        self._elo = elo
        self._trueskill = trueskill_cfg
        self._ts = TrueSkill1vs1.from_config(trueskill_cfg)
        self._ratings: dict[str, Rating] = {}
        # Rated since `take_changed` last ran (the store writes only those).
        self._changed: set[str] = set()

    def add_player(self, player_id: str, parent_id: str | None = None) -> None:
        """Rate a new player, starting from its parent's rating when it has one."""
        if player_id in self._ratings:
            raise ValueError(f"player_id: {player_id!r} is already rated")
        if parent_id is not None and parent_id in self._ratings:
            parent = self._ratings[parent_id]
            self._ratings[player_id] = Rating(parent.elo, parent.mu, parent.sigma, 0)
        else:
            self._ratings[player_id] = Rating(self._elo.initial, self._trueskill.mu, self._trueskill.sigma, 0)
        self._changed.add(player_id)

    def restart(self, player_id: str) -> None:
        """A player reset to other weights (a mutation) is rated afresh: the initial rating, as the pretrained
        weights it is reset to are rated (roster), its rated games still counted. It kept the replaced weights'
        rating, its TrueSkill sigma shrunk by hundreds of games, so that it moved only slowly to its own."""
        games = self.get(player_id).games
        self._ratings[player_id] = Rating(self._elo.initial, self._trueskill.mu, self._trueskill.sigma, games)
        self._changed.add(player_id)

    def get(self, player_id: str) -> Rating:
        try:
            return self._ratings[player_id]
        except KeyError:
            raise UnknownPlayerError(player_id) from None

    def compute(self, matches: Iterable[tuple[str, str, Outcome]]) -> dict[str, Rating]:
        """The ratings after these (home, away, home's outcome) episodes, in order; nothing is changed yet.

        Self-play episodes carry no information about relative skill and are skipped. The whole batch is
        worked on one mutable tally per player; a Rating per player is built once at the end.
        """
        work: dict[str, _Tally] = {}
        k_factor, params = self._elo.k_factor, self._ts
        for home, away, outcome in matches:
            if home == away:
                continue
            a = work.get(home) or work.setdefault(home, self._tally(home))
            b = work.get(away) or work.setdefault(away, self._tally(away))
            delta = k_factor * (_SCORE[outcome] - elo_expected(a.elo, b.elo))
            if outcome is Outcome.LOSS:
                (b.mu, b.sigma), (a.mu, a.sigma) = trueskill_1vs1(params, (b.mu, b.sigma), (a.mu, a.sigma))
            else:
                (a.mu, a.sigma), (b.mu, b.sigma) = trueskill_1vs1(
                    params, (a.mu, a.sigma), (b.mu, b.sigma), drawn=outcome is Outcome.DRAW
                )
            a.elo += delta
            b.elo -= delta
            a.games += 1
            b.games += 1
        return {pid: Rating(t.elo, t.mu, t.sigma, t.games) for pid, t in work.items()}

    def _tally(self, player_id: str) -> _Tally:
        r = self.get(player_id)
        return _Tally(r.elo, r.mu, r.sigma, r.games)

    def commit(self, updated: dict[str, Rating]) -> None:
        for player_id in updated:
            self.get(player_id)
        self._ratings.update(updated)
        self._changed.update(updated)

    def state_dict(self) -> dict[str, Any]:
        return {pid: _rating_state(r) for pid, r in self._ratings.items()}

    def take_changed(self) -> list[tuple[str, dict[str, Any]]]:
        """(player id, rating as in `state_dict`) of every rating changed since the last call; forgets them."""
        changed, self._changed = self._changed, set()
        return [(pid, _rating_state(self._ratings[pid])) for pid in sorted(changed)]

    def load_state_dict(self, state: Any, player_ids: Iterable[str]) -> None:
        """Replace all ratings; `state` must rate exactly `player_ids`."""
        expected = set(player_ids)
        if not isinstance(state, dict) or set(state) != expected:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise LeagueStateError(
                "ratings", f"must rate exactly the league's players {sorted(expected)}, got {got}"
            )
        ratings = {}
        for pid, row in state.items():
            try:
                ratings[pid] = Rating(
                    float(row["elo"]), float(row["mu"]), float(row["sigma"]), int(row["games"])
                )
                # (A damaged or hand-edited state: a NaN rating was shown, then the first commit, which writes
                # the whole state after a load, refused it, and every restart failed the same way.)
                r = ratings[pid]
                if not all(math.isfinite(v) for v in (r.elo, r.mu, r.sigma)):
                    raise ValueError(f"elo, mu and sigma must be finite, got {(r.elo, r.mu, r.sigma)}")
                if r.games < 0:
                    raise ValueError(f"games must be >= 0, got {r.games}")
            except (KeyError, TypeError, ValueError) as exc:
                raise LeagueStateError(f"ratings.{pid}", f"malformed rating: {exc}") from None
        self._ratings, self._changed = ratings, set()


def _rating_state(r: Rating) -> dict[str, Any]:
    return {"elo": r.elo, "mu": r.mu, "sigma": r.sigma, "games": r.games}
