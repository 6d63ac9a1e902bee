"""The coordinator's typed requests and replies; the servicer translates them to and from protobuf.

Kept apart from the wire format so the coordinator (and its tests) never touch protobuf, and apart from the
league core's messages (league_service.messages) because leases, workers and counters are not the core's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from league_service.job_retries import PlayerJobFailures
from league_service.leases import JobEndStatus, JobKind, WorkerRole
from league_service.messages import EpisodeOutcome, PlayerUpdate
from league_service.status import LeagueStatus
from league_service.store import Counters


@dataclass(frozen=True)
class Registration:
    worker_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    league_id: str
    shared_root_id: str = ""


@dataclass(frozen=True)
class PlayerRef:
    player_id: str
    # Relative to the shared root; "" when the player has no checkpoint yet.
    checkpoint_path: str
    checkpoint_version: int
    active: bool
    # The reference bot the env plays this player with ("mcts:25"); "" for a player with a policy.
    bot: str = ""


@dataclass(frozen=True)
class JobGrant:
    """A job under a lease, with everything the worker needs to run it."""

    job_id: str
    kind: JobKind
    launch_player: str
    players: tuple[PlayerRef, ...]
    env_name: str
    env_kwargs: dict[str, Any]
    env_num: int
    episode_num: int
    env_steps: int
    forward_kwargs: dict[str, Any]
    adder_kwargs: dict[str, Any]
    learner_endpoint: str
    lease_deadline: float
    lease_timeout_s: float
    policy: dict[str, Any]
    learner_kwargs: dict[str, Any]


@dataclass(frozen=True)
class NoJob:
    retry_after_s: float
    reason: str


@dataclass(frozen=True)
class JobWait:
    """`Coordinator.poll_job`: nothing to lease yet. Look again when the ready listener fires for the role, or
    after `recheck_in_s` (a held-back job becomes free then; None: no such time)."""

    recheck_in_s: float | None


@dataclass(frozen=True)
class FinishReport:
    worker_id: str
    job_id: str
    # COMPLETED, RELEASED or FAILED (EXPIRED is the coordinator's own verdict, never a worker's).
    status: JobEndStatus
    episodes: tuple[EpisodeOutcome, ...]
    env_steps: int
    agent_steps: int
    error: str
    # FAILED because these historical players' checkpoints cannot be loaded: set aside, not retried.
    unloadable_player_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class FinishAck:
    duplicate: bool
    episodes_counted: int


@dataclass(frozen=True)
class PlayerUpdateRequest:
    worker_id: str
    update: PlayerUpdate


@dataclass(frozen=True)
class JobView:
    job_id: str
    kind: JobKind
    launch_player: str
    players: tuple[str, ...]
    worker_id: str
    lease_deadline: float
    issued_at: float


@dataclass(frozen=True)
class WorkerView:
    worker_id: str
    role: WorkerRole
    hostname: str
    data_endpoint: str
    last_heartbeat: float
    job_ids: tuple[str, ...]
    alive: bool


@dataclass(frozen=True)
class CoordinatorStatus:
    """The league core's status plus what the coordinator adds: learners, jobs, workers, counters."""

    league: LeagueStatus
    learner_of: dict[str, str]  # active player id -> worker id of its bound learner
    started_at: float
    now: float
    jobs: tuple[JobView, ...]
    workers: tuple[WorkerView, ...]
    counters: Counters
    # Launch players whose collect jobs failed (since their last completed job, or ever gave one up).
    job_failures: tuple[PlayerJobFailures, ...] = ()
