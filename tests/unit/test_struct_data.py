"""Free-form job sections read back from their Structs the same way by actors and learners."""

from __future__ import annotations

from google.protobuf import struct_pb2

from common.envs.registry import make_env
from common.proto.league.v1 import league_pb2 as pb
from common.struct_data import struct_to_dict
from learner_service.league_client import LearnJob


def struct(data: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data)
    return s


def test_struct_to_dict_keeps_fractions_and_strings():
    assert struct_to_dict(struct({"a": 0.5, "b": "x", "c": [1, 2.5], "d": True})) == {
        "a": 0.5, "b": "x", "c": [1, 2.5], "d": True}


def test_whole_numbers_come_back_as_ints_at_any_depth():
    data = struct_to_dict(struct({"n": 3, "nested": {"rows": 6, "list": [{"k": 2}]}}))
    assert data == {"n": 3, "nested": {"rows": 6, "list": [{"k": 2}]}}
    assert all(type(v) is int for v in (data["n"], data["nested"]["rows"], data["nested"]["list"][0]["k"]))


def test_a_learner_builds_the_jobs_env_with_integer_kwargs():
    """The learner builds the job's env for its specs. It used to read the kwargs with a plain MessageToDict,
    so `max_episode_steps: 300` or a game's `columns: 6` arrived as 300.0 / 6.0 and every learn job of such
    a league failed at setup, while the actors (which converted) were fine."""
    for env_name, kwargs in (
        ("MountainCar-v0", {"max_episode_steps": 300}),
        ("openspiel:breakthrough", {"game_params": {"rows": 6, "columns": 6}}),
    ):
        job = pb.Job(job_id="j", kind=pb.JOB_KIND_LEARN, env_name=env_name, env_kwargs=struct(kwargs),
                     learner_kwargs=struct({"batch_size": 64}))
        job.players.add(player_id="p", checkpoint_path="", checkpoint_version=0, active=True)
        learn = LearnJob.from_proto(job, requested_at=0.0)
        assert learn.env_kwargs == kwargs and learn.learner_kwargs == {"batch_size": 64}
        make_env(learn.env_name, **learn.env_kwargs).close()
