"""Run a docker compose deployment without Docker: every service replica a process in a network namespace.

CI has no Docker engine, yet most of what can go wrong in a deployment is in its text: the commands and flags,
which address a service dials and which it advertises, where volumes and secrets land, which healthcheck gates
which start. So this harness reads the real compose files (deploy/docker-compose.yml and the extra-node ones)
and the image's ENTRYPOINT (deploy/Dockerfile), and runs each replica's command as a process on a host of its own:

- hosts are network namespaces joined by veth pairs to a bridge that sits in a switch namespace of its own, one
  address each in a private /24 that exists only inside namespaces made here (the host's own network namespace
  is never touched, and nothing can leave the machine);
- service and replica names resolve through a per-namespace /etc/hosts (`ip netns exec` bind-mounts
  /etc/netns/<ns>/hosts over /etc/hosts) and each replica gets its own hostname (`unshare --uts`);
- named volumes are host directories (the same name in two compose files is the same directory: the stand-in for
  the NFS export every node mounts), secrets and configs are their host files, and container paths in arguments
  are rewritten to them; a replica starts with a clean environment, as in a container.

`close()` (also on `with` exit) stops every process, deletes every namespace and removes every file under
/etc/netns it made, whatever happened before. The compose model (`load_compose` and friends) is pure and usable
without root, so unit tests check the files with it too.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from league_cli.processes import ManagedProcess, ProcessGroup

REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY_DIR = REPO_ROOT / "deploy"
DOCKERFILE = DEPLOY_DIR / "Dockerfile"
NETNS_ETC = Path("/etc/netns")
SUBNET_PREFIX = "10.213.0"
# Namespaces are named lgt<pid>x<n>-<role>, so a later run can tell an abandoned one (its pid is gone).
_NETWORK_SERIAL = itertools.count()
_OUR_NAMESPACE = re.compile(r"lgt(\d+)x\d+-\w+")


class ComposeError(ValueError):
    """A compose file the harness (or compose itself) cannot use; the message names the key."""


class DeploymentError(RuntimeError):
    """A replica did not come up, or a command in a namespace failed."""


# ================================================================================================================
# Compose model (pure)
# ================================================================================================================

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str, env: Mapping[str, str], where: str = "") -> str:
    """Compose's variable syntax: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR:+alt}."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        value, op, arg = env.get(name), match["op"], match["arg"] or ""
        if op is None:
            return value or ""
        missing = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if missing else value
        if op.endswith("+"):
            return "" if missing else arg
        if missing:
            raise ComposeError(f"{where}: required variable {name} is missing a value: {arg}")
        return value

    return _VARIABLE.sub(replace, text)


def _interpolate_tree(node: Any, env: Mapping[str, str], where: str) -> Any:
    if isinstance(node, str):
        return interpolate(node, env, where)
    if isinstance(node, list):
        return [_interpolate_tree(v, env, f"{where}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, env, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
    return node


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str | int | float, where: str) -> float:
    """Seconds in a compose duration such as "5s", "1m30s" or "500ms"."""
    if isinstance(text, int | float):
        return float(text)
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeError(f"{where}: not a duration: {text!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


@dataclass(frozen=True)
class Mount:
    """Something a container sees at `target`: a named volume, a bind mount, a secret or a config."""

    kind: str  # "volume" | "bind" | "secret" | "config"
    source: str  # the volume / secret / config name; the host path for a bind
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]  # the exec-form command (after "CMD")
    interval_s: float
    timeout_s: float
    retries: int
    start_period_s: float


@dataclass(frozen=True)
class Dependency:
    service: str
    condition: str  # service_started | service_healthy | service_completed_successfully


@dataclass(frozen=True)
class Service:
    name: str
    command: tuple[str, ...]
    entrypoint: tuple[str, ...] | None
    environment: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    healthcheck: Healthcheck | None
    depends_on: tuple[Dependency, ...]
    restart: str
    replicas: int
    profiles: tuple[str, ...]
    ports: tuple[str, ...]
    stop_grace_s: float

    def mount_at(self, target: str) -> Mount | None:
        return next((m for m in self.mounts if m.target == target), None)

    def option(self, flag: str) -> str | None:
        """The value after `flag` in the command (either `--flag value` or `--flag=value`), None if absent."""
        for i, arg in enumerate(self.command):
            if arg == flag and i + 1 < len(self.command):
                return self.command[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
        return None


@dataclass(frozen=True)
class ComposeFile:
    path: Path
    project: str
    services: Mapping[str, Service]
    volumes: Mapping[str, Mapping[str, Any]]
    secrets: Mapping[str, Path]  # name -> host file
    configs: Mapping[str, Path]


def _command(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    raise ComposeError(f"{where}: expected a string or a list of strings, got {value!r}")


def _environment(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if isinstance(value, dict):
        return tuple((str(k), "" if v is None else str(v)) for k, v in value.items())
    if isinstance(value, list):
        pairs = []
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep:
                raise ComposeError(f"{where}: {item!r} takes its value from the host; give KEY=VALUE")
            pairs.append((key, val))
        return tuple(pairs)
    raise ComposeError(f"{where}: expected a mapping or a list, got {value!r}")


def _volume_mount(item: Any, base: Path, where: str) -> Mount:
    if isinstance(item, str):
        parts = item.split(":")
        if len(parts) not in (2, 3):
            raise ComposeError(f"{where}: expected SOURCE:TARGET[:MODE], got {item!r}")
        source, target = parts[0], parts[1]
        read_only = len(parts) == 3 and "ro" in parts[2].split(",")
        kind = "bind" if source.startswith(("/", ".", "~")) else "volume"
    elif isinstance(item, dict):
        kind, source, target = item.get("type", "volume"), str(item.get("source", "")), item.get("target")
        read_only = bool(item.get("read_only", False))
        if kind not in ("volume", "bind") or not target:
            raise ComposeError(
                f"{where}: only volume and bind mounts with a target are supported, got {item!r}"
            )
    else:
        raise ComposeError(f"{where}: expected a string or a mapping, got {item!r}")
    if kind == "bind":
        source = str((base / Path(source).expanduser()).resolve())
    return Mount(kind, source, str(target), read_only)


def _file_mount(kind: str, item: Any, where: str) -> Mount:
    """A secret (default target /run/secrets/NAME) or a config (default target /NAME)."""
    default_dir = "/run/secrets" if kind == "secret" else "/"
    if isinstance(item, str):
        source, target = item, None
    elif isinstance(item, dict) and "source" in item:
        source, target = str(item["source"]), item.get("target")
    else:
        raise ComposeError(f"{where}: expected a name or {{source, target}}, got {item!r}")
    if target is None:
        target = source
    if not str(target).startswith("/"):
        target = f"{default_dir.rstrip('/')}/{target}"
    return Mount(kind, source, str(target), read_only=True)


def _healthcheck(value: Any, where: str) -> Healthcheck | None:
    if value is None or value.get("disable"):
        return None
    test = value.get("test")
    if isinstance(test, list) and test and test[0] == "NONE":
        return None
    if not (isinstance(test, list) and len(test) > 1 and test[0] == "CMD"):
        raise ComposeError(
            f"{where}.test: use the exec form [CMD, program, args...] (no shell), got {test!r}"
        )
    return Healthcheck(
        test=tuple(str(t) for t in test[1:]),
        interval_s=parse_duration(value.get("interval", "30s"), f"{where}.interval"),
        timeout_s=parse_duration(value.get("timeout", "30s"), f"{where}.timeout"),
        retries=int(value.get("retries", 3)),
        start_period_s=parse_duration(value.get("start_period", "0s"), f"{where}.start_period"),
    )


def _depends_on(value: Any, where: str) -> tuple[Dependency, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(Dependency(str(s), "service_started") for s in value)
    if isinstance(value, dict):
        return tuple(
            Dependency(str(s), (spec or {}).get("condition", "service_started")) for s, spec in value.items()
        )
    raise ComposeError(f"{where}: expected a list or a mapping, got {value!r}")


def _service(name: str, raw: Mapping[str, Any], base: Path) -> Service:
    where = f"services.{name}"
    command = _command(raw.get("command"), f"{where}.command")
    if command is None:
        raise ComposeError(f"{where}.command: every service must say which `league` subcommand it runs")
    replicas = raw.get("scale", (raw.get("deploy") or {}).get("replicas", 1))
    return Service(
        name=name,
        command=command,
        entrypoint=_command(raw.get("entrypoint"), f"{where}.entrypoint"),
        environment=_environment(raw.get("environment"), f"{where}.environment"),
        mounts=(
            *(
                _volume_mount(v, base, f"{where}.volumes[{i}]")
                for i, v in enumerate(raw.get("volumes") or ())
            ),
            *(
                _file_mount("secret", s, f"{where}.secrets[{i}]")
                for i, s in enumerate(raw.get("secrets") or ())
            ),
            *(
                _file_mount("config", c, f"{where}.configs[{i}]")
                for i, c in enumerate(raw.get("configs") or ())
            ),
        ),
        healthcheck=_healthcheck(raw.get("healthcheck"), f"{where}.healthcheck"),
        depends_on=_depends_on(raw.get("depends_on"), f"{where}.depends_on"),
        restart=str(raw.get("restart", "no")),
        replicas=int(replicas),
        profiles=tuple(raw.get("profiles") or ()),
        ports=tuple(str(p) for p in raw.get("ports") or ()),
        stop_grace_s=parse_duration(raw.get("stop_grace_period", "10s"), f"{where}.stop_grace_period"),
    )


def _file_sources(section: Mapping[str, Any] | None, base: Path, where: str) -> dict[str, Path]:
    files = {}
    for name, spec in (section or {}).items():
        if not isinstance(spec, dict) or "file" not in spec:
            raise ComposeError(f"{where}.{name}: only file-backed entries are supported, got {spec!r}")
        files[name] = (base / Path(spec["file"]).expanduser()).resolve()
    return files


def load_compose(path: str | os.PathLike[str], env: Mapping[str, str]) -> ComposeFile:
    """Parse and interpolate a compose file (YAML anchors and merge keys included) into a `ComposeFile`."""
    path = Path(path).resolve()
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("services"), dict):
        raise ComposeError(f"{path}: a compose file needs a `services` mapping")
    raw = _interpolate_tree(raw, env, "")
    base = path.parent
    services = {name: _service(name, spec or {}, base) for name, spec in raw["services"].items()}
    compose = ComposeFile(
        path=path,
        project=str(raw.get("name", base.name)),
        services=services,
        volumes={name: spec or {} for name, spec in (raw.get("volumes") or {}).items()},
        secrets=_file_sources(raw.get("secrets"), base, "secrets"),
        configs=_file_sources(raw.get("configs"), base, "configs"),
    )
    _check_references(compose)
    return compose


def _check_references(compose: ComposeFile) -> None:
    """Every named volume, secret, config and dependency a service uses is declared (as compose requires)."""
    declared = {"volume": compose.volumes, "secret": compose.secrets, "config": compose.configs}
    for service in compose.services.values():
        for mount in service.mounts:
            if mount.kind != "bind" and mount.source not in declared[mount.kind]:
                raise ComposeError(f"services.{service.name}: {mount.kind} {mount.source!r} is not declared")
        for dep in service.depends_on:
            if dep.service not in compose.services:
                raise ComposeError(f"services.{service.name}.depends_on: no service {dep.service!r}")


def dockerfile_entrypoint(path: Path = DOCKERFILE) -> tuple[str, ...]:
    """The exec-form ENTRYPOINT of the image's final stage."""
    found = None
    for line in path.read_text().splitlines():
        if line.startswith("FROM "):
            found = None
        elif line.startswith("ENTRYPOINT "):
            found = line[len("ENTRYPOINT ") :].strip()
    if found is None:
        raise ComposeError(f"{path}: the final stage has no ENTRYPOINT")
    value = json.loads(found)
    if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise ComposeError(f"{path}: ENTRYPOINT must be the exec form, a JSON list of strings")
    return tuple(value)


def league_argv(args: Sequence[str]) -> list[str]:
    """`league ARGS` as a child of this interpreter (no console script or PATH needed)."""
    return [sys.executable, "-m", "league_cli", *args]


def python_argv(*args: str) -> list[str]:
    """`python ARGS` with this interpreter (the one whose environment has the package)."""
    return [sys.executable, *args]


def image_argv(argv: Sequence[str]) -> list[str]:
    """What a container's argv (entrypoint + command) runs as here.

    tini is dropped (the harness itself reaps and signals its children); `league` and `python` are this
    interpreter. Anything else is not in the image's contract and is refused.
    """
    argv = list(argv)
    if argv[:2] == ["tini", "--"]:
        argv = argv[2:]
    if not argv:
        raise ComposeError("empty command")
    if argv[0] == "league":
        return league_argv(argv[1:])
    if argv[0] in ("python", "python3"):
        return python_argv(*argv[1:])
    raise ComposeError(f"{argv[0]!r}: only `league ...` and `python ...` run inside the image")


# ================================================================================================================
# Network: namespaces on a private bridge
# ================================================================================================================


def _run(argv: Sequence[str], *, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise DeploymentError(f"`{shlex.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (a skip reason), or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH (apt-get install -y {package})"
    probe = f"lgtprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        for what, argv in (
            ("enter a network namespace", ["ip", "netns", "exec", probe, "unshare", "--uts", "true"]),
            (
                "create a veth pair",
                ["ip", "-n", probe, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb"],
            ),
            ("create a bridge", ["ip", "-n", probe, "link", "add", "br0", "type", "bridge"]),
        ):
            ran = subprocess.run(argv, capture_output=True, text=True)
            if ran.returncode != 0:
                return f"cannot {what}: {ran.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe])
    return None


@dataclass(frozen=True)
class Host:
    """One machine on the test network: its namespace, address, names, and the switch port its cable is in."""

    name: str
    netns: str
    address: str
    switch_port: str
    aliases: tuple[str, ...] = ()


class NetnsNetwork:
    """A private layer-2 network: a bridge in a switch namespace, and one namespace per host cabled to it."""

    def __init__(self, prefix: str | None = None, subnet_prefix: str = SUBNET_PREFIX) -> None:
        self.prefix = prefix or f"lgt{os.getpid()}x{next(_NETWORK_SERIAL)}"
        self.subnet_prefix = subnet_prefix
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self._etc_dirs: list[Path] = []
        self._made_netns_etc = False
        self._closed = False
        _sweep_stale_namespaces()
        self.switch = self._add_namespace("sw")
        try:
            _run(["ip", "-n", self.switch, "link", "set", "lo", "up"])
            _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}"
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        return name

    def add_host(self, name: str, aliases: Sequence[str] = ()) -> Host:
        """A new namespace with `eth0` on the bridge and the next free address; names resolve once
        `write_hosts_files()` ran."""
        if name in self.hosts:
            raise ValueError(f"name: host {name!r} exists already")
        index = len(self.hosts) + 2  # .1 stays free, as a gateway would have it
        if index > 254:
            raise ValueError("hosts: the /24 test subnet is full")
        netns = self._add_namespace(f"h{index}")
        port = f"p{index}"
        address = f"{self.subnet_prefix}.{index}"
        _run(["ip", "link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name", port, "netns", self.switch])  # fmt: skip
        _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0"])
        _run(["ip", "-n", self.switch, "link", "set", port, "up"])
        _run(["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0"])
        _run(["ip", "-n", netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        host = Host(name, netns, address, port, tuple(aliases))
        self.hosts[name] = host
        return host

    def write_hosts_files(self) -> None:
        """/etc/hosts of every namespace: localhost, then every host's name and aliases.

        Written before any process starts: `ip netns exec` bind-mounts the file, so it must not change under a
        running resolver.
        """
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{h.address} {' '.join((h.name, *h.aliases))}" for h in self.hosts.values()]
        text = "\n".join(lines) + "\n"
        if not NETNS_ETC.exists():
            NETNS_ETC.mkdir(mode=0o755)
            self._made_netns_etc = True
        for host in self.hosts.values():
            etc = NETNS_ETC / host.netns
            if etc not in self._etc_dirs:
                etc.mkdir(mode=0o755, exist_ok=False)
                self._etc_dirs.append(etc)
            (etc / "hosts").write_text(text)

    def exec_argv(self, host: Host, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path) -> list[str]:
        """`argv` inside `host`: its network namespace, its own hostname, `cwd`, and only `env` (as a container)."""
        script = 'hostname "$1" && cd "$2" && shift 2 && exec "$@"'
        return [
            "ip", "netns", "exec", host.netns, "unshare", "--uts", "--", "sh", "-c", script, "sh",
            host.name, str(cwd), "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv,
        ]  # fmt: skip

    def set_link(self, host: Host, up: bool) -> None:
        """Plug `host`'s cable in or out at the switch (its own interface sees the carrier go)."""
        _run(["ip", "-n", self.switch, "link", "set", host.switch_port, "up" if up else "down"])

    def close(self) -> None:
        """Kill what still runs in our namespaces, delete them and their /etc/netns files; raise what failed."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for netns in reversed(self._namespaces):
            try:
                _kill_namespace_processes(netns)
                _run(["ip", "netns", "del", netns])
            except (DeploymentError, OSError, subprocess.TimeoutExpired) as err:
                errors.append(f"{netns}: {err}")
        for etc in self._etc_dirs:
            try:
                (etc / "hosts").unlink(missing_ok=True)
                etc.rmdir()
            except OSError as err:
                errors.append(f"{etc}: {err}")
        if self._made_netns_etc:
            try:
                NETNS_ETC.rmdir()
            except OSError as err:
                # Another run (ours or a neighbour's) still has namespaces with files there: it is theirs now.
                if err.errno != errno.ENOTEMPTY:
                    errors.append(f"{NETNS_ETC}: {err}")
        if errors:
            raise DeploymentError("cleanup failed: " + "; ".join(errors))


def _namespace_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _kill_namespace_processes(netns: str) -> None:
    """SIGKILL processes left in a namespace we made (they can only be ours: env subprocesses of our replicas)."""
    for pid in _namespace_pids(netns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _sweep_stale_namespaces() -> None:
    """Delete empty namespaces that an earlier, killed run of this harness left behind (its pid is gone)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _OUR_NAMESPACE.fullmatch(name)
        if match is None or Path(f"/proc/{match[1]}").exists() or _namespace_pids(name):
            continue
        _run(["ip", "netns", "del", name])
        etc = NETNS_ETC / name
        (etc / "hosts").unlink(missing_ok=True)
        if etc.exists():
            etc.rmdir()


# ================================================================================================================
# Deployment: compose projects on the network
# ================================================================================================================


@dataclass(frozen=True)
class Project:
    """Which services of a compose file run, and how many replicas each (`--scale`)."""

    compose: ComposeFile
    services: tuple[str, ...] | None = None  # None: every service without a profile
    scale: Mapping[str, int] = field(default_factory=dict)
    # Prepended to replica names so two files' `actor` replicas do not clash (think: another node).
    host_prefix: str = ""

    def selected(self) -> list[Service]:
        if self.services is None:
            return [s for s in self.compose.services.values() if not s.profiles]
        unknown = set(self.services) - set(self.compose.services)
        if unknown:
            raise ComposeError(f"{self.compose.path.name}: no services {sorted(unknown)}")
        return [self.compose.services[n] for n in self.services]


@dataclass(frozen=True)
class Replica:
    name: str
    service: Service
    project: Project
    host: Host


class NetnsDeployment:
    """Compose projects run as processes on a `NetnsNetwork`; use as a context manager so cleanup always runs."""

    def __init__(
        self,
        projects: Sequence[Project],
        work_dir: Path,
        *,
        extra_hosts: Sequence[str] = (),
        entrypoint: Sequence[str] | None = None,
        probe_interval_s: float = 0.5,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.entrypoint = tuple(entrypoint) if entrypoint is not None else dockerfile_entrypoint()
        self.probe_interval_s = probe_interval_s
        self.replicas: dict[str, Replica] = {}
        self._stop = threading.Event()
        self._by_project: dict[int, list[Replica]] = {}
        for d in ("volumes", "homes", "logs"):
            (self.work_dir / d).mkdir(parents=True, exist_ok=True)
        self.network = NetnsNetwork()
        try:
            self.processes = ProcessGroup(self.work_dir / "logs")
            for project in projects:
                self._add_project(project)
            for name in extra_hosts:
                self.network.add_host(name)
            self.network.write_hosts_files()
        except BaseException:
            self.network.close()
            raise

    def _add_project(self, project: Project) -> None:
        replicas = self._by_project.setdefault(id(project), [])
        for service in project.selected():
            count = project.scale.get(service.name, service.replicas)
            for i in range(1, count + 1):
                name = f"{project.host_prefix}{service.name}" + (f"-{i}" if count > 1 else "")
                # Compose's DNS answers the service name with every replica; the first project owns the name.
                alias = (service.name,) if count > 1 and not project.host_prefix else ()
                replica = Replica(name, service, project, self.network.add_host(name, alias))
                self.replicas[name] = replica
                replicas.append(replica)

    # ---- paths and commands ------------------------------------------------------------------------------

    def volume_dir(self, name: str) -> Path:
        path = self.work_dir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _host_paths(self, replica: Replica) -> list[tuple[str, str]]:
        compose, out = replica.project.compose, []
        for m in replica.service.mounts:
            if m.kind == "volume":
                out.append((m.target, str(self.volume_dir(m.source))))
            elif m.kind == "bind":
                out.append((m.target, m.source))
            else:
                files = compose.secrets if m.kind == "secret" else compose.configs
                out.append((m.target, str(files[m.source])))
        return sorted(out, key=lambda pair: len(pair[0]), reverse=True)

    def _translate(self, replica: Replica, arg: str) -> str:
        flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        for target, host in self._host_paths(replica):
            if value == target or value.startswith(target.rstrip("/") + "/"):
                return f"{flag}{eq}{host}{value[len(target) :]}"
        return arg

    def container_argv(self, replica: Replica, argv: Sequence[str]) -> list[str]:
        """A command as the container would run it, as a host argv with container paths mapped to host files."""
        return [self._translate(replica, a) for a in image_argv(argv)]

    def _home(self, name: str) -> Path:
        home = self.work_dir / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        return home

    def _env(self, replica: Replica | None, name: str) -> dict[str, str]:
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self._home(name)),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        if replica is not None:
            env.update({k: self._translate(replica, v) for k, v in replica.service.environment})
        return env

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def up(self, project: Project, *, health_timeout_s: float = 60.0, wait: bool = True) -> None:
        """Start `project`'s replicas in dependency order; `service_healthy` waits for the dependency's healthcheck.

        `wait` (as `docker compose up --wait`): return once every replica that has a healthcheck passes it.
        """
        replicas = self._by_project[id(project)]
        started: set[str] = set()
        pending = list(dict.fromkeys(r.service.name for r in replicas))
        while pending:
            ready = [
                s
                for s in pending
                if all(d.service in started for d in project.compose.services[s].depends_on)
            ]
            if not ready:
                raise ComposeError(f"{project.compose.path.name}: depends_on cannot be met for {pending}")
            for service_name in ready:
                service = project.compose.services[service_name]
                for dep in service.depends_on:
                    self._await_condition(project, dep, health_timeout_s)
                for replica in (r for r in replicas if r.service.name == service_name):
                    self._start(replica)
                started.add(service_name)
                pending.remove(service_name)
        if wait:
            for replica in replicas:
                if replica.service.healthcheck is not None:
                    self.wait_healthy(replica.name, health_timeout_s)

    def _await_condition(self, project: Project, dep: Dependency, timeout_s: float) -> None:
        targets = [r for r in self._by_project[id(project)] if r.service.name == dep.service]
        if not targets:
            raise ComposeError(f"{dep.service!r} is a dependency but not among the services started")
        for replica in targets:
            if dep.condition == "service_healthy":
                self.wait_healthy(replica.name, timeout_s)
            elif dep.condition == "service_completed_successfully":
                code = self.process(replica.name).popen.wait(timeout=timeout_s)
                if code != 0:
                    raise DeploymentError(
                        f"{replica.name} exited {code}:\n{self.process(replica.name).log_tail()}"
                    )

    def _start(self, replica: Replica) -> ManagedProcess:
        argv = [*(replica.service.entrypoint or self.entrypoint), *replica.service.command]
        host_argv = self.container_argv(replica, argv)
        return self.processes.start(
            replica.name,
            self.network.exec_argv(
                replica.host, host_argv, env=self._env(replica, replica.name), cwd=self._home(replica.name)
            ),
        )

    def process(self, name: str) -> ManagedProcess:
        return self.processes.get(name)

    def healthcheck(self, name: str) -> subprocess.CompletedProcess[str]:
        """Run the replica's compose healthcheck inside its namespace (where Docker runs it: in the container)."""
        replica = self.replicas[name]
        check = replica.service.healthcheck
        if check is None:
            raise ComposeError(f"services.{replica.service.name}: has no healthcheck")
        return self._exec(
            replica.host,
            self.container_argv(replica, check.test),
            self._env(replica, name),
            timeout_s=check.timeout_s + 5.0,
        )

    def wait_healthy(self, name: str, timeout_s: float) -> None:
        """Probe at the healthcheck's interval (capped at `probe_interval_s`) until it passes or time runs out."""
        replica = self.replicas[name]
        if replica.service.healthcheck is None:
            raise ComposeError(f"services.{replica.service.name}: service_healthy needs a healthcheck")
        interval = min(replica.service.healthcheck.interval_s, self.probe_interval_s)
        deadline = time.monotonic() + timeout_s
        while True:
            proc = self.process(name)
            if not proc.alive():
                raise DeploymentError(
                    f"{name} exited ({proc.popen.returncode}) before it was healthy:\n{proc.log_tail()}"
                )
            result = self.healthcheck(name)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise DeploymentError(
                    f"{name} not healthy after {timeout_s:.0f}s: {result.stderr.strip()}\n{proc.log_tail()}"
                )
            self._stop.wait(interval)

    def run(
        self, host_name: str, argv: Sequence[str], *, timeout_s: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """A one-off host argv on any host (e.g. `league status` from a laptop); the result, whatever its code."""
        host = self.network.hosts[host_name]
        return self._exec(host, argv, self._env(None, host_name), timeout_s=timeout_s)

    def _exec(self, host: Host, argv: Sequence[str], env: Mapping[str, str], *, timeout_s: float):
        full = self.network.exec_argv(host, argv, env=env, cwd=self._home(host.name))
        return subprocess.run(
            full, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )

    def set_link(self, name: str, up: bool) -> None:
        self.network.set_link(self.network.hosts[name], up)

    def logs(self) -> str:
        """Every replica's log tail, for failure messages."""
        return "\n".join(
            f"--- {p.name} ({'running' if p.alive() else p.popen.returncode})\n{p.log_tail(30)}"
            for p in self.processes.processes
        )

    def close(self) -> None:
        """Stop every replica (SIGTERM, then SIGKILL after its grace), then tear the network down."""
        self._stop.set()
        try:
            grace = max((r.service.stop_grace_s for r in self.replicas.values()), default=5.0)
            self.processes.stop(grace_s=min(grace, 10.0))
        finally:
            self.network.close()

    def __enter__(self) -> NetnsDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
