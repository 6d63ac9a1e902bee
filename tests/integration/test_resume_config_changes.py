"""A league resumed with a changed config (`league coordinator --state` restarted with another `--config`): what
the config may add takes effect, as real coordinator processes on one state file show."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from common.checkpoint_store import CheckpointStore
from common.proto.league.v1 import league_pb2 as pb
from league_service.coordinator_testing import coordinator_process, league_stub

LEAGUE = {
    "league": {"active_players": {"main_player": 1, "main_exploiter": 1}, "reference_bots": []},
    "env": {"name": "connect_four", "env_num": 2, "episode_num": 4},
}


def _status(tmp_path: Path, config: dict) -> pb.LeagueStatus:
    """The league's status from a coordinator started on tmp_path's state with `config`, then stopped."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["--shared-root", str(tmp_path / "shared"), "--state", str(tmp_path / "state.sqlite"), "--config",
            str(path), "--port", "0", "--grace", "1", "--drain", "0"]
    with coordinator_process(argv, tmp_path / "coordinator.log") as proc:
        channel, stub = league_stub(proc.address, default_deadline_s=30)
        with channel:
            status = stub.GetStatus(pb.GetStatusRequest())
        assert proc.terminate() == 0
    return status


def test_use_pretrain_init_historical_turned_on_for_a_resumed_league_adds_the_pretrained_player(tmp_path):
    """The option was taken on resume (and `league run` wrote it into the run's config.yaml), but the pretrained
    player joined only a new league: the resumed one went on without it, unsaid."""
    (tmp_path / "shared").mkdir()
    ref = CheckpointStore(tmp_path / "shared").publish("sl", {"w": np.zeros(3, np.float32)}, 0)
    first = _status(tmp_path, LEAGUE)
    assert [p.player_id for p in first.players if not p.active] == []

    pretrained = {**LEAGUE, "league": {**LEAGUE["league"], "use_pretrain_init_historical": True,
                                       "pretrain_checkpoint_path": {"default": ref.path}}}
    resumed = _status(tmp_path, pretrained)
    assert resumed.league_id == first.league_id
    (joined,) = [p for p in resumed.players if not p.active]
    assert (joined.player_id, joined.checkpoint_path) == ("main_player_default_0_pretrain", ref.path)
    initial = {p.player_id: p.elo for p in first.players}["main_player_default_0"]
    assert joined.elo == initial  # the pretrained weights' rating, not its parent's trained one

    # Restarted again with the same config: the same player, not a second one nor a refusal.
    again = _status(tmp_path, pretrained)
    assert [p.player_id for p in again.players if not p.active] == ["main_player_default_0_pretrain"]
