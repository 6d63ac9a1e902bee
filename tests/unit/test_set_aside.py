"""A historical player whose checkpoint cannot be loaded: the actor's FAILED finish names it, the league sets it
aside from matchmaking (persisted), the launch player is not held back, and bad names are refused. The real
coordinator (league core, lease table, SQLite store; no gRPC) with a fake clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.checkpoint_store import CheckpointStore
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_messages import FinishReport, JobGrant
from league_service.coordinator_testing import FakeClock, small_league_config
from league_service.errors import InvalidArgumentError, NotFoundError
from league_service.leases import JobEndStatus, WorkerRole
from league_service.messages import EpisodeOutcome, Outcome, PlayerOutcome
from league_service.status_view import render_status
from league_service.wire import status_reply

MAIN = "main_player_default_0"
PRETRAINED = "pre/v0000000000.pt"


def _open(root: Path, published: bool = False, slots: int = 1) -> Coordinator:
    """`published`: the pretrained file is a checkpoint that verifies (else bytes no manifest publishes);
    `slots`: the main player's launch slots (jobs matched at once)."""
    if published:
        assert CheckpointStore(root).publish("pre", {"w": np.ones(4, np.float32)}, 0).path == PRETRAINED
    elif not (root / PRETRAINED).exists():
        (root / "pre").mkdir(exist_ok=True)
        (root / PRETRAINED).write_bytes(b"weights")
    cfg = small_league_config({"league": {
        "active_players": {"main_player": 1}, "max_active_player_job": slots,
        "use_pretrain_init_historical": True, "pretrain_checkpoint_path": {"default": PRETRAINED},
    }})
    coord = Coordinator(cfg, CoordinatorSettings(shared_root=root, lease_timeout_s=30.0, needs_learner=False,
                                                 rng_seed=0),
                        clock=FakeClock(), expiry_thread=False)
    coord.start()
    coord.register_worker("actor", WorkerRole.ACTOR, "host", "")
    return coord


def _job(coord: Coordinator) -> JobGrant:
    grant = coord.get_job("actor", WorkerRole.ACTOR, "", wait_s=10.0)
    assert isinstance(grant, JobGrant), grant
    return grant


def _complete(coord: Coordinator, grant: JobGrant) -> None:
    ids = [p.player_id for p in grant.players]
    outcomes = tuple(PlayerOutcome(pid, Outcome.WIN if i == 0 else Outcome.LOSS, 0.0) for i, pid in enumerate(ids))
    coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.COMPLETED, (EpisodeOutcome(outcomes, 3),), 3,
                                  3, ""))


def _job_against(coord: Coordinator, opponent: str) -> JobGrant:
    """The first job that plays `opponent` (the jobs before it completed)."""
    grant = _job(coord)
    while opponent not in [p.player_id for p in grant.players]:
        _complete(coord, grant)
        grant = _job(coord)
    return grant


def _historical(coord: Coordinator) -> str:
    (player,) = [p for p in coord.status().league.players if not p.active]
    return player.player_id


def test_an_unloadable_historical_player_is_set_aside_and_its_launch_player_plays_on(tmp_path):
    coord = _open(tmp_path)
    try:
        frozen = _historical(coord)
        grant = _job_against(coord, frozen)
        error = f"UnloadableOpponentError: historical player {frozen}: {PRETRAINED}: digest mismatch"
        coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.FAILED, (), 0, 0, error, (frozen,)))
        status = coord.status()
        (player,) = [p for p in status.league.players if p.player_id == frozen]
        assert "digest mismatch" in player.set_aside
        assert not status.job_failures  # not the launch player's failure: no backoff, no retry of those players
        assert status.counters.jobs_failed == 1
        for _ in range(30):  # PFSP over the historical players now has none: self-play
            grant = _job(coord)
            assert frozen not in [p.player_id for p in grant.players]
            _complete(coord, grant)
        rendered = render_status(status_reply(coord.status()))
        assert rendered is not None
    finally:
        coord.close()
    reopened = _open(tmp_path)  # the league's state keeps it set aside
    try:
        (player,) = [p for p in reopened.status().league.players if p.player_id == frozen]
        assert "digest mismatch" in player.set_aside
    finally:
        reopened.close()


def test_waiting_jobs_that_play_a_player_set_aside_are_matched_anew(tmp_path):
    """Jobs matched before the player was set aside, still waiting for an actor, would fail alike."""
    coord = _open(tmp_path, slots=6)
    try:
        frozen = _historical(coord)
        grant = _job_against(coord, frozen)
        waiting = [job for job in coord._table.pending if frozen in job.players]
        assert waiting, "the test needs waiting jobs that play the player (seeded matchmaking)"
        coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.FAILED, (), 0, 0,
                                      f"UnloadableOpponentError: {frozen}: digest mismatch", (frozen,)))
        assert coord.status().counters.jobs_failed == 1
        for _ in range(12):  # every slot's job, and the ones after them
            grant = _job(coord)
            assert frozen not in [p.player_id for p in grant.players]
            _complete(coord, grant)
        assert coord.status().counters.jobs_failed == 1
    finally:
        coord.close()


def test_a_job_out_with_another_actor_that_plays_a_player_set_aside_is_not_offered_again(tmp_path):
    """Only jobs still waiting were withdrawn: a job out with another actor at the set-aside, whose attempt then
    failed (or expired, or its learner moved), was offered again with the same opponent, and failed alike (a
    review). Its slot is matched anew."""
    coord = _open(tmp_path, slots=2)
    try:
        coord.register_worker("actor2", WorkerRole.ACTOR, "host", "")
        frozen = _historical(coord)
        first, second = _job(coord), coord.get_job("actor2", WorkerRole.ACTOR, "", wait_s=10.0)
        for _ in range(50):  # (seeded matchmaking: until both actors hold a job against it)
            if frozen not in [p.player_id for p in first.players]:
                _complete(coord, first)
                first = _job(coord)
            elif frozen not in [p.player_id for p in second.players]:
                coord.finish_job(FinishReport("actor2", second.job_id, JobEndStatus.COMPLETED, (), 0, 0, ""))
                second = coord.get_job("actor2", WorkerRole.ACTOR, "", wait_s=10.0)
            else:
                break
        assert frozen in [p.player_id for p in first.players] and frozen in [p.player_id for p in second.players]
        coord.finish_job(FinishReport("actor", first.job_id, JobEndStatus.FAILED, (), 0, 0,
                                      f"UnloadableOpponentError: {frozen}: digest mismatch", (frozen,)))
        coord.finish_job(FinishReport("actor2", second.job_id, JobEndStatus.FAILED, (), 0, 0,
                                      "RuntimeError: its manifest cannot be read"))
        assert all(frozen not in job.players for job in coord._table.pending)
        for _ in range(12):
            grant = _job(coord)
            assert frozen not in [p.player_id for p in grant.players]
            _complete(coord, grant)
    finally:
        coord.close()


def test_only_a_failed_jobs_historical_opponents_can_be_named_unloadable(tmp_path):
    coord = _open(tmp_path)
    try:
        frozen = _historical(coord)
        grant = _job(coord)
        others = [p.player_id for p in grant.players[1:]]
        bad = [
            (JobEndStatus.FAILED, (MAIN,), "not (an opponent|a historical player)"),  # active: older versions
            (JobEndStatus.FAILED, ("nobody",), "not an opponent"),
            (JobEndStatus.COMPLETED, (frozen,), "only a FAILED job"),
        ]
        if frozen not in others:
            bad.append((JobEndStatus.FAILED, (frozen,), "not an opponent"))
        for status, ids, message in bad:
            with pytest.raises(InvalidArgumentError, match=message):
                coord.finish_job(FinishReport("actor", grant.job_id, status, (), 0, 0, "x", ids))
        assert all(not p.set_aside for p in coord.status().league.players)
        _complete(coord, grant)  # the refusals changed nothing: the job is still this actor's
    finally:
        coord.close()


def test_no_checkpoint_is_read_before_the_worker_its_job_and_the_ids_are_checked(tmp_path, monkeypatch):
    """A finish naming a player with a checkpoint 300 times, from no registered worker, had the coordinator hash
    that checkpoint 300 times on its event loop before refusing it (10 s per 300 ids of a 64 MiB file)."""
    coord = _open(tmp_path, published=True)
    verified = []
    real_verify = CheckpointStore.verify
    monkeypatch.setattr(CheckpointStore, "verify", lambda self, path: verified.append(path) or real_verify(self, path))
    try:
        frozen = _historical(coord)
        with pytest.raises(NotFoundError, match="worker_id"):
            coord.finish_job(FinishReport("nobody", "no-job", JobEndStatus.FAILED, (), 0, 0, "x", (frozen,) * 300))
        with pytest.raises(NotFoundError, match="job_id"):
            coord.finish_job(FinishReport("actor", "no-job", JobEndStatus.FAILED, (), 0, 0, "x", (frozen,) * 300))
        grant = _job_against(coord, frozen)
        with pytest.raises(InvalidArgumentError, match="more than once"):
            coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.FAILED, (), 0, 0, "x", (frozen,) * 2))
        assert verified == []
        coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.FAILED, (), 0, 0, "x", (frozen,)))
        assert verified == [PRETRAINED]  # a valid report: its one player is verified (and stays in play)
        assert all(not p.set_aside for p in coord.status().league.players)
    finally:
        coord.close()


def test_a_player_whose_checkpoint_verifies_on_the_coordinators_share_stays_in_play(tmp_path):
    """An actor with another share mounted cannot load a good player: its word alone must not take the player
    out of the league for good. The failure counts as any other (retried, then backed off)."""
    coord = _open(tmp_path, published=True)
    try:
        frozen = _historical(coord)
        grant = _job_against(coord, frozen)
        coord.finish_job(FinishReport("actor", grant.job_id, JobEndStatus.FAILED, (), 0, 0,
                                      f"CheckpointNotFoundError: {PRETRAINED}: file missing", (frozen,)))
        status = coord.status()
        assert all(not p.set_aside for p in status.league.players)
        (books,) = status.job_failures
        assert books.player_id == MAIN and books.failures_in_a_row == 1
        assert frozen in [p.player_id for p in _job(coord).players]  # the same job, offered again
    finally:
        coord.close()
