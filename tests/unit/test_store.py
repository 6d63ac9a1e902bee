import sqlite3
from dataclasses import replace

import pytest

from league_service.leases import JobEnd, JobEndStatus, JobKind, Lease, WorkerInfo, WorkerRole
from league_service.store import CHECKPOINT_EVERY, COUNTER_LIMIT, Counters, LeagueStore, has_trained


def lease(job_id: str, kind=JobKind.COLLECT) -> Lease[None]:
    return Lease(job_id, kind, "main", ("main", "hist"), "actor-1", 1.0, 2.0, "10.0.0.1:7000")


def test_fresh_store_loads_nothing_until_initialised(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    try:
        assert store.load() is None
        assert store.initialise("digest", now=5.0) == 5.0
        assert store.initialise("other", now=9.0) == 5.0
        state = store.load()
        assert state.created_at == 5.0 and state.config_digest == "digest"
        assert state.league_state is None and state.counters == Counters()
    finally:
        store.close()


def test_round_trip_survives_reopen_and_uses_wal(tmp_path):
    path = tmp_path / "state.sqlite"
    store = LeagueStore(path)
    store.initialise("d")
    worker = WorkerInfo("actor-1", WorkerRole.ACTOR, "host", "", 1.0)
    with store.transaction() as tx:
        tx.put_worker(worker, last_seen=3.0)
        tx.put_lease(lease("j1"))
        tx.put_lease(lease("j2", JobKind.LEARN))
        tx.put_league_state({"players": ["main"], "payoff": {"main": 1}})
        tx.put_counters(Counters(jobs_issued=2))
    with store.transaction() as tx:
        tx.put_end(JobEnd("j1", JobEndStatus.COMPLETED, 4, 6.0))
    store.close()
    store.close()  # idempotent

    again = LeagueStore(path)
    try:
        state = again.load()
        assert state.workers == ((worker, 3.0),)
        assert [x.job_id for x in state.leases] == ["j2"]
        restored = state.leases[0]
        assert restored.kind is JobKind.LEARN and restored.players == ("main", "hist")
        assert restored.endpoint == "10.0.0.1:7000"
        assert state.ended == (JobEnd("j1", JobEndStatus.COMPLETED, 4, 6.0),)
        assert state.league_state == {"players": ["main"], "payoff": {"main": 1}}
        assert state.counters.jobs_issued == 2
    finally:
        again.close()
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_a_failed_transaction_leaves_nothing(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    try:
        store.initialise("d")
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.put_lease(lease("j1"))
            tx.put_counters(Counters(jobs_issued=1))
            raise RuntimeError("boom")
        state = store.load()
        assert state.leases == () and state.counters == Counters()
    finally:
        store.close()


def test_an_ended_job_cannot_end_twice(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    try:
        store.initialise("d")
        with store.transaction() as tx:
            tx.put_end(JobEnd("j1", JobEndStatus.EXPIRED, 0, 1.0))
        with pytest.raises(sqlite3.IntegrityError), store.transaction() as tx:
            tx.put_end(JobEnd("j1", JobEndStatus.COMPLETED, 2, 2.0))
        assert store.load().ended == (JobEnd("j1", JobEndStatus.EXPIRED, 0, 1.0),)
    finally:
        store.close()


def test_non_finite_league_state_is_refused(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    try:
        with pytest.raises(ValueError), store.transaction() as tx:
            tx.put_league_state({"elo": float("nan")})
    finally:
        store.close()


def test_load_keeps_the_latest_ends_and_older_ones_are_looked_up(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    try:
        store.initialise("d")
        for i in range(5):
            with store.transaction() as tx:
                tx.put_end(JobEnd(f"z{i}", JobEndStatus.COMPLETED, i, float(i)))
        assert [e.job_id for e in store.load(recent_ends=2).ended] == ["z3", "z4"]
        assert store.ended("z0") == JobEnd("z0", JobEndStatus.COMPLETED, 0, 0.0)
        assert store.ended("nope") is None
    finally:
        store.close()


def test_ended_jobs_are_pruned_to_the_newest_and_a_failed_commit_prunes_nothing(tmp_path):
    """The table of ended job ids (for duplicate finishes) must not grow for as long as the league runs."""
    store = LeagueStore(tmp_path / "state.sqlite", keep_ended_jobs=10, prune_ends_every=7)
    try:
        store.initialise("d")
        for i in range(60):
            with store.transaction() as tx:
                tx.put_end(JobEnd(f"z{i:02d}", JobEndStatus.COMPLETED, 1, float(i)))
        ended = sqlite3.connect(store.path).execute("SELECT job_id FROM ended_jobs ORDER BY rowid").fetchall()
        assert 10 <= len(ended) < 10 + 7  # at most one prune period beyond the limit
        assert ended[-1] == ("z59",) and store.ended("z59") is not None
        assert store.ended("z00") is None  # pruned: a late finish of it is unknown, still never counted
        count = len(ended)
        for _ in range(7):  # a transaction that fails rolls its prune back with everything else
            with pytest.raises(RuntimeError), store.transaction() as tx:
                tx.put_end(JobEnd("bad", JobEndStatus.COMPLETED, 1, 99.0))
                raise RuntimeError("boom")
        assert len(sqlite3.connect(store.path).execute("SELECT job_id FROM ended_jobs").fetchall()) == count
    finally:
        store.close()
    with pytest.raises(ValueError, match="keep_ended_jobs"):
        LeagueStore(tmp_path / "other.sqlite", keep_ended_jobs=0)


def test_a_counter_stops_at_what_a_status_reply_can_carry():
    counters = Counters(env_steps=COUNTER_LIMIT - 2).plus(env_steps=5, episodes=1)
    assert (counters.env_steps, counters.episodes) == (COUNTER_LIMIT, 1)


def test_a_league_has_trained_once_it_stepped_an_env_or_any_player_has_a_checkpoint():
    """What binds a stored league to its env and networks (a config of another is then refused): each of these
    alone, e.g. long episodes that stepped the env but ended none, or checkpoints published before any game."""
    untrained = {"players": [{"player_id": "main", "checkpoint_path": ""}]}
    assert not has_trained(None, None)
    assert not has_trained(untrained, Counters())
    assert has_trained(untrained, Counters(episodes=1))
    assert has_trained(untrained, Counters(env_steps=1))
    checkpointed = {"players": [{"player_id": "main", "checkpoint_path": ""},
                                {"player_id": "main_10", "checkpoint_path": "main/ckpt_10.pt"}]}
    assert has_trained(checkpointed, Counters())
    assert has_trained(checkpointed, None)


def test_the_wal_starts_over_under_steady_commits(tmp_path):
    """SQLite starts the WAL over only when a checkpoint caught up with every commit: under steady commits a
    PASSIVE checkpoint never does, and the WAL grew without end. Past `wal_max_bytes` the store holds its
    writers back for one checkpoint that starts it over."""
    path = tmp_path / "state.sqlite"
    store = LeagueStore(path, wal_max_bytes=1 << 20)
    try:
        store.initialise("d")
        largest = 0
        for n in range(12 * CHECKPOINT_EVERY):
            with store.transaction() as tx:
                tx.put_end(JobEnd(f"job-{n}", JobEndStatus.COMPLETED, 1, float(n)))
                tx.put_counters(Counters(jobs_finished=n))
            if n % 100 == 0:
                largest = max(largest, path.with_name(path.name + "-wal").stat().st_size)
    finally:
        store.close()
    written = 12 * CHECKPOINT_EVERY * 2 * 4096  # two pages a commit at least (the table and its index)
    assert largest < 16 << 20 < written, (largest, written)


def _path_of_length(root, length):
    """A path under `root` (made) of exactly `length` bytes, with symlinks resolved."""
    base = root.resolve()
    parts, left = [], length - len(str(base)) - 1
    while left > 200:
        parts.append("d" * 150)
        left -= 151
    directory = base.joinpath(*parts)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ("s" * left)
    assert len(str(path)) == length
    return path


def test_a_state_path_too_long_for_sqlite_is_refused_saying_so(tmp_path):
    """A run directory some 500 characters deep gave the coordinator SQLite's bare "unable to open database file"
    (exit 2), which says nothing of the path's length."""
    SQLITE_MAX_PATH_BYTES = 504  # noqa: N806 (SQLite's MAX_PATHNAME, 512, less its 8-byte "-journal" suffix)
    longest = _path_of_length(tmp_path, SQLITE_MAX_PATH_BYTES)
    LeagueStore(longest).close()  # SQLite still opens it: the bound is SQLite's own
    too_long = _path_of_length(tmp_path, SQLITE_MAX_PATH_BYTES + 1)
    with pytest.raises(ValueError, match=rf"path is {SQLITE_MAX_PATH_BYTES + 1} bytes long .*longer than "
                                         rf"{SQLITE_MAX_PATH_BYTES} bytes: give a shorter path"):
        LeagueStore(too_long)
    LeagueStore(too_long.with_name("short.sqlite")).close()



def test_a_state_path_too_long_for_sqlite_is_refused_before_its_folders_and_lock_are_made(tmp_path):
    """The refusal came after the state's folders and its lock file were made: they were left behind."""
    too_long = tmp_path.resolve() / "new" / ("d" * 200) / ("d" * 200) / ("s" * 120)
    with pytest.raises(ValueError, match=r"bytes long .*give a shorter path"):
        LeagueStore(too_long)
    assert list(tmp_path.iterdir()) == []


def test_a_state_path_that_is_a_directory_is_refused_saying_so(tmp_path):
    """`--state DIR` gave SQLite's bare "unable to open database file", and left a DIR.lock beside it."""
    (tmp_path / "states").mkdir()
    with pytest.raises(ValueError, match=r"states is a directory, not a state file \(such as .*league_state.sqlite\)"):
        LeagueStore(tmp_path / "states")
    assert not (tmp_path / "states.lock").exists()


def test_a_job_in_flight_keeps_its_episode_num_and_an_older_stores_jobs_load_without_one(tmp_path):
    """The coordinator holds a collect job's finish to the episodes it was granted with, and counts its results
    only if no player was reset since it was leased (its generations), also after a restart; a schema-2 store
    kept neither: its jobs in flight load with None (only the wire bound holds for them; counted as before)."""
    path = tmp_path / "state.sqlite"
    conn = sqlite3.connect(path)  # what a schema-2 coordinator left, with one job in flight
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '2'), ('created_at', '5.0'), ('config_digest', 'd');
        CREATE TABLE jobs (
            job_id TEXT PRIMARY KEY, kind TEXT NOT NULL, launch_player TEXT NOT NULL, players TEXT NOT NULL,
            worker_id TEXT NOT NULL, issued_at REAL NOT NULL, endpoint TEXT NOT NULL) WITHOUT ROWID;
        INSERT INTO jobs VALUES ('old', 'collect', 'main', '["main","hist"]', 'actor-1', 1.0, '');
    """)
    conn.close()
    store = LeagueStore(path)
    try:
        with store.transaction() as tx:
            tx.put_lease(replace(lease("new"), episode_num=4, generations=(2, 0)))
        kept = {x.job_id: (x.episode_num, x.generations) for x in store.load().leases}
        assert kept == {"old": (None, None), "new": (4, (2, 0))}
    finally:
        store.close()
    again = LeagueStore(path)
    try:
        assert {x.job_id: (x.episode_num, x.generations) for x in again.load().leases} == kept
    finally:
        again.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    finally:
        conn.close()


def test_a_state_file_with_a_second_name_is_refused(tmp_path):
    """A hard link passed the lock (named after the path) and SQLite kept a WAL beside each name: a second
    coordinator served the same database beside the first, each with its own WAL."""
    from common.exclusive_lock import ExclusiveLock

    state = tmp_path / "shared" / "state.sqlite"
    first = LeagueStore(state)
    first.initialise("d")
    other = tmp_path / "other" / "name"
    other.parent.mkdir()
    other.hardlink_to(state)
    try:
        with pytest.raises(ValueError, match=r"it has 2 names \(hard links\).*-samefile .*other/name"):
            LeagueStore(other)
        ExclusiveLock(other.with_name("name.lock"), "x").release()  # the refusal let go of its lock
        assert not other.with_name("name-wal").exists()
    finally:
        first.close()
    with pytest.raises(ValueError, match="2 names"):  # one at a time too: each name's WAL misses the other's
        LeagueStore(state)
    other.unlink()
    LeagueStore(state).close()


def test_a_newer_coordinators_store_is_refused_before_anything_of_it_changes(tmp_path):
    """It was switched to WAL and given this version's tables before its schema version was read (a review)."""
    from league_service.store import SCHEMA_VERSION

    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION + 1),))
    conn.close()
    before = path.read_bytes()
    with pytest.raises(ValueError, match="a newer coordinator's"):
        LeagueStore(path)
    assert path.read_bytes() == before
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal"
        assert [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["meta"]
    conn.close()


def test_a_store_whose_second_connection_fails_lets_go_of_its_lock(tmp_path, monkeypatch):
    """The checkpointer's connection was opened after the store's lock was taken and outside its cleanup: one
    that failed (out of file descriptors) kept the state locked for the rest of the process."""
    path = tmp_path / "state.sqlite"
    connect, calls = sqlite3.connect, []

    def second_fails(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise sqlite3.OperationalError("unable to open database file")
        return connect(*args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(sqlite3, "connect", second_fails)
        with pytest.raises(sqlite3.OperationalError):
            LeagueStore(path)
    LeagueStore(path).close()  # not "in use"
