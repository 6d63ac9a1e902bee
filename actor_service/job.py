"""A job as the actor runs it: the protobuf `Job` checked once, on arrival, into typed fields.

Everything the coordinator sends is validated here and a bad field raises `JobError` naming it, so the rest of
the actor never meets a half-valid job (the job is then finished as FAILED with that message).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2

from common.adder_config import AdderConfig
from common.computation.algorithm import ForwardKwargs
from common.envs.bot_spec import BotSpec
from common.job_limits import MAX_ENV_NUM, MAX_EPISODES_PER_JOB
from common.proto.league.v1 import league_pb2
from common.struct_data import struct_to_dict
from common.typed_config import from_mapping


class JobError(ValueError):
    """A job the actor cannot run as given; `field` names the Job field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class JobKind(enum.Enum):
    COLLECT = "collect"  # play, stream the launch player's trajectories to its learner, report results
    EVAL = "eval"  # play and report results only


_KINDS = {league_pb2.JOB_KIND_COLLECT: JobKind.COLLECT, league_pb2.JOB_KIND_EVAL: JobKind.EVAL}


@dataclass(frozen=True)
class PlayerSlot:
    """One participant of the match and the checkpoint its policy loads from ("" = none yet)."""

    player_id: str
    checkpoint_path: str
    checkpoint_version: int
    active: bool
    bot: str = ""
    """A reference bot ("mcts:25") the env plays this player's seat with: no policy, no checkpoint."""


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    kind: JobKind
    launch_player: str
    players: tuple[PlayerSlot, ...]
    """Seat order as the league sees it: players[0] is the launch player."""
    env_name: str
    env_kwargs: Mapping[str, Any]
    env_num: int
    episode_num: int
    """Episodes to play; 0: play until `env_steps` env steps are spent."""
    env_steps: int
    forward_kwargs: ForwardKwargs
    """How the launch player acts (the league's exploration schedule); other players act with the defaults."""
    adder: AdderConfig
    learner_endpoint: str
    """Where trajectories go; empty for a coordinator run `--without-learners` (then nothing is streamed)."""
    lease_timeout_s: float
    policy: Mapping[str, Any]
    """The league config's ``policy`` section (algorithm and model), for `make_computation_task`."""

    @property
    def launch(self) -> PlayerSlot:
        return self.players[0]

    @classmethod
    def from_proto(cls, job: league_pb2.Job, env_num_override: int | None = None) -> JobPlan:
        """Check every field of `job`; `env_num_override` (the actor's --env-num) replaces the job's env_num."""
        if not job.job_id:
            raise JobError("job_id", "is empty")
        kind = _KINDS.get(job.kind)
        if kind is None:
            name = league_pb2.JobKind.Name(job.kind) if job.kind in league_pb2.JobKind.values() else str(job.kind)
            raise JobError("kind", f"an actor runs collect and eval jobs, got {name}")
        if not job.players:
            raise JobError("players", "names no player")
        players = tuple(_player_slot(p, f"players[{i}]") for i, p in enumerate(job.players))
        if job.launch_player != players[0].player_id:
            raise JobError("players", f"players[0] is {players[0].player_id!r}, not the launch player {job.launch_player!r}")
        if players[0].bot:
            raise JobError("players[0].bot", f"the launch player {players[0].player_id!r} must have a policy, not a bot")
        if not job.env_name:
            raise JobError("env_name", "is empty")
        env_num = env_num_override if env_num_override is not None else job.env_num
        if not 1 <= env_num <= MAX_ENV_NUM:
            raise JobError("env_num", f"must be within [1, {MAX_ENV_NUM}], got {env_num}")
        if job.episode_num < 0 or job.env_steps < 0:
            raise JobError("episode_num", f"episode_num {job.episode_num} and env_steps {job.env_steps} must be >= 0")
        if job.episode_num == 0 and job.env_steps == 0:
            raise JobError("episode_num", "episode_num and env_steps are both 0: the job would never end")
        if job.episode_num > MAX_EPISODES_PER_JOB:
            raise JobError("episode_num", f"must be at most {MAX_EPISODES_PER_JOB} (the episodes one FinishJob can "
                           f"report), got {job.episode_num}")
        if not (math.isfinite(job.lease_timeout_s) and job.lease_timeout_s >= 0):
            # (A NaN made every checkpoint read and env call under way look stuck past two leases: the actor
            # exited 1 as if its filesystem hung; a review.) 0: a coordinator that does not say.
            raise JobError("lease_timeout_s", f"must be a number of seconds >= 0, got {job.lease_timeout_s}")
        env_kwargs = _plain(job.env_kwargs, "env_kwargs")
        if "bots" in env_kwargs and any(p.bot for p in players):
            raise JobError("env_kwargs.bots", "the job seats reference-bot players: the env's own bots would take "
                           "their seats")
        return cls(
            job_id=job.job_id,
            kind=kind,
            launch_player=job.launch_player,
            players=players,
            env_name=job.env_name,
            env_kwargs=env_kwargs,
            env_num=env_num,
            episode_num=job.episode_num,
            env_steps=job.env_steps,
            forward_kwargs=_typed(ForwardKwargs, job.forward_kwargs, "forward_kwargs"),
            adder=_typed(AdderConfig, job.adder_kwargs, "adder_kwargs"),
            learner_endpoint=job.learner_endpoint,
            lease_timeout_s=job.lease_timeout_s,
            policy=_plain(job.policy, "policy"),
        )

    @property
    def player_bots(self) -> tuple[str, ...]:
        """Each player's reference bot ("" for a policy); all "" in a job without bots."""
        return tuple(p.bot for p in self.players)


def _plain(struct: struct_pb2.Struct, field: str) -> dict[str, Any]:
    """`struct_to_dict`, with what it cannot convert (a NaN or an infinity) failing the job, not the actor."""
    try:
        return struct_to_dict(struct)
    except ValueError as e:
        raise JobError(field, str(e)) from None


def _typed(cls: type, struct: struct_pb2.Struct, field: str) -> Any:
    try:
        return from_mapping(cls, _plain(struct, field), field)
    except ValueError as e:
        raise JobError(field, str(e).removeprefix(f"{field}: ")) from None


def _player_slot(ref: league_pb2.PlayerRef, field: str) -> PlayerSlot:
    if not ref.player_id:
        raise JobError(f"{field}.player_id", "is empty")
    if ref.checkpoint_version < 0:
        raise JobError(f"{field}.checkpoint_version", f"must be >= 0, got {ref.checkpoint_version}")
    if ref.bot:
        if ref.active:
            raise JobError(f"{field}.bot", f"{ref.player_id!r} is active (trained); a reference bot never is")
        try:
            BotSpec.parse(ref.bot)
        except ValueError as err:
            raise JobError(f"{field}.bot", str(err)) from None
    return PlayerSlot(ref.player_id, ref.checkpoint_path, ref.checkpoint_version, ref.active, ref.bot)
