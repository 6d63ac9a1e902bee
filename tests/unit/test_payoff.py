"""Payoff: records, decay, win rates, validation that changes nothing on bad input, thread safety."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest

from league_service.config import ActivePlayerConfig, PayoffConfig
from league_service.league_errors import InvalidResultError, LeagueStateError, UnknownPlayerError
from league_service.messages import EpisodeOutcome, JobResult, Outcome, PlayerOutcome
from league_service.payoff import (
    BattleRecordDict,
    BattleSharedPayoff,
    PayoffDict,
    SoloSharedPayoff,
    create_payoff,
)
from league_service.players import ActivePlayer, HistoricalPlayer, SoloActivePlayer
from league_service.testing import battle_result, solo_result

W, D, L = Outcome.WIN, Outcome.DRAW, Outcome.LOSS


def _battle_payoff(ids=("a", "b", "c"), **cfg) -> BattleSharedPayoff:
    payoff = BattleSharedPayoff(PayoffConfig(**{"decay": 1.0, "min_win_rate_games": 0.0, **cfg}))
    for pid in ids:
        payoff.add_player(
            ActivePlayer(player_id=pid, category="default", payoff=payoff, cfg=ActivePlayerConfig())
        )
    return payoff


def test_battle_record_dict_counts_and_decays_by_multiplication():
    record = BattleRecordDict()
    assert record == {"wins": 0.0, "draws": 0.0, "losses": 0.0, "games": 0.0, "played": 0}
    record = BattleRecordDict(4, 2, 2, 8, played=9)
    half = record * 0.5
    assert half == {"wins": 2.0, "draws": 1.0, "losses": 1.0, "games": 4.0, "played": 9}  # played never decays
    assert record["wins"] == 4.0  # * makes a new record
    record *= 0.25
    assert record == {"wins": 1.0, "draws": 0.5, "losses": 0.5, "games": 2.0, "played": 9}
    assert record.reversed() == {"wins": 0.5, "draws": 0.5, "losses": 1.0, "games": 2.0, "played": 9}


def test_payoff_dict_makes_records_on_first_use():
    battle = PayoffDict(BattleRecordDict)
    battle[("a", "b")]["wins"] += 1
    assert battle[("a", "b")]["wins"] == 1.0
    solo = PayoffDict(list)
    solo["a"].append(1.0)
    assert solo["a"] == [1.0]


def test_update_counts_both_sides_and_win_rate_counts_draws_half():
    payoff = _battle_payoff()
    assert payoff.update(battle_result(("b", "a"), [W, W, D, L])) == 4
    assert payoff.record("b", "a") == {"wins": 2.0, "draws": 1.0, "losses": 1.0, "games": 4.0, "played": 4}
    assert payoff.record("a", "b") == {"wins": 1.0, "draws": 1.0, "losses": 2.0, "games": 4.0, "played": 4}
    assert payoff.win_rate("b", "a") == pytest.approx(2.5 / 4)
    assert payoff.win_rate("a", "b") == pytest.approx(1.5 / 4)
    players = {p.player_id: p for p in payoff.players}
    np.testing.assert_allclose(payoff[players["a"], [players["b"], players["c"]]], [1.5 / 4, 0.5])


def test_seat_order_of_outcomes_does_not_matter():
    payoff = _battle_payoff()
    swapped = EpisodeOutcome((PlayerOutcome("b", Outcome.LOSS), PlayerOutcome("a", Outcome.WIN)))
    payoff.update(JobResult("a", ("a", "b"), (swapped,)))
    assert payoff.record("a", "b")["wins"] == 1.0


def test_win_rate_needs_min_games_else_default():
    payoff = _battle_payoff(min_win_rate_games=3.0, default_win_rate=0.4)
    payoff.update(battle_result(("a", "b"), [W, W]))
    assert payoff.win_rate("a", "b") == 0.4
    payoff.update(battle_result(("a", "b"), [W]))
    assert payoff.win_rate("a", "b") == 1.0
    assert payoff.win_rate("a", "c") == 0.4
    assert payoff.win_rate("a", "a") == 0.5


def test_decay_applies_before_each_new_game():
    payoff = _battle_payoff(decay=0.5)
    payoff.update(battle_result(("a", "b"), [W, L]))
    # after W: wins 1, games 1; after L: everything * 0.5, then losses +1, games +1
    assert payoff.record("a", "b") == {"wins": 0.5, "draws": 0.0, "losses": 1.0, "games": 1.5, "played": 2}
    assert payoff.win_rate("a", "b") == pytest.approx(0.5 / 1.5)


def test_win_rates_stay_within_0_and_1_when_decayed_counts_round_apart():
    """wins, draws and games decay separately: after 3 draws and ~3,230 wins (decay 0.99) wins + draws / 2 rounded
    an ulp above games, a win rate of 1.0000000000000002, which PFSP refuses (the league stopped launching)."""
    payoff = _battle_payoff(decay=0.99, min_win_rate_games=8.0)
    payoff.update(battle_result(("a", "b"), [D] * 3))
    for _ in range(3_300):
        payoff.update(battle_result(("a", "b"), [W]))
        assert 0.0 <= payoff.win_rate("a", "b") <= 1.0
        assert 0.0 <= payoff.win_rate("b", "a") <= 1.0
    assert all(0.0 <= row.win_rate <= 1.0 for row in payoff.rows())
    assert payoff.win_rate("a", "b") == pytest.approx(1.0)


def test_the_games_played_are_counted_beside_the_decayed_counts_and_saved():
    """With decay 0.99 every pair that had played often showed ~100 "games" in a status: the decayed weight.
    The games played are counted too, never decayed, in the rows and the saved state."""
    payoff = _battle_payoff(decay=0.99)
    payoff.update(battle_result(("a", "b"), [W] * 600 + [L] * 400))
    (ab, ba) = [r for r in payoff.rows() if {r.home, r.away} == {"a", "b"}]
    assert ab.played == ba.played == 1000 and ab.games == pytest.approx(100 * (1 - 0.99**1000))
    restored = _battle_payoff(decay=0.99)
    restored.load_records(json.loads(json.dumps(payoff.state_dict())))
    assert restored.record("b", "a")["played"] == 1000
    old = {"records": [{"home": "a", "away": "b", "wins": 1.0, "draws": 0.0, "losses": 0.0, "games": 1.0}]}
    restored.load_records(old)  # saved before games were counted: from 0 on
    assert restored.record("a", "b")["played"] == 0
    for bad in (-1, 1.5, "7", True):
        with pytest.raises(LeagueStateError, match="played"):
            restored.load_records({"records": [{**old["records"][0], "played": bad}]})
    # A NaN count made a NaN win rate, PFSP raised, and the league stopped launching jobs (a review).
    for key, bad in (("wins", math.nan), ("games", math.inf), ("losses", -1.0)):
        with pytest.raises(LeagueStateError, match="finite and >= 0"):
            restored.load_records({"records": [{**old["records"][0], key: bad}]})


def test_rows_say_when_the_win_rate_is_the_default():
    """Below min_win_rate_games the rate is the configured default: the rows say so (status marks it)."""
    payoff = _battle_payoff(decay=0.99, min_win_rate_games=8)
    payoff.update(battle_result(("a", "b"), [W] * 3))
    assert [(r.win_rate, r.win_rate_is_default) for r in payoff.rows()] == [(0.5, True), (0.5, True)]
    payoff.update(battle_result(("a", "b"), [W] * 20))
    assert [(r.home, r.win_rate, r.win_rate_is_default) for r in payoff.rows()] == [
        ("a", 1.0, False), ("b", 0.0, False)]


def test_self_play_is_not_recorded():
    payoff = _battle_payoff()
    assert payoff.update(battle_result(("a", "a"), [W, L])) == 2
    assert payoff.rows() == []
    assert payoff.win_rate("a", "a") == 0.5


@pytest.mark.parametrize(
    ("result", "error", "field"),
    [
        (battle_result(("a", "x"), [W]), UnknownPlayerError, "players[1]"),
        (JobResult("a", ("a",), ()), InvalidResultError, "players"),
        (
            JobResult("a", ("a", "b"), (EpisodeOutcome((PlayerOutcome("a", W), PlayerOutcome("b", W))),)),
            InvalidResultError,
            "episodes[0].players",
        ),
        (
            JobResult("a", ("a", "b"), (EpisodeOutcome((PlayerOutcome("a", W), PlayerOutcome("c", L))),)),
            InvalidResultError,
            "episodes[0].players",
        ),
        (
            JobResult("a", ("a", "b"), (EpisodeOutcome((PlayerOutcome("a", W),)),)),
            InvalidResultError,
            "episodes[0].players",
        ),
        (
            JobResult(
                "a", ("a", "b"), (EpisodeOutcome((PlayerOutcome("a", Outcome.NONE), PlayerOutcome("b", L))),)
            ),
            InvalidResultError,
            "episodes[0].players",
        ),
    ],
)
def test_bad_results_raise_naming_the_field_and_change_nothing(result, error, field):
    payoff = _battle_payoff()
    payoff.update(battle_result(("a", "b"), [W]))
    before = payoff.state_dict()
    good_then_bad = JobResult(result.launch_player, result.players, result.episodes)
    with pytest.raises(error) as info:
        payoff.update(good_then_bad)
    assert info.value.field == field
    assert payoff.state_dict() == before


def test_a_bad_episode_after_good_ones_changes_nothing():
    payoff = _battle_payoff()
    good = battle_result(("a", "b"), [W, W]).episodes
    bad = EpisodeOutcome((PlayerOutcome("a", W), PlayerOutcome("b", D)))
    with pytest.raises(InvalidResultError, match=r"episodes\[2\]"):
        payoff.update(JobResult("a", ("a", "b"), (*good, bad)))
    assert payoff.rows() == []


def test_rows_show_both_sides():
    payoff = _battle_payoff()
    payoff.update(battle_result(("a", "b"), [W, W, L, D]))
    rows = {(r.home, r.away): r for r in payoff.rows()}
    assert set(rows) == {("a", "b"), ("b", "a")}
    assert (rows["a", "b"].wins, rows["a", "b"].losses, rows["a", "b"].win_rate) == (2.0, 1.0, 0.625)
    assert (rows["b", "a"].wins, rows["b", "a"].losses, rows["b", "a"].win_rate) == (1.0, 2.0, 0.375)


def test_battle_state_round_trips_through_json():
    payoff = _battle_payoff(decay=0.97)
    payoff.update(battle_result(("c", "a"), [W, L, D, W, W]))
    payoff.update(battle_result(("b", "c"), [L, L]))
    restored = _battle_payoff(decay=0.97)
    restored.load_records(json.loads(json.dumps(payoff.state_dict())))
    assert restored.rows() == payoff.rows()
    assert restored.state_dict() == payoff.state_dict()


def test_a_saved_record_of_a_player_against_itself_is_refused():
    """Self-play is never recorded, so such a record is a damaged or hand-edited state; its two rows (home and
    away the same player) would show win rates that contradict each other."""
    state = {"records": [{"home": "a", "away": "a", "wins": 3.0, "draws": 0.0, "losses": 1.0, "games": 4.0}]}
    with pytest.raises(LeagueStateError, match=r"payoff.records\[0\].*'a' against itself"):
        _battle_payoff().load_records(state)


def test_concurrent_updates_are_all_counted():
    payoff = _battle_payoff()

    def play():
        for _ in range(200):
            payoff.update(battle_result(("a", "b"), [W, L]))

    threads = [threading.Thread(target=play) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert payoff.record("a", "b") == {"wins": 800.0, "draws": 0.0, "losses": 800.0, "games": 1600.0, "played": 1600}


def test_players_keep_the_order_they_joined():
    payoff = _battle_payoff(ids=("z", "a"))
    hp = HistoricalPlayer(
        player_id="m", category="default", payoff=payoff, parent_id="z", parent_type="main_player"
    )
    payoff.add_player(hp)
    assert [p.player_id for p in payoff.players] == ["z", "a", "m"]
    with pytest.raises(ValueError, match="already"):
        payoff.add_player(hp)


def test_solo_payoff_keeps_a_bounded_record_of_returns():
    payoff = SoloSharedPayoff(PayoffConfig(solo_buffer_size=3))
    payoff.add_player(
        SoloActivePlayer(player_id="s", category="default", payoff=payoff, cfg=ActivePlayerConfig())
    )
    assert payoff.mean_return("s") == 0.0
    assert payoff.update(solo_result("s", [1.0, 2.0, 3.0, 4.0, 5.0])) == 5
    assert payoff.recent_returns("s") == [3.0, 4.0, 5.0]
    assert payoff.mean_return("s") == 4.0
    assert payoff.episodes("s") == 5
    with pytest.raises(InvalidResultError):
        payoff.update(battle_result(("s", "s"), [W]))
    with pytest.raises(UnknownPlayerError):
        payoff.update(solo_result("t", [1.0]))
    restored = SoloSharedPayoff(PayoffConfig(solo_buffer_size=3))
    restored.add_player(
        SoloActivePlayer(player_id="s", category="default", payoff=restored, cfg=ActivePlayerConfig())
    )
    restored.load_records(json.loads(json.dumps(payoff.state_dict())))
    assert restored.recent_returns("s") == [3.0, 4.0, 5.0] and restored.episodes("s") == 5
    # The episode count adds up across results, after a restore too (the buffer forgets, the count does not).
    assert restored.update(solo_result("s", [6.0, 7.0])) == 2
    assert restored.recent_returns("s") == [5.0, 6.0, 7.0] and restored.episodes("s") == 7
    # A damaged state: an infinite return was shown as the mean, then failed every commit (and restart).
    for key, bad in (("returns", [1.0, math.inf]), ("returns", [math.nan]), ("episodes", -1)):
        state = json.loads(json.dumps(payoff.state_dict()))
        state["records"][0][key] = bad
        with pytest.raises(LeagueStateError, match=r"payoff.records\[0\]: malformed record"):
            restored.load_records(state)


def test_the_mean_of_returns_near_the_float_limit_is_finite():
    """Returns are any finite floats; their sum overflowed, and every status (and a restart) failed on it."""
    payoff = SoloSharedPayoff(PayoffConfig(solo_buffer_size=3))
    payoff.add_player(
        SoloActivePlayer(player_id="s", category="default", payoff=payoff, cfg=ActivePlayerConfig())
    )
    payoff.update(solo_result("s", [1e308, 1e308, 1.7e308]))
    assert payoff.mean_return("s") == pytest.approx(1.2333333e308)
    payoff.update(solo_result("s", [-1.7e308, -1.7e308, -1.7e308]))
    assert payoff.mean_return("s") == pytest.approx(-1.7e308)


def test_create_payoff_by_league_type():
    assert isinstance(create_payoff("one_vs_one", PayoffConfig()), BattleSharedPayoff)
    assert isinstance(create_payoff("solo", PayoffConfig()), SoloSharedPayoff)
    with pytest.raises(ValueError, match="league_type"):
        create_payoff("team", PayoffConfig())


def test_win_rates_of_many_opponents_are_each_win_rate():
    """`win_rates` (one lock, no record copied: PFSP over thousands of historical players) is `win_rate` per
    opponent, from either side of a record, unplayed pairs and self-play included."""
    payoff = _battle_payoff(ids=("a", "b", "c", "d"), min_win_rate_games=2.0, default_win_rate=0.4)
    payoff.update(battle_result(("b", "a"), [W, W, D, L]))  # recorded from a's side (a <= b)
    payoff.update(battle_result(("b", "c"), [L, D, D]))
    payoff.update(battle_result(("d", "b"), [W]))  # too few games: the default
    for home in "abcd":
        aways = list("abcd")
        expected = [payoff.win_rate(home, away) for away in aways]
        assert payoff.win_rates(home, aways).tolist() == expected
    assert payoff.win_rates("b", ["a", "c", "b", "d"]).tolist() == [0.625, 1 / 3, 0.5, 0.4]
    assert payoff.win_rates("a", []).tolist() == []
