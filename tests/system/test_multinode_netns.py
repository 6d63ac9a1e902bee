"""The compose deployment across hosts, without Docker: each service of deploy/docker-compose.yml runs its real
command in a network namespace of its own (tests/netns_harness.py), talking over a private bridge.

Part 1 (coordinator only) runs today: the coordinator on its host, healthchecks as compose runs them, and
`league status` from a laptop host, with and without the token. Part 2 runs a short training across hosts
(coordinator, a learner, actors on two "nodes"), cuts one actor's cable and plugs it back, and checks the
league recovers without counting anything twice.
Both skip when this machine cannot make network namespaces (not root, or no `ip`: apt-get install -y iproute2).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import yaml

from league_service.config import load_config
from tests.netns_harness import (
    DEPLOY_DIR,
    NetnsDeployment,
    Project,
    league_argv,
    load_compose,
    netns_unavailable_reason,
    python_argv,
)

COORDINATOR = "coordinator:50051"
LAPTOP = "laptop"


@pytest.fixture(scope="module")
def netns_available() -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-host test needs network namespaces: {reason}")


def compose_env(token_file: Path, config_file: Path, **extra: str) -> dict[str, str]:
    """What the operator exports before `docker compose up`: where the secret and the league config are."""
    return {"LEAGUE_TOKEN_FILE": str(token_file), "LEAGUE_CONFIG_FILE": str(config_file), **extra}


def status_json(lab: NetnsDeployment, token_file: Path, host: str = LAPTOP) -> dict:
    result = lab.run(
        host, league_argv(["status", "--addr", COORDINATOR, "--json", "--token-file", str(token_file)])
    )
    assert result.returncode == 0, f"league status failed: {result.stderr}\n{lab.logs()}"
    return json.loads(result.stdout)


def wait_for(what: str, check: Callable[[], bool], lab: NetnsDeployment, timeout_s: float) -> None:
    """Poll remote state (nothing to wait on across hosts) once a second until `check()` holds."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{lab.logs()}")
        pause.wait(1.0)


# ---- part 1: the coordinator across hosts ---------------------------------------------------------------------


@pytest.fixture
def coordinator_lab(netns_available, tmp_path: Path, token_file: Path) -> Iterator[NetnsDeployment]:
    compose = load_compose(
        DEPLOY_DIR / "docker-compose.yml", compose_env(token_file, DEPLOY_DIR / "league.yaml")
    )
    main = Project(compose, services=("coordinator",))
    with NetnsDeployment([main], tmp_path / "lab", extra_hosts=[LAPTOP]) as lab:
        lab.up(main, health_timeout_s=60.0)
        yield lab


def test_coordinator_serves_status_health_and_metrics_to_other_hosts(coordinator_lab, token_file):
    lab = coordinator_lab
    # The compose healthcheck, run where Docker runs it (inside the coordinator's host), passed to get here;
    # the same probe works from another host too, and needs no token.
    assert lab.healthcheck("coordinator").returncode == 0
    probe = lab.run(LAPTOP, python_argv("-m", "league_cli.health", "--addr", COORDINATOR))
    assert probe.returncode == 0, probe.stderr
    assert "SERVING" in probe.stdout

    status = status_json(lab, token_file)
    # The league of deploy/league.yaml (mounted as a compose config), not the embedded default's.
    expected = load_config(DEPLOY_DIR / "league.yaml").league
    assert status["league_type"] == expected.league_type
    assert len([p for p in status["players"] if p["active"]]) == sum(expected.active_players.values())

    # State on the coordinator's own volume, not on the shared (NFS) one.
    assert (lab.volume_dir("coordinator-state") / "league_state.sqlite").exists()
    assert not list(lab.volume_dir("league-shared").glob("*.sqlite*"))

    # /metrics asks for the coordinator's token, as a Prometheus scrape config with `credentials_file` sends it.
    scrape = ("import sys, urllib.error, urllib.request\n"
              "headers = {'Authorization': 'Bearer ' + open(sys.argv[1]).read().strip()} if sys.argv[1:] else {}\n"
              "try: print(urllib.request.urlopen(urllib.request.Request('http://coordinator:9464/metrics', "
              "headers=headers), timeout=5).read().decode())\n"
              "except urllib.error.HTTPError as err: print(err.code)")
    metrics = lab.run(LAPTOP, python_argv("-c", scrape, str(token_file)))
    assert metrics.returncode == 0, metrics.stderr
    assert "league_jobs_issued" in metrics.stdout
    refused = lab.run(LAPTOP, python_argv("-c", scrape))
    assert refused.returncode == 0 and refused.stdout.strip() == "401", (refused.stdout, refused.stderr)


def test_coordinator_refuses_status_without_the_token(coordinator_lab, tmp_path):
    lab = coordinator_lab
    missing = lab.run(LAPTOP, league_argv(["status", "--addr", COORDINATOR, "--json"]))
    assert missing.returncode != 0
    assert "UNAUTHENTICATED" in missing.stderr
    wrong = tmp_path / "wrong_token"
    wrong.write_text("not-the-token\n")
    refused = lab.run(
        LAPTOP, league_argv(["status", "--addr", COORDINATOR, "--json", "--token-file", str(wrong)])
    )
    assert refused.returncode != 0
    assert "UNAUTHENTICATED" in refused.stderr


def test_health_probe_fails_while_the_coordinator_is_cut_off(coordinator_lab, token_file):
    lab = coordinator_lab
    probe = python_argv("-m", "league_cli.health", "--addr", COORDINATOR, "--timeout", "1")
    lab.set_link("coordinator", up=False)
    try:
        cut = lab.run(LAPTOP, probe)
        assert cut.returncode == 1
        assert "league health" in cut.stderr
        # Inside its own host the coordinator is still fine: the compose healthcheck does not flap with the link.
        assert lab.healthcheck("coordinator").returncode == 0
    finally:
        lab.set_link("coordinator", up=True)
    wait_for("the probe to pass again", lambda: lab.run(LAPTOP, probe).returncode == 0, lab, timeout_s=30)
    assert status_json(lab, token_file)["league_type"]


# ---- part 2: training across hosts ------------------------------------------------------------------------

# A solo league on CartPole: one active player (so one learner), short jobs, and a short lease so a cut-off
# actor's job comes back quickly.
TRAINING_CONFIG = {
    "league": {
        "league_type": "solo",
        "active_players": {"solo_active_player": 1},
        "max_active_player_job": 3,
    },
    "env": {"name": "CartPole-v1", "env_num": 2, "episode_num": 16},
    "policy": {"algorithm": "ppo", "model": {"hidden": [32]}, "ppo": {"num_minibatches": 4, "update_epochs": 2}},
    "learner": {"batch_size": 256},
    "coordinator": {"lease_timeout_s": 4.0, "heartbeat_interval_s": 1.0},
}


def _active_player(status: dict) -> dict:
    return next(p for p in status["players"] if p["active"])


def _worker(status: dict, hostname: str) -> dict | None:
    return next((w for w in status["workers"] if w["hostname"] == hostname), None)


def _jobs_gone(lab: NetnsDeployment, token_file: Path, job_ids: set[str]) -> bool:
    return not {j["job_id"] for j in status_json(lab, token_file)["jobs"]} & job_ids


def _conserved(status: dict) -> bool:
    """Every job ever issued is finished, expired, failed or still in flight, exactly once."""
    c = status["counters"]
    return c["jobs_issued"] == c["jobs_finished"] + c["jobs_expired"] + c["jobs_failed"] + len(status["jobs"])


def cut_off_while_holding_a_job(lab: NetnsDeployment, token_file: Path, host: str) -> tuple[str, dict]:
    """Unplug `host` while the coordinator sees it hold a job, and plug it back once that job's lease expired.

    Jobs are short, so the job may have finished in the moment before the cable came out; then the cut is
    tried again. Returns the lost job's id and the counters from just before the cut.
    """
    for _ in range(5):
        wait_for(
            f"{host} to hold a job",
            lambda: bool((_worker(status_json(lab, token_file), host) or {}).get("job_ids")),
            lab,
            timeout_s=60,
        )
        before = status_json(lab, token_file)["counters"]
        lab.set_link(host, up=False)
        try:
            w = _worker(status_json(lab, token_file), host)
            held = list(w["job_ids"]) if w else []
            if held:
                wait_for(
                    f"{host}'s job to leave the table",
                    partial(_jobs_gone, lab, token_file, set(held)),
                    lab,
                    timeout_s=60,
                )
        finally:
            lab.set_link(host, up=True)
        if held and status_json(lab, token_file)["counters"]["jobs_expired"] > before["jobs_expired"]:
            return held[0], before
    raise AssertionError(f"{host} never lost a job to an expired lease in 5 cuts\n{lab.logs()}")


def test_training_across_hosts_survives_an_actor_link_flap(netns_available, tmp_path, token_file):
    config_file = tmp_path / "league.yaml"
    config_file.write_text(yaml.safe_dump(TRAINING_CONFIG))
    load_config(config_file)  # fail here, not in a namespace, if the league config is wrong
    env = compose_env(token_file, config_file)
    main = Project(
        load_compose(DEPLOY_DIR / "docker-compose.yml", env),
        services=("coordinator", "learner-0", "actor"),
        scale={"actor": 2},
    )
    # An extra node with the actors-only file; its NFS volume is the same host directory here.
    node2 = Project(
        load_compose(
            DEPLOY_DIR / "docker-compose.actors.yml",
            {**env, "LEAGUE_COORDINATOR": COORDINATOR, "NFS_SERVER": "10.213.0.1", "NFS_EXPORT": "/league"},
        ),
        scale={"actor": 1},
        host_prefix="node2-",
    )
    with NetnsDeployment([main, node2], tmp_path / "lab", extra_hosts=[LAPTOP]) as lab:
        lab.up(main, health_timeout_s=120.0)
        lab.up(node2)
        episode_num = TRAINING_CONFIG["env"]["episode_num"]

        # Jobs flow from every node, checkpoints are published on the shared volume.
        def trained() -> bool:
            s = status_json(lab, token_file)
            player = _active_player(s)
            return (
                s["counters"]["jobs_finished"] >= 4
                and s["counters"]["matches"] > 0
                and player["checkpoint_version"] >= 1
                and all(_worker(s, h) for h in ("actor-1", "actor-2", "node2-actor"))
            )

        wait_for("jobs to finish and a checkpoint to be published", trained, lab, timeout_s=150)
        player = _active_player(status_json(lab, token_file))
        assert (lab.volume_dir("league-shared") / player["checkpoint_path"]).exists()

        # Cut actor-1 off while it holds a job; its lease expires and the job goes back to the league.
        lost_job, before = cut_off_while_holding_a_job(lab, token_file, "actor-1")
        plugged_in = status_json(lab, token_file)["now"]

        # Back on the network, actor-1 is heard from again and takes new jobs; the league keeps counting.
        new_jobs: set[str] = set()

        def recovered() -> bool:
            s = status_json(lab, token_file)
            w = _worker(s, "actor-1")
            if w is not None and w["last_heartbeat"] > plugged_in:
                new_jobs.update(j for j in w["job_ids"] if j != lost_job)
            return bool(new_jobs) and s["counters"]["jobs_finished"] > before["jobs_finished"] + 2

        wait_for("actor-1 to take new jobs", recovered, lab, timeout_s=90)
        assert lab.process("actor-1").alive(), lab.logs()

        # Nothing counted twice: the late finish of the expired job was refused, every job is accounted once,
        # and no more episodes were counted than finished jobs can hold.
        final = status_json(lab, token_file)
        assert _conserved(final), final["counters"]
        assert final["counters"]["matches"] <= episode_num * final["counters"]["jobs_finished"]
        assert all(p.alive() for p in lab.processes.processes), lab.logs()
