"""Players: opponent choice of every type (statistical, fixed seed), snapshots, phases, mutation, jobs."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from league_service.alphastar_players import (
    LeagueExploiter,
    MainExploiter,
    MainPlayer,
    remove_monotonic_suffix,
)
from league_service.config import (
    ActivePlayerConfig,
    ExplorationConfig,
    LeagueConfig,
    LeagueExploiterConfig,
    MainExploiterConfig,
    MainPlayerConfig,
    NaiveSpPlayerConfig,
    PayoffConfig,
    SoloActivePlayerConfig,
)
from league_service.league_errors import StaleUpdateError
from league_service.messages import PlayerUpdate
from league_service.payoff import BattleSharedPayoff
from league_service.player_factory import PLAYER_CLASSES, create_player
from league_service.players import (
    ActivePlayer,
    HistoricalPlayer,
    NaiveSpPlayer,
    SoloActivePlayer,
    draw_index,
    epsilon_greedy,
    snapshot_checkpoint_path,
)

SAMPLES = 4000


def _payoff() -> BattleSharedPayoff:
    # No decay and no minimum of games: win rates are exactly what the tests set.
    return BattleSharedPayoff(PayoffConfig(decay=1.0, min_win_rate_games=0.0))


def _active(payoff, cls, pid, cfg=None, **kwargs) -> ActivePlayer:
    cfg = cfg if cfg is not None else LeagueConfig().player_config(cls.player_type)
    player = cls(player_id=pid, category="default", payoff=payoff, cfg=cfg, **kwargs)
    payoff.add_player(player)
    return player


def _historical(payoff, pid, parent: ActivePlayer | None) -> HistoricalPlayer:
    player = HistoricalPlayer(
        player_id=pid,
        category="default",
        payoff=payoff,
        parent_id=parent.player_id if parent else "",
        parent_type=parent.player_type if parent else "",
    )
    payoff.add_player(player)
    return player


def _set_win_rate(payoff, home, away, rate: float, games: float = 20.0) -> None:
    """Replace the record of the pair with one where home wins `rate` of `games`."""
    pair = {home.player_id, away.player_id}
    records = [r for r in payoff.state_dict()["records"] if {r["home"], r["away"]} != pair]
    wins = rate * games
    records.append(
        {
            "home": home.player_id,
            "away": away.player_id,
            "wins": wins,
            "draws": 0.0,
            "losses": games - wins,
            "games": games,
        }
    )
    payoff.load_records({"records": records})
    assert payoff.win_rate(home.player_id, away.player_id) == pytest.approx(rate)


def _opponent_frequencies(player: ActivePlayer, seed: int = 0) -> Counter:
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    for _ in range(SAMPLES):
        (opponent,) = player.get_job(rng).opponents
        counts[opponent.player_id] += 1
    return counts


def _assert_distribution(counts: Counter, expected: dict[str, float]) -> None:
    assert set(counts) <= {k for k, p in expected.items() if p > 0}, counts
    for pid, p in expected.items():
        freq = counts[pid] / SAMPLES
        bound = 4.5 * math.sqrt(p * (1 - p) / SAMPLES) + 1e-9
        assert abs(freq - p) <= bound, (
            f"{pid}: frequency {freq:.4f}, expected {p:.4f} (counts {dict(counts)})"
        )


# -- opponent choice -----------------------------------------------------------------------------------------


def test_main_player_mixes_pfsp_self_play_and_verification():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main")
    exploiter = _active(payoff, MainExploiter, "exploiter")
    _active(payoff, LeagueExploiter, "league_exploiter")
    past_main = _historical(payoff, "main_100", main)
    past_exploiter = _historical(payoff, "exploiter_100", exploiter)
    _set_win_rate(payoff, main, past_main, 0.8)
    _set_win_rate(payoff, main, past_exploiter, 0.2)
    # pfsp (0.5): squared weights 0.04 / 0.64; sp (0.35): the only main player is itself;
    # verification (0.15): the past exploiter beats us (0.2 < 0.3), so it is replayed.
    _assert_distribution(
        _opponent_frequencies(main),
        {"main": 0.35, "main_100": 0.5 * 0.04 / 0.68, "exploiter_100": 0.5 * 0.64 / 0.68 + 0.15},
    )


def test_main_player_pfsp_weighting_is_configurable():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main", MainPlayerConfig(branch_probs={"pfsp": 1.0}, pfsp_weighting="linear"))
    weak, strong = _historical(payoff, "main_1", main), _historical(payoff, "main_2", main)
    _set_win_rate(payoff, main, weak, 0.9)
    _set_win_rate(payoff, main, strong, 0.4)
    # linear weights 0.1 / 0.6 (squared would give 0.01 / 0.36)
    _assert_distribution(_opponent_frequencies(main), {"main_1": 0.1 / 0.7, "main_2": 0.6 / 0.7})


def test_main_player_self_play_falls_back_to_past_versions_of_a_too_strong_opponent():
    payoff = _payoff()
    cfg = MainPlayerConfig(branch_probs={"sp": 1.0})
    me = _active(payoff, MainPlayer, "me", cfg)
    strong = _active(payoff, MainPlayer, "strong", cfg)
    old, older = _historical(payoff, "strong_1", strong), _historical(payoff, "strong_2", strong)
    _set_win_rate(payoff, me, strong, 0.1)
    _set_win_rate(payoff, me, old, 0.5)
    _set_win_rate(payoff, me, older, 0.9)
    # Either main opponent with 0.5; `strong` is too strong (0.1 < 0.3): its past versions by variance
    # weights 0.25 / 0.09.
    _assert_distribution(
        _opponent_frequencies(me),
        {"me": 0.5, "strong": 0.0, "strong_1": 0.5 * 0.25 / 0.34, "strong_2": 0.5 * 0.09 / 0.34},
    )


def test_main_player_verification_replays_forgotten_past_versions():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main", MainPlayerConfig(branch_probs={"verification": 1.0}))
    past = [_historical(payoff, f"main_{i}", main) for i in range(3)]
    for player, rate in zip(past, [0.4, 0.8, 0.6], strict=True):
        _set_win_rate(payoff, main, player, rate)
    # The decreasing tail (0.8, 0.6) is dropped; 0.4 < 0.7 shows forgetting: squared weights 0.36 / 0.04.
    _assert_distribution(_opponent_frequencies(main), {"main_0": 0.9, "main_1": 0.1, "main_2": 0.0})


def test_past_versions_are_oldest_first_by_step_whatever_order_they_joined_in():
    """A pretrained historical player (step 0) added when a resumed league turned use_pretrain_init_historical
    on joins last: it was taken for the newest past version (a review)."""
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main", MainPlayerConfig(branch_probs={"verification": 1.0}))
    past = []
    for step in (100, 200, 300, 0):
        player = HistoricalPlayer(player_id=f"main_{step}", category="default", payoff=payoff, parent_id="main",
                                  parent_type="main_player", total_agent_step=step)
        payoff.add_player(player)
        past.append(player)
    assert [p.player_id for p in main._past_versions_of(main)] == ["main_0", "main_100", "main_200", "main_300"]


def test_main_player_verification_without_weakness_is_self_play():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main", MainPlayerConfig(branch_probs={"verification": 1.0}))
    past = _historical(payoff, "main_0", main)
    _set_win_rate(payoff, main, past, 0.9)
    _assert_distribution(_opponent_frequencies(main), {"main": 1.0})


def test_main_player_verification_replays_only_past_main_exploiters_that_beat_it():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main", MainPlayerConfig(branch_probs={"verification": 1.0}))
    exploiter = _active(payoff, MainExploiter, "exploiter")
    league_exploiter = _active(payoff, LeagueExploiter, "league_exploiter")
    beats_us, beaten = _historical(payoff, "exploiter_1", exploiter), _historical(payoff, "exploiter_2", exploiter)
    not_a_main_exploiter = _historical(payoff, "league_exploiter_1", league_exploiter)
    _set_win_rate(payoff, main, beats_us, 0.2)
    _set_win_rate(payoff, main, beaten, 0.9)
    _set_win_rate(payoff, main, not_a_main_exploiter, 0.0)
    # One past main exploiter beats us (0.2 < 0.3, the lowest rate decides): the past main exploiters (and
    # only they) by squared weights 0.64 / 0.01; a past league exploiter is no exploitation check.
    _assert_distribution(
        _opponent_frequencies(main),
        {"exploiter_1": 0.64 / 0.65, "exploiter_2": 0.01 / 0.65, "league_exploiter_1": 0.0, "main": 0.0},
    )


def test_main_player_verification_sees_no_forgetting_in_equal_win_rates():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main", MainPlayerConfig(branch_probs={"verification": 1.0}))
    for i in range(3):  # past versions not played yet: the default win rate (0.5) against each
        _historical(payoff, f"main_{i}", main)
    _assert_distribution(_opponent_frequencies(main), {"main": 1.0})


def test_main_player_without_history_plays_itself():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main")
    _assert_distribution(_opponent_frequencies(main), {"main": 1.0})


def test_main_exploiter_targets_main_players_with_a_variance_curriculum():
    payoff = _payoff()
    beatable = _active(payoff, MainPlayer, "beatable")
    strong = _active(payoff, MainPlayer, "strong")
    exploiter = _active(payoff, MainExploiter, "exploiter")
    _historical(payoff, "beatable_1", beatable)
    strong_1, strong_2 = _historical(payoff, "strong_1", strong), _historical(payoff, "strong_2", strong)
    _set_win_rate(payoff, exploiter, beatable, 0.5)
    _set_win_rate(payoff, exploiter, strong, 0.05)
    _set_win_rate(payoff, exploiter, strong_1, 0.5)
    _set_win_rate(payoff, exploiter, strong_2, 0.0)
    # `strong` gives no signal (0.05 < 0.1): its past versions by variance, 0.25 vs 0 (never an
    # unwinnable one).
    _assert_distribution(
        _opponent_frequencies(exploiter), {"beatable": 0.5, "strong_1": 0.5, "strong": 0.0, "strong_2": 0.0}
    )


def test_main_exploiter_without_main_players_plays_itself():
    payoff = _payoff()
    exploiter = _active(payoff, MainExploiter, "exploiter")
    _assert_distribution(_opponent_frequencies(exploiter), {"exploiter": 1.0})


def test_league_exploiter_pfsp_over_all_historical_players():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main")
    league_exploiter = _active(payoff, LeagueExploiter, "league_exploiter")
    a, b = _historical(payoff, "a", main), _historical(payoff, "b", league_exploiter)
    _set_win_rate(payoff, league_exploiter, a, 0.25)
    _set_win_rate(payoff, league_exploiter, b, 0.75)
    # AlphaStar's linear_capped: min(0.5, 1 - x) weighs a (0.25) at 0.5, not 0.75 (plain `linear`), b at 0.25.
    _assert_distribution(_opponent_frequencies(league_exploiter), {"a": 2 / 3, "b": 1 / 3, "main": 0.0})


def test_naive_sp_player_splits_self_play_and_pfsp():
    payoff = _payoff()
    player = _active(payoff, NaiveSpPlayer, "sp")
    weak, beaten = _historical(payoff, "sp_1", player), _historical(payoff, "sp_2", player)
    _set_win_rate(payoff, player, weak, 0.5)
    _set_win_rate(payoff, player, beaten, 1.0)
    _assert_distribution(_opponent_frequencies(player), {"sp": 0.5, "sp_1": 0.5, "sp_2": 0.0})


def test_pfsp_when_we_beat_everyone_is_uniform():
    payoff = _payoff()
    player = _active(payoff, NaiveSpPlayer, "sp", NaiveSpPlayerConfig(branch_probs={"pfsp": 1.0}))
    past = [_historical(payoff, f"sp_{i}", player) for i in range(4)]
    for p in past:
        _set_win_rate(payoff, player, p, 1.0)
    _assert_distribution(_opponent_frequencies(player), {p.player_id: 0.25 for p in past})


def test_solo_player_has_no_opponent():
    payoff = _payoff()
    player = _active(payoff, SoloActivePlayer, "solo")
    assert player.get_job(np.random.default_rng(0)).opponents == ()


class _FixedRandom:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_draw_index_never_draws_a_zero_weight():
    # Uniform draws land on the cumulative sums' edges: the edge belongs to the next (positive) weight.
    assert draw_index(_FixedRandom(0.0), [0.0, 1.0]) == 1
    assert draw_index(_FixedRandom(0.5), [0.5, 0.5, 1.0]) == 2
    assert draw_index(_FixedRandom(0.25), [0.5, 0.5, 1.0]) == 0


@pytest.mark.parametrize("player_type", sorted(PLAYER_CLASSES))
def test_every_configured_branch_is_implemented(player_type):
    cls = PLAYER_CLASSES[player_type]
    cfg = LeagueConfig().player_config(player_type)
    for branch in type(cfg).BRANCHES:
        assert callable(getattr(cls, f"_{branch}_branch", None)), f"{cls.__name__} lacks _{branch}_branch"
    assert cls.player_type == player_type and cls.is_active


def test_remove_monotonic_suffix():
    players = ["a", "b", "c", "d"]
    rates, kept = remove_monotonic_suffix(np.array([0.3, 0.5, 0.4, 0.2]), players)
    assert kept == ["a", "b"] and list(rates) == [0.3, 0.5]
    rates, kept = remove_monotonic_suffix(np.array([0.9, 0.5, 0.4]), players[:3])
    assert kept == [] and len(rates) == 0
    # Equal rates show no forgetting: a tail that only stays level is dropped too.
    rates, kept = remove_monotonic_suffix(np.array([0.4, 0.5, 0.5]), players[:3])
    assert kept == ["a", "b"] and list(rates) == [0.4, 0.5]
    rates, kept = remove_monotonic_suffix(np.array([0.5, 0.5, 0.5]), players[:3])
    assert kept == [] and len(rates) == 0


# -- training phases and snapshots ---------------------------------------------------------------------------


def _update(player: ActivePlayer, steps: int, path: str = "", version: int = 0, iteration: int = 0,
            reset_applied: int = 0):
    return player.apply_update(PlayerUpdate(player.player_id, iteration, steps, path, version, reset_applied))


def test_the_train_iteration_shown_never_goes_back():
    """Steps and versions refused going back; the train iteration was taken as sent (100, then 1: status said 1)."""
    player = _active(_payoff(), NaiveSpPlayer, "sp", NaiveSpPlayerConfig(one_phase_step=100))
    _update(player, 10, iteration=100)
    _update(player, 20, iteration=1)
    assert player.train_iteration == 100


def test_trained_enough_after_one_phase_without_the_strong_rule():
    payoff = _payoff()
    player = _active(payoff, NaiveSpPlayer, "sp", NaiveSpPlayerConfig(one_phase_step=100))
    _update(player, 99)
    assert not player.is_trained_enough()
    _update(player, 100)
    assert player.is_trained_enough()
    assert player.is_trained_enough()  # pure: asking twice changes nothing
    player.record_snapshot(player.snapshot())
    assert not player.is_trained_enough()
    _update(player, 200)
    assert player.is_trained_enough()


def test_strong_win_rate_rule_allows_one_phase_only_when_strong():
    payoff = _payoff()
    cfg = NaiveSpPlayerConfig(one_phase_step=100, strong_win_rate=0.7)
    player = _active(payoff, NaiveSpPlayer, "sp", cfg)
    _update(player, 150)
    assert not player.is_trained_enough()  # no reference opponents yet
    past = _historical(payoff, "sp_old", player)
    _set_win_rate(payoff, player, past, 0.7)
    assert not player.is_trained_enough()  # must exceed the strong win rate
    _set_win_rate(payoff, player, past, 0.8)
    assert player.is_trained_enough()
    player.record_snapshot(player.snapshot())
    _update(player, 349)
    _set_win_rate(payoff, player, past, 0.0)
    assert not player.is_trained_enough()
    _update(player, 350)  # two phases: trained enough whatever the win rate
    assert player.is_trained_enough()


def test_strong_win_rate_rule_needs_every_reference_beaten():
    payoff = _payoff()
    player = _active(payoff, NaiveSpPlayer, "sp", NaiveSpPlayerConfig(one_phase_step=100, strong_win_rate=0.7))
    beaten, not_yet = _historical(payoff, "sp_1", player), _historical(payoff, "sp_2", player)
    _update(player, 150)
    _set_win_rate(payoff, player, beaten, 0.9)
    _set_win_rate(payoff, player, not_yet, 0.5)
    assert not player.is_trained_enough()  # the weakest win rate decides
    _set_win_rate(payoff, player, not_yet, 0.75)
    assert player.is_trained_enough()


@pytest.mark.parametrize("weak_at", [0, 40, 69])
def test_strong_win_rate_rule_over_many_references_reads_the_newest_first_to_the_same_answer(weak_at):
    """The rule looks at the newest references first and at all only when it beats those (a league of thousands
    of past players read every win rate at every report): an old reference not beaten still decides."""
    payoff = _payoff()
    player = _active(payoff, NaiveSpPlayer, "sp", NaiveSpPlayerConfig(one_phase_step=100, strong_win_rate=0.7))
    past = [_historical(payoff, f"sp_{i}", player) for i in range(70)]
    _update(player, 150)
    for i, other in enumerate(past):
        _set_win_rate(payoff, player, other, 0.5 if i == weak_at else 0.9)
    assert not player.is_trained_enough()
    _set_win_rate(payoff, player, past[weak_at], 0.8)
    assert player.is_trained_enough()


def test_main_exploiter_strong_rule_looks_at_main_players():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main")
    exploiter = _active(payoff, MainExploiter, "exploiter", MainExploiterConfig(one_phase_step=10))
    _historical(payoff, "main_old", main)
    _update(exploiter, 10)
    assert not exploiter.is_trained_enough()  # 0.5 (no games) against the main player
    _set_win_rate(payoff, exploiter, main, 0.9)
    assert exploiter.is_trained_enough()


def test_snapshot_names_and_freezes_the_player():
    payoff = _payoff()
    player = _active(payoff, MainPlayer, "main_player_default_0")
    _update(player, 20000, "main_player_default_0/ckpt.pt", 7, iteration=12)
    snap = player.snapshot()
    assert isinstance(snap, HistoricalPlayer) and not snap.is_active
    assert snap.player_id == "main_player_default_0_20000"
    assert snap.checkpoint_path == "main_player_default_0/ckpt_20000.pt"
    assert snap.checkpoint_version == 7
    assert (snap.parent_id, snap.parent_type, snap.total_agent_step) == (
        "main_player_default_0",
        "main_player",
        20000,
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [("", ""), ("ckpt", "ckpt_5"), ("a/b.pth", "a/b_5.pth"), ("a/dir/", "a/dir_5"), ("a.b/c", "a.b/c_5")],
)
def test_snapshot_checkpoint_path(path, expected):
    assert snapshot_checkpoint_path(path, 5) == expected


# -- mutation and updates ------------------------------------------------------------------------------------


def test_only_exploiters_mutate():
    payoff = _payoff()
    rng = np.random.default_rng(0)
    main = _active(payoff, MainPlayer, "main")
    always = _active(payoff, LeagueExploiter, "le_always", LeagueExploiterConfig(mutate_prob=1.0))
    never = _active(payoff, LeagueExploiter, "le_never", LeagueExploiterConfig(mutate_prob=0.0))
    assert main.mutate("pre.pt", rng) is None
    assert always.mutate("pre.pt", rng) == "pre.pt"
    assert never.mutate("pre.pt", rng) is None


def test_league_exploiter_mutates_with_its_probability():
    payoff = _payoff()
    player = _active(payoff, LeagueExploiter, "le")
    rng = np.random.default_rng(0)
    resets = sum(player.mutate("pre.pt", rng) is not None for _ in range(SAMPLES))
    assert abs(resets / SAMPLES - 0.25) < 4.5 * math.sqrt(0.25 * 0.75 / SAMPLES)


def test_main_exploiter_resets_when_stuck_or_after_its_step_limit():
    payoff = _payoff()
    main = _active(payoff, MainPlayer, "main")
    cfg = MainExploiterConfig(reset_win_rate_below=0.2, reset_after_steps=1000)
    exploiter = _active(payoff, MainExploiter, "exploiter", cfg)
    rng = np.random.default_rng(0)
    _update(exploiter, 500)
    assert exploiter.mutate("pre.pt", rng) is None  # 0.5 against main, 500 steps
    _set_win_rate(payoff, exploiter, main, 0.1)
    assert exploiter.mutate("pre.pt", rng) == "pre.pt"  # stuck
    _set_win_rate(payoff, exploiter, main, 0.9)
    assert exploiter.mutate("pre.pt", rng) is None
    _update(exploiter, 1000)
    exploiter.record_snapshot(exploiter.snapshot())  # mutate follows a snapshot, and counts at its step
    assert exploiter.mutate("pre.pt", rng) == "pre.pt"  # step limit
    exploiter.reset_checkpoint("pre.pt")
    assert exploiter.mutate("pre.pt", rng) is None  # the step limit counts from the reset


def test_main_exploiter_resets_when_any_main_player_is_out_of_reach():
    payoff = _payoff()
    far, near = _active(payoff, MainPlayer, "far"), _active(payoff, MainPlayer, "near")
    exploiter = _active(payoff, MainExploiter, "exploiter", MainExploiterConfig(reset_win_rate_below=0.2))
    _set_win_rate(payoff, exploiter, far, 0.1)
    _set_win_rate(payoff, exploiter, near, 0.9)
    assert exploiter.mutate("pre.pt", np.random.default_rng(0)) == "pre.pt"  # stuck against `far`


def test_main_exploiter_step_limit_counts_from_the_snapshot_it_reset_at():
    """Steps reported between a snapshot and its reset do not push the next step-limit reset back."""
    payoff = _payoff()
    exploiter = _active(payoff, MainExploiter, "exploiter", MainExploiterConfig(reset_after_steps=1000))
    rng = np.random.default_rng(0)
    _update(exploiter, 1000)
    exploiter.record_snapshot(exploiter.snapshot())
    _update(exploiter, 1050)  # reported while the reset checkpoint was being copied
    exploiter.reset_checkpoint("pre.pt")
    assert exploiter.last_reset_step == 1000
    _update(exploiter, 2000, reset_applied=exploiter.checkpoint_version)
    exploiter.record_snapshot(exploiter.snapshot())
    assert exploiter.mutate("pre.pt", rng) == "pre.pt"  # 1000 steps since the reset's snapshot


def test_reset_checkpoint_is_handed_to_the_learner_until_it_acknowledges_it():
    payoff = _payoff()
    player = _active(payoff, LeagueExploiter, "le")
    assert not _update(player, 100, "le/v3.pt", 3).mutated
    ref = player.reset_checkpoint("pretrained.pt")
    assert (player.checkpoint_path, player.checkpoint_version) == ("pretrained.pt", 4)
    assert player.mutations == 1
    # The learner's next update was trained from the old weights: ignored, and it is told to reload.
    outcome = _update(player, 200, "le/v4.pt", 4)
    assert outcome.mutated and (outcome.reset_checkpoint_path, outcome.reset_checkpoint_version) == (
        ref.path,
        4,
    )
    assert (player.checkpoint_path, player.checkpoint_version, player.total_agent_step) == (
        "pretrained.pt",
        4,
        200,
    )
    # That reply was lost (or the learner died before reloading): the reset is repeated, not dropped.
    again = _update(player, 250, "le/v5.pt", 5)
    assert (again.mutated, again.reset_checkpoint_path, again.reset_checkpoint_version) == (True, ref.path, 4)
    assert (player.checkpoint_path, player.checkpoint_version, player.total_agent_step) == ("pretrained.pt", 4, 250)
    assert player.pending_reset == ref
    # An acknowledgement of an older reset is not one of this reset.
    assert _update(player, 260, "le/v5.pt", 5, reset_applied=3).mutated
    # The learner reloaded and acknowledges: its checkpoint counts, and the reset is not repeated.
    assert not _update(player, 300, "le/v5.pt", 5, reset_applied=4).mutated
    assert (player.checkpoint_path, player.checkpoint_version) == ("le/v5.pt", 5)
    assert player.pending_reset is None
    assert not _update(player, 400, "le/v6.pt", 6, reset_applied=4).mutated


def test_a_refused_update_leaves_the_pending_reset_alone():
    """An update that acknowledges the reset but is refused (an older checkpoint version) changes nothing: the
    reset is still repeated, as the store (which never saw the refused update) still holds it."""
    payoff = _payoff()
    player = _active(payoff, LeagueExploiter, "le")
    _update(player, 100, "le/v3.pt", 3)
    ref = player.reset_checkpoint("pretrained.pt")
    with pytest.raises(StaleUpdateError, match="checkpoint_version"):
        _update(player, 200, "le/v2.pt", 2, reset_applied=ref.version)
    assert player.pending_reset == ref and player.total_agent_step == 100
    again = _update(player, 200, "le/v4.pt", 4)
    assert again.mutated and again.reset_checkpoint_version == ref.version
    assert not _update(player, 300, "le/v5.pt", 5, reset_applied=ref.version).mutated
    assert player.pending_reset is None


def test_updates_never_go_backwards():
    payoff = _payoff()
    player = _active(payoff, MainPlayer, "main")
    _update(player, 100, "m/v2.pt", 2)
    with pytest.raises(StaleUpdateError, match="agent_steps"):
        _update(player, 99)
    with pytest.raises(StaleUpdateError, match="checkpoint_version"):
        _update(player, 120, "m/v1.pt", 1)
    assert (player.total_agent_step, player.checkpoint_path) == (100, "m/v2.pt")
    _update(player, 130)  # no checkpoint: steps only
    assert (player.total_agent_step, player.checkpoint_path, player.checkpoint_version) == (130, "m/v2.pt", 2)


def test_a_retried_update_is_accepted_again():
    """UpdatePlayer is retried as is when its reply is lost: the same checkpoint version is no step back."""
    payoff = _payoff()
    player = _active(payoff, MainPlayer, "main")
    _update(player, 100, "m/v2.pt", 2)
    assert not _update(player, 100, "m/v2.pt", 2).mutated
    assert (player.total_agent_step, player.checkpoint_path, player.checkpoint_version) == (100, "m/v2.pt", 2)


# -- jobs ----------------------------------------------------------------------------------------------------


def test_epsilon_schedules():
    exp = epsilon_greedy(ExplorationConfig(start=1.0, end=0.1, decay_len=100, kind="exp"))
    assert exp(0) == 1.0 and exp(100) == pytest.approx(0.1 + 0.9 * math.exp(-1))
    linear = epsilon_greedy(ExplorationConfig(start=1.0, end=0.1, decay_len=100, kind="linear"))
    assert linear(0) == 1.0 and linear(50) == pytest.approx(0.55) and linear(1000) == 0.1
    rising = epsilon_greedy(ExplorationConfig(start=0.05, end=0.95, decay_len=100, kind="linear"))
    assert rising(0) == 0.05 and rising(50) == pytest.approx(0.5) and rising(1000) == 0.95  # stops at `end`
    rising_exp = epsilon_greedy(ExplorationConfig(start=0.05, end=0.95, decay_len=100, kind="exp"))
    assert rising_exp(0) == pytest.approx(0.05) and 0.05 < rising_exp(10**6) <= 0.95


def test_get_job_merges_computed_values_over_the_job_template():
    payoff = _payoff()
    cfg = SoloActivePlayerConfig(
        exploration=ExplorationConfig(start=0.9, end=0.1, decay_len=100, kind="linear"),
        forward_kwargs={"temperature": 1.0},
        adder_kwargs={"unroll_len": 32},
        env_kwargs={"difficulty": 2},
        job={"forward_kwargs": {"temperature": 2.0, "greedy": False}, "env_kwargs": {"seed": 1}},
    )
    player = _active(payoff, SoloActivePlayer, "solo", cfg)
    _update(player, 50)
    job = player.get_job(np.random.default_rng(0))
    assert job.forward_kwargs == {"eps": pytest.approx(0.5), "greedy": False, "temperature": 1.0}
    assert job.adder_kwargs == {"unroll_len": 32}
    assert job.env_kwargs == {"seed": 1, "difficulty": 2}
    assert job.extra == {}  # (a template key beside the three sections is refused at load: no job carries it)
    job.env_kwargs["difficulty"] = 99
    assert cfg.env_kwargs == {"difficulty": 2}  # jobs are copies


def test_a_reset_to_a_fresh_network_restarts_the_exploration_schedule_and_a_restart_keeps_it():
    """A DQN exploiter reset to a fresh network (its learner starts a new Q-network and replay) explored at the
    schedule's end, eps ~0.1 where a new player has 0.95 (a review). A pretrained reset keeps the schedule."""
    payoff = _payoff()
    cfg = MainExploiterConfig(exploration=ExplorationConfig(start=0.9, end=0.1, decay_len=100, kind="linear"),
                              reset_after_steps=1000)
    _active(payoff, MainPlayer, "main")
    exploiter = _active(payoff, MainExploiter, "exploiter", cfg)
    rng = np.random.default_rng(0)
    _update(exploiter, 1000)
    assert exploiter.get_job(rng).forward_kwargs["eps"] == pytest.approx(0.1)
    exploiter.record_snapshot(exploiter.snapshot())
    exploiter.reset_checkpoint("")
    _update(exploiter, 1050, reset_applied=exploiter.checkpoint_version)
    assert exploiter.get_job(rng).forward_kwargs["eps"] == pytest.approx(0.5)  # 50 steps into its schedule
    again = _active(_payoff(), MainExploiter, "exploiter", cfg)
    again.load_state_dict(exploiter.state_dict())
    assert again.get_job(rng).forward_kwargs["eps"] == pytest.approx(0.5)
    exploiter.record_snapshot(exploiter.snapshot())
    exploiter.reset_checkpoint("pre.pt")
    assert exploiter.get_job(rng).forward_kwargs["eps"] == pytest.approx(0.5)  # a pretrained reset: as it was


def test_create_player_gives_readable_ids():
    payoff = _payoff()
    player = create_player(LeagueConfig(), "main_exploiter", "zerg", 2, payoff)
    assert isinstance(player, MainExploiter) and player.player_id == "main_exploiter_zerg_2"
    assert player.category == "zerg" and player.cfg == LeagueConfig().main_exploiter
    with pytest.raises(ValueError, match="player_type"):
        create_player(LeagueConfig(), "hero", "zerg", 0, payoff)


def test_active_player_config_base_is_usable():
    assert ActivePlayerConfig().branch_probs == {}
