import itertools

import pytest

from common.rpc import _KEEPALIVE_CLIENT_OPTIONS
from league_service.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    WorkerIdInUseError,
)
from league_service.leases import (
    RECONNECT_GRACE_S,
    JobEndStatus,
    JobKind,
    LeaseTable,
    WorkerInfo,
    WorkerRole,
    process_host,
)

TIMEOUT = 1.0


def make_table(needs_learner=lambda p: True, players=("main", "exploiter")) -> LeaseTable[str]:
    ids = (f"job-{i}" for i in itertools.count())
    table: LeaseTable[str] = LeaseTable(
        lease_timeout_s=TIMEOUT, active_players=players, needs_learner=needs_learner, new_job_id=lambda: next(ids)
    )
    table.register(WorkerInfo("actor-1", WorkerRole.ACTOR, "h", "", 0.0))
    table.register(WorkerInfo("actor-2", WorkerRole.ACTOR, "h", "", 0.0))
    table.register(WorkerInfo("learner-1", WorkerRole.LEARNER, "h", "10.0.0.1:7000", 0.0))
    return table


def test_collect_jobs_wait_for_the_players_learner():
    table = make_table()
    table.offer("main", ("main", "hist"), "spec")
    assert table.lease_collect("actor-1", now=0.0) is None
    learn = table.lease_learn("learner-1", "10.0.0.1:7000", now=0.0)
    assert learn is not None and learn.kind is JobKind.LEARN and learn.launch_player == "main"
    lease = table.lease_collect("actor-1", now=0.1)
    assert lease is not None and lease.endpoint == "10.0.0.1:7000" and lease.payload == "spec"
    assert lease.deadline == pytest.approx(1.1)


def test_players_without_learner_are_ready_at_once():
    table = make_table(needs_learner=lambda p: False)
    table.offer("main", ("main",), None)
    assert table.lease_collect("actor-1", now=0.0) is not None
    assert table.lease_learn("learner-1", "x:1", now=0.0) is None


def test_finish_is_idempotent_and_late_finish_is_refused():
    table = make_table(needs_learner=lambda p: False)
    table.offer("main", ("main",), None)
    table.offer("main", ("main",), None)
    a = table.lease_collect("actor-1", now=0.0)
    b = table.lease_collect("actor-2", now=0.0)
    assert table.check_finish("actor-1", a.job_id, now=0.5) == a
    table.end(a.job_id, JobEndStatus.COMPLETED, 3, now=0.5)
    dup = table.check_finish("actor-1", a.job_id, now=0.6)
    assert dup.status is JobEndStatus.COMPLETED and dup.episodes_counted == 3
    expired = table.expire_due(now=1.0)
    assert [x.job_id for x in expired] == [b.job_id]
    with pytest.raises(FailedPreconditionError, match="expired"):
        table.check_finish("actor-2", b.job_id, now=1.1)


def test_finish_refuses_other_worker_unknown_job_and_unleased_job():
    table = make_table(needs_learner=lambda p: False)
    pending = table.offer("main", ("main",), None)
    with pytest.raises(FailedPreconditionError, match="never leased"):
        table.check_finish("actor-1", pending.job_id, now=0.0)
    lease = table.lease_collect("actor-1", now=0.0)
    with pytest.raises(FailedPreconditionError, match="another worker"):
        table.check_finish("actor-2", lease.job_id, now=0.0)
    with pytest.raises(NotFoundError, match="job_id"):
        table.check_finish("actor-1", "nope", now=0.0)
    with pytest.raises(NotFoundError, match="worker_id"):
        table.check_finish("ghost", lease.job_id, now=0.0)


def test_a_lease_past_its_deadline_is_refused_even_before_the_sweep():
    table = make_table(needs_learner=lambda p: False)
    table.offer("main", ("main",), None)
    lease = table.lease_collect("actor-1", now=0.0)
    with pytest.raises(FailedPreconditionError):
        table.check_finish("actor-1", lease.job_id, now=TIMEOUT)
    # Nor does a heartbeat bring it back: it is no longer held, so it is named revoked and keeps its deadline.
    result = table.heartbeat("actor-1", [lease.job_id], now=TIMEOUT + 0.5)
    assert result.revoked_job_ids == (lease.job_id,)
    assert [x.job_id for x in table.expire_due(now=TIMEOUT + 0.5)] == [lease.job_id]


def test_a_job_named_twice_in_a_heartbeat_is_answered_once():
    table = make_table(needs_learner=lambda p: False)
    table.offer("main", ("main",), None)
    lease = table.lease_collect("actor-1", now=0.0)
    result = table.heartbeat("actor-1", [lease.job_id, "gone", lease.job_id, "gone"], now=0.5)
    assert result.revoked_job_ids == ("gone",)
    assert table.leases[lease.job_id].deadline == pytest.approx(0.5 + TIMEOUT)


def test_heartbeat_extends_named_leases_and_revokes_the_rest():
    table = make_table(needs_learner=lambda p: False)
    table.offer("main", ("main",), None)
    table.offer("main", ("main",), None)
    mine = table.lease_collect("actor-1", now=0.0)
    other = table.lease_collect("actor-2", now=0.0)
    result = table.heartbeat("actor-1", [mine.job_id, other.job_id, "unknown"], now=0.8)
    assert result.revoked_job_ids == (other.job_id, "unknown")
    assert result.lease_deadline == pytest.approx(1.8)
    assert [x.job_id for x in table.expire_due(now=1.5)] == [other.job_id]
    assert table.leases[mine.job_id].deadline == pytest.approx(1.8)
    assert [x.job_id for x in table.expire_due(now=1.8)] == [mine.job_id]
    assert table.next_deadline() is None


def test_heartbeat_does_not_extend_a_lease_the_worker_did_not_name():
    table = make_table(needs_learner=lambda p: False)
    table.offer("main", ("main",), None)
    lease = table.lease_collect("actor-1", now=0.0)
    table.heartbeat("actor-1", [], now=0.9)
    assert [x.job_id for x in table.expire_due(now=1.0)] == [lease.job_id]


def test_learner_gets_its_binding_back_and_one_learner_per_player():
    table = make_table()
    table.register(WorkerInfo("learner-2", WorkerRole.LEARNER, "h", "", 0.0))
    table.register(WorkerInfo("learner-3", WorkerRole.LEARNER, "h", "", 0.0))
    first = table.lease_learn("learner-1", "a:1", now=0.0)
    again = table.lease_learn("learner-1", "a:2", now=0.5)
    assert again.job_id == first.job_id and again.endpoint == "a:2" and again.deadline == pytest.approx(1.5)
    second = table.lease_learn("learner-2", "b:1", now=0.5)
    assert second.launch_player == "exploiter"
    assert table.lease_learn("learner-3", "c:1", now=0.5) is None
    # The first binding expires; the player's learn job goes to the next learner that asks.
    table.expire_due(now=1.5)
    third = table.lease_learn("learner-3", "c:1", now=1.6)
    assert third.launch_player == "main" and third.job_id != first.job_id


def test_learners_back_from_a_partition_rebind_their_own_players():
    """Both learn leases expired in a partition; on healing the learner that asked first took the other's player
    (roster order), and each learner dropped the samples it held for its own. Each now gets its own back, and a
    learner new to the league takes a player no lost learner is expected back for."""
    table = make_table(players=("main", "exploiter", "league"))
    for worker in ("learner-2", "learner-3"):
        table.register(WorkerInfo(worker, WorkerRole.LEARNER, "h", "", 0.0))
    assert table.lease_learn("learner-1", "a:1", now=0.0).launch_player == "main"
    assert table.lease_learn("learner-2", "b:1", now=0.0).launch_player == "exploiter"
    table.expire_due(now=5.0)
    assert table.lease_learn("learner-3", "c:1", now=5.1).launch_player == "league"  # not main: learner-1's
    assert table.lease_learn("learner-2", "b:1", now=5.2).launch_player == "exploiter"
    assert table.lease_learn("learner-1", "a:1", now=5.3).launch_player == "main"
    # A lost learner's player is not held back from the others when it is the one free.
    table.expire_due(now=10.0)
    table.register(WorkerInfo("learner-4", WorkerRole.LEARNER, "h", "", 10.0))
    assert table.lease_learn("learner-3", "c:1", now=10.1).launch_player == "league"
    assert table.lease_learn("learner-2", "b:1", now=10.2).launch_player == "exploiter"
    assert table.lease_learn("learner-4", "d:1", now=10.3).launch_player == "main"


def test_roles_and_endpoints_are_checked():
    table = make_table()
    with pytest.raises(FailedPreconditionError, match="role"):
        table.lease_learn("actor-1", "x:1", now=0.0)
    with pytest.raises(FailedPreconditionError, match="role"):
        table.lease_collect("learner-1", now=0.0)
    with pytest.raises(InvalidArgumentError, match="data_endpoint"):
        table.lease_learn("learner-1", "", now=0.0)
    with pytest.raises(FailedPreconditionError, match="registered as actor"):
        table.register(WorkerInfo("actor-1", WorkerRole.LEARNER, "h", "", 1.0))


def test_restore_gives_a_fresh_deadline_and_keeps_bindings():
    table = make_table()
    learn = table.lease_learn("learner-1", "a:1", now=0.0)
    fresh = make_table()
    fresh.restore(learn, now=100.0)
    # A lease timeout after the restart, plus the time a worker's channel may take to notice the server is back.
    assert fresh.learner_lease("main").deadline == pytest.approx(101.0 + RECONNECT_GRACE_S)
    assert fresh.lease_learn("learner-1", "a:1", now=100.5).job_id == learn.job_id
    with pytest.raises(ValueError, match="restored twice"):
        fresh.restore(learn, now=100.0)


def test_live_collect_jobs_counts_pending_and_leased():
    table = make_table(needs_learner=lambda p: False)
    table.offer("main", ("main",), None)
    table.offer("main", ("main",), None)
    table.lease_collect("actor-1", now=0.0)
    assert table.live_collect_jobs("main") == 2
    table.expire_due(now=5.0)
    assert table.live_collect_jobs("main") == 1


def test_old_ends_are_forgotten_in_memory_and_asked_of_the_store():
    archive = {}
    ids = (f"job-{i}" for i in itertools.count())
    table: LeaseTable[None] = LeaseTable(
        lease_timeout_s=TIMEOUT, active_players=("main",), needs_learner=lambda p: False,
        new_job_id=lambda: next(ids), remember_ends=2, forgotten_end=archive.get,
    )
    table.register(WorkerInfo("a", WorkerRole.ACTOR, "h", "", 0.0))
    ended = []
    for status in (JobEndStatus.COMPLETED, JobEndStatus.EXPIRED, JobEndStatus.FAILED):
        table.offer("main", ("main",), None)
        lease = table.lease_collect("a", now=0.0)
        _, end = table.end(lease.job_id, status, 1, now=0.0)
        archive[end.job_id] = end  # what the store holds
        ended.append(end)
    first, second, third = ended
    archive.pop(first.job_id)
    with pytest.raises(NotFoundError):  # neither remembered nor stored
        table.check_finish("a", first.job_id, now=0.0)
    archive[first.job_id] = first
    assert table.check_finish("a", first.job_id, now=0.0) == first  # from the store: a duplicate
    with pytest.raises(FailedPreconditionError, match="expired"):
        table.check_finish("a", second.job_id, now=0.0)
    assert table.ended(third.job_id) == third


def test_the_restart_grace_covers_the_longest_reconnect_backoff_of_a_workers_channel():
    options = dict(_KEEPALIVE_CLIENT_OPTIONS)  # what every channel of the project is made with (make_channel)
    assert options["grpc.max_reconnect_backoff_ms"] <= RECONNECT_GRACE_S * 1000


def test_one_process_per_worker_id_the_newest_registration_wins_for_good():
    table = make_table()
    assert table.take_over("learner-1", "host/pid 1/a", 0.0) is None
    table.claim("learner-1", "host/pid 1/a")
    # A restart (or a second process given the same --worker-id) registers: it takes the id over.
    assert table.take_over("learner-1", "host/pid 2/b", 1.0) == "host/pid 1/a"
    table.claim("learner-1", "host/pid 2/b")
    with pytest.raises(WorkerIdInUseError, match=r"used by another process now \(host/pid 2/b\)"):
        table.claim("learner-1", "host/pid 1/a")
    with pytest.raises(WorkerIdInUseError):  # registering again does not take it back
        table.take_over("learner-1", "host/pid 1/a", 2.0)
    assert table.take_over("learner-1", "host/pid 2/b", 3.0) is None  # the owner registering again: no change
    table.claim("learner-1", "")  # a client that sends no process (grpcurl): not checked
    table.claim("actor-1", "host/pid 1/a")  # another worker id: the superseded process may hold others


def test_a_live_worker_id_is_not_taken_over_from_another_host():
    """One `.env` copied to two hosts under a restart policy: the second host's process is refused while the
    first one is heard from (each of its restarts too), instead of the two taking the id from each other for
    ever. Once the first has been silent for a lease, a process on another host takes the id over (a worker
    moved to a new machine); on the same host a restart takes it over at once."""
    table = make_table()
    assert process_host("node-a/pid 7/x") == "node-a" and process_host("grpcurl") == "grpcurl"
    table.take_over("learner-1", "node-a/pid 1/a", 0.0)
    table.heartbeat("learner-1", [], 10.0)
    for attempt, now in enumerate((10.0, 10.5, 10.0 + TIMEOUT * 0.99)):
        with pytest.raises(WorkerIdInUseError, match=r"live process on another host \(node-a/pid 1/a, heard from"):
            table.take_over("learner-1", f"node-b/pid {attempt}/b", now)
        table.claim("learner-1", "node-a/pid 1/a")  # the first one works on
    assert table.take_over("learner-1", "node-a/pid 2/c", 10.5) == "node-a/pid 1/a"  # a restart on its host
    table.claim("learner-1", "node-a/pid 2/c")
    assert table.take_over("learner-1", "node-b/pid 9/d", 10.0 + TIMEOUT) == "node-a/pid 2/c"  # silent a lease
    with pytest.raises(WorkerIdInUseError):
        table.claim("learner-1", "node-a/pid 2/c")


def test_a_lease_expiring_is_no_word_from_its_worker():
    """The expiry of a silent learner's lease counted as hearing from it: a learner moved to another host was
    refused for a second lease timeout ("heard from 0 s ago"), and the status showed it seen at the expiry."""
    table = make_table()
    table.take_over("learner-1", "node-a/pid 1/a", 0.0)
    assert table.lease_learn("learner-1", "10.0.0.1:7000", 0.0) is not None
    assert len(table.expire_due(TIMEOUT + 0.01)) == 1
    assert table.last_seen("learner-1") == 0.0
    assert table.take_over("learner-1", "node-b/pid 2/b", TIMEOUT + 0.02) == "node-a/pid 1/a"


def test_after_a_coordinator_restart_the_first_caller_of_a_worker_id_owns_it():
    table = make_table()  # processes are not stored: a restored table knows none
    table.claim("actor-1", "host/pid 7/c")
    with pytest.raises(WorkerIdInUseError):
        table.claim("actor-1", "host/pid 8/d")
    assert table.forget_idle(seen_before=1.0) == ["actor-1", "actor-2", "learner-1"]
    table.register(WorkerInfo("actor-1", WorkerRole.ACTOR, "h", "", 2.0))
    table.claim("actor-1", "host/pid 8/d")  # forgotten with the worker: a new process may use the id
