"""A small real league as separate processes the chaos tests can kill -9 one by one and start again.

`league run` supervises its own coordinator (and restarts workers on its own), so the process-kill tests lay
the league out themselves with the same commands and the same `ProcessGroup`: one coordinator on a fixed
port and state file (a restart comes back where workers look for it), one learner per active player on a
fixed port (collect jobs already handed out name it), N actors. Killing is SIGKILL to the process group, as a
crash (or the OOM killer) would; starting again reuses the exact command line.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from common.ports import restartable_port
from common.proto.league.v1 import league_pb2
from league_cli.processes import ManagedProcess, ProcessGroup, league_command
from tests.chaos.invariants import (
    Ledger,
    assert_invariants,
    check_ledger,
    check_status,
    fetch_status,
    read_ledger,
)

# A one-player connect-four league that plays its own snapshots: battle payoff, ratings, snapshots every few
# hundred agent steps, a model small enough for two shared cores. No payoff decay, so game counts add up.
SELF_PLAY_LEAGUE: dict[str, Any] = {
    "league": {
        "league_type": "one_vs_one",
        "active_players": {"main_player": 1},
        "max_active_player_job": 2,
        "main_player": {"one_phase_step": 1500, "branch_probs": {"pfsp": 0.5, "sp": 0.5}},
        "payoff": {"decay": 1.0, "min_win_rate_games": 4},
    },
    "env": {"name": "connect_four", "kwargs": {}, "env_num": 4, "episode_num": 8, "env_steps": 0},
    "policy": {"algorithm": "ppo", "model": {"conv": [[8, 3, 1]], "hidden": [32], "shared_torso": True},
               "ppo": {"update_epochs": 1, "num_minibatches": 1}},
    "learner": {"batch_size": 256, "publish_every": 1, "keep_last": 3, "queue_chunks": 8},
}


@dataclass(frozen=True)
class LeagueLayout:
    """What to start: the league config (merged over the embedded default) and the process counts."""

    config: dict[str, Any]
    actors: int = 2
    learners: int = 1
    lease_timeout_s: float = 3.0
    heartbeat_interval_s: float = 0.5


def free_port() -> int:
    """A port for a server the test restarts on it: outside the range outgoing connections are given."""
    return restartable_port()


class KillableLeague:
    """Coordinator, learners and actors as child processes; `close()` kills whatever is left (use a fixture)."""

    def __init__(self, root: Path, layout: LeagueLayout) -> None:
        self.root = Path(root)
        self.layout = layout
        self.shared_root = self.root / "shared"
        self.shared_root.mkdir(parents=True, exist_ok=True)
        self.state_path = self.root / "league_state.sqlite"
        config = {
            **layout.config,
            "coordinator": {"lease_timeout_s": layout.lease_timeout_s,
                            "heartbeat_interval_s": layout.heartbeat_interval_s},
        }
        self.config_path = self.root / "league.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.payoff_decay = float(config.get("league", {}).get("payoff", {}).get("decay", 0.99))
        self.address = f"127.0.0.1:{free_port()}"
        self._learner_ports = {f"learner-{i}": free_port() for i in range(layout.learners)}
        self.group = ProcessGroup(self.root / "logs", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        self._argv: dict[str, list[str]] = {}
        self._poll = threading.Event()  # never set: its wait() is the pause between two status polls
        self.kills: dict[str, int] = {}
        # Every status polled is checked against the previous one; across a coordinator kill, against the
        # ledger read right after the kill instead (a status from before may show changes never committed).
        self.last_status: league_pb2.LeagueStatus | None = None
        self.ledger_at_kill: Ledger | None = None
        # Jobs killed actors held (per the last status): an ack may have reached one just before it died,
        # unlogged, so these are the only counted jobs the actors' logs may not mention.
        self.killed_jobs: set[str] = set()

    # ---- processes ---------------------------------------------------------------------------------------

    def start(self) -> KillableLeague:
        host, port = self.address.rsplit(":", 1)
        self._launch("coordinator", league_command(
            "coordinator", "--config", str(self.config_path), "--shared-root", str(self.shared_root),
            "--state", str(self.state_path), "--host", host, "--port", port, "--seed", "0"))
        self.wait_for(lambda s: True, 120, "the coordinator to serve")
        common = ["--coordinator", self.address, "--shared-root", str(self.shared_root)]
        for name, lport in self._learner_ports.items():
            self._launch(name, league_command("learner", *common, "--worker-id", name, "--host", "127.0.0.1",
                                              "--port", str(lport), "--device", "cpu"))
        for i in range(self.layout.actors):
            name = f"actor-{i}"
            self._launch(name, league_command("actor", *common, "--worker-id", name, "--manager", "base",
                                              "--log-level", "DEBUG"))  # every job's end: actor_reports
        return self

    def _launch(self, name: str, argv: list[str]) -> ManagedProcess:
        self._argv[name] = argv
        return self.group.start(name, argv)

    def kill(self, name: str) -> None:
        """SIGKILL the process and everything it started (a crash: no cleanup, no goodbye to anyone)."""
        proc = self.group.get(name)
        if self.last_status is not None:
            self.killed_jobs |= {j.job_id for j in self.last_status.jobs if j.worker_id == name}
        proc.kill_group()
        proc.popen.wait()
        self.group.forget(proc)
        self.kills[name] = self.kills.get(name, 0) + 1
        if name == "coordinator":
            self.ledger_at_kill = self.ledger()
            self.last_status = None

    def restart(self, name: str) -> None:
        """Start a killed process again with its exact command line (same ports, state and worker id)."""
        log = self.group.log_dir / f"{name}.log"
        with open(log, "a") as f:
            f.write(f"\n===== restarted by the chaos test after kill {self.kills.get(name, 0)} =====\n")
        self.group.start(name, self._argv[name])

    def revive(self) -> list[str]:
        """Start again every process that was killed and not restarted (a scenario that failed half way)."""
        running = {p.name for p in self.group.processes}
        missing = [name for name in self._argv if name not in running]
        for name in missing:
            self.restart(name)
        return missing

    def pause(self, seconds: float) -> None:
        """Let the league run (or stay down) for a while."""
        self._poll.wait(seconds)

    def dead(self) -> list[str]:
        return [p.name for p in self.group.dead()]

    def close(self) -> None:
        """Stop everything: SIGTERM, a short grace, then SIGKILL to every process group."""
        self.group.stop_in_order(
            [[p for p in self.group.processes if p.name.startswith(kind)] for kind in ("actor", "learner")],
            grace_s=3.0,
        )

    def actor_reports(self) -> dict[str, tuple[str, int]]:
        """Job id -> (completed | released, episodes) of every job the actors logged as ended that way.

        "completed" is logged only once FinishJob was acknowledged (a refused finish is logged as refused);
        "released" also when a job broke while its actor stopped, acknowledged or not.
        """
        reports: dict[str, tuple[str, int]] = {}
        for i in range(self.layout.actors):
            text = (self.group.log_dir / f"actor-{i}.log").read_text(errors="replace")
            for job_id, how, n in _REPORT_LINE.findall(text):
                if reports.setdefault(job_id, (how, int(n))) != (how, int(n)):
                    raise AssertionError(f"job {job_id} logged as {reports[job_id]} and as {(how, n)}")
        return reports

    def audit(self) -> None:
        """After `close()`: the books against what the actors were told. Every acknowledged result is
        recorded with its count, and every counted job is one an actor reported (or one a killed actor
        held), so no accepted match was lost and none counted twice."""
        if any(p.alive() for p in self.group.processes):
            raise RuntimeError("audit() needs the league stopped (close() first)")
        ledger = read_ledger(self.state_path)
        reports = self.actor_reports()
        if ledger.episodes_counted and not reports:
            raise AssertionError("no finished job in the actor logs (did their log format change?)")
        check_ledger(ledger, accepted={jid: n for jid, (how, n) in reports.items() if how == "completed"})
        unexplained = {jid: n for jid, (_, n) in ledger.ended.items()
                       if n and jid not in reports and jid not in self.killed_jobs}
        assert not unexplained, f"counted jobs no actor reported: {unexplained}"

    def logs(self, tail: int = 15) -> str:
        parts = []
        for name in sorted(self._argv):
            try:
                lines = (self.group.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
            except OSError:
                continue
            parts.append(f"--- {name} ---\n" + "\n".join(lines[-tail:]))
        return "\n".join(parts)

    # ---- observing ---------------------------------------------------------------------------------------

    def status(self) -> league_pb2.LeagueStatus:
        return fetch_status(self.address, timeout_s=5.0)

    def wait_for(
        self, predicate: Callable[[league_pb2.LeagueStatus], bool], timeout_s: float, what: str
    ) -> league_pb2.LeagueStatus:
        """Poll GetStatus until `predicate` holds (the coordinator may be restarting: UNAVAILABLE is waited out).

        Every status seen is checked (`check_status`, against the one before); fails at once if a process
        died that the test did not kill.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            unexpected = self.dead()
            if unexpected:
                raise AssertionError(f"{unexpected} exited on their own while waiting for {what}:\n{self.logs()}")
            try:
                status = self.status()
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
            else:
                check_status(status, earlier=self.last_status, since=self.ledger_at_kill,
                             payoff_decay=self.payoff_decay)
                self.last_status = status
                if predicate(status):
                    return status
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{self.logs()}")
            self._poll.wait(0.3)

    def check(self, earlier: league_pb2.LeagueStatus | None = None) -> league_pb2.LeagueStatus:
        """The invariants, live: status (against `earlier`) and the durable ledger. Returns the status."""
        status = assert_invariants(self.address, state_path=self.state_path, earlier=earlier or self.last_status,
                                   payoff_decay=self.payoff_decay, shared_root=self.shared_root)
        assert status is not None
        check_status(status, since=self.ledger_at_kill)
        self.last_status = status
        return status

    def ledger(self, earlier: Ledger | None = None) -> Ledger:
        """The durable books, checked (against an earlier read: nothing ended comes back, no snapshot lost)."""
        ledger = read_ledger(self.state_path)
        check_ledger(ledger, earlier=earlier)
        return ledger


# actor_service/actor.py logs "job <id> <how>: <n> episodes, ..." when a job ends (at DEBUG when it completed as usual).
_REPORT_LINE = re.compile(r"job ([0-9a-f]+) (completed|released): (\d+) episodes")


def active(status: league_pb2.LeagueStatus) -> league_pb2.PlayerStatus:
    (player,) = [p for p in status.players if p.active]
    return player


def snapshots(status: league_pb2.LeagueStatus) -> set[str]:
    return {p.player_id for p in status.players if not p.active}
