"""Durable state: state_dict -> json -> load_state_dict restores a league exactly; a misfit is rejected."""

from __future__ import annotations

import copy
import json
import random

import pytest

from league_service.base_league_manager import BaseLeagueManager
from league_service.config import Config, config_from_dict
from league_service.factory import create_league
from league_service.league_errors import LeagueStateError
from league_service.messages import Outcome, PlayerUpdate
from league_service.testing import JobRecorder, battle_result, solo_result

OUTCOMES = (Outcome.WIN, Outcome.DRAW, Outcome.LOSS)


def _battle_cfg() -> Config:
    return config_from_dict(
        {
            "league": {
                "use_pretrain_init_historical": True,
                "pretrain_checkpoint_path": {"default": "sl/pretrained.pt"},
                "max_active_player_job": 3,
                "main_player": {"one_phase_step": 3000, "exploration": {"start": 0.9, "decay_len": 5000}},
                "main_exploiter": {"one_phase_step": 2000, "reset_after_steps": 6000},
                "league_exploiter": {"one_phase_step": 2500, "mutate_prob": 0.5},
                "payoff": {"min_win_rate_games": 2},
            }
        }
    )


def _league(cfg: Config, seed: int, log: list) -> BaseLeagueManager:
    return create_league(cfg, lambda s, d: log.append((s, d)), JobRecorder(), rng_seed=seed)


def _drive(league: BaseLeagueManager, rounds: int, seed: int, steps: dict[str, int]) -> list:
    """Play `rounds` rounds: launch every free slot, finish the jobs with random results, train, snapshot.
    Returns what the league decided (jobs, snapshots, update outcomes) for comparison."""
    rng = random.Random(seed)
    trace: list = []
    in_flight: list = []
    for _ in range(rounds):
        specs = league.launch_ready_jobs()
        trace.append([(s.players, s.forward_kwargs) for s in specs])
        # Finish all but the newest job: one stays in flight across rounds (slots are part of the state).
        in_flight.extend(specs)
        for spec in in_flight[:-1]:
            league.finish_job(battle_result(spec.players, [rng.choice(OUTCOMES) for _ in range(5)]))
        del in_flight[:-1]
        for player in league.active_players:
            pid = player.player_id
            steps[pid] = steps.get(pid, 0) + rng.randrange(500, 1500)
            version = steps[pid] // 100
            outcome = league.update_active_player(
                PlayerUpdate(pid, version, steps[pid], f"{pid}/v{version}.pt", version)
            )
            trace.append(outcome)
        trace.append([h.player_id for h in league.snapshot_ready_players()])
    return trace


def _roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


def test_battle_state_round_trip_gives_the_same_status_and_the_same_future():
    cfg = _battle_cfg()
    copies_a, copies_b = [], []
    original = _league(cfg, seed=1, log=copies_a)
    steps: dict[str, int] = {}
    _drive(original, rounds=12, seed=7, steps=steps)
    status = original.status()
    assert status.counters.snapshots >= 3 and status.counters.mutations >= 1  # the script exercised them
    assert len(original.historical_players) >= 4

    restored = _league(cfg, seed=999, log=copies_b)
    restored.load_state_dict(_roundtrip(original.state_dict()))
    assert restored.status() == status
    assert restored.league_id == original.league_id
    assert restored.state_dict() == original.state_dict()

    future_a = _drive(original, rounds=8, seed=8, steps=dict(steps))
    future_b = _drive(restored, rounds=8, seed=8, steps=dict(steps))
    assert future_a == future_b
    assert restored.status() == original.status()
    assert copies_b == copies_a[len(copies_a) - len(copies_b) :]


def test_solo_state_round_trip():
    cfg = config_from_dict(
        {
            "env": {"name": "CartPole-v1"},
            "league": {
                "league_type": "solo",
                "active_players": {"solo_active_player": 2},
                "solo_active_player": {"one_phase_step": 100},
            },
        }
    )
    original = _league(cfg, seed=0, log=[])
    for spec in original.launch_ready_jobs()[:3]:
        original.finish_job(solo_result(spec.launch_player, [1.0, 2.5]))
    original.update_active_player(PlayerUpdate("solo_active_player_default_0", 1, 150, "s/v1.pt", 1))
    original.snapshot_ready_players()
    restored = _league(cfg, seed=5, log=[])
    restored.load_state_dict(_roundtrip(original.state_dict()))
    assert restored.status() == original.status()
    assert restored.launch_ready_jobs() == original.launch_ready_jobs()


def test_a_state_of_other_players_is_rejected_and_changes_nothing():
    original = _league(_battle_cfg(), seed=1, log=[])
    _drive(original, rounds=3, seed=1, steps={})
    other = _league(config_from_dict({"league": {"active_players": {"naive_sp_player": 1}}}), seed=0, log=[])
    before = other.state_dict()
    with pytest.raises(LeagueStateError, match="configured"):
        other.load_state_dict(_roundtrip(original.state_dict()))
    assert other.state_dict() == before


@pytest.mark.parametrize(
    ("corrupt", "field"),
    [
        (lambda s: s.update(format_version=99), "format_version"),
        (lambda s: s.update(league_type="solo"), "league_type"),
        (lambda s: s["players"][0].update(total_agent_step="many"), "players"),
        (lambda s: s["players"].append({"player_type": "wizard", "player_id": "x"}), "players"),
        (lambda s: s["players"].append(copy.deepcopy(s["players"][-1])), "players"),
        (lambda s: s["players"].append(copy.deepcopy(s["players"][0])), "players"),
        (
            lambda s: s["payoff"]["records"].append({"home": "ghost", "away": "main_player_default_0"}),
            "payoff",
        ),
        (lambda s: s["ratings"].pop("main_player_default_0"), "ratings"),
        (lambda s: s["slots_used"].update(main_player_default_0=-1), "slots_used"),
        (lambda s: s["counters"].update(matches=-1), "counters"),
        (lambda s: s.update(rng={"bit_generator": "nope"}), "rng"),
    ],
)
def test_a_corrupt_state_is_rejected_naming_the_part_and_changes_nothing(corrupt, field):
    original = _league(_battle_cfg(), seed=1, log=[])
    _drive(original, rounds=4, seed=2, steps={})
    state = _roundtrip(original.state_dict())
    corrupt(state)
    target = _league(_battle_cfg(), seed=3, log=[])
    before = target.state_dict()
    with pytest.raises(LeagueStateError) as info:
        target.load_state_dict(state)
    assert info.value.field.startswith(field)
    assert target.state_dict() == before


def test_load_state_dict_only_before_run():
    league = _league(_battle_cfg(), seed=1, log=[])
    state = league.state_dict()
    league.run()
    try:
        with pytest.raises(RuntimeError, match="before run"):
            league.load_state_dict(state)
    finally:
        league.close()
