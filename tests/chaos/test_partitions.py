"""Chaos: network partitions of an actor and of a learner, longer than the lease, then healed.

The compose deployment runs across network namespaces (tests/netns_harness.py, as tests/system/
test_multinode_netns.py does): a coordinator, a learner and actors each on a host of their own. A host's cable
is pulled at the switch for longer than the lease, then plugged back. What must hold:
- detected: the cut-off worker's lease expires (counters.jobs_expired grows, its job leaves the table; a cut-off
  learner's player shows no learner bound);
- healed: the worker is heard from again and works again (an actor takes new jobs; the learner is bound to its
  player again, with the trainer it kept, and publishes versions above everything before);
- nothing counted twice: late reports of expired jobs are refused, every job issued is accounted exactly once,
  the durable ledger adds up, and the league's invariants (tests/chaos/invariants.py) hold throughout.

Short version: one actor, the learner cut once (an actor's cut is in tests/system/test_multinode_netns.py,
which runs by default too). Slow version: two actors, each partition twice and both cut at
once, each cut held for three leases.
Skips when this machine cannot make network namespaces (not root, or no `ip`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from league_service.config import load_config
from tests.chaos.invariants import assert_invariants, check_ledger, read_ledger
from tests.netns_harness import DEPLOY_DIR, NetnsDeployment, Project, load_compose, netns_unavailable_reason
from tests.system.test_multinode_netns import (
    LAPTOP,
    TRAINING_CONFIG,
    _active_player,
    _conserved,
    _worker,
    compose_env,
    cut_off_while_holding_a_job,
    status_json,
    wait_for,
)

LEARNER = "learner-0"
LEASE_S = float(TRAINING_CONFIG["coordinator"]["lease_timeout_s"])


@pytest.fixture
def netns_available() -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"partition chaos needs network namespaces: {reason}")


@pytest.fixture
def lab_factory(netns_available, tmp_path: Path, token_file: Path) -> Iterator:
    """Start the deployment with ``actors`` actors; torn down (processes, namespaces) whatever happens."""
    labs: list[NetnsDeployment] = []

    def start(actors: int) -> NetnsDeployment:
        config_file = tmp_path / "league.yaml"
        config_file.write_text(yaml.safe_dump(TRAINING_CONFIG))
        load_config(config_file)  # fail here, not in a namespace, if the league config is wrong
        main = Project(
            load_compose(DEPLOY_DIR / "docker-compose.yml", compose_env(token_file, config_file)),
            services=("coordinator", LEARNER, "actor"),
            scale={"actor": actors},
        )
        lab = NetnsDeployment([main], tmp_path / "lab", extra_hosts=[LAPTOP])
        labs.append(lab)
        lab.up(main, health_timeout_s=120.0)
        return lab

    try:
        yield start
    finally:
        for lab in labs:
            try:  # the scenario is over: no graceful stop to wait for (the learner would train its queue first)
                lab.processes.stop(grace_s=1.0)
            finally:
                lab.close()


class League:
    """What the test sees of the league: `league status --json` from the laptop host, invariants on each."""

    def __init__(self, lab: NetnsDeployment, token_file: Path) -> None:
        self.lab = lab
        self.token_file = token_file
        self.shared = lab.volume_dir("league-shared")
        self.state = lab.volume_dir("coordinator-state") / "league_state.sqlite"
        self.first: dict | None = None

    def status(self) -> dict:
        """A status whose invariants hold, also against the first one seen (nothing goes back)."""
        s = status_json(self.lab, self.token_file)
        assert_invariants(status=s, earlier=self.first, shared_root=self.shared)
        assert _conserved(s), s["counters"]
        if self.first is None:
            self.first = s
        return s

    def check_ledger(self) -> None:
        """The durable books: stored matches == the episodes of the ended jobs, nothing both ended and leased."""
        check_ledger(read_ledger(self.state))


def _learn_jobs(status: dict) -> set[str]:
    return {j["job_id"] for j in status["jobs"] if j["kind"] == "JOB_KIND_LEARN"}


def wait_trained(league: League, actors: tuple[str, ...]) -> dict:
    def trained() -> bool:
        s = league.status()
        return (
            s["counters"]["jobs_finished"] >= 2
            and _active_player(s)["checkpoint_version"] >= 1
            and _active_player(s)["learner_worker_id"] == LEARNER
            and all(_worker(s, a) for a in actors)
        )

    wait_for("jobs to finish and checkpoints to be published", trained, league.lab, timeout_s=150)
    return league.status()


def partition_actor(league: League, host: str) -> None:
    """Cut `host` off while it holds a job until that lease expired; plug it back; it must take new jobs."""
    lost_job, before = cut_off_while_holding_a_job(league.lab, league.token_file, host)
    plugged_in = league.status()["now"]
    assert league.status()["counters"]["jobs_expired"] > before["jobs_expired"]
    new_jobs: set[str] = set()

    def rejoined() -> bool:
        s = league.status()
        w = _worker(s, host)
        if w is not None and w["last_heartbeat"] > plugged_in:
            new_jobs.update(j for j in w["job_ids"] if j != lost_job)
        return bool(new_jobs) and s["counters"]["jobs_finished"] > before["jobs_finished"] + 1

    wait_for(f"{host} to take new jobs after the partition", rejoined, league.lab, timeout_s=90)
    assert league.lab.process(host).alive(), league.lab.logs()


def partition_learner(league: League, hold_leases: float = 1.0) -> None:
    """Cut the learner off until its learn lease expired (the player shows no learner), hold the cut for
    ``hold_leases`` more leases, plug it back: it must be bound again and publish above everything before."""
    lab = league.lab
    before = league.status()
    player = _active_player(before)
    assert player["learner_worker_id"] == LEARNER, player
    bound_jobs = _learn_jobs(before)
    assert bound_jobs
    lab.set_link(LEARNER, up=False)
    try:
        def unbound() -> bool:
            s = league.status()
            return not _active_player(s)["learner_worker_id"] and not (_learn_jobs(s) & bound_jobs)

        wait_for("the cut-off learner's lease to expire", unbound, lab, timeout_s=60)
        cut = league.status()
        assert cut["counters"]["jobs_expired"] > before["counters"]["jobs_expired"]
        w = _worker(cut, LEARNER)
        assert w is None or not set(w["job_ids"]) & bound_jobs
        if hold_leases > 0:
            time.sleep(hold_leases * LEASE_S)  # hold the partition: the cut-off learner must stay unbound
            still = league.status()
            assert not _active_player(still)["learner_worker_id"], "a learner was bound while cut off"
    finally:
        lab.set_link(LEARNER, up=True)
    held = _active_player(cut)

    def rebound() -> bool:
        s = league.status()
        p = _active_player(s)
        return (
            p["learner_worker_id"] == LEARNER
            and p["checkpoint_version"] > held["checkpoint_version"]
            and s["counters"]["jobs_finished"] > cut["counters"]["jobs_finished"] + 1
        )

    wait_for("the learner to be bound again and training to go on", rebound, lab, timeout_s=120)
    after = league.status()
    assert len(_learn_jobs(after)) == 1, after["jobs"]
    assert _active_player(after)["agent_steps"] >= held["agent_steps"]
    assert lab.process(LEARNER).alive(), lab.logs()


def assert_nothing_double_counted(league: League) -> None:
    final = league.status()
    c = final["counters"]
    episode_num = TRAINING_CONFIG["env"]["episode_num"]
    assert c["matches"] <= episode_num * c["jobs_finished"], c
    assert sum(p["episodes"] for p in final["players"]) == c["matches"], final["players"]
    league.check_ledger()
    assert all(p.alive() for p in league.lab.processes.processes), league.lab.logs()
    learner_log = league.lab.process(LEARNER).log_tail(400)
    assert "Traceback" not in learner_log, learner_log


def test_a_learner_cut_off_for_longer_than_its_lease_is_unbound_and_rejoins(lab_factory, token_file):
    # The short form of the actor's partition runs in the default suite already (tests/system/
    # test_multinode_netns.py: an actor's link flap); the slow test below cuts actors under these checks too.
    lab = lab_factory(actors=1)
    league = League(lab, token_file)
    wait_trained(league, ("actor",))
    partition_learner(league, hold_leases=0.0)
    assert_nothing_double_counted(league)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_repeated_partitions_of_actors_and_the_learner(lab_factory, token_file):
    lab = lab_factory(actors=2)
    league = League(lab, token_file)
    wait_trained(league, ("actor-1", "actor-2"))
    for _ in range(2):
        partition_actor(league, "actor-1")
        partition_learner(league, hold_leases=3.0)
        partition_actor(league, "actor-2")
    # Both sides of the data plane at once: an actor streaming to a learner that is cut off too.
    lab.set_link("actor-1", up=False)
    try:
        partition_learner(league, hold_leases=3.0)
    finally:
        lab.set_link("actor-1", up=True)
    partition_actor(league, "actor-1")
    assert_nothing_double_counted(league)
