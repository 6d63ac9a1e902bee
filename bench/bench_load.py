"""Load test: many simulated workers doing the real RPC sequence against one `league coordinator` process.

Actors: RegisterWorker, then GetJob (long poll) -> "play" the job for a while, heartbeating its lease at the
interval the coordinator asked for -> FinishJob(COMPLETED) with one result per episode; at the end a job in
hand is finished RELEASED, as an actor does on SIGTERM. Learners: RegisterWorker, GetJob (binds one active
player each), then UpdatePlayer with growing steps and a new checkpoint file on the shared root every
`update_every_s` (so the league snapshots, and sometimes mutates, players while it serves), heartbeating their
learn job. The clients are coroutines on one asyncio loop, each worker with its own channel (connection).

Deliberate faults, counted apart from errors: a few actors let a lease expire and finish late
(FAILED_PRECONDITION), finish a job FAILED, retry a finish (a duplicate), or first send results in the wrong
seat order (INVALID_ARGUMENT, then the right ones); a vandal sends bad requests (unknown ids, malformed fields,
a checkpoint path outside the shared root) and checks each is refused with its status code. Anything else that
fails — any other status, a revoked lease, a lease that expired without being let go — is an unexpected error.

At the end every job must be accounted for: the coordinator's counters equal the clients' books (issued =
finished + failed + expired + in flight, each side alike), its match count equals the episodes the clients
were told were counted, and the league's invariants (tests/chaos/invariants.py) hold, live and after a
SIGTERM against the state file. Latency per RPC is reported against a bare echo server of the same RPCs
under the same clients (measured in the same run).

Run: `python bench/bench_load.py [--workers 200 --seconds 60]` (or `make bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import pathlib
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

ROOT = pathlib.Path(__file__).resolve().parent.parent
# First, even when ROOT is on PYTHONPATH: run as `python bench/X.py`, sys.path[0] is bench/, whose common.py
# would otherwise shadow the project's `common` package.
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import yaml  # noqa: E402

from bench.bench_coordinator import EchoServicer, percentile, serve_echo  # noqa: E402
from bench.common import BenchRow, exit_on_sigterm, print_rows  # noqa: E402
from common.proto.league.v1 import league_pb2 as pb  # noqa: E402
from common.proto.league.v1 import league_pb2_grpc  # noqa: E402
from league_service.coordinator_testing import ServerProcess, coordinator_process, server_process  # noqa: E402

T = TypeVar("T")
ACTOR, LEARNER = pb.WORKER_ROLE_ACTOR, pb.WORKER_ROLE_LEARNER
ECHO = "echo server (same RPCs and clients, no league)"
# The episode outcomes a finished job reports, as (launch player's, opponent's).
_RESULTS = ((pb.OUTCOME_WIN, pb.OUTCOME_LOSS), (pb.OUTCOME_LOSS, pb.OUTCOME_WIN), (pb.OUTCOME_DRAW, pb.OUTCOME_DRAW))
ACTIVE_PLAYERS = {"main_player": 1, "main_exploiter": 1, "league_exploiter": 1}


@dataclass(frozen=True)
class LoadSettings:
    actors: int = 196
    # One per active player (ACTIVE_PLAYERS): collect jobs of a player go out once its learner is bound.
    learners: int = 3
    seconds: float = 60.0
    # How long an actor "plays" a job: uniform in this range.
    job_seconds: tuple[float, float] = (0.2, 2.0)
    lease_timeout_s: float = 5.0
    get_job_wait_s: float = 5.0
    update_every_s: float = 0.5
    agent_steps_per_update: int = 1000
    # The league's one_phase_step: a player is snapshotted every one or two phases, so with the defaults every
    # 2.5-5 s (the league grows by a few dozen historical players in a minute; every commit writes its state).
    snapshot_steps: int = 5_000
    # Actors that let one lease expire / finish one job FAILED / retry one finish / send one bad seat order.
    expiring_actors: int = 2
    failing_actors: int = 3
    duplicating_actors: int = 3
    misordering_actors: int = 3
    # Malformed or misdirected requests per second from the vandal.
    bad_requests_per_s: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.actors < 1:
            raise ValueError(f"actors: must be >= 1, got {self.actors}")
        if self.learners != len(ACTIVE_PLAYERS):
            raise ValueError(f"learners: must be {len(ACTIVE_PLAYERS)} (one per active player), got {self.learners}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds: must be > 0, got {self.seconds}")
        low, high = self.job_seconds
        if not 0 <= low <= high:
            raise ValueError(f"job_seconds: need 0 <= low <= high, got {self.job_seconds}")
        deliberate = self.expiring_actors + self.failing_actors + self.duplicating_actors + self.misordering_actors
        if deliberate > self.actors:
            raise ValueError(f"actors: {self.actors} cannot cover {deliberate} deliberately misbehaving ones")

    @property
    def total_workers(self) -> int:
        return self.actors + self.learners

    def honest(self) -> LoadSettings:
        """The same load with no deliberate faults (the echo baseline cannot refuse anything)."""
        return LoadSettings(**{**vars(self), "expiring_actors": 0, "failing_actors": 0, "duplicating_actors": 0,
                               "misordering_actors": 0, "bad_requests_per_s": 0.0})


@dataclass(frozen=True)
class RpcLatency:
    method: str
    calls: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class JobBooks:
    """Jobs as one side counted them."""

    issued: int
    finished: int  # completed or released
    failed: int
    expired: int
    in_flight: int
    matches: int

    @property
    def unaccounted(self) -> int:
        return self.issued - self.finished - self.failed - self.expired - self.in_flight


@dataclass(frozen=True)
class LoadReport:
    settings: LoadSettings
    # The measured window (from the first worker registered to the stop signal).
    seconds: float
    round_trips: int  # GetJob answered with a job + FinishJob accepted
    latencies: tuple[RpcLatency, ...]
    unexpected_errors: int
    # The first few, as "Method: CODE details".
    error_samples: tuple[str, ...]
    deliberate_sent: int
    deliberate_as_expected: int
    duplicates_acknowledged: int
    snapshots: int
    clients: JobBooks | None  # None against the echo server
    server: JobBooks | None
    # Accounting differences and invariant violations; empty when everything adds up.
    problems: tuple[str, ...]

    def latency(self, method: str) -> RpcLatency:
        for entry in self.latencies:
            if entry.method == method:
                return entry
        raise KeyError(f"method: no calls of {method!r} were timed")


# ---- the clients --------------------------------------------------------------------------------------------


class _Books:
    """What the clients saw (one asyncio loop: no locks)."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.deliberate_sent = 0
        self.deliberate_ok = 0
        self.duplicates = 0
        self.granted: set[str] = set()
        self.finished: dict[str, int] = {}  # job id -> episodes counted (completed or released)
        self.failed: set[str] = set()
        self.expired: set[str] = set()
        self.held: set[str] = set()  # granted and not yet ended
        self.round_trips = 0


class _Clients:
    def __init__(self, address: str, settings: LoadSettings, shared_root: pathlib.Path | None) -> None:
        self.address = address
        self.s = settings
        self.shared_root = shared_root
        self.books = _Books()
        self.stop = asyncio.Event()
        self.let_go = asyncio.Event()  # the learners stop renewing their leases (after the books are read)
        self.rng = random.Random(settings.seed)

    # -- plumbing ---------------------------------------------------------------------------------------------

    async def call(self, method: str, pending: Awaitable[T]) -> T | None:
        """An honest call: timed; a failure is an unexpected error (None)."""
        start = time.perf_counter()
        try:
            reply = await pending
        except grpc.aio.AioRpcError as err:
            self.error(method, f"{err.code().name} {err.details()}")
            return None
        self.books.latency.setdefault(method, []).append(time.perf_counter() - start)
        return reply

    async def refused(self, method: str, pending: Awaitable[Any], expected: grpc.StatusCode) -> None:
        """A deliberate bad call: it must fail with `expected`."""
        self.books.deliberate_sent += 1
        try:
            await pending
        except grpc.aio.AioRpcError as err:
            if err.code() is expected:
                self.books.deliberate_ok += 1
            else:
                self.error(method, f"deliberate call failed with {err.code().name} (expected {expected.name}): "
                                   f"{err.details()}")
            return
        self.error(method, f"deliberate call was accepted (expected {expected.name})")

    def error(self, method: str, what: str) -> None:
        self.books.errors.append(f"{method}: {what}")

    async def pause(self, seconds: float, until: asyncio.Event | None = None) -> bool:
        """Sleep `seconds` or until stopped (or `until` is set); True if stopped."""
        try:
            await asyncio.wait_for((until or self.stop).wait(), max(0.0, seconds))
        except TimeoutError:
            return False
        return True

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.address)

    # -- actors -----------------------------------------------------------------------------------------------

    async def actor(self, i: int, quirk: str) -> None:
        worker_id = f"load-actor-{i}"
        async with self.channel() as channel:
            stub = league_pb2_grpc.LeagueServiceStub(channel)
            reg = await self.call("RegisterWorker", stub.RegisterWorker(
                pb.RegisterWorkerRequest(worker_id=worker_id, role=ACTOR, hostname="load"), timeout=10))
            if reg is None:
                return
            while not self.stop.is_set():
                reply = await self.call("GetJob", stub.GetJob(
                    pb.GetJobRequest(worker_id=worker_id, role=ACTOR, wait_s=self.s.get_job_wait_s),
                    timeout=self.s.get_job_wait_s + 5))
                if reply is None:
                    return
                if not reply.HasField("job"):
                    await self.pause(reply.retry_after_s)
                    continue
                job = reply.job
                self.books.granted.add(job.job_id)
                self.books.held.add(job.job_id)
                if quirk == "misorder" and len({p.player_id for p in job.players}) < 2:
                    quirk_now = ""  # a self-play job's seats read the same both ways: try the next job
                else:
                    quirk_now, quirk = quirk, ""
                await self.play(stub, worker_id, job, reg.heartbeat_interval_s, quirk_now)

    async def play(self, stub: Any, worker_id: str, job: pb.Job, heartbeat_s: float, quirk: str) -> None:
        if quirk == "expire":  # sit on the job, silent, until its lease is long gone; the late finish is refused
            await asyncio.sleep(job.lease_timeout_s + 1.5)
            await self.refused("FinishJob", stub.FinishJob(self.finish_request(worker_id, job, job.episode_num),
                                                           timeout=10), grpc.StatusCode.FAILED_PRECONDITION)
            self.books.held.discard(job.job_id)
            self.books.expired.add(job.job_id)
            return
        duration = self.rng.uniform(*self.s.job_seconds)
        started = time.monotonic()
        stopped = False
        while not stopped:
            left = duration - (time.monotonic() - started)
            if left <= 0:
                break
            stopped = await self.pause(min(left, heartbeat_s))
            if not stopped and time.monotonic() - started < duration:
                beat = await self.call("Heartbeat", stub.Heartbeat(
                    pb.HeartbeatRequest(worker_id=worker_id, job_ids=[job.job_id]), timeout=10))
                if beat is not None and job.job_id in beat.revoked_job_ids:
                    self.error("Heartbeat", f"lease of job {job.job_id} revoked")
                    self.books.held.discard(job.job_id)
                    return
        if quirk == "fail":
            request = pb.FinishJobRequest(worker_id=worker_id, job_id=job.job_id, status=pb.FINISH_STATUS_FAILED,
                                          error="deliberately failed by the load test")
            self.books.deliberate_sent += 1
            if await self.call("FinishJob", stub.FinishJob(request, timeout=10)) is not None:
                self.books.deliberate_ok += 1
                self.books.failed.add(job.job_id)
            self.books.held.discard(job.job_id)
            return
        episodes = job.episode_num
        if stopped:  # an actor stopping mid-job releases it with the episodes it has
            episodes = min(episodes, int(episodes * (time.monotonic() - started) / max(duration, 1e-9)))
        request = self.finish_request(worker_id, job, episodes)
        if stopped:
            request.status = pb.FINISH_STATUS_RELEASED
        if quirk == "misorder":
            wrong = pb.FinishJobRequest()
            wrong.CopyFrom(request)
            for episode in wrong.episodes:
                episode.players.reverse()
            await self.refused("FinishJob", stub.FinishJob(wrong, timeout=10), grpc.StatusCode.INVALID_ARGUMENT)
        ack = await self.call("FinishJob", stub.FinishJob(request, timeout=10))
        if ack is None:
            return
        self.books.held.discard(job.job_id)
        if ack.duplicate:
            self.error("FinishJob", f"first finish of {job.job_id} answered as a duplicate")
            return
        self.books.finished[job.job_id] = ack.episodes_counted
        if not stopped:
            self.books.round_trips += 1
        if quirk == "duplicate":  # a retried finish (the reply was lost, say): acknowledged, not counted again
            self.books.deliberate_sent += 1
            again = await self.call("FinishJob", stub.FinishJob(request, timeout=10))
            if again is not None and again.duplicate and again.episodes_counted == ack.episodes_counted:
                self.books.deliberate_ok += 1
                self.books.duplicates += 1
            elif again is not None:
                self.error("FinishJob", f"a retried finish of {job.job_id} was not a duplicate: {again}")

    def finish_request(self, worker_id: str, job: pb.Job, episodes: int) -> pb.FinishJobRequest:
        ids = [p.player_id for p in job.players]
        results = []
        for _ in range(episodes):
            home, away = self.rng.choice(_RESULTS)
            outcomes = [pb.PlayerOutcome(player_id=ids[0], outcome=home, episode_return=1.0)]
            if len(ids) > 1:
                outcomes.append(pb.PlayerOutcome(player_id=ids[1], outcome=away, episode_return=-1.0))
            results.append(pb.EpisodeResult(length=self.rng.randint(7, 42), players=outcomes))
        return pb.FinishJobRequest(worker_id=worker_id, job_id=job.job_id, status=pb.FINISH_STATUS_COMPLETED,
                                   episodes=results, env_steps=sum(r.length for r in results))

    # -- learners ---------------------------------------------------------------------------------------------

    async def learner(self, i: int, quiet: asyncio.Event) -> None:
        """`quiet` is set once the learner sends nothing but heartbeats (stopped, or ended)."""
        try:
            await self._learner(i, quiet)
        finally:
            quiet.set()

    async def _learner(self, i: int, quiet: asyncio.Event) -> None:
        worker_id = f"load-learner-{i}"
        async with self.channel() as channel:
            stub = league_pb2_grpc.LeagueServiceStub(channel)
            reg = await self.call("RegisterWorker", stub.RegisterWorker(pb.RegisterWorkerRequest(
                worker_id=worker_id, role=LEARNER, hostname="load", data_endpoint=f"127.0.0.1:{20000 + i}"),
                timeout=10))
            if reg is None:
                return
            job = None
            while job is None and not self.stop.is_set():
                reply = await self.call("GetJob", stub.GetJob(
                    pb.GetJobRequest(worker_id=worker_id, role=LEARNER, wait_s=self.s.get_job_wait_s),
                    timeout=self.s.get_job_wait_s + 5))
                if reply is None:
                    return
                job = reply.job if reply.HasField("job") else None
            if job is None:
                return
            self.books.granted.add(job.job_id)
            self.books.held.add(job.job_id)
            player, steps, version, iteration, reset_applied = job.launch_player, 0, 0, 0, 0
            last_beat = time.monotonic()
            while not await self.pause(self.s.update_every_s):
                steps += self.s.agent_steps_per_update
                version += 1
                iteration += 1
                request = pb.UpdatePlayerRequest(worker_id=worker_id, player_id=player, train_iteration=iteration,
                                                 agent_steps=steps, reset_applied_version=reset_applied)
                if self.shared_root is not None:
                    relative = f"load-checkpoints/{player}/v{version}.bin"
                    path = self.shared_root / relative
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(b"weights %d" % version)
                    request.checkpoint_path, request.checkpoint_version = relative, version
                reply = await self.call("UpdatePlayer", stub.UpdatePlayer(request, timeout=10))
                if reply is not None and reply.mutated:  # reset: number the next checkpoints above the reset one,
                    version = reply.reset_checkpoint_version  # and acknowledge it in the next updates
                    reset_applied = reply.reset_checkpoint_version
                if time.monotonic() - last_beat >= reg.heartbeat_interval_s:
                    last_beat = time.monotonic()
                    if not await self.renew(stub, worker_id, job):
                        return
            quiet.set()
            # Stopped, the learn job still in flight as the books count it: keep its lease until they are read.
            # The learners used to stop renewing at the stop, and under CPU load the actors' wind-down and the
            # status call took longer than the rest of the lease: test_fifty_workers_for_eight_seconds failed
            # with "expired: clients 2 != coordinator 3", "in_flight: clients 3 != coordinator 2".
            while not await self.pause(last_beat + reg.heartbeat_interval_s - time.monotonic(), self.let_go):
                last_beat = time.monotonic()
                if not await self.renew(stub, worker_id, job):
                    return

    async def renew(self, stub: Any, worker_id: str, job: pb.Job) -> bool:
        """Heartbeat a learn job; False if its lease was revoked (an unexpected error)."""
        beat = await self.call("Heartbeat", stub.Heartbeat(
            pb.HeartbeatRequest(worker_id=worker_id, job_ids=[job.job_id]), timeout=10))
        if beat is not None and job.job_id in beat.revoked_job_ids:
            self.error("Heartbeat", f"learn job {job.job_id} of {worker_id} revoked")
            self.books.held.discard(job.job_id)
            return False
        return True

    # -- the vandal -------------------------------------------------------------------------------------------

    async def vandal(self) -> None:
        """Bad requests, each refused with its own status code; the league must not notice."""
        if self.s.bad_requests_per_s <= 0:
            return
        code = grpc.StatusCode
        async with self.channel() as channel:
            stub = league_pb2_grpc.LeagueServiceStub(channel)
            if await self.call("RegisterWorker", stub.RegisterWorker(
                    pb.RegisterWorkerRequest(worker_id="load-vandal", role=ACTOR), timeout=10)) is None:
                return
            nan_episode = pb.EpisodeResult(length=3, players=[
                pb.PlayerOutcome(player_id="main_player_default_0", outcome=pb.OUTCOME_WIN,
                                 episode_return=float("nan"))])
            bad = [
                ("GetJob", lambda: stub.GetJob(pb.GetJobRequest(worker_id="load-ghost", role=ACTOR), timeout=10),
                 code.NOT_FOUND),
                ("Heartbeat", lambda: stub.Heartbeat(pb.HeartbeatRequest(worker_id="load-ghost"), timeout=10),
                 code.NOT_FOUND),
                ("FinishJob", lambda: stub.FinishJob(pb.FinishJobRequest(
                    worker_id="load-vandal", job_id="no-such-job", status=pb.FINISH_STATUS_COMPLETED), timeout=10),
                 code.NOT_FOUND),
                ("RegisterWorker", lambda: stub.RegisterWorker(pb.RegisterWorkerRequest(role=ACTOR), timeout=10),
                 code.INVALID_ARGUMENT),
                ("GetJob", lambda: stub.GetJob(pb.GetJobRequest(worker_id="load-vandal", role=ACTOR, wait_s=-1.0),
                                               timeout=10), code.INVALID_ARGUMENT),
                ("FinishJob", lambda: stub.FinishJob(pb.FinishJobRequest(
                    worker_id="load-vandal", job_id="no-such-job", status=pb.FINISH_STATUS_COMPLETED,
                    episodes=[nan_episode]), timeout=10), code.INVALID_ARGUMENT),
                ("UpdatePlayer", lambda: stub.UpdatePlayer(pb.UpdatePlayerRequest(
                    worker_id="load-vandal", player_id="main_player_default_0", agent_steps=1,
                    checkpoint_path="../../etc/passwd", checkpoint_version=1), timeout=10), code.INVALID_ARGUMENT),
                ("UpdatePlayer", lambda: stub.UpdatePlayer(pb.UpdatePlayerRequest(
                    worker_id="load-vandal", player_id="main_player_default_0", agent_steps=1), timeout=10),
                 code.FAILED_PRECONDITION),
            ]
            k = 0
            while not await self.pause(1.0 / self.s.bad_requests_per_s):
                method, send, expected = bad[k % len(bad)]
                k += 1
                await self.refused(method, send(), expected)

    # -- all of them ------------------------------------------------------------------------------------------

    async def run(self, read_books: Callable[[], Awaitable[T]] | None = None) -> tuple[float, T | None]:
        """The load for `settings.seconds`; returns its window and, if asked for, the server's books as
        `read_books()` reads them after the actors and the vandal are done, the learners' leases still held."""
        quirks = (["expire"] * self.s.expiring_actors + ["fail"] * self.s.failing_actors
                  + ["duplicate"] * self.s.duplicating_actors + ["misorder"] * self.s.misordering_actors)
        quirks += [""] * (self.s.actors - len(quirks))
        quiet = [asyncio.Event() for _ in range(self.s.learners)]
        learners = [asyncio.create_task(self.learner(i, q)) for i, q in enumerate(quiet)]
        tasks = [asyncio.create_task(self.actor(i, quirk)) for i, quirk in enumerate(quirks)]
        tasks.append(asyncio.create_task(self.vandal()))
        started = time.perf_counter()
        await asyncio.sleep(self.s.seconds)
        self.stop.set()
        window = time.perf_counter() - started
        try:
            await asyncio.wait_for(asyncio.gather(*tasks, *(q.wait() for q in quiet)), timeout=self.s.get_job_wait_s + 30)
            books = await read_books() if read_books is not None else None
        finally:
            self.let_go.set()
        await asyncio.wait_for(asyncio.gather(*learners), timeout=30)
        return window, books


# ---- the run ------------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    return percentile(values, q)  # nearest rank, as the coordinator benchmark


def _latencies(books: _Books) -> tuple[RpcLatency, ...]:
    out = []
    for method in sorted(books.latency):
        values = sorted(books.latency[method])
        out.append(RpcLatency(method, len(values), _percentile(values, 0.5) * 1e3, _percentile(values, 0.99) * 1e3,
                              values[-1] * 1e3))
    return tuple(out)


def _league_config(path: pathlib.Path, settings: LoadSettings) -> pathlib.Path:
    per_player = {"one_phase_step": settings.snapshot_steps}
    slots = math.ceil(settings.actors * 1.25 / len(ACTIVE_PLAYERS))  # more jobs than actors: GetJob rarely waits
    path.write_text(yaml.safe_dump({
        "league": {
            "active_players": ACTIVE_PLAYERS,
            "max_active_player_job": slots,
            "payoff": {"decay": 1.0},
            **{player_type: per_player for player_type in ACTIVE_PLAYERS},
        },
        "env": {"name": "connect_four", "env_num": 1, "episode_num": 4},
        "coordinator": {"lease_timeout_s": settings.lease_timeout_s,
                        "heartbeat_interval_s": settings.lease_timeout_s / 3},
    }))
    return path


def _server_books(status: pb.LeagueStatus) -> JobBooks:
    c = status.counters
    return JobBooks(c.jobs_issued, c.jobs_finished, c.jobs_failed, c.jobs_expired, len(status.jobs), c.matches)


def _audit(clients: JobBooks, server: JobBooks, status: pb.LeagueStatus, books: _Books, state_path: pathlib.Path,
           decay: float, server_process: ServerProcess) -> list[str]:
    """Clients' books against the coordinator's, and the league's invariants, live and after SIGTERM."""
    from tests.chaos.invariants import InvariantViolation, check_ledger, check_status, read_ledger

    problems = [f"{name}: clients {getattr(clients, name)} != coordinator {getattr(server, name)}"
                for name in ("issued", "finished", "failed", "expired", "in_flight", "matches")
                if getattr(clients, name) != getattr(server, name)]
    for side, b in (("clients", clients), ("coordinator", server)):
        if b.unaccounted:
            problems.append(f"{side}: {b.unaccounted} jobs unaccounted for (issued {b.issued} != finished "
                            f"{b.finished} + failed {b.failed} + expired {b.expired} + in flight {b.in_flight})")
    accepted = dict(books.finished)
    try:
        check_status(status, accepted=accepted, accepted_complete=True, payoff_decay=decay)
    except InvariantViolation as err:
        problems += [f"live: {p}" for p in err.problems]
    code = server_process.terminate(60)
    if code != 0:
        problems.append(f"the coordinator exited with {code} on SIGTERM")
    ledger = read_ledger(state_path)
    try:
        check_ledger(ledger, accepted=accepted, accepted_complete=True)
    except InvariantViolation as err:
        problems += [f"stored: {p}" for p in err.problems]
    if ledger.matches != status.counters.matches:  # nothing was sending after the status: they must agree
        problems.append(f"stored matches {ledger.matches} != {status.counters.matches} in the last status")
    return problems


async def _status(address: str) -> pb.LeagueStatus:
    async with grpc.aio.insecure_channel(address) as channel:
        return await league_pb2_grpc.LeagueServiceStub(channel).GetStatus(pb.GetStatusRequest(), timeout=30)


def run_load(settings: LoadSettings, workdir: pathlib.Path, *, echo: bool = False) -> LoadReport:
    """One load run against a fresh coordinator process (or the echo server) under `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    if echo:
        settings = settings.honest()
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--serve-echo",
                   "--echo-lease", str(settings.lease_timeout_s)]
        context = server_process(command, workdir / "echo.log")
        shared_root = None
    else:
        shared_root = workdir / "shared"
        shared_root.mkdir(exist_ok=True)
        state_path = workdir / "league_state.sqlite"
        argv = ["--config", str(_league_config(workdir / "league.yaml", settings)), "--shared-root", str(shared_root),
                "--state", str(state_path), "--port", "0", "--lease-timeout", str(settings.lease_timeout_s),
                "--seed", str(settings.seed), "--log-level", "WARNING"]
        context = coordinator_process(argv, workdir / "coordinator.log")
    with context as proc:
        clients = _Clients(proc.address, settings, shared_root)
        window, status = asyncio.run(clients.run(None if echo else functools.partial(_status, proc.address)))
        books = clients.books
        client_books = server_books = None
        problems: list[str] = []
        snapshots = 0
        if not echo:
            snapshots = status.counters.snapshots
            client_books = JobBooks(len(books.granted), len(books.finished), len(books.failed), len(books.expired),
                                    len(books.held), sum(books.finished.values()))
            server_books = _server_books(status)
            problems = _audit(client_books, server_books, status, books, state_path, 1.0, proc)
    return LoadReport(
        settings=settings, seconds=window, round_trips=books.round_trips, latencies=_latencies(books),
        unexpected_errors=len(books.errors), error_samples=tuple(books.errors[:20]),
        deliberate_sent=books.deliberate_sent, deliberate_as_expected=books.deliberate_ok,
        duplicates_acknowledged=books.duplicates, snapshots=snapshots, clients=client_books, server=server_books,
        problems=tuple(problems),
    )


# ---- the echo baseline's server -----------------------------------------------------------------------------


class LoadEchoServicer(EchoServicer):
    """The coordinator benchmark's echo server, also answering the learners' UpdatePlayer, with the load's lease
    and heartbeat interval: workers then heartbeat as often as against the coordinator (same calls)."""

    def __init__(self, lease_timeout_s: float) -> None:
        super().__init__()
        self._lease_timeout_s = lease_timeout_s

    def RegisterWorker(self, request, context):
        return pb.RegisterWorkerResponse(worker_id=request.worker_id, heartbeat_interval_s=self._lease_timeout_s / 3,
                                         lease_timeout_s=self._lease_timeout_s)

    def UpdatePlayer(self, request, context):
        return pb.UpdatePlayerResponse()


# ---- driver -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=200, help="simulated workers (3 of them learners)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the load runs")
    parser.add_argument("--quick", action="store_true", help="50 workers for 8 s (a smoke check)")
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--echo-lease", type=float, default=5.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_echo:
        sys.exit(serve_echo(functools.partial(LoadEchoServicer, args.echo_lease)))
    exit_on_sigterm()  # its servers run in sessions of their own: a SIGTERM unwinds and stops them
    if args.quick:
        args.workers, args.seconds = 50, 8.0
    learners = len(ACTIVE_PLAYERS)
    settings = LoadSettings(actors=args.workers - learners, learners=learners, seconds=args.seconds)
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        report = run_load(settings, pathlib.Path(tmp) / "league")
        echo = run_load(settings, pathlib.Path(tmp) / "echo", echo=True)  # the same clients for as long
    if echo.unexpected_errors:
        # A baseline whose calls failed: its rates and latencies are of the calls that did not (a review).
        raise RuntimeError(f"the echo baseline had {echo.unexpected_errors} unexpected errors, e.g. "
                           f"{'; '.join(echo.error_samples[:5])}")
    return report_rows(report, echo)


def report_rows(report: LoadReport, echo: LoadReport) -> list[BenchRow]:
    s = report.settings
    load = f"{s.total_workers} workers, {report.seconds:.0f} s"
    for line in report.error_samples:
        print(f"  unexpected: {line}")
    for line in report.problems:
        print(f"  problem: {line}")
    clients = report.clients
    rows = [
        BenchRow(f"unexpected errors, {load}", float(report.unexpected_errors), "errors", "none expected", 0.0, "0",
                 report.unexpected_errors == 0),
        BenchRow(f"deliberate faults answered as expected, {load}", float(report.deliberate_as_expected), "requests",
                 "deliberate faults sent", float(report.deliberate_sent), "all",
                 report.deliberate_as_expected == report.deliberate_sent),
        BenchRow(f"accounting and invariant problems, {load}", float(len(report.problems)), "problems",
                 "none expected", 0.0, "0", not report.problems),
        BenchRow(f"jobs issued (all accounted for: finished + failed + expired + in flight), {load}",
                 float(clients.issued if clients else 0), "jobs", "coordinator's jobs_issued",
                 float(report.server.issued if report.server else 0), "equal", not report.problems),
        BenchRow(f"GetJob+FinishJob round trips/s, {load}", report.round_trips / report.seconds, "rt/s", ECHO,
                 echo.round_trips / echo.seconds, "(reported)"),
    ]
    nan = RpcLatency("", 0, math.nan, math.nan, math.nan)
    for entry in report.latencies:
        base = next((e for e in echo.latencies if e.method == entry.method), nan)
        rows.append(BenchRow(f"{entry.method} p50, {load}", entry.p50_ms, "ms", ECHO, base.p50_ms, "(reported)"))
        rows.append(BenchRow(f"{entry.method} p99 ({entry.calls} calls), {load}", entry.p99_ms, "ms", ECHO,
                             base.p99_ms, "(reported)"))
    rows.append(BenchRow(f"snapshots taken while serving, {load}", float(report.snapshots), "snapshots",
                         "none needed", 0.0, "(reported)"))
    print_rows("Coordinator under load", rows)
    return rows


if __name__ == "__main__":
    main()
