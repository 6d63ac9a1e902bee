"""Durable coordinator state in SQLite (WAL mode): what must survive a `kill -9` of the coordinator.

Stored: the league core's `state_dict()` (players, payoff, ratings, snapshots) as one JSON document, the
counters, the worker registry, the jobs in flight (leases) and the ids of ended jobs. Every change the
coordinator accepts is written in one transaction with the league state it produced, so after a crash the
store holds either all of an accepted FinishJob or none of it.

Durability: WAL with `synchronous=NORMAL` survives a process crash (every commit is in the OS before the reply
goes out); pass `fsync=True` (`synchronous=FULL`) to also survive power loss, at the cost of one flush per
commit. WAL checkpoints (which flush the disk, ~30 ms to seconds on a slow virtual disk) run on a background
thread with its own connection every CHECKPOINT_EVERY commits, so no request waits for one.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from league_service.job_retries import PlayerJobFailures
from league_service.leases import JobEnd, JobEndStatus, JobKind, Lease, WorkerInfo, WorkerRole

T = TypeVar("T")

SCHEMA_VERSION = 1
CHECKPOINT_EVERY = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workers (
    worker_id TEXT PRIMARY KEY, role TEXT NOT NULL, hostname TEXT NOT NULL, data_endpoint TEXT NOT NULL,
    registered_at REAL NOT NULL, last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, kind TEXT NOT NULL, launch_player TEXT NOT NULL, players TEXT NOT NULL,
    worker_id TEXT NOT NULL, issued_at REAL NOT NULL, endpoint TEXT NOT NULL) WITHOUT ROWID;
-- A rowid table on purpose: rowid order is commit order, which `load` uses to keep the latest ends.
CREATE TABLE IF NOT EXISTS ended_jobs (
    job_id TEXT PRIMARY KEY, status TEXT NOT NULL, episodes_counted INTEGER NOT NULL, ended_at REAL NOT NULL);
-- Failing collect jobs, per launch player (job_retries.PlayerJobFailures): the backoff survives a restart.
CREATE TABLE IF NOT EXISTS job_failures (
    player_id TEXT PRIMARY KEY, failures_in_a_row INTEGER NOT NULL, jobs_given_up INTEGER NOT NULL,
    last_error TEXT NOT NULL, last_failure_at REAL NOT NULL, held_until REAL NOT NULL) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class Counters:
    """Coordinator-level totals since the league was created (they survive restarts)."""

    jobs_issued: int = 0
    jobs_finished: int = 0
    jobs_expired: int = 0
    jobs_failed: int = 0
    # Collect jobs whose every attempt failed (job_retries.py); their attempts are counted above too.
    jobs_given_up: int = 0
    episodes: int = 0
    env_steps: int = 0

    def plus(self, **deltas: int) -> Counters:
        """These counters with `deltas` added (a few per request: kept cheaper than dataclasses.replace)."""
        unknown = deltas.keys() - _COUNTER_NAMES
        if unknown:
            raise TypeError(f"Counters has no {sorted(unknown)}")
        return Counters(*[getattr(self, name) + deltas.get(name, 0) for name in _COUNTER_NAMES])

    @staticmethod
    def from_json(text: str) -> Counters:
        data = json.loads(text)
        known = {f.name for f in fields(Counters)}
        return Counters(**{k: int(v) for k, v in data.items() if k in known})


_COUNTER_NAMES = tuple(f.name for f in fields(Counters))


@dataclass(frozen=True)
class StoredState:
    created_at: float
    config_digest: str
    league_state: dict[str, Any] | None
    counters: Counters
    workers: tuple[tuple[WorkerInfo, float], ...]  # (info, last seen)
    leases: tuple[Lease[Any], ...]
    # The most recent ends, oldest first (older ones: `LeagueStore.ended`).
    ended: tuple[JobEnd, ...]
    job_failures: tuple[PlayerJobFailures, ...] = ()


class StoreWriter:
    """The changes of one transaction; only valid inside `LeagueStore.transaction()`.

    The plural methods write a whole batch in one statement per table (multi-row VALUES): every statement is a
    round trip into SQLite that lets go of the GIL, and a group commit holds many changes.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def put_worker(self, info: WorkerInfo, last_seen: float) -> None:
        self.put_workers([(info, last_seen)])

    def put_workers(self, workers: Sequence[tuple[WorkerInfo, float]]) -> None:
        self._insert(
            "INSERT OR REPLACE INTO workers VALUES",
            [(i.worker_id, i.role.value, i.hostname, i.data_endpoint, i.registered_at, seen) for i, seen in workers],
        )

    def put_lease(self, lease: Lease[Any]) -> None:
        self.put_leases([lease])

    def put_leases(self, leases: Sequence[Lease[Any]]) -> None:
        """Record jobs in flight. Deadlines are not stored: a restart grants every lease a fresh one."""
        self._insert(
            "INSERT OR REPLACE INTO jobs VALUES",
            [
                (lease.job_id, lease.kind.value, lease.launch_player, json.dumps(list(lease.players)),
                 lease.worker_id, lease.issued_at, lease.endpoint)
                for lease in leases
            ],
        )

    def put_end(self, end: JobEnd) -> None:
        self.put_ends([end])

    def put_ends(self, ends: Sequence[JobEnd]) -> None:
        """Jobs ended: they leave the in-flight table and their ids are remembered (in this order)."""
        for chunk in _chunks(ends):
            self._conn.execute(
                f"DELETE FROM jobs WHERE job_id IN ({', '.join('?' * len(chunk))})", [e.job_id for e in chunk]
            )
        self._insert(
            "INSERT INTO ended_jobs VALUES",
            [(e.job_id, e.status.value, e.episodes_counted, e.ended_at) for e in ends],
        )

    def put_job_failures(self, record: PlayerJobFailures) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO job_failures VALUES (?, ?, ?, ?, ?, ?)",
            (record.player_id, record.failures_in_a_row, record.jobs_given_up, record.last_error,
             record.last_failure_at, record.held_until),
        )

    def put_league_state(self, state: dict[str, Any]) -> None:
        self.put_state(state, None)

    def put_counters(self, counters: Counters) -> None:
        self.put_state(None, counters)

    def put_state(self, state: dict[str, Any] | None, counters: Counters | None) -> None:
        """The league state and/or the counters (None: unchanged), in one statement."""
        rows = []
        if state is not None:
            rows.append(("league_state", json.dumps(state, separators=(",", ":"), allow_nan=False)))
        if counters is not None:
            rows.append(("counters", json.dumps(vars(counters))))
        self._insert("INSERT OR REPLACE INTO meta VALUES", rows)

    def _insert(self, head: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """`head` (an INSERT ... VALUES) with `rows`, a few hundred rows per statement."""
        if not rows:
            return
        one = f"({', '.join('?' * len(rows[0]))})"
        for chunk in _chunks(rows):
            self._conn.execute(f"{head} {', '.join([one] * len(chunk))}", [v for row in chunk for v in row])


_CHUNK_ROWS = 200  # rows per statement: well below SQLite's bound-parameter limit with 7 columns


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), _CHUNK_ROWS):
        yield items[start:start + _CHUNK_ROWS]


class LeagueStore:
    """One SQLite file; `transaction()` serialises writers and commits all-or-nothing."""

    def __init__(self, path: str | Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._conn.executescript(_SCHEMA)
        self._checkpoint_due = threading.Condition(self._lock)
        self._commits = 0
        self._stopping = False
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, args=(sqlite3.connect(self.path, check_same_thread=False),),
            name="sqlite-checkpoint", daemon=True,
        )
        self._checkpointer.start()
        self._closed = False
        with self.transaction() as _:
            version = self._meta("schema_version")
            if version is None:
                self._conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(version) != SCHEMA_VERSION:
                raise ValueError(f"state: {self.path} has schema version {version}, expected {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[StoreWriter]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield StoreWriter(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            self._commits += 1
            if self._commits >= CHECKPOINT_EVERY:
                self._checkpoint_due.notify()

    def initialise(self, config_digest: str, now: float | None = None) -> float:
        """Mark a new store as created now with this config; returns created_at (also of an existing store)."""
        with self.transaction() as _:
            if self._meta("created_at") is None:
                created = time.time() if now is None else now
                self._conn.executemany(
                    "INSERT INTO meta VALUES (?, ?)", [("created_at", repr(created)), ("config_digest", config_digest)]
                )
            return float(self._meta("created_at"))

    def load(self, recent_ends: int = 100_000) -> StoredState | None:
        """Everything stored (of the ended jobs, the `recent_ends` latest), or None for a fresh store."""
        with self._lock:
            created_at = self._meta("created_at")
            if created_at is None:
                return None
            league_state = self._meta("league_state")
            counters = self._meta("counters")
            workers = tuple(
                (WorkerInfo(wid, WorkerRole(role), host, endpoint, registered), last_seen)
                for wid, role, host, endpoint, registered, last_seen in self._conn.execute(
                    "SELECT * FROM workers ORDER BY registered_at, worker_id"
                )
            )
            leases = tuple(
                Lease(
                    job_id=job_id,
                    kind=JobKind(kind),
                    launch_player=launch,
                    players=tuple(json.loads(players)),
                    worker_id=worker_id,
                    issued_at=issued_at,
                    deadline=float("nan"),
                    endpoint=endpoint,
                )
                for job_id, kind, launch, players, worker_id, issued_at, endpoint in self._conn.execute(
                    "SELECT * FROM jobs ORDER BY issued_at, job_id"
                )
            )
            rows = self._conn.execute(
                "SELECT * FROM ended_jobs ORDER BY rowid DESC LIMIT ?", (recent_ends,)
            ).fetchall()
            ended = tuple(JobEnd(job_id, JobEndStatus(status), count, at) for job_id, status, count, at in reversed(rows))
            job_failures = tuple(
                PlayerJobFailures(*row) for row in self._conn.execute("SELECT * FROM job_failures ORDER BY player_id")
            )
            return StoredState(
                created_at=float(created_at),
                config_digest=self._meta("config_digest") or "",
                league_state=json.loads(league_state) if league_state is not None else None,
                counters=Counters.from_json(counters) if counters is not None else Counters(),
                workers=workers,
                leases=leases,
                ended=ended,
                job_failures=job_failures,
            )

    def ended(self, job_id: str) -> JobEnd | None:
        """How an (older) job ended, looked up by id; None if it never did."""
        with self._lock:
            row = self._conn.execute("SELECT * FROM ended_jobs WHERE job_id = ?", (job_id,)).fetchone()
        return JobEnd(row[0], JobEndStatus(row[1]), row[2], row[3]) if row is not None else None

    def close(self) -> None:
        """Close the connection (idempotent). Writes nothing: a crash and a close leave the same store."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._stopping = True
            self._checkpoint_due.notify()
        self._checkpointer.join()
        with self._lock:
            self._conn.close()

    def _checkpoint_loop(self, conn: sqlite3.Connection) -> None:
        """Fold the WAL back into the database file when enough commits piled up (PASSIVE: writers go on)."""
        try:
            while True:
                with self._lock:
                    self._checkpoint_due.wait_for(lambda: self._stopping or self._commits >= CHECKPOINT_EVERY)
                    if self._stopping:
                        return
                    self._commits = 0
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row is not None else None
