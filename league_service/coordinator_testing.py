"""A real coordinator for tests and benchmarks: in process on port 0, or as a `league coordinator` subprocess.

Not fakes: the same Coordinator, servicer and server factory the product runs. Shared by this package's tests,
the benchmark, and the integration tests of actors and learners that need a coordinator to talk to.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from common.config import merge_with_defaults
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import ServerOptions, ServerTls, make_channel, parse_listen_line
from league_service.config import Config, config_from_dict
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.server import CoordinatorServer, serve_coordinator

# A small battle league: two active players, two jobs each, no payoff decay (so game counts add up exactly).
SMALL_LEAGUE: Mapping[str, Any] = {
    "league": {
        "active_players": {"main_player": 1, "main_exploiter": 1},
        "max_active_player_job": 2,
        "payoff": {"decay": 1.0},
        "reference_bots": [],  # tests that want bots name them
    },
    "env": {"name": "connect_four", "env_num": 2, "episode_num": 4},
}


class FakeClock:
    """A coordinator's clock that tests move by hand (`clock.now += 31.0`): leases expire when they say so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def small_league_config(overrides: Mapping[str, Any] | None = None) -> Config:
    return config_from_dict(merge_with_defaults(Config, SMALL_LEAGUE, overrides or {}))


@contextlib.contextmanager
def running_coordinator(
    cfg: Config,
    shared_root: Path,
    *,
    lease_timeout_s: float | None = None,
    needs_learner: bool = True,
    token: str | None = None,
    tls: ServerTls | None = None,
    metrics_port: int | None = None,
    rng_seed: int | None = 0,
) -> Iterator[CoordinatorServer]:
    """A coordinator served on 127.0.0.1 (port 0) for the duration of the block; stopped even on failure."""
    coordinator = Coordinator(
        cfg,
        CoordinatorSettings(
            shared_root=shared_root, lease_timeout_s=lease_timeout_s, needs_learner=needs_learner, rng_seed=rng_seed
        ),
    )
    server = serve_coordinator(
        coordinator,
        ServerOptions(host="127.0.0.1", port=0, token=token, tls=tls),
        metrics_port=metrics_port,
    )
    try:
        yield server
    finally:
        server.stop(grace_s=1.0)


def run_dir_holding(run_dir: Path, config: Path) -> None:
    """`run_dir` as a `league run` directory holding the league of `config` in its state (made and closed by a
    coordinator, as a first run does), with its checkpoints' `shared` folder and nothing else."""
    from league_service.config import load_config

    (run_dir / "shared").mkdir(parents=True)
    Coordinator(load_config(config), CoordinatorSettings(shared_root=run_dir / "shared",
                                                         state_path=run_dir / "league_state.sqlite")).close()


def league_stub(address: str, **channel_kwargs: Any) -> tuple[grpc.Channel, league_pb2_grpc.LeagueServiceStub]:
    channel = make_channel(address, **channel_kwargs)
    return channel, league_pb2_grpc.LeagueServiceStub(channel)


def outcomes_for(job: league_pb2.Job, home_wins: Sequence[bool]) -> list[league_pb2.EpisodeResult]:
    """Episode results of a collect job: one per entry, won (or lost) by the launch player, in seat order."""
    ids = [p.player_id for p in job.players]
    episodes = []
    for won in home_wins:
        if len(ids) == 1:
            outcomes = [league_pb2.PlayerOutcome(player_id=ids[0], episode_return=1.0 if won else 0.0)]
        else:
            home, away = (league_pb2.OUTCOME_WIN, league_pb2.OUTCOME_LOSS) if won else (
                league_pb2.OUTCOME_LOSS, league_pb2.OUTCOME_WIN)
            outcomes = [
                league_pb2.PlayerOutcome(player_id=ids[0], outcome=home),
                league_pb2.PlayerOutcome(player_id=ids[1], outcome=away),
            ]
        episodes.append(league_pb2.EpisodeResult(length=7, players=outcomes))
    return episodes


def coordinator_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "league_service.cli", "coordinator", *argv]


@dataclass
class ServerProcess:
    """A server command (by default `league coordinator`) as a child process in its own process group; its
    address comes from the `LISTENING service=... address=...` line it prints once bound."""

    command: list[str]
    log_path: Path
    popen: subprocess.Popen[str] = field(init=False)
    address: str = field(init=False, default="")
    _lines: queue.Queue[str] = field(init=False, default_factory=queue.Queue)

    def start(self, timeout_s: float = 60.0) -> ServerProcess:
        self.popen = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, name="server-log", daemon=True).start()
        try:
            while True:
                try:
                    line = self._lines.get(timeout=timeout_s)
                except queue.Empty:
                    raise TimeoutError(f"server did not report its address in {timeout_s}s: {self.log_tail()}") from None
                if line == "":
                    raise RuntimeError(f"server exited with {self.popen.wait()}: {self.log_tail()}")
                parsed = parse_listen_line(line)
                if parsed is not None:
                    self.address = parsed[1]
                    return self
        except BaseException:
            self.kill()
            raise

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        with open(self.log_path, "a") as log:
            for line in self.popen.stdout:
                log.write(line)
                log.flush()
                self._lines.put(line)
        self._lines.put("")

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the exit code."""
        self._signal(signal.SIGTERM)
        return self.popen.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL the whole process group (no cleanup runs: this is the crash case)."""
        self._signal(signal.SIGKILL)
        self.popen.wait(30)

    def _signal(self, sig: int) -> None:
        """To the whole group, whether or not its leader still runs: what it started may outlive it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


@contextlib.contextmanager
def server_process(command: Sequence[str], log_path: Path) -> Iterator[ServerProcess]:
    """A started server subprocess, killed at the end of the block whatever happened."""
    proc = ServerProcess(list(command), log_path).start()  # kills what it started if it fails
    try:
        yield proc
    finally:
        proc.kill()


def coordinator_process(argv: Sequence[str], log_path: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    """`league coordinator ARGV...` for the duration of a with-block."""
    return server_process(coordinator_command(*argv), log_path)
