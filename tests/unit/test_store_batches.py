"""A group commit writes whole batches (multi-row statements, a few hundred rows each): what it stores is what
row-by-row writes would have stored, order of the ended jobs included."""

from __future__ import annotations

from dataclasses import replace

from league_service.leases import JobEnd, JobEndStatus, JobKind, Lease, WorkerInfo, WorkerRole
from league_service.store import Counters, LeagueStore


def _lease(i: int) -> Lease[None]:
    return Lease(f"j{i}", JobKind.COLLECT, "main", ("main", f"hist{i % 3}"), f"actor-{i % 7}", float(i), 0.0, "ep")


def test_batches_larger_than_one_statement_round_trip(tmp_path):
    store = LeagueStore(tmp_path / "state.sqlite")
    try:
        store.initialise("d")
        n = 450  # more than two statements' worth of rows
        with store.transaction() as tx:
            tx.put_workers([(WorkerInfo(f"actor-{i}", WorkerRole.ACTOR, "h", "", float(i)), 9.0) for i in range(7)])
            tx.put_leases([_lease(i) for i in range(n)])
            tx.put_state({"players": []}, Counters(jobs_issued=n))
        ends = [JobEnd(f"j{i}", JobEndStatus.COMPLETED, i % 5, float(i)) for i in range(0, n, 2)]
        with store.transaction() as tx:
            tx.put_leases([])  # nothing to write is fine
            tx.put_ends(ends)
            tx.put_state(None, Counters(jobs_issued=n, jobs_finished=len(ends)))
        state = store.load()
        assert [lease.job_id for lease in state.leases] == [f"j{i}" for i in range(1, n, 2)]
        assert replace(state.leases[0], deadline=0.0) == _lease(1)  # deadlines are not stored
        assert state.ended == tuple(ends)  # commit order kept within the batch
        assert state.league_state == {"players": []}
        assert state.counters == Counters(jobs_issued=n, jobs_finished=len(ends))
        assert len(state.workers) == 7
    finally:
        store.close()
