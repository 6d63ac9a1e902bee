"""JobPlan: a protobuf Job checked into typed fields; bad fields are named; episode results in job order."""

import pytest
from google.protobuf import struct_pb2

from actor_service.actor import episode_result, job_seed
from actor_service.job import JobError, JobKind, JobPlan
from actor_service.rollout import EpisodeRecord
from actor_service.trajectory_sender import SenderSettings
from common.adder_config import DEFAULT_UNROLL_LEN
from common.envs.base import Outcome
from common.proto.league.v1 import league_pb2 as pb
from common.rpc import MIN_HEARTBEAT_INTERVAL_S, job_heartbeat_interval


def struct(data: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def job(**overrides) -> pb.Job:
    fields = dict(
        job_id="j1",
        kind=pb.JOB_KIND_COLLECT,
        launch_player="p",
        players=[pb.PlayerRef(player_id="p", active=True), pb.PlayerRef(player_id="q", checkpoint_path="q/v.pt",
                                                                         checkpoint_version=3)],
        env_name="connect_four",
        env_kwargs=struct({"game_params": {"rows": 6}}),
        env_num=4,
        episode_num=8,
        forward_kwargs=struct({"eps": 0.25}),
        adder_kwargs=struct({"unroll_len": 16}),
        learner_endpoint="127.0.0.1:1",
        policy=struct({"algorithm": "ppo", "model": {"hidden": [32, 32]}}),
    )
    fields.update(overrides)
    return pb.Job(**fields)


def test_a_job_becomes_typed_fields():
    plan = JobPlan.from_proto(job())
    assert plan.kind is JobKind.COLLECT
    assert plan.launch.player_id == "p" and plan.players[1].checkpoint_version == 3
    assert plan.env_kwargs == {"game_params": {"rows": 6}}  # whole numbers come back as ints
    assert isinstance(plan.env_kwargs["game_params"]["rows"], int)
    assert plan.forward_kwargs.eps == 0.25
    assert plan.adder.unroll_len == 16
    assert plan.policy == {"algorithm": "ppo", "model": {"hidden": [32, 32]}}
    assert JobPlan.from_proto(job(), env_num_override=2).env_num == 2


def test_defaults_for_empty_sections():
    plan = JobPlan.from_proto(job(adder_kwargs=struct({}), forward_kwargs=struct({}), kind=pb.JOB_KIND_EVAL))
    assert plan.kind is JobKind.EVAL
    assert plan.adder.unroll_len == DEFAULT_UNROLL_LEN
    assert plan.forward_kwargs.eps == 0.0


def test_chunks_in_flight_bounds_the_actors_sender():
    default = SenderSettings()
    plan = JobPlan.from_proto(job())
    assert default.within(plan.adder.chunks_in_flight) == default  # 0: the actor's own settings
    for bound, queued, streamed in ((2, 1, 1), (3, 1, 2), (8, 4, 4), (1000, default.queue_chunks,
                                                                       default.stream_chunks)):
        plan = JobPlan.from_proto(job(adder_kwargs=struct({"chunks_in_flight": bound})))
        settings = default.within(plan.adder.chunks_in_flight)
        assert (settings.queue_chunks, settings.stream_chunks) == (queued, streamed)
        assert settings.queue_chunks + settings.stream_chunks <= bound


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"job_id": ""}, "job_id"),
        ({"kind": pb.JOB_KIND_LEARN}, "kind"),
        ({"players": []}, "players"),
        ({"launch_player": "q"}, "players"),
        ({"env_name": ""}, "env_name"),
        ({"env_num": 0}, "env_num"),
        ({"episode_num": 0, "env_steps": 0}, "episode_num"),
        ({"forward_kwargs": struct({"epsilon": 0.1})}, "forward_kwargs"),
        ({"forward_kwargs": struct({"eps": 2.0})}, "forward_kwargs"),
        ({"adder_kwargs": struct({"unroll_len": 0})}, "adder_kwargs"),
        ({"adder_kwargs": struct({"unroll": 8})}, "adder_kwargs"),
        ({"adder_kwargs": struct({"chunks_in_flight": 1})}, "adder_kwargs"),
        # What a newer or foreign coordinator may send: a job kind this actor does not know, numbers JSON
        # cannot hold. These used to escape as plain ValueErrors and take the actor process down.
        ({"kind": 99}, "kind"),
        ({"env_kwargs": struct({"game_params": {"rows": float("nan")}})}, "env_kwargs"),
        ({"policy": struct({"ppo": {"learning_rate": float("inf")}})}, "policy"),
        ({"forward_kwargs": struct({"eps": float("nan")})}, "forward_kwargs"),
        # (A NaN lease made every checkpoint read look stuck past two leases: the actor exited 1; a review.)
        ({"lease_timeout_s": float("nan")}, "lease_timeout_s"),
        ({"lease_timeout_s": float("inf")}, "lease_timeout_s"),
        ({"lease_timeout_s": -1.0}, "lease_timeout_s"),
    ],
)
def test_bad_fields_are_named(overrides, field):
    with pytest.raises(JobError) as err:
        JobPlan.from_proto(job(**overrides))
    assert err.value.field == field
    assert str(err.value).startswith(field)


def test_episode_results_list_players_in_job_order():
    record = EpisodeRecord(9, ("p", "q"), (Outcome.LOSS, Outcome.WIN), (-1.0, 1.0))
    result = episode_result(record)
    assert result.length == 9
    assert [(p.player_id, p.outcome, p.episode_return) for p in result.players] == [
        ("p", pb.OUTCOME_LOSS, -1.0), ("q", pb.OUTCOME_WIN, 1.0)]
    solo = episode_result(EpisodeRecord(20, ("p",), (None,), (20.0,)))
    assert solo.players[0].outcome == pb.OUTCOME_UNSPECIFIED


def test_job_seed_is_stable_per_job():
    assert job_seed("abc") == job_seed("abc") != job_seed("abd")


def test_a_jobs_heartbeat_beats_at_least_three_times_per_its_own_lease():
    """The actor registers once; a coordinator restarted with a shorter lease still knows it, so the job's
    lease_timeout_s (not the first registration's interval) must set the pace, or every lease expires."""
    assert job_heartbeat_interval(5.0, 30.0) == 5.0
    assert job_heartbeat_interval(5.0, 3.0) == 1.0
    assert job_heartbeat_interval(5.0, 0.0) == 5.0  # no lease in the job (an older coordinator): as registered


def test_a_heartbeat_never_goes_out_more_often_than_the_floor():
    """A lease of a nanosecond (a coordinator's bug) made an actor's heartbeat a busy loop (a review)."""
    assert job_heartbeat_interval(5.0, 1e-9) == MIN_HEARTBEAT_INTERVAL_S
    assert job_heartbeat_interval(1e-9, 30.0) == MIN_HEARTBEAT_INTERVAL_S
