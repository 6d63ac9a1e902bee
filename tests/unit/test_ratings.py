"""Elo and TrueSkill ratings move the right way: winners up, losers down, draws pull together."""

from __future__ import annotations

import json

import pytest

from league_service.config import EloConfig, TrueSkillConfig
from league_service.league_errors import LeagueStateError, UnknownPlayerError
from league_service.messages import Outcome
from league_service.ratings import RatingBook, elo_expected


def _book(*ids: str) -> RatingBook:
    book = RatingBook(EloConfig(initial=1200.0, k_factor=16.0), TrueSkillConfig())
    for pid in ids:
        book.add_player(pid)
    return book


def _play(book: RatingBook, matches) -> None:
    book.commit(book.compute(matches))


def test_winner_goes_up_loser_goes_down():
    book = _book("a", "b")
    _play(book, [("a", "b", Outcome.WIN)])
    a, b = book.get("a"), book.get("b")
    assert a.elo == pytest.approx(1208.0) and b.elo == pytest.approx(1192.0)
    assert a.mu > 25.0 > b.mu
    assert a.sigma < 25.0 / 3 and b.sigma < 25.0 / 3
    assert a.games == b.games == 1


def test_a_loss_is_a_win_for_the_other_side():
    by_win, by_loss = _book("a", "b"), _book("a", "b")
    _play(by_win, [("b", "a", Outcome.WIN)])
    _play(by_loss, [("a", "b", Outcome.LOSS)])
    assert by_win.state_dict() == by_loss.state_dict()


def test_draws_pull_ratings_together():
    book = _book("strong", "weak")
    _play(book, [("strong", "weak", Outcome.WIN)] * 10)
    before_strong, before_weak = book.get("strong"), book.get("weak")
    _play(book, [("strong", "weak", Outcome.DRAW)])
    after_strong, after_weak = book.get("strong"), book.get("weak")
    assert after_strong.elo < before_strong.elo and after_weak.elo > before_weak.elo
    assert after_strong.mu < before_strong.mu and after_weak.mu > before_weak.mu


def test_a_draw_between_equals_changes_no_elo_but_shrinks_uncertainty():
    book = _book("a", "b")
    _play(book, [("a", "b", Outcome.DRAW)])
    assert book.get("a").elo == book.get("b").elo == 1200.0
    assert book.get("a").sigma < 25.0 / 3


def test_elo_expected_score():
    assert elo_expected(1200, 1200) == 0.5
    assert elo_expected(1600, 1200) == pytest.approx(10 / 11)
    assert elo_expected(0.0, 1e9) < 1e-299 and elo_expected(1e9, 0.0) == 1.0  # no OverflowError at huge gaps


def test_compute_changes_nothing_until_commit_and_skips_self_play():
    book = _book("a", "b")
    updated = book.compute([("a", "a", Outcome.WIN), ("a", "b", Outcome.WIN), ("a", "b", Outcome.WIN)])
    assert book.get("a").elo == 1200.0
    assert updated["a"].games == 2
    with pytest.raises(UnknownPlayerError):
        book.compute([("a", "ghost", Outcome.WIN)])


def test_snapshots_start_from_their_parent():
    book = _book("a", "b")
    _play(book, [("a", "b", Outcome.WIN)] * 3)
    book.add_player("a_100", parent_id="a")
    assert (book.get("a_100").elo, book.get("a_100").mu) == (book.get("a").elo, book.get("a").mu)
    assert book.get("a_100").games == 0


def test_state_round_trips_through_json_and_is_validated():
    book = _book("a", "b")
    _play(book, [("a", "b", Outcome.WIN), ("a", "b", Outcome.DRAW)])
    restored = _book("a", "b")
    restored.load_state_dict(json.loads(json.dumps(book.state_dict())), ["a", "b"])
    assert restored.state_dict() == book.state_dict()
    with pytest.raises(LeagueStateError, match="ratings"):
        restored.load_state_dict(book.state_dict(), ["a", "b", "c"])
    # A damaged or hand-edited state: a NaN rating was shown, then failed the first commit (which writes the whole
    # state after a load) and every restart after it.
    for key, bad in (("elo", float("nan")), ("mu", float("inf")), ("sigma", float("-inf")), ("games", -1)):
        state = json.loads(json.dumps(book.state_dict()))
        state["a"][key] = bad
        with pytest.raises(LeagueStateError, match="ratings.a: malformed rating"):
            restored.load_state_dict(state, ["a", "b"])
    assert restored.state_dict() == book.state_dict()  # refused before anything changed


def test_a_draw_whose_margin_is_too_thin_for_float64_moves_the_two_together_without_dividing_by_zero():
    """beta 1e-15 against sigma 8 (and sigmas near 1e154) divided by zero on the first draw and took the
    coordinator down; the limit of a vanishing draw margin is both ratings meeting at the truncation point."""
    import math

    from league_service.ratings import TrueSkill1vs1, trueskill_1vs1

    params = TrueSkill1vs1(beta=1e-15, tau=0.0, draw_margin=1e-24)
    (mu1, s1), (mu2, s2) = trueskill_1vs1(params, (30.0, 8.0), (20.0, 8.0), drawn=True)
    assert all(math.isfinite(x) for x in (mu1, s1, mu2, s2))
    assert mu1 == pytest.approx(mu2) and mu1 == pytest.approx(25.0)
    # Near the edge the exact formula tends to the same limit: each mean moves by its share s^2 / c^2 of the gap.
    wide = TrueSkill1vs1(beta=1.0, tau=0.0, draw_margin=1e-6)
    (a, _), (b, _) = trueskill_1vs1(wide, (30.0, 8.0), (20.0, 8.0), drawn=True)
    assert a == pytest.approx(30.0 - 10.0 * 64 / 130, abs=1e-4) and b == pytest.approx(20.0 + 10.0 * 64 / 130, abs=1e-4)


@pytest.mark.parametrize(("first", "second"), [((25.5, 8.333), (25.0, 8.333)), ((60.0, 8.333), (25.0, 8.333))])
def test_a_draw_with_a_margin_just_above_what_float64_can_tell_apart_is_still_right(first, second):
    """beta 1e-5 and draw_probability 1e-9 (both accepted) make eps ~1.5e-15: Phi(a) - Phi(b) kept a few
    digits, and a draw swapped the two means (25.5 and 25.0 became 24.96 and 25.54) or left the gap open."""
    from league_service.ratings import TrueSkill1vs1, trueskill_1vs1

    params = TrueSkill1vs1.from_config(TrueSkillConfig(beta=1e-5, draw_probability=1e-9))
    (mu1, s1), (mu2, s2) = trueskill_1vs1(params, first, second, drawn=True)
    assert mu1 >= mu2 and mu1 - mu2 < 1e-6  # the draw says they are equal; the order is kept
    assert mu1 == pytest.approx((first[0] + second[0]) / 2)  # equal sigmas: they meet halfway
    assert s1 < first[1] and s2 < second[1]
