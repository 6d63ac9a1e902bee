"""The job and lease table: who holds which job until when. Pure logic, no gRPC, no threads, no I/O.

Every method takes `now` (seconds) so tests drive time with a fake clock. The table does not call the league:
it returns what changed (an expired lease, an ended job) and the coordinator applies that to the league and the
durable store in one transaction. The semantics are written down in LEASES.md.

A job's life: collect jobs are *offered* (pending) when the league's launch thread fills a slot, then *leased*
to one actor; learn jobs are created when a learner asks and bind that learner to one active player. A lease
ends exactly once: finished (completed / released / failed) or expired; its id is remembered so a retried
finish is acknowledged as a duplicate and a late one is refused. The most recent ends are kept in memory (as
plain tuples the garbage collector skips); older ones are asked of `forgotten_end` (the durable store).
A collect job whose attempt failed may be offered again (the coordinator decides, job_retries.py): as a new
pending job with its own id and the next `attempt` number, holding the same launch slot, and not leased before
its `not_before` time (a failing player's backoff).
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from league_service.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    WorkerIdInUseError,
)

P = TypeVar("P")

MAX_SUPERSEDED = 10_000
"""Processes remembered as having lost their worker id to a newer one (the oldest are forgotten first)."""
RECONNECT_GRACE_S = 5.0
"""Added to the deadline of a lease restored after a restart: a worker's channel retries a server it lost at
most every 5 s (``grpc.max_reconnect_backoff_ms`` in common/rpc.py), so it may reach the restarted coordinator
only that long after it listens. Without it, leases shorter than that backoff expired at restart."""


class WorkerRole(enum.Enum):
    ACTOR = "actor"
    LEARNER = "learner"


class JobKind(enum.Enum):
    COLLECT = "collect"
    LEARN = "learn"

    __hash__ = object.__hash__  # identity, as equality: a C slot instead of Enum's Python-level hash


class JobEndStatus(enum.Enum):
    COMPLETED = "completed"  # results counted
    RELEASED = "released"  # worker gave it back; results, if any, counted
    FAILED = "failed"  # nothing counted
    EXPIRED = "expired"  # lease ran out; nothing counted, a late finish is refused


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    role: WorkerRole
    hostname: str
    data_endpoint: str
    registered_at: float


@dataclass(frozen=True)
class Lease(Generic[P]):
    job_id: str
    kind: JobKind
    launch_player: str
    # Seat order; players[0] is the launch player. Learn jobs: just the bound player.
    players: tuple[str, ...]
    worker_id: str
    issued_at: float
    deadline: float
    # Collect jobs: where the launch player's learner listens (empty when it trains without one).
    # Learn jobs: the learner's own data endpoint.
    endpoint: str
    # What the league asked for (the coordinator's job spec); None for learn jobs and after a restart.
    payload: P | None = None
    # Collect jobs: which lease of the job this is (1 = first); a failed attempt may be offered again.
    attempt: int = 1
    # Collect jobs: the episodes the job was granted with (0: until its env steps), so that its finish is held to
    # them also after a restart; None for learn jobs and for one restored from a state that did not store it.
    episode_num: int | None = None
    # Collect jobs: each player's reset generation when the job was leased, i.e. of the weights it is played with
    # (results of a player reset since are not counted); None for learn jobs and for one restored from a state
    # that did not store them.
    generations: tuple[int, ...] | None = None


@dataclass(frozen=True)
class JobEnd:
    job_id: str
    status: JobEndStatus
    episodes_counted: int
    ended_at: float


def _no_forgotten_ends(job_id: str) -> JobEnd | None:
    return None


@dataclass(frozen=True)
class PendingJob(Generic[P]):
    job_id: str
    launch_player: str
    players: tuple[str, ...]
    payload: P | None
    attempt: int = 1
    # Not leased before this time (a failing player's backoff); 0: at once.
    not_before: float = 0.0


@dataclass(frozen=True)
class HeartbeatResult:
    revoked_job_ids: tuple[str, ...]
    lease_deadline: float
    lease_timeout_s: float


class LeaseTable(Generic[P]):
    """Pending jobs, leases, ended job ids, workers and learner bindings, with the invariants between them.

    Invariants (checked by tests): a job id is pending, leased or ended — never two of these; a lease has one
    owner; an active player has at most one bound learner; an ended job never comes back.
    """

    def __init__(
        self,
        *,
        lease_timeout_s: float,
        active_players: Iterable[str],
        needs_learner: Callable[[str], bool],
        new_job_id: Callable[[], str],
        remember_ends: int = 100_000,
        forgotten_end: Callable[[str], JobEnd | None] = _no_forgotten_ends,
    ) -> None:
        if not (math.isfinite(lease_timeout_s) and lease_timeout_s > 0):
            raise ValueError(f"lease_timeout_s: must be a positive number, got {lease_timeout_s}")
        self.lease_timeout_s = lease_timeout_s
        self._active_players = tuple(active_players)
        self._needs_learner = needs_learner
        self._new_job_id = new_job_id
        self._workers: dict[str, WorkerInfo] = {}
        self._last_seen: dict[str, float] = {}
        self._seen_since_taken: set[str] = set()  # workers whose last-seen time changed (take_seen)
        self._process_of: dict[str, str] = {}  # worker id -> the process using it (`claim`; not stored)
        self._superseded: dict[str, str] = {}  # process -> the worker id a newer process took from it
        self._pending: dict[str, PendingJob[P]] = {}  # insertion order = FIFO
        self._leases: dict[str, Lease[P]] = {}
        if remember_ends < 1:
            raise ValueError(f"remember_ends: must be >= 1, got {remember_ends}")
        self._remember_ends = remember_ends
        self._forgotten_end = forgotten_end
        # job id -> (status value, episodes counted, ended at): atomic tuples stay out of the GC's way.
        self._ended: OrderedDict[str, tuple[str, int, float]] = OrderedDict()
        self._learner_of: dict[str, str] = {}  # active player id -> learn job id
        self._lost_learn: dict[str, str] = {}
        """Learner worker id -> the player whose learn lease it let expire (not stored): offered it first when it
        asks again, so learners back from a partition rebind their own players and keep the samples they hold."""
        self._deadlines: list[tuple[float, str]] = []  # heap with stale entries skipped lazily

    # ---- read-only views -------------------------------------------------------------------------------

    @property
    def workers(self) -> dict[str, WorkerInfo]:
        return dict(self._workers)

    def last_seen(self, worker_id: str) -> float:
        return self._last_seen.get(worker_id, float("nan"))

    @property
    def leases(self) -> dict[str, Lease[P]]:
        return dict(self._leases)

    @property
    def pending(self) -> tuple[PendingJob[P], ...]:
        return tuple(self._pending.values())

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def ended(self, job_id: str) -> JobEnd | None:
        """How a job ended, from memory or (for old jobs) from `forgotten_end`; None if it has not ended."""
        packed = self._ended.get(job_id)
        if packed is None:
            return self._forgotten_end(job_id)
        status, counted, at = packed
        return JobEnd(job_id, JobEndStatus(status), counted, at)

    def learner_lease(self, player_id: str) -> Lease[P] | None:
        job_id = self._learner_of.get(player_id)
        return self._leases[job_id] if job_id is not None else None

    def jobs_of(self, worker_id: str) -> tuple[str, ...]:
        return tuple(j for j, lease in self._leases.items() if lease.worker_id == worker_id)

    def live_collect_jobs(self, player_id: str) -> int:
        """Pending + leased collect jobs launched for `player_id` (each holds one of its launch slots)."""
        pending = sum(1 for p in self._pending.values() if p.launch_player == player_id)
        leased = sum(
            1 for x in self._leases.values() if x.kind is JobKind.COLLECT and x.launch_player == player_id
        )
        return pending + leased

    def next_deadline(self) -> float | None:
        while self._deadlines:
            deadline, job_id = self._deadlines[0]
            lease = self._leases.get(job_id)
            if lease is not None and lease.deadline == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def collect_ready(self, player_id: str) -> bool:
        """Collect jobs of a player go out only once its learner is bound (unless it trains without one)."""
        return not self._needs_learner(player_id) or player_id in self._learner_of

    # ---- workers -----------------------------------------------------------------------------------------

    def register(self, info: WorkerInfo) -> None:
        """Idempotent by worker id: a restarted worker registers again (its role may not change)."""
        known = self._workers.get(info.worker_id)
        if known is not None and known.role is not info.role:
            raise FailedPreconditionError(
                "role", f"worker {info.worker_id!r} is registered as {known.role.value}, not {info.role.value}"
            )
        seen = info.registered_at
        if known is not None:
            seen = max(seen, self._last_seen[info.worker_id])
            info = dataclasses.replace(info, registered_at=known.registered_at)
        self._workers[info.worker_id] = info
        self._last_seen[info.worker_id] = seen

    def take_over(self, worker_id: str, process: str, now: float) -> str | None:
        """A registration: `process` (the caller's PROCESS_METADATA_KEY, "" when it sent none) uses the worker
        id from now on; returns the process it took it from, if another. The newest registration wins on the
        same host, since a restarted worker registers again while its old process may look alive for up to a
        lease; a process that lost its id stays refused (registering again would take it back, and two
        processes started with the same --worker-id would trade it for ever).

        From another host, the id is taken over only once its process has been silent for a lease: two hosts
        given the same id (one `.env` copied to both) under a restart policy (compose's `unless-stopped`)
        would otherwise knock each other out for ever, each restart taking the id back; now the newcomer is
        refused (and restarted, and refused) while the first one works on."""
        if not process:
            return None
        if self._superseded.get(process) == worker_id:
            raise WorkerIdInUseError("worker_id", self._in_use(worker_id, process))
        previous = self._process_of.get(worker_id)
        if previous is not None and previous != process and process_host(previous) != process_host(process):
            silent_s = now - self._last_seen.get(worker_id, -math.inf)
            if silent_s < self.lease_timeout_s:
                raise WorkerIdInUseError(
                    "worker_id",
                    f"worker id {worker_id!r} is used by a live process on another host ({previous}, heard from "
                    f"{silent_s:.0f} s ago); this one ({process}) is refused: give every worker process its own "
                    f"--worker-id (a worker moved to another host takes its id over once the old process has been "
                    f"silent for the lease timeout, {self.lease_timeout_s:g} s)")
        self._process_of[worker_id] = process
        if previous is None or previous == process:
            return None
        self._superseded[previous] = worker_id
        while len(self._superseded) > MAX_SUPERSEDED:
            del self._superseded[next(iter(self._superseded))]
        return previous

    def claim(self, worker_id: str, process: str) -> WorkerInfo:
        """Any other call naming the worker: its registration (NotFoundError if none), refused unless `process`
        is the one using the id (the first caller after a coordinator restart, which does not store processes,
        becomes it)."""
        info = self.worker(worker_id)
        if process and self._process_of.setdefault(worker_id, process) != process:
            raise WorkerIdInUseError("worker_id", self._in_use(worker_id, process))
        return info

    def _in_use(self, worker_id: str, process: str) -> str:
        return (f"worker id {worker_id!r} is used by another process now ({self._process_of.get(worker_id)}); "
                f"this one ({process}) was superseded: give every worker process its own --worker-id")

    def worker(self, worker_id: str) -> WorkerInfo:
        info = self._workers.get(worker_id)
        if info is None:
            raise NotFoundError("worker_id", f"unknown worker {worker_id!r} (RegisterWorker first)")
        return info

    def restore_worker(self, info: WorkerInfo, last_seen: float) -> None:
        self._workers[info.worker_id] = info
        self._last_seen[info.worker_id] = last_seen

    def forget_idle(self, seen_before: float) -> list[str]:
        """Drop the workers last seen before `seen_before` that hold no job; returns their ids."""
        busy = {lease.worker_id for lease in self._leases.values()}
        gone = [w for w, seen in self._last_seen.items() if seen < seen_before and w not in busy]
        for worker_id in gone:
            self._drop_worker(worker_id)
        return gone

    def forget(self, worker_id: str) -> bool:
        """Drop a worker that says it is leaving, unless it holds a lease (which then ends or expires as usual)."""
        if worker_id not in self._workers or any(lease.worker_id == worker_id for lease in self._leases.values()):
            return False
        self._drop_worker(worker_id)
        return True

    def _drop_worker(self, worker_id: str) -> None:
        del self._workers[worker_id]
        del self._last_seen[worker_id]
        self._seen_since_taken.discard(worker_id)
        self._process_of.pop(worker_id, None)
        self._lost_learn.pop(worker_id, None)

    def take_seen(self) -> list[tuple[WorkerInfo, float]]:
        """(worker, last seen) of every worker seen since the last call (which forgets them)."""
        seen, self._seen_since_taken = self._seen_since_taken, set()
        return [(self._workers[w], self._last_seen[w]) for w in sorted(seen)]

    # ---- jobs --------------------------------------------------------------------------------------------

    def offer(
        self, launch_player: str, players: tuple[str, ...], payload: P | None, *, attempt: int = 1,
        not_before: float = 0.0,
    ) -> PendingJob[P]:
        """A collect job the league launched (or a failed one offered again, as a new job id with the next
        `attempt`); it waits here until an actor asks, and is not leased before `not_before`."""
        if not players or players[0] != launch_player:
            raise ValueError(f"players: must start with the launch player {launch_player!r}, got {players}")
        if attempt < 1:
            raise ValueError(f"attempt: must be >= 1, got {attempt}")
        job = PendingJob(self._fresh_job_id(), launch_player, tuple(players), payload, attempt, not_before)
        self._pending[job.job_id] = job
        return job

    def next_release(self, now: float) -> float | None:
        """When the earliest held-back pending job whose player is ready may be leased (None: none held)."""
        held = [p.not_before for p in self._pending.values()
                if p.not_before > now and self.collect_ready(p.launch_player)]
        return min(held) if held else None

    def release_held(self, launch_player: str) -> int:
        """Let the held-back pending jobs of `launch_player` go out at once; returns how many were held."""
        held = [job for job in self._pending.values() if job.launch_player == launch_player and job.not_before]
        for job in held:
            self._pending[job.job_id] = dataclasses.replace(job, not_before=0.0)
        return len(held)

    def hold_pending(self, launch_player: str, until: float) -> int:
        """Hold back `launch_player`'s pending jobs until `until` (its backoff began: jobs offered before it, in
        its other launch slots, went out at once); returns how many were moved."""
        moved = 0
        for job in list(self._pending.values()):
            if job.launch_player == launch_player and job.not_before < until:
                self._pending[job.job_id] = dataclasses.replace(job, not_before=until)
                moved += 1
        return moved

    def withdraw_pending(self, naming: Collection[str]) -> list[PendingJob[P]]:
        """Take back the pending (never leased) jobs whose players include any of `naming`; returns them."""
        names = set(naming)
        gone = [job for job in self._pending.values() if names.intersection(job.players)]
        for job in gone:
            del self._pending[job.job_id]
        return gone

    def lease_collect(
        self, worker_id: str, now: float, episode_num: int | None = None,
        generations_of: Callable[[tuple[str, ...]], tuple[int, ...]] | None = None,
    ) -> Lease[P] | None:
        """Lease the oldest pending collect job whose player is ready and which is not held back, or None;
        `episode_num`: the episodes it is granted with; `generations_of`: the players' reset generations now (both
        kept on the lease)."""
        self._require_role(worker_id, WorkerRole.ACTOR)
        self._touch(worker_id, now)
        for job in self._pending.values():
            if job.not_before <= now and self.collect_ready(job.launch_player):
                del self._pending[job.job_id]
                binding = self.learner_lease(job.launch_player)
                return self._grant(
                    Lease(
                        job_id=job.job_id,
                        kind=JobKind.COLLECT,
                        launch_player=job.launch_player,
                        players=job.players,
                        worker_id=worker_id,
                        issued_at=now,
                        deadline=now + self.lease_timeout_s,
                        endpoint=binding.endpoint if binding is not None else "",
                        payload=job.payload,
                        attempt=job.attempt,
                        episode_num=episode_num,
                        generations=generations_of(job.players) if generations_of is not None else None,
                    )
                )
        return None

    def lease_learn(self, worker_id: str, endpoint: str, now: float) -> Lease[P] | None:
        """Bind this learner to an active player that needs one, or hand back the binding it already holds."""
        self._require_role(worker_id, WorkerRole.LEARNER)
        if not endpoint:
            raise InvalidArgumentError("data_endpoint", "a learner must give the address actors stream to")
        self._touch(worker_id, now)
        held = next((x for x in self._leases.values() if x.worker_id == worker_id and x.kind is JobKind.LEARN), None)
        if held is not None:
            # A learner that restarted (or lost the reply) gets its binding back, with a fresh lease.
            return self._grant(dataclasses.replace(held, endpoint=endpoint, deadline=now + self.lease_timeout_s))
        free = [p for p in self._active_players if self._needs_learner(p) and p not in self._learner_of]
        previous = self._lost_learn.get(worker_id)
        awaited = {p for w, p in self._lost_learn.items() if w != worker_id}
        # Its own player first, then players no other lost learner is expected back for, in roster order: two
        # learners healed from a partition swapped players, and each dropped the samples it held.
        if not free:
            return None
        player_id = min(free, key=lambda p: (p != previous, p in awaited))  # (the first of equals: roster order)
        self._lost_learn.pop(worker_id, None)
        lease: Lease[P] = Lease(
            job_id=self._fresh_job_id(),
            kind=JobKind.LEARN,
            launch_player=player_id,
            players=(player_id,),
            worker_id=worker_id,
            issued_at=now,
            deadline=now + self.lease_timeout_s,
            endpoint=endpoint,
        )
        self._learner_of[player_id] = lease.job_id
        return self._grant(lease)

    def collect_leases_not_to(self, player_id: str, endpoint: str) -> list[Lease[P]]:
        """`player_id`'s collect leases that stream to another address than `endpoint` (its learner moved)."""
        return [lease for lease in self._leases.values()
                if lease.kind is JobKind.COLLECT and lease.launch_player == player_id and lease.endpoint != endpoint]

    def heartbeat(self, worker_id: str, job_ids: Iterable[str], now: float) -> HeartbeatResult:
        """Extend the leases the worker names and still holds; name the others as revoked."""
        self.worker(worker_id)
        self._touch(worker_id, now)
        deadline = now + self.lease_timeout_s
        revoked: list[str] = []
        for job_id in dict.fromkeys(job_ids):
            lease = self._leases.get(job_id)
            if lease is None or lease.worker_id != worker_id or lease.deadline <= now:
                revoked.append(job_id)
                continue
            self._grant(dataclasses.replace(lease, deadline=deadline))
        return HeartbeatResult(tuple(revoked), deadline, self.lease_timeout_s)

    def check_finish(self, worker_id: str, job_id: str, now: float) -> Lease[P] | JobEnd:
        """The lease a finish applies to, or the JobEnd of an already finished job (a duplicate). No change.

        Raises NotFoundError for an unknown job, FailedPreconditionError for an expired lease, a lease of
        another worker or a job that was never leased.
        """
        self.worker(worker_id)
        end = None if job_id in self._leases or job_id in self._pending else self.ended(job_id)
        if end is not None:
            if end.status is JobEndStatus.EXPIRED:
                raise FailedPreconditionError("job_id", f"the lease of job {job_id!r} expired; its result is not counted")
            return end
        lease = self._leases.get(job_id)
        if lease is None:
            if job_id in self._pending:
                raise FailedPreconditionError("job_id", f"job {job_id!r} was never leased")
            raise NotFoundError("job_id", f"unknown job {job_id!r}")
        if lease.worker_id != worker_id:
            raise FailedPreconditionError("worker_id", f"job {job_id!r} is leased to another worker")
        if lease.deadline <= now:
            raise FailedPreconditionError("job_id", f"the lease of job {job_id!r} expired; its result is not counted")
        return lease

    def end(self, job_id: str, status: JobEndStatus, episodes_counted: int, now: float) -> tuple[Lease[P], JobEnd]:
        """End a lease (after `check_finish` accepted it, or on expiry) and remember its id."""
        lease = self._leases.pop(job_id)
        if lease.kind is JobKind.LEARN:
            del self._learner_of[lease.launch_player]
            if status is JobEndStatus.EXPIRED:
                self._lost_learn[lease.worker_id] = lease.launch_player
        end = JobEnd(job_id, status, episodes_counted, now)
        self._remember(end)
        if status is not JobEndStatus.EXPIRED:  # an expiry is the worker's silence, not a word from it: a
            self._touch(lease.worker_id, now)  # process gone for a lease looked heard from just then (take_over)
        return lease, end

    def expire_due(self, now: float) -> list[Lease[P]]:
        """End every lease whose deadline has passed; returns them (the coordinator releases their slots)."""
        expired: list[Lease[P]] = []
        while (deadline := self.next_deadline()) is not None and deadline <= now:
            _, job_id = heapq.heappop(self._deadlines)
            lease, _ = self.end(job_id, JobEndStatus.EXPIRED, 0, now)
            expired.append(lease)
        return expired

    def restore(self, lease: Lease[P], now: float) -> None:
        """Put back a lease that was in flight when the coordinator stopped, with a fresh deadline so its
        worker has a full lease timeout to heartbeat once it reconnects (`RECONNECT_GRACE_S` more)."""
        if lease.job_id in self._leases or lease.job_id in self._ended:
            raise ValueError(f"job_id: {lease.job_id!r} restored twice or already ended")
        if lease.kind is JobKind.LEARN:
            self._learner_of[lease.launch_player] = lease.job_id
        self._grant(dataclasses.replace(lease, issued_at=min(lease.issued_at, now),  # a clock stepped back
                                        deadline=now + self.lease_timeout_s + RECONNECT_GRACE_S))

    def postpone_all(self, by: float) -> int:
        """Move every lease's deadline `by` seconds later (the coordinator was paused, so no worker could renew
        its lease meanwhile); returns how many leases there are."""
        for lease in list(self._leases.values()):
            self._grant(dataclasses.replace(lease, deadline=lease.deadline + by))
        return len(self._leases)

    def restore_end(self, end: JobEnd) -> None:
        self._remember(end)

    # ---- internals ---------------------------------------------------------------------------------------

    def _remember(self, end: JobEnd) -> None:
        self._ended[end.job_id] = (end.status.value, end.episodes_counted, end.ended_at)
        if len(self._ended) > self._remember_ends:
            self._ended.popitem(last=False)

    def _grant(self, lease: Lease[P]) -> Lease[P]:
        self._leases[lease.job_id] = lease
        heapq.heappush(self._deadlines, (lease.deadline, lease.job_id))
        return lease

    def _touch(self, worker_id: str, now: float) -> None:
        if worker_id in self._workers:
            self._last_seen[worker_id] = max(now, self._last_seen.get(worker_id, now))
            self._seen_since_taken.add(worker_id)

    def _require_role(self, worker_id: str, role: WorkerRole) -> None:
        info = self.worker(worker_id)
        if info.role is not role:
            raise FailedPreconditionError("role", f"worker {worker_id!r} is registered as {info.role.value}")

    def _fresh_job_id(self) -> str:
        job_id = self._new_job_id()
        if job_id in self._pending or job_id in self._leases or job_id in self._ended:
            raise RuntimeError(f"job id factory repeated {job_id!r}")
        return job_id


def process_host(process: str) -> str:
    """The host part of a PROCESS_METADATA_KEY value (`common.rpc.process_id`: "host/pid N/token"); a value of
    another shape is its own host."""
    host, sep, _ = process.rpartition("/pid ")
    return host if sep else process
