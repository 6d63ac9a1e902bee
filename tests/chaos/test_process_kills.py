"""`kill -9` the league's processes one kind at a time and check that it carries on and keeps honest books.

A real league as separate processes (procs_league.py): a coordinator, one learner and two actors on a small
connect-four self-play league that takes snapshots every few hundred steps. Every status polled during a
scenario is checked against the one before (counters, steps and game counts never go back, no snapshot
disappears, leases have one owner, slots stay within limits), and each scenario ends with the full invariants,
the durable ledger included (tests/chaos/invariants.py).

The short scenarios share one league (starting torch processes costs most of their time on two cores): actors
killed three times, then the learner, then the coordinator. The slow ones each get their own league and kill
more often.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from common.checkpoint_store import CheckpointStore
from common.proto.league.v1 import league_pb2
from tests.chaos.invariants import check_ledger, read_ledger
from tests.chaos.procs_league import SELF_PLAY_LEAGUE, KillableLeague, LeagueLayout, active, snapshots

STARTUP_S = 180.0  # first jobs need every process up: torch imports on two busy cores
PROGRESS_S = 90.0


def _training(league: KillableLeague) -> KillableLeague:
    league.wait_for(lambda s: s.counters.matches > 0 and active(s).checkpoint_version >= 2, STARTUP_S,
                    "the league to train (matches counted, checkpoints published)")
    league.check()
    return league


@pytest.fixture(scope="class")
def shared_league(tmp_path_factory) -> Iterator[KillableLeague]:
    league = KillableLeague(tmp_path_factory.mktemp("chaos-league"), LeagueLayout(SELF_PLAY_LEAGUE))
    try:
        yield _training(league.start())
    finally:
        league.close()


@pytest.fixture
def own_league(start_league) -> KillableLeague:
    return _training(start_league())


# ---- scenarios --------------------------------------------------------------------------------------------


def _collect_job_of(status: league_pb2.LeagueStatus, worker: str) -> str | None:
    for job in status.jobs:
        if job.worker_id == worker and job.kind != league_pb2.JOB_KIND_LEARN:
            return job.job_id
    return None


def kill_actors(league: KillableLeague, kills: int, *, both_at_once: bool = False) -> None:
    """Kill actors while they hold collect jobs: the jobs end uncounted (released when the restarted actor takes
    the worker id over, else expired), the slots are re-issued as new jobs, the restarted actors take them, and
    the books stay exact."""
    start = league.check()
    killed_jobs: list[str] = []
    for k in range(kills):
        victims = ["actor-0", "actor-1"] if both_at_once and k % 2 else [f"actor-{k % 2}"]
        held = league.wait_for(lambda s, v=victims: all(_collect_job_of(s, w) for w in v), PROGRESS_S,
                               f"{victims} to hold collect jobs")
        jobs = [_collect_job_of(held, w) for w in victims]
        for victim in victims:
            league.kill(victim)
            league.restart(victim)  # at once, as a supervisor would: the old lease is not its to resume
        killed_jobs += [j for j in jobs if j is not None]
        # The dead actors' jobs end: released when a restarted actor takes the worker id over (the old process can
        # never finish them), or expired, nobody heartbeating them; the restarted actors do not know them.
        league.wait_for(lambda s, js=jobs: not {j.job_id for j in s.jobs} & set(js), PROGRESS_S,
                        f"the leases of {jobs} to end")
    # The freed slots were issued again as new jobs, and the restarted actors took them.
    league.wait_for(lambda s: all(_collect_job_of(s, f"actor-{i}") not in (None, *killed_jobs) for i in range(2)),
                    PROGRESS_S, "the restarted actors to take new jobs")
    end = league.check(earlier=start)
    ledger = league.ledger()
    # A killed job was either finished just before the kill (counted once), or released or expired (never).
    ends = {j: ledger.ended.get(j) for j in killed_jobs}
    assert all(e is not None and e[0] in ("released", "expired", "completed") for e in ends.values()), ends
    cut_short = [j for j, e in ends.items() if e is not None and e[0] != "completed"]
    assert cut_short, f"no killed actor's job was cut short: {ends}"
    assert all(ledger.ended[j][1] == 0 for j in cut_short)
    expired = [j for j in cut_short if ends[j][0] == "expired"]
    assert end.counters.jobs_expired >= start.counters.jobs_expired + len(expired)
    assert end.counters.matches > start.counters.matches


def kill_learner(league: KillableLeague, kills: int, *, alternate_expiry: bool = False) -> None:
    """Kill the learner: its restart resumes from the newest published checkpoint, the player's steps never
    go back, and the actors (who were streaming to it) wait for it and carry on.

    The learner is started again at once, as `league run` does (it asks for its binding back while the
    coordinator still holds it); with alternate_expiry every other restart waits until the learn lease expired
    (the player is unbound meanwhile and its collect jobs wait)."""
    store = CheckpointStore(league.shared_root)
    start = league.check()
    for k in range(kills):
        before = league.wait_for(lambda s: active(s).checkpoint_version >= 2, PROGRESS_S, "published checkpoints")
        player = active(before)
        league.kill("learner-0")
        latest = store.latest(player.player_id)
        assert latest is not None and latest.version >= player.checkpoint_version
        if alternate_expiry and k % 2 == 1:
            # Without a learner the player's collect jobs stop (its learn lease expires); the actors stay up.
            league.wait_for(lambda s: not active(s).learner_worker_id, PROGRESS_S, "the learn lease to expire")
        league.restart("learner-0")
        resumed = league.wait_for(
            lambda s, v=latest.version, b=before: active(s).checkpoint_version > v + 1
            and s.counters.env_steps > b.counters.env_steps, PROGRESS_S,
            "training and collection to resume after the learner restart")
        assert active(resumed).agent_steps >= player.agent_steps
        starts = re.findall(r"starting from (\S+) at version (\d+)", _log_since_restart(league, "learner-0"))
        assert starts, f"the restarted learner did not say where it started:\n{league.logs()}"
        source, version = starts[0]
        assert source != "fresh" and int(version) == latest.version, (
            f"kill {k + 1}: restarted from {source} v{version}, the latest published was v{latest.version}")
    end = league.check(earlier=start)
    assert end.counters.matches > start.counters.matches
    assert not league.dead()


def kill_coordinator(league: KillableLeague, kills: int, down_s: float = 0.0) -> None:
    """Kill the coordinator mid-training and start it again on the same state and port: workers reconnect,
    the league goes on from its durable state, nothing accepted is lost or counted twice, no snapshot lost."""
    start = league.check()
    for _ in range(kills):
        before = league.wait_for(lambda s: len(s.jobs) >= 2, PROGRESS_S, "jobs in flight")
        league.kill("coordinator")
        durable = league.ledger_at_kill
        assert durable is not None and durable.matches > 0
        if down_s:
            league.pause(down_s)
        league.restart("coordinator")
        known = set(durable.ended) | set(durable.in_flight)
        after = league.wait_for(
            lambda s, b=before, d=durable: s.counters.matches > max(b.counters.matches, d.matches)
            and s.counters.env_steps > b.counters.env_steps
            and active(s).agent_steps > active(b).agent_steps,
            PROGRESS_S, "the league to continue past where it was killed")
        # Every worker came back to the restarted coordinator: each actor got a job it issued.
        league.wait_for(
            lambda s, k=known: all(_collect_job_of(s, f"actor-{i}") not in (None, *k) for i in range(2))
            and active(s).learner_worker_id == "learner-0",
            PROGRESS_S, "every worker to take jobs from the restarted coordinator")
        assert snapshots(after) >= set(durable.historical), "a snapshot stored before the kill was lost"
        check_ledger(read_ledger(league.state_path), earlier=durable)
    end = league.check()
    assert end.counters.matches > start.counters.matches
    assert snapshots(end) >= snapshots(start)
    assert not league.dead(), f"{league.dead()} died:\n{league.logs()}"


def kill_coordinator_with_an_actor(league: KillableLeague) -> None:
    """The coordinator and an actor die together: the actor's job comes back from the state with a fresh
    lease nobody heartbeats, so it expires cleanly (counted never) and its slot is issued again."""
    held = league.wait_for(lambda s: _collect_job_of(s, "actor-0") is not None, PROGRESS_S, "actor-0 busy")
    league.kill("actor-0")
    league.kill("coordinator")
    orphan = _collect_job_of(held, "actor-0")
    durable = league.ledger_at_kill
    assert durable is not None
    league.restart("coordinator")
    league.restart("actor-0")
    if orphan in durable.in_flight:  # else it finished before the kill
        league.wait_for(lambda s: orphan not in {j.job_id for j in s.jobs}, PROGRESS_S,
                        f"the restored lease of the dead actor's job {orphan} to expire")
        assert read_ledger(league.state_path).ended[orphan] == ("expired", 0)
    league.wait_for(lambda s, d=durable: s.counters.matches > d.matches + 16
                    and _collect_job_of(s, "actor-0") not in (None, *d.ended, *d.in_flight),
                    PROGRESS_S, "the league to go on with the restarted actor")
    league.check()


def kill_coordinator_while_it_restores(league: KillableLeague) -> None:
    """Killed again as soon as it serves, before the workers are back: a restored state restores again."""
    before = league.wait_for(lambda s: len(s.jobs) >= 2, PROGRESS_S, "jobs in flight")
    league.kill("coordinator")
    first = league.ledger_at_kill
    league.restart("coordinator")
    league.wait_for(lambda s: True, PROGRESS_S, "the coordinator to serve")
    league.kill("coordinator")
    check_ledger(read_ledger(league.state_path), earlier=first)
    league.restart("coordinator")
    league.wait_for(lambda s, b=before: s.counters.matches > b.counters.matches
                    and active(s).agent_steps > active(b).agent_steps, PROGRESS_S, "the league to go on")
    league.check()


def _log_since_restart(league: KillableLeague, name: str) -> str:
    text = (league.group.log_dir / f"{name}.log").read_text(errors="replace")
    return text.rsplit("===== restarted by the chaos test", 1)[-1]


# ---- short versions (make test): one league, one kind of kill after another ----------------------------------


class TestKillsOnOneLeague:
    """In file order on one league; each starts by reviving what a failed predecessor may have left dead."""

    @pytest.fixture(autouse=True)
    def _revived(self, shared_league):
        shared_league.revive()

    def test_actors_killed_three_times(self, shared_league):
        kill_actors(shared_league, kills=3)

    def test_learner_killed(self, shared_league):
        kill_learner(shared_league, kills=1)

    def test_coordinator_killed(self, shared_league):
        kill_coordinator(shared_league, kills=1)

    def test_books_balance_once_stopped(self, shared_league):
        _stop_and_audit(shared_league)


def _stop_and_audit(league: KillableLeague) -> None:
    """Stop the league cleanly, then hold its durable books against what every actor reported."""
    last = league.check()
    league.close()
    league.audit()
    final = read_ledger(league.state_path)
    assert final.matches >= last.counters.matches


# ---- long versions (make chaos) ---------------------------------------------------------------------------


@pytest.mark.slow
def test_actors_killed_again_and_again(own_league):
    kill_actors(own_league, kills=8, both_at_once=True)
    _stop_and_audit(own_league)


@pytest.mark.slow
def test_learner_killed_again_and_again(own_league):
    kill_learner(own_league, kills=4, alternate_expiry=True)
    _stop_and_audit(own_league)


@pytest.mark.slow
def test_coordinator_killed_again_and_again(own_league):
    kill_coordinator(own_league, kills=2)
    kill_coordinator(own_league, kills=1, down_s=5.0)  # longer than a lease: restored leases get fresh ones
    kill_coordinator_with_an_actor(own_league)
    kill_coordinator_while_it_restores(own_league)
    _stop_and_audit(own_league)
