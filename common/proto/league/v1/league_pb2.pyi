from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_ACTOR: _ClassVar[WorkerRole]
    WORKER_ROLE_LEARNER: _ClassVar[WorkerRole]

class JobKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_KIND_UNSPECIFIED: _ClassVar[JobKind]
    JOB_KIND_COLLECT: _ClassVar[JobKind]
    JOB_KIND_LEARN: _ClassVar[JobKind]
    JOB_KIND_EVAL: _ClassVar[JobKind]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_WIN: _ClassVar[Outcome]
    OUTCOME_DRAW: _ClassVar[Outcome]
    OUTCOME_LOSS: _ClassVar[Outcome]

class FinishStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_STATUS_UNSPECIFIED: _ClassVar[FinishStatus]
    FINISH_STATUS_COMPLETED: _ClassVar[FinishStatus]
    FINISH_STATUS_RELEASED: _ClassVar[FinishStatus]
    FINISH_STATUS_FAILED: _ClassVar[FinishStatus]
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_ACTOR: WorkerRole
WORKER_ROLE_LEARNER: WorkerRole
JOB_KIND_UNSPECIFIED: JobKind
JOB_KIND_COLLECT: JobKind
JOB_KIND_LEARN: JobKind
JOB_KIND_EVAL: JobKind
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_WIN: Outcome
OUTCOME_DRAW: Outcome
OUTCOME_LOSS: Outcome
FINISH_STATUS_UNSPECIFIED: FinishStatus
FINISH_STATUS_COMPLETED: FinishStatus
FINISH_STATUS_RELEASED: FinishStatus
FINISH_STATUS_FAILED: FinishStatus

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "role", "hostname", "data_endpoint")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: WorkerRole
    hostname: str
    data_endpoint: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., hostname: _Optional[str] = ..., data_endpoint: _Optional[str] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("worker_id", "heartbeat_interval_s", "lease_timeout_s", "league_id", "shared_root_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    LEAGUE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARED_ROOT_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    league_id: str
    shared_root_id: str
    def __init__(self, worker_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., lease_timeout_s: _Optional[float] = ..., league_id: _Optional[str] = ..., shared_root_id: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "job_ids", "leaving")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    leaving: bool
    def __init__(self, worker_id: _Optional[str] = ..., job_ids: _Optional[_Iterable[str]] = ..., leaving: _Optional[bool] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("revoked_job_ids", "lease_deadline", "lease_timeout_s")
    REVOKED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    revoked_job_ids: _containers.RepeatedScalarFieldContainer[str]
    lease_deadline: float
    lease_timeout_s: float
    def __init__(self, revoked_job_ids: _Optional[_Iterable[str]] = ..., lease_deadline: _Optional[float] = ..., lease_timeout_s: _Optional[float] = ...) -> None: ...

class PlayerRef(_message.Message):
    __slots__ = ("player_id", "checkpoint_path", "checkpoint_version", "active", "bot")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    BOT_FIELD_NUMBER: _ClassVar[int]
    player_id: str
    checkpoint_path: str
    checkpoint_version: int
    active: bool
    bot: str
    def __init__(self, player_id: _Optional[str] = ..., checkpoint_path: _Optional[str] = ..., checkpoint_version: _Optional[int] = ..., active: _Optional[bool] = ..., bot: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "kind", "launch_player", "players", "env_name", "env_kwargs", "env_num", "episode_num", "env_steps", "forward_kwargs", "adder_kwargs", "learner_endpoint", "lease_deadline", "lease_timeout_s", "policy", "learner_kwargs")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_PLAYER_FIELD_NUMBER: _ClassVar[int]
    PLAYERS_FIELD_NUMBER: _ClassVar[int]
    ENV_NAME_FIELD_NUMBER: _ClassVar[int]
    ENV_KWARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_NUM_FIELD_NUMBER: _ClassVar[int]
    EPISODE_NUM_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_KWARGS_FIELD_NUMBER: _ClassVar[int]
    ADDER_KWARGS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    LEARNER_KWARGS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    kind: JobKind
    launch_player: str
    players: _containers.RepeatedCompositeFieldContainer[PlayerRef]
    env_name: str
    env_kwargs: _struct_pb2.Struct
    env_num: int
    episode_num: int
    env_steps: int
    forward_kwargs: _struct_pb2.Struct
    adder_kwargs: _struct_pb2.Struct
    learner_endpoint: str
    lease_deadline: float
    lease_timeout_s: float
    policy: _struct_pb2.Struct
    learner_kwargs: _struct_pb2.Struct
    def __init__(self, job_id: _Optional[str] = ..., kind: _Optional[_Union[JobKind, str]] = ..., launch_player: _Optional[str] = ..., players: _Optional[_Iterable[_Union[PlayerRef, _Mapping]]] = ..., env_name: _Optional[str] = ..., env_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., env_num: _Optional[int] = ..., episode_num: _Optional[int] = ..., env_steps: _Optional[int] = ..., forward_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., adder_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., learner_endpoint: _Optional[str] = ..., lease_deadline: _Optional[float] = ..., lease_timeout_s: _Optional[float] = ..., policy: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., learner_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("worker_id", "role", "data_endpoint", "wait_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: WorkerRole
    data_endpoint: str
    wait_s: float
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., data_endpoint: _Optional[str] = ..., wait_s: _Optional[float] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job", "retry_after_s", "reason")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job: Job
    retry_after_s: float
    reason: str
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., retry_after_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class PlayerOutcome(_message.Message):
    __slots__ = ("player_id", "outcome", "episode_return")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURN_FIELD_NUMBER: _ClassVar[int]
    player_id: str
    outcome: Outcome
    episode_return: float
    def __init__(self, player_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., episode_return: _Optional[float] = ...) -> None: ...

class EpisodeResult(_message.Message):
    __slots__ = ("length", "players")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PLAYERS_FIELD_NUMBER: _ClassVar[int]
    length: int
    players: _containers.RepeatedCompositeFieldContainer[PlayerOutcome]
    def __init__(self, length: _Optional[int] = ..., players: _Optional[_Iterable[_Union[PlayerOutcome, _Mapping]]] = ...) -> None: ...

class FinishJobRequest(_message.Message):
    __slots__ = ("worker_id", "job_id", "status", "episodes", "env_steps", "agent_steps", "error", "unloadable_player_ids")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    AGENT_STEPS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    UNLOADABLE_PLAYER_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job_id: str
    status: FinishStatus
    episodes: _containers.RepeatedCompositeFieldContainer[EpisodeResult]
    env_steps: int
    agent_steps: int
    error: str
    unloadable_player_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., job_id: _Optional[str] = ..., status: _Optional[_Union[FinishStatus, str]] = ..., episodes: _Optional[_Iterable[_Union[EpisodeResult, _Mapping]]] = ..., env_steps: _Optional[int] = ..., agent_steps: _Optional[int] = ..., error: _Optional[str] = ..., unloadable_player_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class FinishJobResponse(_message.Message):
    __slots__ = ("duplicate", "episodes_counted")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    EPISODES_COUNTED_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    episodes_counted: int
    def __init__(self, duplicate: _Optional[bool] = ..., episodes_counted: _Optional[int] = ...) -> None: ...

class UpdatePlayerRequest(_message.Message):
    __slots__ = ("worker_id", "player_id", "train_iteration", "agent_steps", "checkpoint_path", "checkpoint_version", "reset_applied_version")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ITERATION_FIELD_NUMBER: _ClassVar[int]
    AGENT_STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESET_APPLIED_VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    player_id: str
    train_iteration: int
    agent_steps: int
    checkpoint_path: str
    checkpoint_version: int
    reset_applied_version: int
    def __init__(self, worker_id: _Optional[str] = ..., player_id: _Optional[str] = ..., train_iteration: _Optional[int] = ..., agent_steps: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., checkpoint_version: _Optional[int] = ..., reset_applied_version: _Optional[int] = ...) -> None: ...

class UpdatePlayerResponse(_message.Message):
    __slots__ = ("reset_checkpoint_path", "reset_checkpoint_version", "mutated")
    RESET_CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    RESET_CHECKPOINT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MUTATED_FIELD_NUMBER: _ClassVar[int]
    reset_checkpoint_path: str
    reset_checkpoint_version: int
    mutated: bool
    def __init__(self, reset_checkpoint_path: _Optional[str] = ..., reset_checkpoint_version: _Optional[int] = ..., mutated: _Optional[bool] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PlayerStatus(_message.Message):
    __slots__ = ("player_id", "player_type", "active", "parent_id", "agent_steps", "train_iteration", "checkpoint_path", "checkpoint_version", "elo", "trueskill_mu", "trueskill_sigma", "slots_used", "slots_limit", "learner_worker_id", "snapshots", "mutations", "mean_return", "episodes", "failed_attempts_in_a_row", "jobs_given_up", "jobs_held_until", "last_job_error", "set_aside", "category")
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    PLAYER_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_STEPS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ITERATION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ELO_FIELD_NUMBER: _ClassVar[int]
    TRUESKILL_MU_FIELD_NUMBER: _ClassVar[int]
    TRUESKILL_SIGMA_FIELD_NUMBER: _ClassVar[int]
    SLOTS_USED_FIELD_NUMBER: _ClassVar[int]
    SLOTS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LEARNER_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    FAILED_ATTEMPTS_IN_A_ROW_FIELD_NUMBER: _ClassVar[int]
    JOBS_GIVEN_UP_FIELD_NUMBER: _ClassVar[int]
    JOBS_HELD_UNTIL_FIELD_NUMBER: _ClassVar[int]
    LAST_JOB_ERROR_FIELD_NUMBER: _ClassVar[int]
    SET_ASIDE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    player_id: str
    player_type: str
    active: bool
    parent_id: str
    agent_steps: int
    train_iteration: int
    checkpoint_path: str
    checkpoint_version: int
    elo: float
    trueskill_mu: float
    trueskill_sigma: float
    slots_used: int
    slots_limit: int
    learner_worker_id: str
    snapshots: int
    mutations: int
    mean_return: float
    episodes: int
    failed_attempts_in_a_row: int
    jobs_given_up: int
    jobs_held_until: float
    last_job_error: str
    set_aside: str
    category: str
    def __init__(self, player_id: _Optional[str] = ..., player_type: _Optional[str] = ..., active: _Optional[bool] = ..., parent_id: _Optional[str] = ..., agent_steps: _Optional[int] = ..., train_iteration: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., checkpoint_version: _Optional[int] = ..., elo: _Optional[float] = ..., trueskill_mu: _Optional[float] = ..., trueskill_sigma: _Optional[float] = ..., slots_used: _Optional[int] = ..., slots_limit: _Optional[int] = ..., learner_worker_id: _Optional[str] = ..., snapshots: _Optional[int] = ..., mutations: _Optional[int] = ..., mean_return: _Optional[float] = ..., episodes: _Optional[int] = ..., failed_attempts_in_a_row: _Optional[int] = ..., jobs_given_up: _Optional[int] = ..., jobs_held_until: _Optional[float] = ..., last_job_error: _Optional[str] = ..., set_aside: _Optional[str] = ..., category: _Optional[str] = ...) -> None: ...

class PayoffEntry(_message.Message):
    __slots__ = ("home", "away", "wins", "draws", "losses", "games", "win_rate", "games_played", "win_rate_is_default")
    HOME_FIELD_NUMBER: _ClassVar[int]
    AWAY_FIELD_NUMBER: _ClassVar[int]
    WINS_FIELD_NUMBER: _ClassVar[int]
    DRAWS_FIELD_NUMBER: _ClassVar[int]
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    GAMES_FIELD_NUMBER: _ClassVar[int]
    WIN_RATE_FIELD_NUMBER: _ClassVar[int]
    GAMES_PLAYED_FIELD_NUMBER: _ClassVar[int]
    WIN_RATE_IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    home: str
    away: str
    wins: float
    draws: float
    losses: float
    games: float
    win_rate: float
    games_played: int
    win_rate_is_default: bool
    def __init__(self, home: _Optional[str] = ..., away: _Optional[str] = ..., wins: _Optional[float] = ..., draws: _Optional[float] = ..., losses: _Optional[float] = ..., games: _Optional[float] = ..., win_rate: _Optional[float] = ..., games_played: _Optional[int] = ..., win_rate_is_default: _Optional[bool] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "kind", "launch_player", "players", "worker_id", "lease_deadline", "issued_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_PLAYER_FIELD_NUMBER: _ClassVar[int]
    PLAYERS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    kind: JobKind
    launch_player: str
    players: _containers.RepeatedScalarFieldContainer[str]
    worker_id: str
    lease_deadline: float
    issued_at: float
    def __init__(self, job_id: _Optional[str] = ..., kind: _Optional[_Union[JobKind, str]] = ..., launch_player: _Optional[str] = ..., players: _Optional[_Iterable[str]] = ..., worker_id: _Optional[str] = ..., lease_deadline: _Optional[float] = ..., issued_at: _Optional[float] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "role", "hostname", "data_endpoint", "last_heartbeat", "job_ids", "alive")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: WorkerRole
    hostname: str
    data_endpoint: str
    last_heartbeat: float
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    alive: bool
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., hostname: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., last_heartbeat: _Optional[float] = ..., job_ids: _Optional[_Iterable[str]] = ..., alive: _Optional[bool] = ...) -> None: ...

class Counters(_message.Message):
    __slots__ = ("jobs_issued", "jobs_finished", "jobs_expired", "jobs_failed", "matches", "snapshots", "mutations", "env_steps", "jobs_given_up")
    JOBS_ISSUED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    JOBS_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FAILED_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    MUTATIONS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    JOBS_GIVEN_UP_FIELD_NUMBER: _ClassVar[int]
    jobs_issued: int
    jobs_finished: int
    jobs_expired: int
    jobs_failed: int
    matches: int
    snapshots: int
    mutations: int
    env_steps: int
    jobs_given_up: int
    def __init__(self, jobs_issued: _Optional[int] = ..., jobs_finished: _Optional[int] = ..., jobs_expired: _Optional[int] = ..., jobs_failed: _Optional[int] = ..., matches: _Optional[int] = ..., snapshots: _Optional[int] = ..., mutations: _Optional[int] = ..., env_steps: _Optional[int] = ..., jobs_given_up: _Optional[int] = ...) -> None: ...

class LeagueStatus(_message.Message):
    __slots__ = ("league_id", "league_type", "started_at", "uptime_s", "now", "players", "payoff", "jobs", "workers", "counters")
    LEAGUE_ID_FIELD_NUMBER: _ClassVar[int]
    LEAGUE_TYPE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    PLAYERS_FIELD_NUMBER: _ClassVar[int]
    PAYOFF_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    league_id: str
    league_type: str
    started_at: float
    uptime_s: float
    now: float
    players: _containers.RepeatedCompositeFieldContainer[PlayerStatus]
    payoff: _containers.RepeatedCompositeFieldContainer[PayoffEntry]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    counters: Counters
    def __init__(self, league_id: _Optional[str] = ..., league_type: _Optional[str] = ..., started_at: _Optional[float] = ..., uptime_s: _Optional[float] = ..., now: _Optional[float] = ..., players: _Optional[_Iterable[_Union[PlayerStatus, _Mapping]]] = ..., payoff: _Optional[_Iterable[_Union[PayoffEntry, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TrajectoryChunk(_message.Message):
    __slots__ = ("job_id", "player_id", "worker_id", "seq", "policy_version", "tensors")
    class TensorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PLAYER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    player_id: str
    worker_id: str
    seq: int
    policy_version: int
    tensors: _containers.MessageMap[str, Tensor]
    def __init__(self, job_id: _Optional[str] = ..., player_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., seq: _Optional[int] = ..., policy_version: _Optional[int] = ..., tensors: _Optional[_Mapping[str, Tensor]] = ...) -> None: ...

class PushSummary(_message.Message):
    __slots__ = ("chunks_accepted", "chunks_duplicate", "samples_accepted", "learner_version")
    CHUNKS_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    LEARNER_VERSION_FIELD_NUMBER: _ClassVar[int]
    chunks_accepted: int
    chunks_duplicate: int
    samples_accepted: int
    learner_version: int
    def __init__(self, chunks_accepted: _Optional[int] = ..., chunks_duplicate: _Optional[int] = ..., samples_accepted: _Optional[int] = ..., learner_version: _Optional[int] = ...) -> None: ...
