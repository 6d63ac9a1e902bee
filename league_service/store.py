"""Durable coordinator state in SQLite (WAL mode): what must survive a `kill -9` of the coordinator.

Stored: the league core's state (players, payoff, ratings, snapshots: `state_dict()`), the counters, the worker
registry (with each worker's last-seen time), the jobs in flight (leases, with the `episode_num` each collect job
was granted with, which its finish is held to) and the ids of ended jobs. Every change
the coordinator accepts is written in one transaction with the league state it produced, so after a crash the
store holds either all of an accepted FinishJob or none of it.

The league state is stored as parts (league_state.py): a header row, and one row per player, payoff record
and rating, so a FinishJob writes the header, one payoff record and two ratings, not the whole league (which
grows with the square of its players). `load` assembles `state_dict()` again. They live in one WITHOUT ROWID
table with the counters (`state_parts`): the rows a commit changes share a b-tree, so a commit writes few pages.
A whole document written with `put_league_state` (schema 1 stored only that) is kept as one row of `meta` until
the league's first complete changes replace it.

A transaction writes one statement per table it changes (multi-row), and few tables change per commit: every
call into SQLite lets go of the GIL and must win it back, which costs more under load than SQLite's own work.

Durability: WAL with `synchronous=NORMAL` survives a process crash (every commit is in the OS before the reply
goes out); pass `fsync=True` (`synchronous=FULL`) to also survive power loss, at the cost of one flush per
commit. WAL checkpoints (which flush the disk, ~30 ms to seconds on a slow virtual disk) run on a background
thread with its own connection every CHECKPOINT_EVERY commits, so no request waits for one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import json.encoder
import logging
import os
import shlex
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from common.exclusive_lock import ExclusiveLock
from league_service.job_retries import PlayerJobFailures
from league_service.league_state import (
    PAYOFF,
    PLAYERS,
    RATINGS,
    LeagueStateChanges,
    assemble_state,
    payoff_record_key,
)
from league_service.leases import JobEnd, JobEndStatus, JobKind, Lease, WorkerInfo, WorkerRole

log = logging.getLogger(__name__)

# 2: the league state in parts and the counters in `state_parts`; 3: a job in flight keeps the `episode_num` it
# was granted with (NULL in the jobs of an upgraded store); 4: and its players' reset generations when leased
# (NULL likewise: a restart counted a job's results played by weights a reset had replaced, a review). Older
# stores are upgraded when opened.
SCHEMA_VERSION = 4
STATE_LOCK_SUFFIX = ".lock"
"""The state file's lock (`ExclusiveLock`) is `<state file><this>`, beside the file its path resolves to."""
STATE_SIDE_FILES = ("-wal", "-shm", "-journal", STATE_LOCK_SUFFIX)
"""The suffixes of the files kept beside the state file: SQLite's and the lock (no checkpoint; removed with a state a
failed start made)."""
CHECKPOINT_EVERY = 500
WAL_MAX_BYTES = 64 * 1024 * 1024
"""How large the WAL may grow before a checkpoint holds writers back to start it over. A PASSIVE checkpoint
lets writers go on, but SQLite starts the WAL over only when a checkpoint caught up with every commit, which
under steady commits never happens: the WAL then grew without end (measured: 450 MB from 42k commits in 20 s;
37 MB in 20 minutes of the default league). A RESTART checkpoint after such a PASSIVE one has little left to
copy; it holds the store's writers back for that and one flush of the disk (65-115 ms measured, against 200 ms
for TRUNCATE, which also shrinks the file), only as often as commits fill this. The WAL file then stays at
about this size, reused from its start."""
COUNTER_LIMIT = 2**63 - 1  # the int64 of the status reply
KEEP_ENDED_JOBS = 1_000_000
"""Ended job ids kept to answer a retried FinishJob as a duplicate; older rows are deleted (a finish for one of
them is then NOT_FOUND instead, and still never counted). A retry comes within seconds; a million is many hours
of a busy league (the default league on 2 cores ends ~30k jobs an hour), so the table stops growing forever."""
PRUNE_ENDS_EVERY = 1_000
"""Commits between two prunes of ended_jobs (each a rowid-range delete inside a commit's transaction)."""
SQLITE_MAX_PATH_BYTES = 504
"""The longest path of a database SQLite opens: its unix VFS takes paths of at most 512 bytes (MAX_PATHNAME)
with room for the 8 of a "-journal" suffix, and it counts the path with its symlinks resolved. A longer one
failed with SQLite's bare "unable to open database file", which does not say why."""

# meta key of a whole league state document (put_league_state; schema 1 stored the league state so).
_WHOLE_STATE = "league_state"
# meta key of what the league's checkpoints and payoff are bound to (league_identity.LeagueIdentity, as JSON).
_IDENTITY = "league_identity"
# meta key of a digest per section of the config the league last started with (JSON), to say which changed.
_CONFIG_SECTIONS = "config_sections"
# state_parts: the parts besides the league's collections (key ""), and which parts make up the league state.
_COUNTERS = "counters"
_HEADER = "header"
_LEAGUE_PARTS = (_HEADER, PLAYERS, PAYOFF, RATINGS)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workers (
    worker_id TEXT PRIMARY KEY, role TEXT NOT NULL, hostname TEXT NOT NULL, data_endpoint TEXT NOT NULL,
    registered_at REAL NOT NULL, last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, kind TEXT NOT NULL, launch_player TEXT NOT NULL, players TEXT NOT NULL,
    worker_id TEXT NOT NULL, issued_at REAL NOT NULL, endpoint TEXT NOT NULL,
    episode_num INTEGER, generations TEXT) WITHOUT ROWID; -- last: where ALTER TABLE adds them to an older store
    -- (NULL: not stored)
-- A rowid table on purpose: rowid order is commit order, which `load` uses to keep the latest ends.
CREATE TABLE IF NOT EXISTS ended_jobs (
    job_id TEXT PRIMARY KEY, status TEXT NOT NULL, episodes_counted INTEGER NOT NULL, ended_at REAL NOT NULL);
-- An ended job leaves the jobs in flight in the same statement (one call into SQLite less per commit).
CREATE TRIGGER IF NOT EXISTS job_ended AFTER INSERT ON ended_jobs
BEGIN DELETE FROM jobs WHERE job_id = NEW.job_id; END;
-- Failing collect jobs, per launch player (job_retries.PlayerJobFailures): the backoff survives a restart.
CREATE TABLE IF NOT EXISTS job_failures (
    player_id TEXT PRIMARY KEY, failures_in_a_row INTEGER NOT NULL, jobs_given_up INTEGER NOT NULL,
    last_error TEXT NOT NULL, last_failure_at REAL NOT NULL, held_until REAL NOT NULL) WITHOUT ROWID;
-- What changes with (nearly) every commit, one row per part: 'counters' and the league state's 'header' (key
-- ""), and the league state's collections one row per item (league_state.py): 'players' (key: player id, seq:
-- position), 'payoff' (key: the record's players as JSON), 'ratings' (key: player id).
CREATE TABLE IF NOT EXISTS state_parts (
    part TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (part, key)) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class Counters:
    """Coordinator-level totals since the league was created (they survive restarts). A total stops at
    COUNTER_LIMIT: past it, no status reply could carry it (int64)."""

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
        values = dict(self.__dict__)
        for name, delta in deltas.items():
            if name not in values:
                raise TypeError(f"Counters has no {name!r}")
            values[name] = min(values[name] + delta, COUNTER_LIMIT)
        return Counters(**values)

    @staticmethod
    def from_json(text: str) -> Counters:
        data = json.loads(text)
        known = {f.name for f in fields(Counters)}
        return Counters(**{k: int(v) for k, v in data.items() if k in known})


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

    def delete_workers(self, worker_ids: Sequence[str]) -> None:
        for start in range(0, len(worker_ids), _CHUNK_ROWS):
            chunk = worker_ids[start : start + _CHUNK_ROWS]
            self._conn.execute(f"DELETE FROM workers WHERE worker_id IN ({','.join('?' * len(chunk))})", chunk)

    def prune_ended_jobs(self, keep: int) -> None:
        """Delete all but the newest `keep` ended jobs (rowid order is commit order: a cheap range delete)."""
        self._conn.execute("DELETE FROM ended_jobs WHERE rowid <= (SELECT max(rowid) FROM ended_jobs) - ?", (keep,))

    def put_lease(self, lease: Lease[Any]) -> None:
        self.put_leases([lease])

    def put_leases(self, leases: Sequence[Lease[Any]]) -> None:
        """Record jobs in flight. Deadlines are not stored: a restart grants every lease a fresh one."""
        self._insert(
            "INSERT OR REPLACE INTO jobs VALUES",
            [
                (x.job_id, x.kind.value, x.launch_player, _dumps(list(x.players)), x.worker_id, x.issued_at, x.endpoint,
                 x.episode_num, None if x.generations is None else _dumps(list(x.generations)))
                for x in leases
            ],
        )

    def put_end(self, end: JobEnd) -> None:
        self.put_ends([end])

    def put_ends(self, ends: Sequence[JobEnd]) -> None:
        """Jobs ended: their ids are remembered (in this order) and they leave the in-flight table (trigger)."""
        self._insert(
            "INSERT INTO ended_jobs VALUES", [(e.job_id, e.status.value, e.episodes_counted, e.ended_at) for e in ends]
        )

    def put_job_failures(self, record: PlayerJobFailures) -> None:
        self._insert(
            "INSERT OR REPLACE INTO job_failures VALUES",
            [(record.player_id, record.failures_in_a_row, record.jobs_given_up, record.last_error,
              record.last_failure_at, record.held_until)],
        )

    def put_league_state(self, state: dict[str, Any]) -> None:
        """A whole league state document, replacing whatever league state was stored."""
        self.put_state(state, None)

    def put_league_changes(self, changes: LeagueStateChanges) -> None:
        """What changed in the league's state since the last changes written (all of it when `complete`)."""
        self.put_state(changes, None)

    def put_counters(self, counters: Counters) -> None:
        self.put_state(None, counters)

    def put_state(self, state: dict[str, Any] | LeagueStateChanges | None, counters: Counters | None) -> None:
        """The league state (a whole document, or changes) and/or the counters (None: unchanged): one statement
        for the parts and counters (a whole document, or replacing the stored state, takes more)."""
        parts: list[tuple[str, str, int, str]] = []
        if isinstance(state, LeagueStateChanges):
            if state.complete:
                self._drop_league_state()
            parts.append((_HEADER, "", 0, _dumps(state.header)))
            parts.extend((PLAYERS, p["player_id"], i, _dumps(p)) for i, p in state.players)
            parts.extend((PAYOFF, payoff_record_key(r), 0, _dumps(r)) for r in state.payoff_records)
            parts.extend((RATINGS, pid, 0, _dumps(r)) for pid, r in state.ratings)
        elif state is not None:
            if not isinstance(state, dict):
                raise TypeError(f"state: expected a dict, got {type(state).__name__}")
            document = _dumps(state)
            self._drop_league_state()
            self._conn.execute("INSERT INTO meta VALUES (?, ?)", (_WHOLE_STATE, document))
        if counters is not None:
            parts.append((_COUNTERS, "", 0, _dumps(vars(counters))))
        self._insert("INSERT OR REPLACE INTO state_parts VALUES", parts)

    def _drop_league_state(self) -> None:
        """Whatever league state is stored goes: its parts, or a whole document."""
        self._conn.execute(
            f"DELETE FROM state_parts WHERE part IN ({', '.join('?' * len(_LEAGUE_PARTS))})", _LEAGUE_PARTS
        )
        self._conn.execute("DELETE FROM meta WHERE key = ?", (_WHOLE_STATE,))

    def _insert(self, head: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """`head` (an INSERT ... VALUES) with `rows`, a few hundred rows per statement."""
        if not rows:
            return
        columns = len(rows[0])
        for start in range(0, len(rows), _CHUNK_ROWS):
            chunk = rows[start:start + _CHUNK_ROWS] if len(rows) > _CHUNK_ROWS else rows
            self._conn.execute(_values_sql(head, columns, len(chunk)), [v for row in chunk for v in row])


_CHUNK_ROWS = 200  # rows per statement: well below SQLite's bound-parameter limit with 8 columns


@functools.lru_cache(maxsize=256)
def _values_sql(head: str, columns: int, rows: int) -> str:
    one = f"({', '.join('?' * columns)})"
    return f"{head} {', '.join([one] * rows)}"


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# JSON as stored: compact, and NaN or infinity refused (they would not load back as numbers). Several rows are
# encoded per commit, so the C encoder is made once (json.dumps makes one per call) and called directly.
_C_ENCODER = json.encoder.c_make_encoder
if _C_ENCODER is not None:
    _encode = _C_ENCODER(None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False)

    def _dumps(value: Any) -> str:
        return "".join(_encode(value, 0))
else:  # an interpreter without the C accelerator
    _dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def read_league_state(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The league state a store file holds (None: none yet), read with `conn` (e.g. a read-only connection to
    a running coordinator's file; call it inside one read transaction for a consistent view)."""
    whole = conn.execute("SELECT value FROM meta WHERE key = ?", (_WHOLE_STATE,)).fetchone()
    if whole is not None:
        return json.loads(whole[0])
    rows: dict[str, list[tuple[str, Any]]] = {part: [] for part in _LEAGUE_PARTS}
    for part, key, value in conn.execute(
        "SELECT part, key, value FROM state_parts WHERE part IN (?, ?, ?, ?) ORDER BY part, seq, key", _LEAGUE_PARTS
    ):
        rows[part].append((key, json.loads(value)))
    if not rows[_HEADER]:
        return None
    ((_, header),) = rows[_HEADER]
    return assemble_state(header, [p for _, p in rows[PLAYERS]], rows[PAYOFF], rows[RATINGS])


def stored_league_type(path: str | Path) -> str | None:
    """The `league_type` of the league a store file holds, read from its header without opening the store (no
    lock taken, nothing written); None when there is no such file or no league in it yet. `league run` checks
    it against the config before it starts a coordinator on the file. sqlite3.DatabaseError for a file that is
    not a store."""
    path = Path(path)
    if not path.is_file():
        return None
    conn = _connect_read_only(path)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        header: Any = None
        if "meta" in tables:
            whole = conn.execute("SELECT value FROM meta WHERE key = ?", (_WHOLE_STATE,)).fetchone()
            header = json.loads(whole[0]) if whole is not None else None
        if header is None and "state_parts" in tables:
            row = conn.execute("SELECT value FROM state_parts WHERE part = ? AND key = ''", (_HEADER,)).fetchone()
            header = json.loads(row[0]) if row is not None else None
    finally:
        conn.close()
    league_type = header.get("league_type") if isinstance(header, dict) else None
    return league_type if isinstance(league_type, str) else None


def stored_league_trained(path: str | Path) -> bool:
    """Whether the league a store file holds has played a game or has a checkpoint (`has_trained`), read without
    opening the store (as `stored_league_type`). True when that cannot be told: the caller then keeps to what a
    trained league may do."""
    try:
        conn = _connect_read_only(path)
        try:
            with conn:  # one read transaction: a consistent view of a running coordinator's file
                conn.execute("BEGIN")
                return has_trained(read_league_state(conn), read_counters(conn))
        finally:
            conn.close()
    except (sqlite3.Error, OSError, ValueError):
        return True


def _connect_read_only(path: str | Path) -> sqlite3.Connection:
    """A connection that cannot write (nor create) the store file: for reading one a coordinator may hold."""
    return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)


def has_trained(league_state: dict[str, Any] | None, counters: Counters | None) -> bool:
    """Whether a league played a game or any of its players has a checkpoint. One that has not (a first run whose
    env did not build) is bound to no env or network yet: a config of another may still take it over."""
    if counters is not None and (counters.episodes or counters.env_steps):
        return True
    players = (league_state or {}).get(PLAYERS) or []
    return any(isinstance(p, dict) and p.get("checkpoint_path") for p in players)


def read_counters(conn: sqlite3.Connection) -> Counters | None:
    """The counters a store file holds (None: none yet), read with `conn` (as `read_league_state`)."""
    row = conn.execute("SELECT value FROM state_parts WHERE part = ? AND key = ''", (_COUNTERS,)).fetchone()
    return Counters.from_json(row[0]) if row is not None else None


class _Transaction:
    """The context manager of `LeagueStore.transaction` (a class: a generator-based one costs more, and every
    commit opens one)."""

    __slots__ = ("_store",)

    def __init__(self, store: LeagueStore) -> None:
        self._store = store

    def __enter__(self) -> StoreWriter:
        return self._store._begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._store._end(commit=exc_type is None)


def _refuse_hard_links(path: Path) -> None:
    """Refuse a state file with more than one name (a hard link). The lock beside the file and SQLite's -wal and
    -shm files are all named after the name it was opened by: through another name a second coordinator took
    another lock and served the same database beside the first, each with its own WAL, and even one at a time
    each name's WAL holds commits the other name never sees. Not keyed on the inode instead: that would share
    the lock, not the WAL."""
    try:
        links = os.stat(path).st_nlink
    except FileNotFoundError:
        return  # a new state: SQLite makes it, with one name
    if links > 1:
        raise ValueError(f"it has {links} names (hard links): SQLite keeps its WAL beside the name a database is "
                         "opened by, so each name would have its own and coordinators on them would overwrite each "
                         "other's commits; remove the other names (`find / -xdev -samefile "
                         f"{shlex.quote(str(path))}` lists them; a symlink is fine)")


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file (an empty file is one too, to SQLite: a new database)."""


def _refuse_foreign_file(path: Path) -> None:
    """Refuse an existing file that is no SQLite database before anything is made beside it: SQLite said only
    "file is not a database", and after the lock file had been left next to the user's file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # (reading a FIFO would wait for a writer)
            return
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError:
        return  # a new state, or a problem the checks that follow word better
    if head and head != SQLITE_HEADER:
        raise ValueError(f"not an SQLite database (it begins {head!r}): not taken over; give the league's state "
                         "file, or a new --state path")


class LeagueStore:
    """One SQLite file; `transaction()` serialises writers and commits all-or-nothing."""

    def __init__(
        self, path: str | Path, *, fsync: bool = False, keep_ended_jobs: int = KEEP_ENDED_JOBS,
        prune_ends_every: int = PRUNE_ENDS_EVERY, wal_max_bytes: int = WAL_MAX_BYTES,
    ) -> None:
        if keep_ended_jobs < 1 or prune_ends_every < 1:
            raise ValueError(f"keep_ended_jobs and prune_ends_every must be >= 1, got {keep_ended_jobs}, "
                             f"{prune_ends_every}")
        self._wal_max_bytes = wal_max_bytes
        self._keep_ended_jobs = keep_ended_jobs
        self._prune_ends_every = prune_ends_every
        self._commits_since_prune = 0
        self.path = Path(path)
        if self.path.is_dir():  # (SQLite said only "unable to open database file", after a stray DIR.lock was made)
            raise ValueError(f"{self.path} is a directory, not a state file (such as "
                             f"{self.path / 'league_state.sqlite'})")
        # Before anything is made: a refused path left its folders and a stray lock file behind.
        if (length := len(os.fsencode(os.path.realpath(self.path)))) > SQLITE_MAX_PATH_BYTES:
            raise ValueError(f"its path is {length} bytes long (symlinks resolved: {os.path.realpath(self.path)}); "
                             f"SQLite opens no database whose path is longer than {SQLITE_MAX_PATH_BYTES} bytes: "
                             "give a shorter path (league run: a shorter --run-dir; league coordinator: --state)")
        _refuse_foreign_file(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One process per state file: a second coordinator would keep its own league in memory and overwrite
        # this one's commits. Held until close() or the process's exit (kill -9 included).
        # The lock sits beside the file the path resolves to: a --state given through a symlink (to the file or
        # to a folder above it) names the same database, WAL and all, so it must meet the same lock. A hard link
        # does not: it is refused below (_refuse_hard_links).
        real = self.real_path = Path(os.path.realpath(self.path))
        self._file_lock = ExclusiveLock(real.with_name(real.name + STATE_LOCK_SUFFIX), f"state {self.path}")
        self._lock = threading.Lock()
        self._checkpoint_due = threading.Condition(self._lock)
        self._commits = 0
        self._stopping = False
        self._closed = True  # until fully open
        try:
            # SQLite opens a file it may not write (its mode, a read-only mount) read-only without a word, and a
            # restore writes nothing: the coordinator served, SERVING, until its first commit failed (exit 1, so
            # a supervisor restarted it into the same failure). Asked without writing (a full disk is not a
            # reason to refuse: it may pass, and a commit that meets it exits 1, to be restarted).
            effective = os.access in os.supports_effective_ids
            if self.path.exists() and not os.access(self.path, os.W_OK, effective_ids=effective):
                raise ValueError(f"cannot write {self.path} (a read-only file or filesystem): not opened, since "
                                 "nothing acknowledged could be stored")
            _refuse_hard_links(self.path)
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                self._open_schema(fsync)
                # A short busy timeout: a RESTART checkpoint waits for readers (an operator's sqlite3 shell, a
                # backup) while it holds the store's writers back; past it, it gives up until the next one.
                # (Opened in here: one that failed, out of file descriptors, left the store's lock held.)
                checkpoint_conn = sqlite3.connect(self.path, timeout=0.2, check_same_thread=False)
            except BaseException:
                self._conn.close()
                raise
        except BaseException:
            self._file_lock.release()
            raise
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, args=(checkpoint_conn,), name="sqlite-checkpoint", daemon=True,
        )
        self._checkpointer.start()
        self._closed = False

    def _open_schema(self, fsync: bool) -> None:
        tables = {name for (name,) in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "meta" not in tables:  # every store of ours, however old or half made, begins with meta
            raise ValueError(f"an SQLite database of something else (tables: {', '.join(sorted(tables)[:8])}); "
                             "not taken over: give a new --state path")
        # A newer coordinator's store is refused before anything of it is changed (it was switched to WAL and
        # given this version's tables first).
        if "meta" in tables and (newer := self._meta("schema_version")) is not None and int(newer) > SCHEMA_VERSION:
            raise ValueError(f"state: {self.path} has schema version {newer}, expected {SCHEMA_VERSION} (a newer "
                             "coordinator's): not changed")
        (mode,) = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if str(mode).lower() != "wal":  # (SQLite keeps its old mode where WAL cannot be used, silently)
            log.warning("state: %s is in journal mode %r, not WAL (this filesystem does not support it?): commits "
                        "are durable, but each blocks readers", self.path, mode)
        self._conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._conn.executescript(_SCHEMA)
        with self._sql_transaction():
            version = self._meta("schema_version")
            if version is None or int(version) in (1, 2, 3):
                if version is None or int(version) == 1:
                    # Schema 1 kept the counters in meta (moved here); its whole-document league state is read as is.
                    self._conn.execute(
                        "INSERT OR IGNORE INTO state_parts SELECT ?, '', 0, value FROM meta WHERE key = ?",
                        (_COUNTERS, _COUNTERS),
                    )
                    self._conn.execute("DELETE FROM meta WHERE key = ?", (_COUNTERS,))
                # Schemas 1 and 2 did not keep a job's episode_num, 1-3 its generations: their jobs in flight keep
                # NULL (not checked; counted as before generations). Added in column order.
                columns = {row[1] for row in self._conn.execute("PRAGMA table_info(jobs)")}
                if "episode_num" not in columns:
                    self._conn.execute("ALTER TABLE jobs ADD COLUMN episode_num INTEGER")
                if "generations" not in columns:
                    self._conn.execute("ALTER TABLE jobs ADD COLUMN generations TEXT")
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(version) != SCHEMA_VERSION:
                raise ValueError(f"state: {self.path} has schema version {version}, expected {SCHEMA_VERSION}")

    def transaction(self) -> _Transaction:
        """`with store.transaction() as tx:` writes through `tx` commit together, or not at all."""
        return _Transaction(self)

    def put_leases_alone(self, leases: Sequence[Lease[Any]]) -> None:
        """`put_leases` as a transaction of its own: one statement, so no BEGIN and COMMIT round trips (jobs
        granted alone are the commonest commit when few workers are busy)."""
        if not leases:
            return
        if len(leases) > _CHUNK_ROWS:  # more than one statement
            with self.transaction() as tx:
                tx.put_leases(leases)
            return
        with self._lock:
            StoreWriter(self._conn).put_leases(leases)  # autocommit: the statement is its transaction
            self._commits += 1
            if self._commits >= CHECKPOINT_EVERY:
                self._checkpoint_due.notify()

    def _begin(self) -> StoreWriter:
        self._lock.acquire()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        writer = StoreWriter(self._conn)
        self._commits_since_prune += 1
        if self._commits_since_prune >= self._prune_ends_every:  # with this transaction's changes
            self._commits_since_prune = 0
            try:
                writer.prune_ended_jobs(self._keep_ended_jobs)
            except BaseException:
                self._end(commit=False)
                raise
        return writer

    def _end(self, commit: bool) -> None:
        try:
            if commit:
                self._conn.execute("COMMIT")
                self._commits += 1
                if self._commits >= CHECKPOINT_EVERY:
                    self._checkpoint_due.notify()
        finally:
            try:
                # SQLite rolls a transaction back itself on some errors (a full disk, an I/O error): a ROLLBACK
                # then fails, and its "no transaction is active" would hide the error that matters.
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            finally:
                self._lock.release()

    @contextlib.contextmanager
    def _sql_transaction(self) -> Iterator[None]:
        """A transaction of plain statements on `_conn` (setting a store up: reads and writes)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self._conn.in_transaction:  # (see _end)
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def initialise(self, config_digest: str, now: float | None = None) -> float:
        """Mark a new store as created now with this config; returns created_at (also of an existing store)."""
        with self._sql_transaction():
            if self._meta("created_at") is None:
                created = time.time() if now is None else now
                self._conn.executemany(
                    "INSERT INTO meta VALUES (?, ?)", [("created_at", repr(created)), ("config_digest", config_digest)]
                )
            return float(self._meta("created_at"))

    def identity(self) -> str | None:
        """What the league is bound to (`LeagueIdentity` as JSON), or None: a new store, or one written before
        stores kept it."""
        with self._lock:
            return self._meta(_IDENTITY)

    def put_identity(self, identity: str) -> None:
        with self._sql_transaction():
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (_IDENTITY, identity))

    def config_sections(self) -> dict[str, str] | None:
        """A digest per section of the config the league last started with, or None: a new store, or one written
        before stores kept them (or a value that is not one)."""
        with self._lock:
            text = self._meta(_CONFIG_SECTIONS)
        try:
            sections = json.loads(text) if text is not None else None
        except ValueError:
            return None
        if not (isinstance(sections, dict) and all(isinstance(v, str) for v in sections.values())):
            return None
        return sections

    def put_config_sections(self, sections: dict[str, str]) -> None:
        with self._sql_transaction():
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                               (_CONFIG_SECTIONS, json.dumps(sections, sort_keys=True)))

    def load(self, recent_ends: int = 100_000) -> StoredState | None:
        """Everything stored (of the ended jobs, the `recent_ends` latest), or None for a fresh store."""
        with self._lock:
            created_at = self._meta("created_at")
            if created_at is None:
                return None
            league_state = read_league_state(self._conn)
            counters = read_counters(self._conn)
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
                    episode_num=episode_num,
                    generations=None if generations is None else tuple(json.loads(generations)),
                )
                for (job_id, kind, launch, players, worker_id, issued_at, endpoint, episode_num,
                     generations) in self._conn.execute("SELECT * FROM jobs ORDER BY issued_at, job_id")
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
                league_state=league_state,
                counters=counters if counters is not None else Counters(),
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
        self._file_lock.release()

    def _checkpoint_loop(self, conn: sqlite3.Connection) -> None:
        """Fold the WAL back into the database file when enough commits piled up (PASSIVE: writers go on), and
        start it over when it grew past `wal_max_bytes` (see WAL_MAX_BYTES). A failed checkpoint is logged and
        tried again at the next due one: the commits are safe in the WAL meanwhile."""
        try:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            while True:
                with self._lock:
                    self._checkpoint_due.wait_for(lambda: self._stopping or self._commits >= CHECKPOINT_EVERY)
                    if self._stopping:
                        return
                    self._commits = 0
                try:
                    _, wal_frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if wal_frames * page_size > self._wal_max_bytes:
                        with self._lock:
                            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                        if busy:
                            log.warning("the state's WAL %s-wal is over %d MB and could not start over: another "
                                        "process is reading the database (tried again later)", self.path,
                                        self._wal_max_bytes // 2**20)
                except sqlite3.Error as exc:
                    log.warning("checkpoint of the state's WAL %s-wal failed (tried again later): %s", self.path, exc)
        finally:
            conn.close()

    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row is not None else None
