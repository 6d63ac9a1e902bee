"""The league coordinator: the league core, the lease table and the durable store behind one lock.

Every accepted request changes the in-memory league and lease table under one lock and records the change;
the group committer (group_commit.py) writes recorded changes to SQLite in batches, each batch with what changed
in the league state up to that moment, and a request replies only once everything recorded before it is
durable. So the store always holds a state the coordinator really was in (an accepted FinishJob and the payoff
it produced commit together), and a restart from it (after `kill -9` too) continues there. Semantics:
LEASES.md. No gRPC here: the servicer (server.py) translates the wire to these calls.

Threads: the league core runs without its launch thread: whoever frees a launch slot (a finish, an expiry)
takes the league's new jobs and offers them in the same critical section (`_refill_locked`), so a finished job
costs no thread hand-off. The league's snapshot thread reports snapshots through `_on_league_change`; the
expiry thread here waits on a condition until the earliest lease deadline and expires what is due (every call
also expires lazily, so the timer only makes it prompt); the committer writes batches. Workers' last-seen times
are lazy changes: written within `LAST_SEEN_FLUSH_S`, not once per call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from common.checkpoint_store import CheckpointError, CheckpointStore
from common.config import ConfigError, deep_merge
from common.job_limits import MANIFEST_SUFFIX, PIN_SUFFIX, TRAINING_STATE_SUFFIX, VERSION_FILE
from common.paths import SharedRoot, UnsafePathError
from common.policy_config import as_published
from common.root_marker import ensure_root_id
from league_service.checkpoint_copy import SnapshotCopier
from league_service.config import Config, LeagueConfig, config_to_dict
from league_service.coordinator_messages import (
    CoordinatorStatus,
    FinishAck,
    FinishReport,
    JobGrant,
    JobView,
    JobWait,
    NoJob,
    PlayerRef,
    PlayerUpdateRequest,
    Registration,
    WorkerView,
)
from league_service.errors import FailedPreconditionError, InvalidArgumentError, RequestError
from league_service.factory import create_league
from league_service.group_commit import GroupCommitter
from league_service.job_retries import JobRetryPolicy, PlayerJobFailures
from league_service.league_errors import LeagueStateError, NotActivePlayerError
from league_service.league_identity import LeagueIdentity
from league_service.league_state import LeagueStateChanges
from league_service.leases import (
    HeartbeatResult,
    JobEnd,
    JobEndStatus,
    JobKind,
    Lease,
    LeaseTable,
    WorkerInfo,
    WorkerRole,
)
from league_service.messages import JobResult, JobSpec, UpdateOutcome
from league_service.metrics import LeagueFigures
from league_service.players import Player
from league_service.store import STATE_SIDE_FILES, Counters, LeagueStore, has_trained

log = logging.getLogger(__name__)

STATE_FILE_NAME = "league_state.sqlite"
# Workers' last-seen times reach the store at most this long after they changed (one write per interval).
LAST_SEEN_FLUSH_S = 2.0


@dataclass(frozen=True)
class CoordinatorSettings:
    shared_root: Path
    # The SQLite file; None puts it in the shared root beside the checkpoints.
    state_path: Path | None = None
    # None: the config's coordinator.lease_timeout_s.
    lease_timeout_s: float | None = None
    # False: collect jobs go out without a bound learner (players that do not train, tests of actors alone).
    needs_learner: bool = True
    # Upper bound of a GetJob long poll, whatever the request asks.
    max_wait_s: float = 30.0
    # Told to a worker that got no job.
    retry_after_s: float = 1.0
    rng_seed: int | None = None
    # Also survive power loss (one disk flush per commit); a process crash is survived either way.
    fsync: bool = False
    # Ended job ids kept in memory; older ones are looked up in the store (a retried finish of an old job).
    remember_ends: int = 100_000

    def __post_init__(self) -> None:
        if self.lease_timeout_s is not None and not (math.isfinite(self.lease_timeout_s) and self.lease_timeout_s > 0):
            raise ValueError(f"lease_timeout_s: must be a positive number, got {self.lease_timeout_s}")
        for name in ("max_wait_s", "retry_after_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value}")

    @property
    def resolved_state_path(self) -> Path:
        return self.state_path if self.state_path is not None else Path(self.shared_root) / STATE_FILE_NAME


class SteadyWallClock:
    """The coordinator's clock: wall-clock seconds (what the store keeps and `league status` shows) that advance
    with `time.monotonic()`, so a step of the wall clock (NTP correcting it, an admin setting it) does not stretch
    or cut the durations measured on it. Read from `time.time()`, an hour's step back left every lease of a worker
    that died meanwhile in place for an extra hour (and the worker alive in `league status`), and a step forward
    would expire live leases at once had the pause check below not taken it for a pause. The offset is taken once,
    at the coordinator's start: a restart reads the wall clock again."""

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()

    def __call__(self) -> float:
        return self._offset + time.monotonic()


PAUSE_TICK_S = 1.0
"""The expiry thread runs at least this often, so a gap between two runs of the coordinator tells a pause."""
PAUSE_AFTER_S = 5.0
"""A gap longer than this (five ticks missed) is taken for a pause of the whole process; leases move on by it."""


def _error_summary(text: str) -> str:
    """A worker's error in one line: its first line and, for a traceback, its last (the exception raised)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} [...] {lines[-1].strip()}"


def _continued(text: str) -> str:
    """A worker's multi-line error (a traceback) for the log, its lines after the first marked as continuations:
    a line of its own could pass for one of the coordinator's (a forged timestamp and level)."""
    return text.strip().replace("\n", "\n    | ")


def _raised(text: str) -> str:
    """The exception a worker's error ends with, without its type: "path: digest does not match ..."."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return re.sub(r"^[\w.]+(Error|Exception): ", "", last)[:500]


def config_digest(cfg: Config) -> str:
    text = json.dumps(config_to_dict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_section_digests(cfg: Config) -> dict[str, str]:
    """A digest of each config section the coordinator serves (`run`, `league run`'s own, left out)."""
    return {section: hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
            for section, value in config_to_dict(cfg).items() if section != "run"}


class Coordinator:
    """The league served to workers: typed calls in, typed replies out, every change durable before replying."""

    def __init__(
        self,
        cfg: Config,
        settings: CoordinatorSettings,
        *,
        clock: Callable[[], float] | None = None,
        expiry_thread: bool = True,
    ) -> None:
        """`clock`: seconds on the wall clock's scale (default `SteadyWallClock`); tests move a fake one."""
        self._cfg = cfg
        self._settings = settings
        self._clock = clock = SteadyWallClock() if clock is None else clock
        self._use_expiry_thread = expiry_thread
        self._lock = threading.Lock()
        self._collect_ready = threading.Condition(self._lock)
        self._collect_pollers = 0  # actors' GetJobs waiting on _collect_ready (offers notify only if any)
        self._learn_ready = threading.Condition(self._lock)
        self._ready_listener: Callable[[WorkerRole], None] | None = None  # set_ready_listener
        self._defer_replies = False  # defer_durability
        self._expiry_wakeup = threading.Condition(self._lock)
        self._ran_at = clock()  # when the coordinator last ran (`_forgive_pause_locked`)
        self._expiry_at = math.inf
        self._closing = False
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._failure: BaseException | None = None

        self.lease_timeout_s = settings.lease_timeout_s or cfg.coordinator.lease_timeout_s
        # A worker gets a few heartbeats into each lease, even when tests shorten the lease.
        self.heartbeat_interval_s = min(cfg.coordinator.heartbeat_interval_s, self.lease_timeout_s / 3)
        self._forget_workers_after_s = cfg.coordinator.forget_workers_after_s
        self._next_forget_check = -math.inf
        self._root = SharedRoot(settings.shared_root)
        self._root_id = _shared_root_id(self._root.root)
        _check_pretrained_checkpoints(cfg.league, self._root, cfg.policy)
        self._league = create_league(
            cfg,
            SnapshotCopier(self._root),
            self._on_launch,
            on_change=self._on_league_change,
            rng_seed=settings.rng_seed,
            launch_thread=False,
        )
        self._active_ids = tuple(p.player_id for p in self._league.active_players)
        self._counters = Counters()
        coord = cfg.coordinator
        self._retry = JobRetryPolicy(coord.max_job_attempts, coord.job_retry_backoff_s, coord.max_job_retry_backoff_s)
        self._job_failures: dict[str, PlayerJobFailures] = {}  # launch player -> its failure books
        self._store = LeagueStore(settings.resolved_state_path, fsync=settings.fsync)
        # Job ids (idempotency keys, not secrets) from a generator seeded once: os.urandom per id is a system call
        # that lets go of the GIL while the coordinator's lock is held.
        self._job_id_rng = random.Random(os.urandom(32))
        self._table: LeaseTable[JobSpec] = LeaseTable(
            lease_timeout_s=self.lease_timeout_s,
            active_players=self._active_ids,
            needs_learner=lambda _player_id: settings.needs_learner,
            new_job_id=self._new_job_id,
            remember_ends=settings.remember_ends,
            forgotten_end=self._store.ended,
        )
        try:
            self.started_at = clock()
            self._restore_or_initialise()
        except BaseException:
            self._store.close()
            raise
        self._commits = GroupCommitter(
            self._store, self._lock, self._snapshot, lazy_rows=self._table.take_seen,
            lazy_interval_s=min(LAST_SEEN_FLUSH_S, self.heartbeat_interval_s),
        )

    # ---- life cycle --------------------------------------------------------------------------------------

    @property
    def league_id(self) -> str:
        return self._league.league_id

    @property
    def failure(self) -> BaseException | None:
        """The exception that stopped a background thread (league, expiry timer, committer), if any."""
        return self._league.failure or self._failure or self._commits.failure

    def start(self) -> None:
        """Fill the launch slots; start the league's snapshot thread and the lease expiry timer."""
        self._league.run()
        with self._lock:
            self._refill_locked()
        if self._use_expiry_thread:
            with self._lock:
                self._ran_at = self._clock()  # restoring a large state may take a while: that was no pause
            thread = threading.Thread(target=self._expiry_loop, name="lease-expiry", daemon=True)
            self._threads.append(thread)
            thread.start()

    def begin_shutdown(self) -> None:
        """Stop handing out jobs and wake every long-polling GetJob (they answer 'shutting down')."""
        with self._lock:
            self._closing = True
            self._expiry_wakeup.notify_all()
            for role in WorkerRole:
                self._jobs_ready_locked(role, everyone=True)

    def close(self) -> None:
        """Stop the threads, commit what is recorded, close the store (idempotent).

        Nothing is written that a crash just before would not have written too: every change is recorded (and
        its reply waits for its commit) as it happens; close only lets the last batch reach the disk. The ready
        listener is dropped first: whoever listened (a server's event loop) has stopped by now.
        """
        self.set_ready_listener(None)
        self.begin_shutdown()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            for thread in self._threads:
                thread.join()
            try:
                self._league.close()
            finally:
                self._commits.close()  # what the league's last callbacks recorded is committed too
        finally:
            self._store.close()
        if self._failure is not None:
            raise RuntimeError("the lease expiry thread failed") from self._failure

    # ---- RPCs --------------------------------------------------------------------------------------------

    def register_worker(
        self, worker_id: str, role: WorkerRole, hostname: str, data_endpoint: str, process: str = ""
    ) -> Registration:
        """`process` (every call's PROCESS_METADATA_KEY; "" from clients that send none): one process per
        worker id, the newest registration's (`LeaseTable.take_over`)."""
        with self._lock:
            known = self._table.workers.get(worker_id)
            if known is not None and known.role is not role:  # refused before the process takes over the id
                raise FailedPreconditionError("role", f"worker {worker_id!r} is registered as {known.role.value}, "
                                                      f"not {role.value}")
            previous = self._table.take_over(worker_id, process, self._clock())
            orphaned: list[str] = []
            if previous is not None:  # usually a restart (a second process with the same id is told when it calls)
                log.info("worker id %s is used by process %s now, no longer by %s, which is refused from now on",
                         worker_id, process, previous)
                # Its collect jobs can never be finished now: released below, not left to expire a lease later
                # as a failed attempt of a worker "gone silent" while the slot idled (a review: a restarted
                # container keeps its hostname and pid, so its id). A learn job stays: the learner takes its
                # player up again.
                leases = self._table.leases
                orphaned = [j for j in self._table.jobs_of(worker_id) if leases[j].kind is JobKind.COLLECT]
            self._table.register(WorkerInfo(worker_id, role, hostname, data_endpoint, self._clock()))
            self._persist(workers=(self._table.worker(worker_id),))
            self._reply_waits_locked()
        self._release(worker_id, orphaned, process, f"the process that held it, {previous}, was replaced")
        return Registration(worker_id, self.heartbeat_interval_s, self.lease_timeout_s, self.league_id,
                            self._root_id)

    def heartbeat(
        self, worker_id: str, job_ids: Iterable[str], process: str = "", leaving: bool = False
    ) -> HeartbeatResult:
        """Renew the named leases. `leaving`: the worker's last call before a clean exit; it leaves the registry
        now (unless it still holds a lease it names), not when its silence passes forget_workers_after_s."""
        if leaving:
            self._release_left_behind(worker_id, frozenset(job_ids), process)
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            self._table.claim(worker_id, process)
            result = self._table.heartbeat(worker_id, job_ids, now)
            if leaving and self._table.forget(worker_id):
                self._commits.record(forgotten_workers=[worker_id])
                log.info("worker %s left", worker_id)
            else:
                self._commits.note_lazy()
            self._reply_waits_locked()
            return result

    def _release_left_behind(self, worker_id: str, named: frozenset[str], process: str) -> None:
        """A worker leaving while it holds leases it does not name: jobs it never heard of (a GetJob reply lost
        to its stop) or could not finish (FinishJob unanswered). Nobody will finish them, and expiring a lease
        later counted a failed attempt against a job that never ran: released now, with no results."""
        with self._lock:
            self._table.claim(worker_id, process)  # (another process's worker id: refused, as any call of it)
            left = [job_id for job_id in self._table.jobs_of(worker_id) if job_id not in named]
        self._release(worker_id, left, process, "its worker left without finishing it")

    def release_undelivered(self, worker_id: str, job_id: str, process: str = "") -> None:
        """A GetJob whose reply cannot reach its worker (the call's deadline passed, or it was cancelled, while
        its lease was being committed): the job is released, with no results. Left leased to a worker that never
        heard of it, its lease expired later as a failed attempt of the player, "worker went silent", though
        the worker was calling all along (a review).

        Not a learn job: a learner's next GetJob hands it its binding back, and the reply lost may have been that
        very hand-back, of a job it held and trained on already (released, its player lost its learner, whose next
        heartbeat ended its session; a review)."""
        with self._lock:
            lease = self._table.leases.get(job_id)
            if lease is not None and lease.kind is JobKind.LEARN:
                return
        self._release(worker_id, [job_id], process, "its GetJob reply could not be delivered (the call's deadline "
                      "passed or it was cancelled)")

    def _release(self, worker_id: str, job_ids: Iterable[str], process: str, why: str) -> None:
        """End the worker's jobs `job_ids` as RELEASED, with no results (nobody will finish them), as `process`,
        the one using the worker id."""
        for job_id in job_ids:
            report = FinishReport(worker_id=worker_id, job_id=job_id, status=JobEndStatus.RELEASED, episodes=(),
                                  env_steps=0, agent_steps=0, error="")
            try:
                self.finish_job(report, process)
            except RequestError as err:  # ended meanwhile (expired, say): nothing left to release
                log.debug("job %s of worker %s: %s", job_id, worker_id, err)
                continue
            log.info("job %s of worker %s released: %s", job_id, worker_id, why)

    def job_wait_s(self, wait_s: float) -> float:
        """How long a GetJob asking to wait `wait_s` may long-poll (checked, capped by max_wait_s)."""
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise InvalidArgumentError("wait_s", f"must be a finite number >= 0, got {wait_s}")
        return min(wait_s, self._settings.max_wait_s)

    def get_job(
        self, worker_id: str, role: WorkerRole, data_endpoint: str, wait_s: float, process: str = ""
    ) -> JobGrant | NoJob:
        """A job under a lease, or NoJob once nothing was ready for `wait_s` (capped by max_wait_s); blocks the
        calling thread while it waits (`poll_job` is the same without blocking)."""
        give_up = time.monotonic() + self.job_wait_s(wait_s)
        ready = self._collect_ready if role is WorkerRole.ACTOR else self._learn_ready
        with self._lock:
            info = self._job_seeker_locked(worker_id, role, data_endpoint, process)
            while True:
                found = self._try_lease_locked(info)
                if isinstance(found, NoJob):
                    return found
                if not isinstance(found, JobWait):
                    lease, ticket = found, self._commits.ticket()
                    break
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return self._no_job_locked(role)
                if found.recheck_in_s is not None:
                    remaining = min(remaining, found.recheck_in_s)
                if role is WorkerRole.ACTOR:
                    self._collect_pollers += 1
                    try:
                        ready.wait(remaining)
                    finally:
                        self._collect_pollers -= 1
                else:
                    ready.wait(remaining)
        # Waiting for the grant's commit and building the reply need nothing more of the lock (hot path).
        self._reply_waits(ticket)
        return self._grant(lease)

    def poll_job(
        self, worker_id: str, role: WorkerRole, data_endpoint: str, *, last: bool, process: str = ""
    ) -> JobGrant | NoJob | JobWait:
        """One look for a job without blocking, for servers that wait without a thread each (grpc.aio).

        JobWait: nothing yet; look again when the ready listener (`set_ready_listener`) fires for `role`, or
        after `recheck_in_s`. With `last` (the caller's wait is over) the answer is NoJob instead.
        """
        with self._lock:
            info = self._job_seeker_locked(worker_id, role, data_endpoint, process)
            found = self._try_lease_locked(info)
            if isinstance(found, NoJob):
                return found
            if isinstance(found, JobWait):
                return self._no_job_locked(role) if last else found
            ticket = self._commits.ticket()
        self._reply_waits(ticket)
        return self._grant(found)

    def defer_durability(self) -> None:
        """For a server that waits for commits without a thread per call (grpc.aio, league_service/server.py):
        from now on the calls return without waiting for their changes to be committed, and the server must
        not reply before `durable(durable_ticket())`, the ticket taken after the call, is true (it commits the
        changes of many calls at once with `commit_until`). Set before serving; never undone."""
        with self._lock:
            self._defer_replies = True

    def durable_ticket(self) -> int:
        """Everything recorded so far, as a ticket for `durable`/`commit_until` (the calling thread's changes
        included: no lock needed to read it after them)."""
        return self._commits.ticket()

    def durable(self, ticket: int) -> bool:
        """Whether the changes up to `ticket` are committed (raises once committing failed)."""
        return self._commits.is_committed(ticket)

    def commit_until(self, ticket: int) -> None:
        """Commit everything recorded up to `ticket` now (or wait for the commit under way), blocking."""
        self._commits.wait_until(ticket)

    def _reply_waits_locked(self) -> None:
        """A reply waits here for everything recorded so far to be durable (unless the server waits itself)."""
        if not self._defer_replies:
            self._commits.wait_durable()

    def _reply_waits(self, ticket: int) -> None:
        """`_reply_waits_locked` without the lock, for the changes up to `ticket`."""
        if not self._defer_replies:
            self._commits.wait_until(ticket)

    def set_ready_listener(self, listener: Callable[[WorkerRole], None] | None) -> None:
        """`listener(role)` is called (under the coordinator's lock, from any thread; it must only schedule)
        whenever jobs for workers of `role` may have become ready, and for both roles at `begin_shutdown`
        (`close` drops it)."""
        with self._lock:
            self._ready_listener = listener

    def _job_seeker_locked(self, worker_id: str, role: WorkerRole, data_endpoint: str, process: str) -> WorkerInfo:
        info = self._table.claim(worker_id, process)
        if info.role is not role:
            raise FailedPreconditionError("role", f"worker {worker_id!r} is registered as {info.role.value}")
        if role is WorkerRole.LEARNER and data_endpoint and data_endpoint != info.data_endpoint:
            info = replace(info, data_endpoint=data_endpoint)
            self._table.register(info)
            self._persist(workers=(info,))
        self._commits.note_lazy()  # leasing (or asking) counts as being seen
        return info

    def _try_lease_locked(self, info: WorkerInfo) -> Lease[JobSpec] | NoJob | JobWait:
        if self._closing:
            return NoJob(self._settings.retry_after_s, "the coordinator is shutting down")
        now = self._clock()
        self._expire_locked(now)
        lease = self._lease_locked(info, now)
        if lease is not None:
            return lease
        release = self._table.next_release(now) if info.role is WorkerRole.ACTOR else None
        # A held-back job becomes free before the poll ends: look again then.
        return JobWait(None if release is None else max(release - now, 0.001))

    def _no_job_locked(self, role: WorkerRole) -> NoJob:
        self._reply_waits_locked()
        return NoJob(self._settings.retry_after_s, self._why_no_job(role, self._clock()))

    def _jobs_ready_locked(self, role: WorkerRole, *, everyone: bool = False) -> None:
        """Wake long polls of `role`: threads waiting in get_job (one, or `everyone`), and the ready listener."""
        if role is WorkerRole.ACTOR:
            if everyone:
                self._collect_ready.notify_all()
            elif self._collect_pollers:
                self._collect_ready.notify()
        else:
            if everyone:
                self._learn_ready.notify_all()
            else:
                self._learn_ready.notify()
        if self._ready_listener is not None:
            self._ready_listener(role)

    def finish_job(self, report: FinishReport, process: str = "") -> FinishAck:
        """Count a job's results exactly once: a retried finish is a duplicate, a late one is refused."""
        if report.status is JobEndStatus.EXPIRED:
            raise InvalidArgumentError("status", "a worker finishes a job as completed, released or failed")
        loads_here = set()
        if report.unloadable_player_ids and self._unloadable_to_verify(report, process):
            loads_here = self._loadable_here(report.unloadable_player_ids)  # reads files: outside the lock
        with self._lock:
            now, found = self._check_finish_locked(report, process)
            if isinstance(found, JobEnd):
                self._reply_waits_locked()  # the original finish may still be on its way to disk
                return FinishAck(duplicate=True, episodes_counted=found.episodes_counted)
            lease = found
            counted = 0
            league_changed = False
            if lease.kind is JobKind.LEARN:
                if report.episodes:
                    raise InvalidArgumentError("episodes", "a learn job has no episodes to report")
                if report.unloadable_player_ids:
                    raise InvalidArgumentError("unloadable_player_ids", "a learn job has no opponents")
            elif report.unloadable_player_ids:
                self._check_unloadable(report, lease.players)
            elif report.status is not JobEndStatus.FAILED:
                self._check_episode_count(report, lease)
                self._check_episode_players(report, lease.players)
                # The generations of the weights the job was leased to play (a job offered before a reset and
                # leased after it plays the reset's: counted). A lease restored from a store that kept none: ().
                generations = lease.generations if lease.generations is not None else ()
                counted = self._league.finish_job(
                    JobResult(lease.launch_player, lease.players, report.episodes, generations))
                league_changed = True
                self._refill_locked()
            _, end = self._table.end(lease.job_id, report.status, counted, now)
            self._commits.note_lazy()
            if lease.kind is JobKind.LEARN:
                self._jobs_ready_locked(WorkerRole.LEARNER)
            elif report.unloadable_player_ids and not set(report.unloadable_player_ids) <= loads_here:
                league_changed = self._set_aside_locked(lease, report, loads_here)
            elif report.status is JobEndStatus.FAILED:
                self._collect_attempt_failed(lease, report.error or "finished FAILED without an error message", now)
            elif report.status is JobEndStatus.COMPLETED:
                self._collect_job_completed(lease.launch_player)
            failed = report.status is JobEndStatus.FAILED
            self._counters = self._counters.plus(
                jobs_finished=0 if failed else 1,
                jobs_failed=1 if failed else 0,
                episodes=counted,
                env_steps=0 if failed else report.env_steps,
            )
            self._persist(ends=(end,), league_state=league_changed, waited=True)
            ticket = self._commits.ticket()
        self._reply_waits(ticket)  # without the lock (hot path): the reply needs nothing more of it
        return FinishAck(duplicate=False, episodes_counted=counted)

    def update_player(self, request: PlayerUpdateRequest, process: str = "") -> UpdateOutcome:
        """A learner's progress for the player it is bound to; the snapshot thread takes it from there."""
        update = request.update
        bad_path: InvalidArgumentError | None = None
        if update.checkpoint_path:
            # The snapshot thread will copy this file: it must be there, inside the shared root. (Looked at
            # before the lock: no file I/O under it.)
            try:
                path = self._root.resolve(update.checkpoint_path)
            except UnsafePathError as err:
                raise InvalidArgumentError("checkpoint_path", str(err)) from None
            try:
                mode: int | None = path.stat().st_mode  # (a stat: a FIFO is not opened, so cannot block)
            except (FileNotFoundError, NotADirectoryError):
                mode = None
            except OSError as err:  # a name too long, say: a path no learner published
                raise InvalidArgumentError("checkpoint_path", f"{update.checkpoint_path!r}: {err.strerror}") from None
            # Raised after the binding check: a learner that lost the player (its old versions retired by the
            # player's next learner) is told it is not bound, which it handles, not that its path is bad.
            not_one = _not_a_checkpoint(path, self._store.real_path)
            if not_one is not None:
                # Snapshotted, it would be copied as a historical player's weights (the league's own database,
                # say), which no actor could load (a hostile-input review).
                bad_path = InvalidArgumentError("checkpoint_path", f"{update.checkpoint_path!r} is {not_one}")
            elif mode is None:
                bad_path = InvalidArgumentError(
                    "checkpoint_path", f"{update.checkpoint_path!r} does not exist under the shared root"
                )
            elif not stat.S_ISREG(mode):
                # A directory or a FIFO named as the player's checkpoint: the snapshot thread's copy of it failed
                # (a directory) or hung on it (a FIFO), and actors given it could not load the player.
                bad_path = InvalidArgumentError(
                    "checkpoint_path", f"{update.checkpoint_path!r} is not a regular file (a checkpoint is one)"
                )
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            try:
                self._check_update_locked(request, process, bad_path)
            except RequestError:
                self._reply_waits_locked()  # its learn lease may have expired just now: see _check_finish_locked
                raise
            outcome = self._league.update_active_player(update)
            self._persist(league_state=True)
            self._reply_waits_locked()
            return outcome

    def _check_update_locked(self, request: PlayerUpdateRequest, process: str,
                             bad_path: InvalidArgumentError | None) -> None:
        """Raises as `update_player` refuses."""
        update = request.update
        self._table.claim(request.worker_id, process)
        player = self._league.get_player(update.player_id)
        if not player.is_active:
            raise NotActivePlayerError("player_id", f"{update.player_id!r} is a historical (frozen) player")
        if self._settings.needs_learner:
            binding = self._table.learner_lease(update.player_id)
            if binding is None or binding.worker_id != request.worker_id:
                raise FailedPreconditionError(
                    "worker_id", f"worker {request.worker_id!r} holds no learn job of player {update.player_id!r}"
                )
        if bad_path is not None:
            raise bad_path

    def status(self) -> CoordinatorStatus:
        """The whole view, of one moment: the league's values are copied under the coordinator's lock with the
        jobs and workers (jobs in flight against launch slots, episodes against matches agree), and the views are
        built after it is let go. Built under it, 6,000 players and 12,000 payoff rows held up every RPC 0.1-0.4 s."""
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            jobs_of: dict[str, list[str]] = {}
            jobs = []
            for lease in self._table.leases.values():
                jobs_of.setdefault(lease.worker_id, []).append(lease.job_id)
                jobs.append(
                    JobView(lease.job_id, lease.kind, lease.launch_player, lease.players, lease.worker_id,
                            lease.deadline, lease.issued_at)
                )
            workers = tuple(
                WorkerView(
                    worker_id=info.worker_id,
                    role=info.role,
                    hostname=info.hostname,
                    data_endpoint=info.data_endpoint,
                    last_heartbeat=self._table.last_seen(info.worker_id),
                    job_ids=tuple(jobs_of.get(info.worker_id, ())),
                    alive=self._alive_locked(info.worker_id, now),
                )
                for info in self._table.workers.values()
            )
            learner_of = {
                pid: binding.worker_id
                for pid in self._active_ids
                if (binding := self._table.learner_lease(pid)) is not None
            }
            counters = self._counters
            job_failures = tuple(self._job_failures[pid] for pid in sorted(self._job_failures))
            league = self._league.status_values()
        return CoordinatorStatus(
            league=league.status(),
            learner_of=learner_of,
            started_at=self.started_at,
            now=now,
            jobs=tuple(jobs),
            workers=workers,
            counters=counters,
            job_failures=job_failures,
        )

    def figures(self) -> LeagueFigures:
        """The numbers Prometheus scrapes: counted, not read off a whole `status()`, which copies every player's
        and worker's values and the payoff counts under the lock every RPC takes."""
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            c = self._counters
            pending = self._table.pending_count
            in_flight = len(self._table.leases)
            alive = sum(1 for worker_id in self._table.workers if self._alive_locked(worker_id, now))
            league, active, historical = self._league.sizes()
        return LeagueFigures(
            jobs_issued=c.jobs_issued,
            jobs_finished=c.jobs_finished,
            jobs_expired=c.jobs_expired,
            jobs_failed=c.jobs_failed,
            jobs_given_up=c.jobs_given_up,
            matches=league.matches,
            episodes=c.episodes,
            snapshots=league.snapshots,
            mutations=league.mutations,
            active_players=active,
            historical_players=historical,
            jobs_in_flight=in_flight,
            jobs_pending=pending,
            workers_alive=alive,
        )

    def _alive_locked(self, worker_id: str, now: float) -> bool:
        """A worker is alive while it was heard from within a lease timeout (the status and the metrics agree)."""
        return now - self._table.last_seen(worker_id) < self.lease_timeout_s

    def expire_due(self) -> None:
        """Expire every lease past its deadline now (what the timer thread does; tests with a fake clock)."""
        with self._lock:
            self._expire_locked(self._clock())

    # ---- league callbacks (called by the core's threads, outside its lock) --------------------------------

    def _on_launch(self, spec: JobSpec) -> None:
        """The league's launch_job_fn (only `league.launch_ready_jobs()` calls it: the league runs without its
        launch thread, `_refill_locked` takes the jobs instead)."""
        with self._lock:
            self._offer_locked(spec)

    def _on_league_change(self) -> None:
        with self._lock:
            self._persist(league_state=True)

    # ---- internals (all under self._lock) -----------------------------------------------------------------

    def _new_job_id(self) -> str:
        return f"{self._job_id_rng.getrandbits(64):016x}"

    def _refill_locked(self) -> None:
        """Offer a job for every free launch slot (after a slot was freed, and at start)."""
        try:
            specs = self._league.take_ready_jobs()
        except Exception:
            # Logged and kept by the league as its failure (GetJob then says the league stopped launching, as
            # when its launch thread died); what freed the slot stands.
            return
        for spec in specs:
            self._offer_locked(spec)

    def _offer_locked(self, spec: JobSpec) -> None:
        books = self._job_failures.get(spec.launch_player)
        self._table.offer(spec.launch_player, spec.players, spec,
                          not_before=books.held_until if books is not None else 0.0)
        self._jobs_ready_locked(WorkerRole.ACTOR)

    def _lease_locked(self, info: WorkerInfo, now: float) -> Lease[JobSpec] | None:
        if info.role is WorkerRole.ACTOR:
            # The generations when leased, before `_grant` reads the checkpoints: a reset in between throws the
            # job's results away (played by the reset's weights, but stamped before it), never the other way.
            lease = self._table.lease_collect(info.worker_id, now, self._cfg.env.episode_num, self._league.generations)
            regrant = False
        else:
            held = set(self._table.jobs_of(info.worker_id))
            lease = self._table.lease_learn(info.worker_id, info.data_endpoint, now)
            regrant = lease is not None and lease.job_id in held
            if lease is not None and not regrant:
                self._jobs_ready_locked(WorkerRole.ACTOR, everyone=True)  # the player's collect jobs are ready now
            if lease is not None:
                self._redirect_collect_jobs_locked(lease, now)
        if lease is None:
            return None
        if not regrant:
            self._counters = self._counters.plus(jobs_issued=1)
        # A collect job may name a snapshot that the snapshot thread added a moment ago and has not recorded for
        # commit yet (it takes this lock after the league's): the lease is committed with it, or a restart would
        # hold a lease naming a player the league does not have.
        unsaved = lease.kind is JobKind.COLLECT and self._league.has_unsaved_players(lease.players)
        self._persist(leases=(lease,), league_state=unsaved, waited=True)  # get_job waits for it next
        if lease.deadline < self._expiry_at:
            self._expiry_wakeup.notify()
        return lease

    def _redirect_collect_jobs_locked(self, learn: Lease[JobSpec], now: float) -> None:
        """The player's learner is bound at another address than its collect jobs in flight stream to (it
        restarted on another port, or another learner took the player over): those actors would retry the old
        address until their sender gives up, starving the league meanwhile. Their leases end now (their next
        heartbeat names them revoked, and the actors drop them) and the same matches are offered again, as new
        jobs with the learner's address; not a failure of the player."""
        stale = self._table.collect_leases_not_to(learn.launch_player, learn.endpoint)
        if not stale:
            return
        ends = [self._table.end(lease.job_id, JobEndStatus.EXPIRED, 0, now)[1] for lease in stale]
        self._counters = self._counters.plus(jobs_expired=len(stale))
        self._persist(ends=ends)
        for lease in stale:
            # Offered again within the player's backoff, if its jobs are held back (LEASES.md).
            if lease.payload is not None and not self._plays_set_aside(lease):
                books = self._job_failures.get(lease.launch_player)
                self._table.offer(lease.launch_player, lease.players, lease.payload, attempt=lease.attempt,
                                  not_before=books.held_until if books is not None else 0.0)
            else:  # restored after a restart (its spec is not stored), or an opponent set aside since it was
                # matched: the league matches anew
                self._league.release_job(lease.launch_player)
        self._refill_locked()
        self._jobs_ready_locked(WorkerRole.ACTOR, everyone=True)
        log.warning("the learner of %s is now at %s: %d collect job(s) streaming to %s revoked and offered again",
                    learn.launch_player, learn.endpoint, len(stale), sorted({lease.endpoint for lease in stale}))

    def _grant(self, lease: Lease[JobSpec]) -> JobGrant:
        env = self._cfg.env
        spec = lease.payload
        if lease.kind is JobKind.COLLECT and spec is None:
            raise RuntimeError(f"collect job {lease.job_id} has no job spec")
        return JobGrant(
            job_id=lease.job_id,
            kind=lease.kind,
            launch_player=lease.launch_player,
            players=tuple(
                PlayerRef(pid, path, version, active, bot)
                for pid, (path, version, active, bot) in zip(
                    lease.players, self._league.job_checkpoints(lease.players), strict=True
                )
            ),
            env_name=env.name,
            # A learn job: its player's own env kwargs too (a type's `env_kwargs`: the learner builds the env its
            # actors play, or its model did not fit their observations).
            env_kwargs=deep_merge(env.kwargs, spec.env_kwargs if spec is not None
                                  else self._league.get_player(lease.launch_player).job_env_kwargs()),
            env_num=env.env_num,
            episode_num=env.episode_num,
            env_steps=env.env_steps,
            forward_kwargs=dict(spec.forward_kwargs) if spec is not None else {},
            adder_kwargs=dict(spec.adder_kwargs) if spec is not None else {},
            learner_endpoint=lease.endpoint,
            lease_deadline=lease.deadline,
            lease_timeout_s=self.lease_timeout_s,
            policy=self._cfg.policy,
            learner_kwargs=self._cfg.learner,
        )

    def _why_no_job(self, role: WorkerRole, now: float) -> str:
        if self._league.failure is not None:
            return f"the league stopped launching jobs: {self._league.failure!r}"
        if role is WorkerRole.LEARNER:
            if not self._settings.needs_learner:
                return "this coordinator runs without learners (--without-learners): it has no learn jobs"
            return "every active player that trains with a learner has one"
        waiting = sum(1 for job in self._table.pending if not self._table.collect_ready(job.launch_player))
        held = [job for job in self._table.pending if job.not_before > now]
        if held:
            players = sorted({job.launch_player for job in held})
            return (f"no collect job ready ({len(held)} held back after repeated failures of {players}, the next "
                    f"in {min(job.not_before for job in held) - now:.1f} s)")
        if waiting:
            return f"no collect job ready ({waiting} waiting for their player's learner)"
        return "no collect job ready (every launch slot is in use)"

    def _collect_attempt_failed(self, lease: Lease[JobSpec], error: str, now: float) -> None:
        """A collect job's attempt failed (FAILED or expired): offer the job again, after the player's backoff,
        while it has attempts left; else give it up and free its launch slot (the league launches a new job,
        which waits out the same backoff). Semantics: LEASES.md, "Failing jobs"."""
        player = lease.launch_player
        given_up = lease.attempt >= self._retry.max_attempts
        books = self._job_failures.get(player, PlayerJobFailures(player)).failed(error, now, self._retry, given_up)
        self._job_failures[player] = books
        if books.held_until > now:  # every job of the player waits, also those offered before the backoff began
            self._table.hold_pending(player, books.held_until)
        wait = f"; its jobs wait {books.held_until - now:.1f} s" if books.held_until else ""
        if not given_up and lease.payload is not None and not self._plays_set_aside(lease):
            retry = self._table.offer(player, lease.players, lease.payload, attempt=lease.attempt + 1,
                                      not_before=books.held_until)
            self._jobs_ready_locked(WorkerRole.ACTOR)
            log.warning("collect job %s of %s failed (attempt %d of %d), offered again as %s%s: %s", lease.job_id,
                        player, lease.attempt, self._retry.max_attempts, retry.job_id, wait,
                        _error_summary(books.last_error))
        else:
            # Given up, a job restored after a restart (its spec is not stored), or one playing an opponent set
            # aside since it was matched (LEASES.md: never issued again): the league launches anew.
            self._league.release_job(player)
            self._refill_locked()
            if given_up:
                self._counters = self._counters.plus(jobs_given_up=1)
                log.error("collect job of %s (players %s) failed %d attempts in a row; given up (%d failed attempts "
                          "of this player since its last completed job%s). Last error: %s", player,
                          list(lease.players), lease.attempt, books.failures_in_a_row, wait,
                          _continued(books.last_error))
        self._persist(job_failures=(books,))

    def _unloadable_to_verify(self, report: FinishReport, process: str) -> bool:
        """Whether the finish's unloadable players are worth reading their checkpoints for: the worker, its job
        and the ids are checked first (raises as `finish_job` would), so a request of anyone's, naming a player
        thousands of times, no longer had the coordinator hash a checkpoint once per id. False for a duplicate
        finish or a learn job (answered without any file read)."""
        with self._lock:
            _, found = self._check_finish_locked(report, process)
            if isinstance(found, JobEnd) or found.kind is JobKind.LEARN:
                return False
            self._check_unloadable(report, found.players)
            return True

    def _check_finish_locked(self, report: FinishReport, process: str) -> tuple[float, Lease[JobSpec] | JobEnd]:
        """Now, and the lease the finish ends (or the end of a job finished before: a retry): leases expired
        first, the worker's process checked. Raises as `finish_job` refuses."""
        now = self._clock()
        self._expire_locked(now)
        try:
            self._table.claim(report.worker_id, process)
            return now, self._table.check_finish(report.worker_id, report.job_id, now)
        except RequestError:
            # A refusal waits for its commit like a reply: "the lease expired" may rest on the expiry recorded just
            # now. Sent before it was durable, a crash took the expiry back, and the restarted coordinator would
            # have counted the results the worker had dropped on hearing it (a review).
            self._reply_waits_locked()
            raise

    def _check_unloadable(self, report: FinishReport, players: tuple[str, ...]) -> None:
        """Before anything changes: the named players are this job's frozen opponents with checkpoints."""
        if report.status is not JobEndStatus.FAILED:
            raise InvalidArgumentError("unloadable_player_ids", "only a FAILED job names unloadable players")
        if len(set(report.unloadable_player_ids)) < len(report.unloadable_player_ids):
            raise InvalidArgumentError("unloadable_player_ids", "names a player more than once")
        for i, pid in enumerate(report.unloadable_player_ids):
            if pid not in players[1:]:
                raise InvalidArgumentError(f"unloadable_player_ids[{i}]", f"{pid!r} is not an opponent in this job")
            self._league.require_settable_aside(pid, f"unloadable_player_ids[{i}]")

    def _loadable_here(self, player_ids: tuple[str, ...]) -> set[str]:
        """Of the players an actor could not load, those whose checkpoints verify on this coordinator's shared
        root: the actor's view is wrong (another share mounted, say), and setting them aside for good on its
        word would take good players out of the league."""
        if not player_ids:
            return set()
        store = CheckpointStore(self._root.root)
        fine = set()
        for pid in player_ids:
            try:
                path = self._league.get_player(pid).checkpoint_path
                if path:
                    store.verify(path)
                    fine.add(pid)
                    log.warning("an actor could not load %s's checkpoint, but it verifies on the coordinator's "
                                "shared root: is that actor's shared root the league's? The player stays in play", pid)
            except (CheckpointError, UnsafePathError, OSError, KeyError, ValueError):
                continue  # unloadable here too, or not a player: `_check_unloadable` says which
        return fine

    def _plays_set_aside(self, lease: Lease[JobSpec]) -> bool:
        """Whether the job's match has a player set aside since it was matched: `_set_aside_locked` withdraws
        the jobs still waiting, not those out with an actor, which a failure or a learner's move offered again
        with the same opponent (a review)."""
        return any(self._league.get_player(pid).set_aside for pid in lease.players[1:])

    def _set_aside_locked(self, lease: Lease[JobSpec], report: FinishReport, loads_here: set[str]) -> bool:
        """A job failed because opponents' checkpoints cannot be loaded: a frozen player has no other version,
        so retrying (the same opponents) would fail alike, and the failures would hold back the launch player,
        which is not at fault. The opponents leave matchmaking; the launch slot goes to a newly matched job.
        Players whose checkpoints verify here (`loads_here`) stay."""
        reason = _raised(report.error) or "its checkpoint cannot be loaded"
        aside = []
        for pid in report.unloadable_player_ids:
            if pid not in loads_here and self._league.set_aside(pid, reason):
                aside.append(pid)
                log.error("historical player %s set aside from matchmaking: its checkpoint %s cannot be loaded "
                          "(worker %s): %s", pid, self._league.get_player(pid).checkpoint_path, report.worker_id,
                          reason)
        # Jobs matched before, still waiting for an actor, would fail alike: their slots are matched anew too.
        withdrawn = self._table.withdraw_pending(aside)
        for job in (lease, *withdrawn):
            self._league.release_job(job.launch_player)
        if withdrawn:
            log.info("%d waiting job(s) that played %s withdrawn and matched anew", len(withdrawn), aside)
        self._refill_locked()
        return bool(aside)

    def _collect_job_completed(self, player: str) -> None:
        """A completed job ends its player's failure streak and backoff; held jobs go out at once."""
        books = self._job_failures.get(player)
        if books is None or (books.failures_in_a_row == 0 and not books.held_until):
            return
        self._job_failures[player] = books.succeeded()
        if self._table.release_held(player):
            self._jobs_ready_locked(WorkerRole.ACTOR, everyone=True)
        log.info("a collect job of %s completed after %d failed attempt(s) in a row", player,
                 books.failures_in_a_row)
        self._persist(job_failures=(self._job_failures[player],))

    def _check_episode_count(self, report: FinishReport, lease: Lease[JobSpec]) -> None:
        """A job granted with `episode_num` > 0 reports at most that many episodes (actors report exactly the first
        `episode_num` started): more would each count in the payoff and ratings. Held to the `episode_num` stored
        with its lease, which a restart restores (the config's may have changed since the grant); a lease restored
        from a state written before leases kept it has only the wire bound (MAX_EPISODES_PER_JOB)."""
        asked = lease.episode_num
        if asked is not None and asked > 0 and len(report.episodes) > asked:
            raise InvalidArgumentError(
                "episodes", f"job {lease.job_id!r} asked for {asked} episodes, got {len(report.episodes)}"
            )

    @staticmethod
    def _check_episode_players(report: FinishReport, players: tuple[str, ...]) -> None:
        for i, episode in enumerate(report.episodes):
            ids = tuple(po.player_id for po in episode.player_outcomes)
            for j, pid in enumerate(ids):
                if pid not in players:
                    raise InvalidArgumentError(
                        f"episodes[{i}].players[{j}].player_id", f"{pid!r} is not a player of this job {list(players)}"
                    )
            if ids != players:
                raise InvalidArgumentError(
                    f"episodes[{i}].players", f"must name the job's players in seat order {list(players)}, got {list(ids)}"
                )

    def _expire_locked(self, now: float) -> None:
        paused = 0.0
        if self._use_expiry_thread:  # it ticks every PAUSE_TICK_S: a longer gap is a pause (fake clocks jump)
            paused = self._forgive_pause_locked(now)
        # (A pause during a write is one stall: the leases move on by it once.)
        if (stalled := self._commits.take_stalled_s() - paused) > 0:
            # The server's replies wait for the state's writes, heartbeats included (the event loop waits on
            # them): a lease must not expire on the silence of a worker whose heartbeat waits unanswered.
            moved = self._table.postpone_all(stalled)
            log.warning("writing the coordinator's state stalled for %.1f s, in which heartbeats waited unanswered: "
                        "the deadlines of %d lease(s) move on by as much", stalled, moved)
        if self._forget_workers_after_s and now >= self._next_forget_check:
            self._forget_idle_workers_locked(now)
        expired = self._table.expire_due(now)
        if not expired:
            return
        ends = []
        self._counters = self._counters.plus(jobs_expired=len(expired))
        for lease in expired:
            end = self._table.ended(lease.job_id)
            assert end is not None
            ends.append(end)
        # The ends first: a collect job offered again below is recorded after the lease it replaces ended.
        self._persist(ends=ends)
        for lease in expired:
            log.info("lease of job %s (%s, worker %s) expired", lease.job_id, lease.kind.value, lease.worker_id)
            if lease.kind is JobKind.COLLECT:
                self._collect_attempt_failed(lease, f"the lease expired (worker {lease.worker_id} went silent)", now)
            else:
                self._jobs_ready_locked(WorkerRole.LEARNER)

    def _forgive_pause_locked(self, now: float) -> float:
        """A coordinator that did not run for a while (SIGSTOP, a frozen VM, a starved host) could not take the
        heartbeats sent meanwhile: without this, every lease expired at once when it ran again, losing more work
        than a crash (whose restart gives leases fresh deadlines). Leases move on by the pause instead; returns
        it (0 for none)."""
        paused = now - self._ran_at
        self._ran_at = now  # after the wall clock steps back, the gap is negative once and the next ones count
        if paused <= PAUSE_AFTER_S:
            return 0.0
        moved = self._table.postpone_all(paused)
        log.warning("the coordinator did not run for %.1f s (paused or starved of CPU): the deadlines of %d lease(s) "
                    "move on by as much, since their workers could not be heard meanwhile", paused, moved)
        return paused

    def _forget_idle_workers_locked(self, now: float) -> None:
        """Drop workers silent for coordinator.forget_workers_after_s that hold no job (checked now and then:
        every call runs `_expire_locked`)."""
        self._next_forget_check = now + min(60.0, self._forget_workers_after_s / 10)
        gone = self._table.forget_idle(now - self._forget_workers_after_s)
        if gone:
            self._commits.record(forgotten_workers=gone)
            log.info("forgot %d worker(s) silent for over %.0f s: %s", len(gone), self._forget_workers_after_s,
                     ", ".join(gone[:5]) + (", ..." if len(gone) > 5 else ""))

    def _persist(
        self,
        *,
        leases: Iterable[Lease[JobSpec]] = (),
        ends: Iterable[JobEnd] = (),
        workers: Iterable[WorkerInfo] = (),
        job_failures: Iterable[PlayerJobFailures] = (),
        league_state: bool = False,
        waited: bool = False,
    ) -> None:
        """Record changes for the next group commit (with the counters, and the league's state when it changed).

        Launch slots alone (a job leased, failed or expired) are no reason to write the league state: a restart
        sets every player's slots from the jobs in flight, not from the stored state. `waited`: the caller
        waits for them next (`wait_durable`, or `wait_until` once it let go of the lock), so no thread is woken.
        """
        self._commits.record(
            leases=leases,
            ends=ends,
            workers=[(info, self._table.last_seen(info.worker_id)) for info in workers],
            job_failures=job_failures,
            league_state=league_state,
            waited=waited,
        )

    def _snapshot(self, league_state: bool) -> tuple[LeagueStateChanges | None, Counters]:
        """What the committer writes with a batch (called under the lock): what changed in the league since
        the last batch that asked, and the counters."""
        return (self._league.take_state_changes() if league_state else None), self._counters

    def _expiry_loop(self) -> None:
        try:
            with self._lock:
                while not self._closing:
                    now = self._clock()
                    self._expire_locked(now)
                    deadline = self._table.next_deadline()
                    self._expiry_at = math.inf if deadline is None else deadline
                    wait = PAUSE_TICK_S if deadline is None else min(max(deadline - now, 0.001), PAUSE_TICK_S)
                    self._expiry_wakeup.wait(wait)
        except BaseException as exc:  # re-raised by close(); lazy expiry on every call keeps working
            log.exception("the lease expiry thread failed")
            self._failure = exc

    def _restore_or_initialise(self) -> None:
        digest = config_digest(self._cfg)
        identity = LeagueIdentity.of(self._cfg)
        stored = self._store.load(recent_ends=self._settings.remember_ends)
        if stored is None or stored.league_state is None:
            _warn_of_checkpoints_already_there(self._league.active_players, self._root, self._store.path)
            self._store.initialise(digest, now=self._clock())
            self._store.put_identity(identity.to_json())
            self._store.put_config_sections(config_section_digests(self._cfg))
            with self._store.transaction() as tx:
                tx.put_league_changes(self._league.take_state_changes())  # the first changes: all of it
                tx.put_counters(self._counters)
            return
        saved = self._store.identity()
        saved_identity = LeagueIdentity.from_json(saved) if saved is not None else None
        change = saved_identity.first_change(identity) if saved_identity is not None else None
        if change is not None and has_trained(stored.league_state, stored.counters):
            key, old, new = change
            raise LeagueStateError(key, f"the league in this state was made with {old!r}, the config says "
                                        f"{new!r}: its checkpoints and games are of that (use the config the "
                                        "league was made with, or a new state)")
        if change is not None:
            log.warning("%s: the league in this state was made with %r, the config says %r; it has played no game "
                        "and has no checkpoint, so it goes on with the config's", change[0], change[1], change[2])
        # A store from before stores kept it learns it from a start with the very config it was made with: from
        # any other, a wrong env given once would lock the league out of its own config for good.
        # An identity saved before it had every part learns the rest the same way.
        record = change is not None or (
            (saved_identity is None or not saved_identity.complete) and stored.config_digest == digest)
        now = self._clock()
        # Times stored ahead of now: the wall clock was stepped back while the coordinator was down (or the state
        # moved to a host whose clock is behind). Taken as they were, a dead worker stayed alive, with a negative
        # silence, and a failing player's jobs were held, for as long as the step.
        for info, last_seen in stored.workers:
            self._table.restore_worker(replace(info, registered_at=min(info.registered_at, now)),
                                       min(last_seen, now))
        for end in stored.ended:
            self._table.restore_end(end)
        for lease in stored.leases:
            self._table.worker(lease.worker_id)
            self._table.restore(lease, now)
        # A player's launch slots are its collect jobs in flight; the jobs that were pending (never leased) are
        # gone, and their slots with them. `slots_used` is the league core's state_dict key for them.
        state = dict(stored.league_state)
        if not isinstance(state.get("slots_used"), dict):
            raise RuntimeError(f"state: {self._store.path} holds a league state without slots_used")
        state["slots_used"] = {pid: self._table.live_collect_jobs(pid) for pid in state["slots_used"]}
        self._league.load_state_dict(state)
        if record:  # only once the state is taken: a start refused here leaves the store as it was
            self._store.put_identity(identity.to_json())
        # Commits of granted jobs alone do not write the counters: every issued job is ended or in flight.
        c = stored.counters
        self._counters = replace(
            c, jobs_issued=max(c.jobs_issued, c.jobs_finished + c.jobs_expired + c.jobs_failed + len(stored.leases))
        )
        self._job_failures = {r.player_id: _failures_not_ahead(r, now) for r in stored.job_failures
                              if r.player_id in self._active_ids}
        _check_checkpoints_present(self._league.active_players + self._league.historical_players, self._root)
        self._note_config_change(stored.config_digest != digest)  # (the start is taken: nothing refuses it now)
        _, active, historical = self._league.sizes()
        log.info(
            "restored league %s: %d players, %d jobs in flight, %d workers",
            self.league_id, active + historical, len(stored.leases), len(stored.workers),
        )

    def _note_config_change(self, unlike_the_first: bool) -> None:
        """Say which config sections changed since the league's last start, once per change, and keep this
        start's. Compared with the state's first config, every start after an allowed change (a learning rate;
        even `run.seconds`, which the coordinator never reads) warned, naming nothing (a review). `league run`
        names each key it changed. `unlike_the_first`: this config is not the one the state was created with
        (said for a state that keeps no section digests yet)."""
        sections, last_sections = config_section_digests(self._cfg), self._store.config_sections()
        if last_sections is None:
            if unlike_the_first:
                log.info("the configuration differs from the one this league's state was created with (%s)",
                         self._store.path)
        elif changed := sorted(k for k in sections.keys() | last_sections.keys()
                               if sections.get(k) != last_sections.get(k)):
            log.info("the config's %s changed since this league's last start (%s)", ", ".join(changed),
                     self._store.path)
        if sections != last_sections:
            self._store.put_config_sections(sections)


def _failures_not_ahead(books: PlayerJobFailures, now: float) -> PlayerJobFailures:
    """A player's restored failure books whose last failure is stored ahead of `now` (the wall clock went back):
    the failure is taken as just now, and its jobs are held for the backoff it asked for, not for the step too."""
    ahead = books.last_failure_at - now
    if ahead <= 0:
        return books
    return replace(books, last_failure_at=now, held_until=books.held_until - ahead if books.held_until else 0.0)


def _check_checkpoints_present(players: Iterable[Player], root: SharedRoot) -> None:
    """The checkpoints a restored league names are under this shared root. A state moved (or a `--shared-root`
    mistyped) without them started without a word: its historical players were set aside one failed job at a
    time and its learners began again from fresh weights. None there: refused (the wrong root, surely); some
    missing: a warning naming them, and the league goes on without those."""
    named = [(p.player_id, p.checkpoint_path) for p in players if p.checkpoint_path and not p.bot]
    missing = [(pid, path) for pid, path in named if not _is_under(root, path)]
    if not missing:
        return
    examples = ", ".join(f"{pid} ({path})" for pid, path in missing[:3]) + (" ..." if len(missing) > 3 else "")
    # A learner goes on publishing while the coordinator is away (until its lease lapses), and its retention may
    # retire the version the state names: the player's directory, with newer versions in it, says the root is right.
    if len(missing) == len(named) and not any(_directory_is_under(root, path) for _, path in missing):
        raise LeagueStateError(
            "shared_root", f"none of the {len(named)} checkpoint(s) this league's state names is under the shared "
                           f"root {root.root} (such as {examples}): give the --shared-root the league trained in "
                           "(`league run`: its run directory's shared/, which must be put back)")
    log.warning("%d of the %d checkpoint(s) this league's state names are not under the shared root %s: %s; "
                "actors cannot load those (an active player's learner names its newer version at its next report)",
                len(missing), len(named), root.root, examples)


def _not_a_checkpoint(path: Path, state: Path) -> str | None:
    """What the (resolved) file `path` is when it is a file the league keeps beside checkpoints, which a learner
    never reports as one: a store's manifest, training state, pin or hidden temporary/retired file, or the
    coordinator's state database (`state`, resolved) or a file beside it; None for anything else."""
    name = path.name
    if name.startswith("."):
        return "a hidden file (a checkpoint store's temporary or retired one), not a checkpoint"
    if name.endswith((MANIFEST_SUFFIX, TRAINING_STATE_SUFFIX, PIN_SUFFIX)):
        return "a checkpoint's manifest, training state or pin, not the checkpoint itself"
    if path.parent == state.parent and name in {state.name + suffix for suffix in ("", *STATE_SIDE_FILES)}:
        return "the coordinator's state database, not a checkpoint"
    return None


def _warn_of_checkpoints_already_there(players: Iterable[Player], root: SharedRoot, state: Path) -> None:
    """A new league (no state yet) whose players' directories already hold published checkpoints: its learners
    take the newest of them up and publish on among them. That is how a league whose state was lost goes on
    (its learners keep their players' training), but it is also what a second league on the same shared root
    does to the first one's players, without a word. Said at start, so the second can be told from the first."""
    found = []
    for player in players:
        folder = root.root / player.player_id
        try:
            published = folder.is_dir() and ((folder / "latest.json").exists()
                                             or any(VERSION_FILE.fullmatch(p.name) for p in folder.glob("v*.pt")))
        except OSError:
            published = False
        if published:
            found.append(player.player_id)
    if found:
        log.warning("%s already holds checkpoints of %s, players of the new league this state (%s) starts: their "
                    "learners resume from them. Right for a league whose state was lost; if they are another "
                    "league's (one still running on this root, say), stop now and give this league another "
                    "--shared-root (or, to start from those weights, league.pretrain_checkpoint_path)",
                    root.root, ", ".join(found), state)


def _is_under(root: SharedRoot, relative: str) -> bool:
    try:
        return root.resolve(relative).exists()
    except (UnsafePathError, OSError):
        return False


def _directory_is_under(root: SharedRoot, relative: str) -> bool:
    """The directory of checkpoint `relative` (other than the root itself) is under the root."""
    parent = PurePosixPath(relative).parent
    return str(parent) not in ("", ".", "/") and _is_under(root, str(parent))


def _check_pretrained_checkpoints(league: LeagueConfig, root: SharedRoot, policy: Mapping[str, Any]) -> None:
    """Every pretrained checkpoint the config names is a file under the shared root: actors and learners load
    it (the league starts from it, mutations reset to it), and one that is not there would fail their jobs
    later, one by one, instead of stopping the coordinator at start with its name."""
    for category, relative in league.pretrain_checkpoint_path.items():
        if not relative:
            continue
        key = f"league.pretrain_checkpoint_path.{category}"
        try:
            path = root.resolve(relative)
            found = path.exists()
            regular = path.is_file()
        except (UnsafePathError, OSError) as err:
            raise ConfigError(key, str(err)) from None
        if not found:
            raise ConfigError(key, f"{relative!r} does not exist under the shared root {root.root}")
        if not regular:  # a directory (the player's directory named instead of one of its versions, say)
            raise ConfigError(key, f"{relative!r} is not a regular file (a checkpoint is one)")
        _adopt_if_copied(key, relative, path, root)
        _warn_of_other_play_settings(key, relative, root, policy)


def _warn_of_other_play_settings(key: str, relative: str, root: SharedRoot, policy: Mapping[str, Any]) -> None:
    """A pretrained checkpoint that records other play settings (activation, obs_scale, ...) than the league's
    policy: its learners train it with the league's, its actors play it with its own (as a historical player,
    and until a learner's first version), so the two disagree about the same weights. Said at start (a review:
    weights imported for the embedded league, run in a league of another activation, without a word)."""
    try:
        metadata = CheckpointStore(root.root).manifest(relative).metadata
    except CheckpointError:
        return  # not published: the loaders say so
    changed = as_published(policy, metadata)[1]
    if changed:
        log.warning("%s: %s was made with other play settings than the league's policy (%s, the policy's first): "
                    "learners train it with the policy's, actors play it as it is with its own", key, relative,
                    "; ".join(changed))


def _adopt_if_copied(key: str, relative: str, path: Path, root: SharedRoot) -> None:
    """A pretrained checkpoint copied here with its manifest from another place (another run's shared root)
    is recorded at its new place: its manifest names the old one, and every learner and actor refused to load
    it (a review: starting a league from another run's main player failed at its first jobs)."""
    try:
        named = json.loads(path.with_name(path.name + MANIFEST_SUFFIX).read_bytes()).get("path")
    except FileNotFoundError:
        log.warning("%s: %s has no manifest: this package's learners and actors load only published checkpoints "
                    "(`league import FILE --to %s` publishes weights trained elsewhere)", key, relative, relative)
        return
    except (OSError, ValueError, AttributeError):
        return  # a manifest not readable here: the loaders say what is wrong with it, as before
    if named == relative:
        return
    try:
        ref = CheckpointStore(root.root).adopt(relative)
    except (CheckpointError, OSError) as err:
        message = f"{relative!r}, copied from {named!r}, cannot be recorded at its new place: {err}"
        raise ConfigError(key, message) from None
    log.info("%s: recorded %s, a checkpoint copied from %s (version %d), at its new place", key, relative,
             ref.metadata.get("copied_from"), ref.version)


def _shared_root_id(root: Path) -> str:
    """The shared root's marker id, which workers check their own --shared-root against ("" when the root takes no
    marker: a read-only share; workers then check nothing)."""
    try:
        return ensure_root_id(root)
    except OSError as err:
        log.warning("no shared-root marker in %s (%s): workers cannot check that their --shared-root is this one",
                    root, err)
        return ""
