"""The Kubernetes manifests, checked structurally: the YAML parses, every kind is there, probes are native gRPC on
the port the server listens on, volumes and the token Secret are mounted where the commands look, and every
container's args parse with the `league` CLI. With kubernetes-validate installed they are also checked against
the Kubernetes API schemas.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import pytest
import yaml

from league_service.config import config_from_dict, load_config
from tests.netns_harness import DEPLOY_DIR
from tests.unit.test_deploy_compose import parse_league

K8S = DEPLOY_DIR / "k8s"
IMAGE = "league-training"
IMAGE_UID = 10001
TOKEN_SECRET = "league-token"


def manifests() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def find(kind: str, name: str) -> dict:
    found = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


WORKLOADS = {
    "coordinator": ("Deployment", "league-coordinator"),
    "learner": ("StatefulSet", "league-learner"),
    "actor": ("Deployment", "league-actor"),
}


def pod_spec(role: str) -> dict:
    return find(*WORKLOADS[role])["spec"]["template"]["spec"]


def container(role: str) -> dict:
    containers = pod_spec(role)["containers"]
    assert len(containers) == 1
    return containers[0]


def option(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def expanded_args(c: dict) -> list[str]:
    """args with Kubernetes' $(VAR) references replaced by sample values (each must be a declared env var)."""
    declared = {e["name"]: e for e in c.get("env", [])}

    def sample(match: re.Match[str]) -> str:
        assert match[1] in declared, f"$({match[1]}) is not in the container's env"
        if "resourceFieldRef" in declared[match[1]].get("valueFrom", {}):
            return "1"  # a resource quantity in whole units
        return f"sample-{match[1].lower()}"

    return [re.sub(r"\$\((\w+)\)", sample, a) for a in c["args"]]


def test_kustomization_lists_every_manifest_and_sets_the_image():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert [i["name"] for i in kustomization["images"]] == [IMAGE]


def test_every_kind_is_there():
    kinds = {(d["kind"], d["metadata"]["name"]) for d in manifests()}
    assert {
        ("Deployment", "league-coordinator"),
        ("Service", "league-coordinator"),
        ("StatefulSet", "league-learner"),
        ("Service", "league-learner"),
        ("Deployment", "league-actor"),
        ("PersistentVolumeClaim", "league-shared"),
        ("PersistentVolumeClaim", "league-coordinator-state"),
        ("ConfigMap", "league-config"),
    } <= kinds
    assert find("PersistentVolumeClaim", "league-shared")["spec"]["accessModes"] == ["ReadWriteMany"]
    assert find("Deployment", "league-coordinator")["spec"]["replicas"] == 1
    assert find("Deployment", "league-coordinator")["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize("role", list(WORKLOADS))
def test_same_image_non_root_and_args_parse_with_the_cli(role):
    c = container(role)
    assert c["image"] == IMAGE
    assert "command" not in c, "keep the image's entrypoint (tini -- league)"
    sec = pod_spec(role)["securityContext"]
    assert sec["runAsNonRoot"] is True and sec["runAsUser"] == IMAGE_UID and sec["fsGroup"] == IMAGE_UID
    args = expanded_args(c)
    assert args[0] == role
    parse_league(args)


@pytest.mark.parametrize("role", ["coordinator", "learner"])
def test_servers_have_native_grpc_probes_on_their_port(role):
    c = container(role)
    port = int(option(c["args"], "--port"))
    assert port in [p["containerPort"] for p in c["ports"]]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert set(c[probe]) - {"periodSeconds", "timeoutSeconds", "failureThreshold"} == {"grpc"}, probe
        assert c[probe]["grpc"]["port"] == port, probe


@pytest.mark.parametrize("role", list(WORKLOADS))
def test_shared_root_and_token_are_mounted_where_the_command_reads_them(role):
    c, spec = container(role), pod_spec(role)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}

    shared = mounts[option(c["args"], "--shared-root")]
    assert volumes[shared["name"]]["persistentVolumeClaim"]["claimName"] == "league-shared"

    token = mounts[option(c["args"], "--token-file")]
    secret = volumes[token["name"]]["secret"]
    assert secret["secretName"] == TOKEN_SECRET and token["subPath"] == "token" and token["readOnly"] is True
    assert secret["defaultMode"] & 0o007 == 0, "the token must not be world-readable"
    assert "--insecure" not in c["args"]


def test_readme_says_how_to_create_the_token_secret():
    assert (
        f"create secret generic {TOKEN_SECRET} --from-file=token=" in (DEPLOY_DIR / "README.md").read_text()
    )


def test_coordinator_state_is_local_and_config_comes_from_the_configmap():
    c, spec = container("coordinator"), pod_spec("coordinator")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    state_dir = str(PurePosixPath(option(c["args"], "--state")).parent)
    assert (
        volumes[mounts[state_dir]["name"]]["persistentVolumeClaim"]["claimName"] == "league-coordinator-state"
    )
    config = PurePosixPath(option(c["args"], "--config"))
    assert volumes[mounts[str(config.parent)]["name"]]["configMap"]["name"] == "league-config"
    assert config.name in find("ConfigMap", "league-config")["data"]


def test_configmap_is_deploy_league_yaml_and_learners_match_its_active_players():
    text = find("ConfigMap", "league-config")["data"]["league.yaml"]
    assert text == (DEPLOY_DIR / "league.yaml").read_text()
    cfg = config_from_dict(yaml.safe_load(text))
    assert cfg == load_config(DEPLOY_DIR / "league.yaml")
    assert find("StatefulSet", "league-learner")["spec"]["replicas"] == sum(
        cfg.league.active_players.values()
    )


def test_learners_take_their_worker_id_and_address_from_the_pod_name():
    sts = find("StatefulSet", "league-learner")
    headless = find("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    c = container("learner")
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert option(c["args"], "--worker-id") == "$(POD_NAME)"
    port = option(c["args"], "--port")
    assert option(c["args"], "--advertise") == f"$(POD_NAME).{headless['metadata']['name']}:{port}"
    assert headless["spec"]["ports"][0]["port"] == int(port)


def test_actors_size_their_env_manager_for_the_cpus_they_request():
    c = container("actor")
    env = {e["name"]: e for e in c["env"]}
    variable = re.fullmatch(r"\$\((\w+)\)", option(c["args"], "--env-cpus"))[1]
    field = env[variable]["valueFrom"]["resourceFieldRef"]
    assert (field["containerName"], field["resource"], field["divisor"]) == ("actor", "requests.cpu", "1")
    assert "cpu" in c["resources"]["requests"]


@pytest.mark.parametrize("role", ["learner", "actor"])
def test_workers_dial_the_coordinator_service(role):
    service = find("Service", "league-coordinator")
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert option(container(role)["args"], "--coordinator") == f"league-coordinator:{grpc_port}"
    labels = find(*WORKLOADS["coordinator"])["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_manifests_match_the_kubernetes_schemas():
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed"
    )
    for doc in manifests():
        kubernetes_validate.validate(doc, desired_version="1.30.0", strict=True)


def test_image_user_matches_the_pods():
    dockerfile = (DEPLOY_DIR / "Dockerfile").read_text()
    assert f"USER {IMAGE_UID}:{IMAGE_UID}" in dockerfile
    assert Path(K8S / "kustomization.yaml").exists()
