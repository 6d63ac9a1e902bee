"""Protobuf <-> the coordinator's typed messages, checking every field on the way in.

A malformed request fails here with InvalidArgumentError naming the proto field (`episodes[2].players[0].
outcome`), before anything reaches the league. Numbers must be finite and not negative, ids non-empty, enums
known. What needs the league's state (unknown ids, players not in the job) is checked by the coordinator.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import struct_pb2

from common.job_limits import MAX_CHECKPOINT_VERSION, MAX_EPISODES_PER_JOB, MAX_ID_CHARS
from common.ports import check_host_port
from common.proto.league.v1 import league_pb2
from league_service.coordinator_messages import (
    CoordinatorStatus,
    FinishAck,
    FinishReport,
    JobGrant,
    NoJob,
    PlayerUpdateRequest,
    Registration,
)
from league_service.errors import InvalidArgumentError
from league_service.job_retries import PlayerJobFailures
from league_service.leases import HeartbeatResult, JobEndStatus, JobKind, WorkerRole
from league_service.messages import EpisodeOutcome, Outcome, PlayerOutcome, PlayerUpdate, UpdateOutcome

_ROLES = {league_pb2.WORKER_ROLE_ACTOR: WorkerRole.ACTOR, league_pb2.WORKER_ROLE_LEARNER: WorkerRole.LEARNER}
_ROLE_TO_PROTO = {v: k for k, v in _ROLES.items()}
_KIND_TO_PROTO = {JobKind.COLLECT: league_pb2.JOB_KIND_COLLECT, JobKind.LEARN: league_pb2.JOB_KIND_LEARN}
_FINISH_STATUS = {
    league_pb2.FINISH_STATUS_COMPLETED: JobEndStatus.COMPLETED,
    league_pb2.FINISH_STATUS_RELEASED: JobEndStatus.RELEASED,
    league_pb2.FINISH_STATUS_FAILED: JobEndStatus.FAILED,
}
_OUTCOMES = {
    league_pb2.OUTCOME_UNSPECIFIED: Outcome.NONE,
    league_pb2.OUTCOME_WIN: Outcome.WIN,
    league_pb2.OUTCOME_DRAW: Outcome.DRAW,
    league_pb2.OUTCOME_LOSS: Outcome.LOSS,
}


# ---- checks -------------------------------------------------------------------------------------------------


def require_id(value: str, field: str) -> str:
    if not value:
        raise InvalidArgumentError(field, "is required")
    if len(value) > MAX_ID_CHARS:
        raise InvalidArgumentError(field, f"is longer than {MAX_ID_CHARS} characters")
    if not value.isprintable():
        raise InvalidArgumentError(field, "contains non-printable characters")
    return value


def optional_text(value: str, field: str, max_chars: int = MAX_ID_CHARS) -> str:
    if len(value) > max_chars or not value.isprintable():
        raise InvalidArgumentError(field, f"must be printable and at most {max_chars} characters")
    return value


MAX_MATCH_PLAYERS = 64
"""The most players one match (one job) names: leagues pit two players (solo ones, one); room for games of many
seats, and a bound on what one FinishJob makes the coordinator parse on its event loop."""

# The largest count a request may carry: beyond any real job or player, and small enough that totals of
# such counts stay within the int64 fields of the status and job replies.
MAX_COUNT = 2**53


def require_count(value: int, field: str) -> int:
    if value < 0:
        raise InvalidArgumentError(field, f"must not be negative, got {value}")
    if value > MAX_COUNT:
        raise InvalidArgumentError(field, f"must be at most 2**53, got {value}")
    return value


def require_finite(value: float, field: str, *, minimum: float | None = None) -> float:
    if not math.isfinite(value):
        raise InvalidArgumentError(field, f"must be a finite number, got {value}")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(field, f"must be >= {minimum}, got {value}")
    return value


def require_role(value: int, field: str = "role") -> WorkerRole:
    role = _ROLES.get(value)
    if role is None:
        raise InvalidArgumentError(field, "must be WORKER_ROLE_ACTOR or WORKER_ROLE_LEARNER")
    return role


def data_endpoint(value: str, role: WorkerRole, field: str = "data_endpoint") -> str:
    """A learner's endpoint is what actors dial to stream to it: HOST:PORT, or actors retry `learner node-a:
    UNAVAILABLE` for good. Empty: the learner gives it with GetJob. An actor's is shown only, never dialled."""
    optional_text(value, field)
    if value and role is WorkerRole.LEARNER:
        try:
            check_host_port(value)
        except ValueError as err:
            raise InvalidArgumentError(field, f"a learner's address actors stream to: {err}") from None
    return value


# ---- requests -----------------------------------------------------------------------------------------------


def parse_register(req: league_pb2.RegisterWorkerRequest) -> tuple[str, WorkerRole, str, str]:
    worker_id, role = require_id(req.worker_id, "worker_id"), require_role(req.role)
    return worker_id, role, optional_text(req.hostname, "hostname"), data_endpoint(req.data_endpoint, role)


MAX_HEARTBEAT_JOBS = 4096
"""The most job ids one heartbeat names: a worker runs a job or a few at a time. Every id is checked on the
coordinator's event loop, which a heartbeat of 1.3M ids held for 0.75 s (measured by a review)."""
MAX_ERROR_CHARS = 4096
"""The most of a failed job's error kept (its last line shows in `league status`)."""


def parse_heartbeat(req: league_pb2.HeartbeatRequest) -> tuple[str, tuple[str, ...], bool]:
    if len(req.job_ids) > MAX_HEARTBEAT_JOBS:
        raise InvalidArgumentError("job_ids", f"at most {MAX_HEARTBEAT_JOBS} per heartbeat, got {len(req.job_ids)}")
    return require_id(req.worker_id, "worker_id"), tuple(
        require_id(job_id, f"job_ids[{i}]") for i, job_id in enumerate(req.job_ids)
    ), req.leaving


def parse_get_job(req: league_pb2.GetJobRequest) -> tuple[str, WorkerRole, str, float]:
    worker_id, role = require_id(req.worker_id, "worker_id"), require_role(req.role)
    return worker_id, role, data_endpoint(req.data_endpoint, role), require_finite(req.wait_s, "wait_s", minimum=0.0)


def parse_finish(req: league_pb2.FinishJobRequest) -> FinishReport:
    status = _FINISH_STATUS.get(req.status)
    if status is None:
        raise InvalidArgumentError("status", "must be COMPLETED, RELEASED or FAILED")
    if len(req.episodes) > MAX_EPISODES_PER_JOB:  # refused before checking each (68,000 held the loop ~3 s)
        raise InvalidArgumentError("episodes", f"at most {MAX_EPISODES_PER_JOB} per job, got {len(req.episodes)}")
    for i, ep in enumerate(req.episodes):  # (the same: one episode of 700,000 players held it ~3 s, a review)
        if len(ep.players) > MAX_MATCH_PLAYERS:
            raise InvalidArgumentError(f"episodes[{i}].players",
                                       f"at most {MAX_MATCH_PLAYERS} players a match, got {len(ep.players)}")
    if len(req.unloadable_player_ids) > MAX_MATCH_PLAYERS:
        raise InvalidArgumentError("unloadable_player_ids", f"at most {MAX_MATCH_PLAYERS}, the players of a match, "
                                                            f"got {len(req.unloadable_player_ids)}")
    return FinishReport(
        worker_id=require_id(req.worker_id, "worker_id"),
        job_id=require_id(req.job_id, "job_id"),
        status=status,
        episodes=tuple(_parse_episode(ep, i) for i, ep in enumerate(req.episodes)),
        env_steps=require_count(req.env_steps, "env_steps"),
        agent_steps=require_count(req.agent_steps, "agent_steps"),
        error=printable_text(req.error[:MAX_ERROR_CHARS]),
        unloadable_player_ids=tuple(require_id(pid, f"unloadable_player_ids[{i}]")
                                    for i, pid in enumerate(req.unloadable_player_ids)),
    )


def printable_text(text: str) -> str:
    """`text` with its control characters (but newlines and tabs) written as escapes: a job's error is shown
    by `league status` and logged, and an escape sequence in it (an env's, or a client's) would drive the
    operator's terminal (clear it, retitle it, recolour what follows)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def _is_id(value: str) -> bool:
    return bool(value) and len(value) <= MAX_ID_CHARS and value.isprintable()


def _parse_episode(ep: league_pb2.EpisodeResult, i: int) -> EpisodeOutcome:
    """episodes[i]; field names are spelled out only for an error (this runs for every episode reported)."""
    players = ep.players
    if not players:
        raise InvalidArgumentError(f"episodes[{i}].players", "must name every player of the match")
    outcomes = []
    for j, po in enumerate(players):
        outcome = _OUTCOMES.get(po.outcome)
        if outcome is None:
            raise InvalidArgumentError(f"episodes[{i}].players[{j}].outcome", f"unknown outcome {po.outcome}")
        player_id, episode_return = po.player_id, po.episode_return
        if not _is_id(player_id):
            require_id(player_id, f"episodes[{i}].players[{j}].player_id")
        if not math.isfinite(episode_return):
            require_finite(episode_return, f"episodes[{i}].players[{j}].episode_return")
        outcomes.append(PlayerOutcome(player_id, outcome, episode_return))
    length = ep.length
    if length < 0:
        require_count(length, f"episodes[{i}].length")
    return EpisodeOutcome(tuple(outcomes), length)


def _version(value: int, field: str, maximum: int) -> int:
    if not 0 <= value <= maximum:
        raise InvalidArgumentError(field, f"must be in [0, {maximum}], got {value}")
    return value


def parse_update(req: league_pb2.UpdatePlayerRequest) -> PlayerUpdateRequest:
    return PlayerUpdateRequest(
        worker_id=require_id(req.worker_id, "worker_id"),
        update=PlayerUpdate(
            player_id=require_id(req.player_id, "player_id"),
            train_iteration=require_count(req.train_iteration, "train_iteration"),
            agent_steps=require_count(req.agent_steps, "agent_steps"),
            checkpoint_path=optional_text(req.checkpoint_path, "checkpoint_path", max_chars=4096),
            checkpoint_version=_version(req.checkpoint_version, "checkpoint_version", MAX_CHECKPOINT_VERSION - 1),
            reset_applied_version=_version(req.reset_applied_version, "reset_applied_version", MAX_CHECKPOINT_VERSION),
        ),
    )


# ---- replies ------------------------------------------------------------------------------------------------


def to_struct(data: dict[str, Any]) -> struct_pb2.Struct:
    """A JSON-like dict as a Struct (numbers travel as doubles: receivers convert back to ints)."""
    struct = struct_pb2.Struct()
    struct.update(data)
    return struct


class _JobTemplates:
    """A serialized Job holding the config's sections (policy, learner_kwargs), built once per config: they go
    into every job unchanged, and parsing these bytes into a reply is several times cheaper than copying the
    sections' Structs into it (the most expensive part of a GetJob reply otherwise).

    Keyed by the dicts' identity and holding the dicts, so an entry can never answer for other dicts. The
    per-job Struct fields are present (empty) in the template, as a reply built field by field has them.
    """

    def __init__(self) -> None:
        self._built: dict[tuple[int, int], tuple[dict[str, Any], dict[str, Any], bytes]] = {}

    def __call__(self, policy: dict[str, Any], learner_kwargs: dict[str, Any]) -> bytes:
        key = (id(policy), id(learner_kwargs))
        entry = self._built.get(key)
        if entry is None or entry[0] is not policy or entry[1] is not learner_kwargs:
            template = league_pb2.Job(
                env_kwargs=struct_pb2.Struct(),
                forward_kwargs=struct_pb2.Struct(),
                adder_kwargs=struct_pb2.Struct(),
                policy=to_struct(policy),
                learner_kwargs=to_struct(learner_kwargs),
            )
            entry = (policy, learner_kwargs, template.SerializeToString())
            if len(self._built) > 64:  # configs are few; this only guards against a caller passing fresh dicts
                self._built.clear()
            self._built[key] = entry
        return entry[2]


_job_template = _JobTemplates()


def registration_reply(r: Registration) -> league_pb2.RegisterWorkerResponse:
    return league_pb2.RegisterWorkerResponse(
        worker_id=r.worker_id,
        heartbeat_interval_s=r.heartbeat_interval_s,
        lease_timeout_s=r.lease_timeout_s,
        league_id=r.league_id,
        shared_root_id=r.shared_root_id,
    )


def heartbeat_reply(r: HeartbeatResult) -> league_pb2.HeartbeatResponse:
    return league_pb2.HeartbeatResponse(revoked_job_ids=r.revoked_job_ids, lease_deadline=r.lease_deadline,
                                        lease_timeout_s=r.lease_timeout_s)


def get_job_reply(result: JobGrant | NoJob) -> league_pb2.GetJobResponse:
    if isinstance(result, NoJob):
        return league_pb2.GetJobResponse(retry_after_s=result.retry_after_s, reason=result.reason)
    reply = league_pb2.GetJobResponse()
    _fill_job(reply.job, result)  # in place: a Job built apart would be copied into the reply once more
    return reply


def job_to_proto(g: JobGrant) -> league_pb2.Job:
    job = league_pb2.Job()
    _fill_job(job, g)
    return job


def _fill_job(job: league_pb2.Job, g: JobGrant) -> None:
    job.MergeFromString(_job_template(g.policy, g.learner_kwargs))
    job.job_id = g.job_id
    job.kind = _KIND_TO_PROTO[g.kind]
    job.launch_player = g.launch_player
    for p in g.players:
        job.players.add(
            player_id=p.player_id,
            checkpoint_path=p.checkpoint_path,
            checkpoint_version=p.checkpoint_version,
            active=p.active,
            bot=p.bot,
        )
    job.env_name = g.env_name
    if g.env_kwargs:
        job.env_kwargs.update(g.env_kwargs)
    job.env_num = g.env_num
    job.episode_num = g.episode_num
    job.env_steps = g.env_steps
    if g.forward_kwargs:
        job.forward_kwargs.update(g.forward_kwargs)
    if g.adder_kwargs:
        job.adder_kwargs.update(g.adder_kwargs)
    job.learner_endpoint = g.learner_endpoint
    job.lease_deadline = g.lease_deadline
    job.lease_timeout_s = g.lease_timeout_s


def finish_reply(ack: FinishAck) -> league_pb2.FinishJobResponse:
    return league_pb2.FinishJobResponse(duplicate=ack.duplicate, episodes_counted=ack.episodes_counted)


def update_reply(outcome: UpdateOutcome) -> league_pb2.UpdatePlayerResponse:
    return league_pb2.UpdatePlayerResponse(
        reset_checkpoint_path=outcome.reset_checkpoint_path,
        reset_checkpoint_version=outcome.reset_checkpoint_version,
        mutated=outcome.mutated,
    )


def status_reply(s: CoordinatorStatus) -> league_pb2.LeagueStatus:
    league = s.league
    failures = {f.player_id: f for f in s.job_failures}
    no_failures = PlayerJobFailures("")
    return league_pb2.LeagueStatus(
        league_id=league.league_id,
        league_type=league.league_type,
        started_at=s.started_at,
        uptime_s=max(0.0, s.now - s.started_at),
        now=s.now,
        players=[
            league_pb2.PlayerStatus(
                player_id=p.player_id,
                player_type=p.player_type,
                active=p.active,
                parent_id=p.parent_id,
                agent_steps=p.agent_steps,
                train_iteration=p.train_iteration,
                checkpoint_path=p.checkpoint_path,
                checkpoint_version=p.checkpoint_version,
                elo=p.elo,
                trueskill_mu=p.trueskill_mu,
                trueskill_sigma=p.trueskill_sigma,
                slots_used=p.slots_used,
                slots_limit=p.slots_limit,
                learner_worker_id=s.learner_of.get(p.player_id, ""),
                snapshots=p.snapshots,
                mutations=p.mutations,
                mean_return=p.mean_return,
                episodes=p.episodes,
                failed_attempts_in_a_row=failures.get(p.player_id, no_failures).failures_in_a_row,
                jobs_given_up=failures.get(p.player_id, no_failures).jobs_given_up,
                jobs_held_until=failures.get(p.player_id, no_failures).held_until,
                last_job_error=failures.get(p.player_id, no_failures).last_error,
                set_aside=p.set_aside,
                category=p.category,
            )
            for p in league.players
        ],
        payoff=[
            league_pb2.PayoffEntry(
                home=r.home, away=r.away, wins=r.wins, draws=r.draws, losses=r.losses, games=r.games,
                win_rate=r.win_rate, games_played=r.played, win_rate_is_default=r.win_rate_is_default,
            )
            for r in league.payoff
        ],
        jobs=[
            league_pb2.JobStatus(
                job_id=j.job_id,
                kind=_KIND_TO_PROTO[j.kind],
                launch_player=j.launch_player,
                players=j.players,
                worker_id=j.worker_id,
                lease_deadline=j.lease_deadline,
                issued_at=j.issued_at,
            )
            for j in s.jobs
        ],
        workers=[
            league_pb2.WorkerStatus(
                worker_id=w.worker_id,
                role=_ROLE_TO_PROTO[w.role],
                hostname=w.hostname,
                data_endpoint=w.data_endpoint,
                last_heartbeat=w.last_heartbeat,
                job_ids=w.job_ids,
                alive=w.alive,
            )
            for w in s.workers
        ],
        counters=league_pb2.Counters(
            jobs_issued=s.counters.jobs_issued,
            jobs_finished=s.counters.jobs_finished,
            jobs_expired=s.counters.jobs_expired,
            jobs_failed=s.counters.jobs_failed,
            matches=league.counters.matches,
            snapshots=league.counters.snapshots,
            mutations=league.counters.mutations,
            env_steps=s.counters.env_steps,
            jobs_given_up=s.counters.jobs_given_up,
        ),
    )
