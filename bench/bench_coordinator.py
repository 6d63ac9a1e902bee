"""Coordinator RPC benchmark: GetJob + FinishJob round trips against a bare echo server of the same shape.

The servers run as their own processes (`league coordinator`, and this file with `--serve-echo`: the same
LeagueService messages, the same server options, no league behind it), measured in the same run with the same
client: N simulated workers, each with its own channel, in threads of this process. Every load runs in rounds
alternating between the servers (medians reported), so the machine's load from elsewhere hits all alike.

The goal's echo is gRPC's threaded server (`make_server`), the bare Python echo the issue measured. The
coordinator itself is served by grpc.aio (common/aio_server.py); an echo on that server kind
(`--serve-aio-echo`) is measured too and reported as context, since it is itself 1.1-1.6x the threaded echo.

- Closed loop (each worker calls again as soon as it is answered): round trips per second at 1, 8 and 64
  workers; the goal is >= 0.7x the echo server at 8 and 64.
- Paced (each of 64 workers does one round trip every PACES seconds; a real actor's job takes seconds, so even
  0.25 s is a very busy league): per-call p50 / p99; the goal is p99 <= 10 ms. In a closed loop with 64 workers
  latency is just concurrency / throughput (Little's law), for the echo server too, so the closed-loop
  percentiles are reported but carry no goal.
- 1,000 registered workers each holding a job and heartbeating every lease_timeout/3: no lease may expire.

Run: `python bench/bench_coordinator.py [--quick] [--rounds N] [--pin-servers CPU]` (or `make bench`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
# First, even when ROOT is on PYTHONPATH: run as `python bench/X.py`, sys.path[0] is bench/, whose common.py
# would otherwise shadow the project's `common` package.
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.common import BenchRow, exit_on_sigterm, print_rows  # noqa: E402
from common.aio_server import make_aio_server  # noqa: E402
from common.proto.league.v1 import league_pb2 as pb  # noqa: E402
from common.proto.league.v1 import league_pb2_grpc  # noqa: E402
from common.rpc import ServerOptions, format_listen_line, make_server  # noqa: E402
from league_service.coordinator_testing import (  # noqa: E402
    ServerProcess,
    coordinator_command,
    coordinator_process,
    league_stub,
    outcomes_for,
    server_process,
)

ECHO = "echo server (same RPCs, no league)"
AIO_ECHO = "asyncio echo server (same RPCs, no league)"
PACES = (0.25, 0.1)  # seconds between one worker's round trips: 256 and 640 round trips/s offered by 64 workers
ACTOR = pb.WORKER_ROLE_ACTOR
SETUP_TIMEOUT_S = 120.0  # for every client to register (and take its job) before a load starts


# ---- the baseline: a servicer that only answers ----------------------------------------------------------------


class EchoServicer(league_pb2_grpc.LeagueServiceServicer):
    """Answers every call with a canned reply of the coordinator's shape; no state, no checks."""

    def __init__(self) -> None:
        job = pb.Job(
            job_id="0123456789abcdef", kind=pb.JOB_KIND_COLLECT, launch_player="main_player_default_0",
            players=[pb.PlayerRef(player_id="main_player_default_0", active=True),
                     pb.PlayerRef(player_id="main_exploiter_default_0", active=True)],
            env_name="connect_four", env_num=2, episode_num=4, lease_deadline=time.time() + 30, lease_timeout_s=30,
        )
        job.policy.update({"algorithm": "ppo", "model": {"hidden": [128, 128]}})
        job.learner_kwargs.update({"batch_size": 1024, "publish_every": 1, "keep_last": 5})
        self._job = pb.GetJobResponse(job=job)

    def RegisterWorker(self, request, context):
        return pb.RegisterWorkerResponse(worker_id=request.worker_id, heartbeat_interval_s=5, lease_timeout_s=30)

    def Heartbeat(self, request, context):
        return pb.HeartbeatResponse(lease_deadline=time.time() + 30)

    def GetJob(self, request, context):
        return self._job

    def FinishJob(self, request, context):
        return pb.FinishJobResponse(episodes_counted=len(request.episodes))


class AioEchoServicer(EchoServicer):
    """The same canned replies from coroutines, for the asyncio server (the coordinator's own kind)."""

    async def RegisterWorker(self, request, context):
        return EchoServicer.RegisterWorker(self, request, context)

    async def Heartbeat(self, request, context):
        return EchoServicer.Heartbeat(self, request, context)

    async def GetJob(self, request, context):
        return EchoServicer.GetJob(self, request, context)

    async def FinishJob(self, request, context):
        return EchoServicer.FinishJob(self, request, context)


def serve_echo(servicer: Callable[[], EchoServicer] = EchoServicer) -> int:
    """Serve `servicer` on a free loopback port and print its LISTEN line (the parent reads the port)."""
    serving = make_server(
        ServerOptions(),
        lambda server: league_pb2_grpc.add_LeagueServiceServicer_to_server(servicer(), server),
        ["league.v1.LeagueService"],
    )
    print(format_listen_line("echo", serving.address), flush=True)
    serving.wait()
    return 0


def serve_aio_echo() -> int:
    """`serve_echo` on the asyncio server the coordinator uses (common/aio_server.py)."""
    serving = make_aio_server(
        ServerOptions(),
        lambda server, _loop: league_pb2_grpc.add_LeagueServiceServicer_to_server(AioEchoServicer(), server),
        ["league.v1.LeagueService"],
    )
    print(format_listen_line("echo", serving.address), flush=True)
    serving.wait()
    return 0


# ---- load --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    round_trips_per_s: float
    p50_ms: float
    p99_ms: float
    calls: int
    # CPU seconds the server process spent per round trip in the window (NaN when not measured).
    server_cpu_us_per_rt: float = float("nan")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least a fraction `q` of the values at or below it."""
    if not sorted_values:
        return float("nan")
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def _wait_at(ready: threading.Barrier, stop: threading.Event, threads: list[threading.Thread],
             errors: list[BaseException], what: str) -> None:
    """Wait until every client thread is set up; raise (after stopping them) when one failed instead."""
    try:
        ready.wait(SETUP_TIMEOUT_S)
    except threading.BrokenBarrierError:
        stop.set()
        for t in threads:
            t.join(30)
        raise RuntimeError(f"{what}: a client failed while setting up") from (errors[0] if errors else None)


def run_load(
    address: str, workers: int, seconds: float, pace_s: float | None, tag: str, server_pid: int | None = None
) -> LoadResult:
    """`workers` threads doing GetJob + FinishJob; counts what completes inside the measured window."""
    stop = threading.Event()
    ready = threading.Barrier(workers + 1)
    window: list[float] = []  # [start, end], set once everyone is connected and warmed up
    samples: list[list[tuple[float, float]]] = [[] for _ in range(workers)]  # (end time, latency s)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        channel, stub = league_stub(address, default_deadline_s=10.0)
        worker_id = f"{tag}-{workers}-{i}"
        try:
            stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id=worker_id, role=ACTOR))
            ready.wait()
            next_at = time.monotonic() + (pace_s or 0) * i / workers
            mine = samples[i]
            while not stop.is_set():
                if pace_s is not None:
                    stop.wait(max(0.0, next_at - time.monotonic()))
                    next_at += pace_s
                t0 = time.perf_counter()
                job = stub.GetJob(pb.GetJobRequest(worker_id=worker_id, role=ACTOR, wait_s=2.0)).job
                t1 = time.perf_counter()
                mine.append((t1, t1 - t0))
                if not job.job_id:
                    continue
                stub.FinishJob(pb.FinishJobRequest(worker_id=worker_id, job_id=job.job_id,
                                                   status=pb.FINISH_STATUS_COMPLETED,
                                                   episodes=outcomes_for(job, [True, False]), env_steps=14))
                t2 = time.perf_counter()
                mine.append((t2, t2 - t1))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            stop.set()
            ready.abort()  # a worker that never reaches the barrier must not leave the others waiting at it
        finally:
            channel.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    _wait_at(ready, stop, threads, errors, tag)
    warmup = min(1.0, seconds / 3)
    time.sleep(warmup)
    cpu_start = process_cpu_s(server_pid) if server_pid else float("nan")
    start = time.perf_counter()
    time.sleep(seconds)
    end = time.perf_counter()
    cpu_end = process_cpu_s(server_pid) if server_pid else float("nan")
    stop.set()
    for t in threads:
        t.join(30)
    if errors:
        raise RuntimeError(f"{tag}: a worker failed") from errors[0]
    window = [lat for per in samples for (t, lat) in per if start <= t <= end]
    window.sort()
    round_trips = len(window) / 2
    return LoadResult(
        round_trips_per_s=round_trips / (end - start),
        p50_ms=percentile(window, 0.50) * 1e3,
        p99_ms=percentile(window, 0.99) * 1e3,
        calls=len(window),
        server_cpu_us_per_rt=(cpu_end - cpu_start) / round_trips * 1e6 if round_trips else float("nan"),
    )


def heartbeat_storm(address: str, workers: int, seconds: float, interval_s: float) -> tuple[int, float]:
    """Register `workers` actors, give each a job, heartbeat each every `interval_s`; (revoked, heartbeats/s)."""
    threads_n = 16
    revoked = [0]
    beats = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []
    ready = threading.Barrier(threads_n + 1)
    stop = threading.Event()

    def run(t: int) -> None:
        channel, stub = league_stub(address, default_deadline_s=10.0)
        try:
            mine = []
            for i in range(t, workers, threads_n):
                worker_id = f"hb-{i}"
                stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id=worker_id, role=ACTOR))
                job = stub.GetJob(pb.GetJobRequest(worker_id=worker_id, role=ACTOR, wait_s=5.0)).job
                if not job.job_id:
                    raise RuntimeError(f"{worker_id} got no job")
                mine.append((worker_id, job.job_id))
            ready.wait()
            next_round = time.monotonic()
            while not stop.is_set():
                for worker_id, job_id in mine:
                    reply = stub.Heartbeat(pb.HeartbeatRequest(worker_id=worker_id, job_ids=[job_id]))
                    with lock:
                        revoked[0] += len(reply.revoked_job_ids)
                        beats[0] += 1
                next_round += interval_s
                stop.wait(max(0.0, next_round - time.monotonic()))
        except BaseException as exc:
            errors.append(exc)
            ready.abort()
        finally:
            channel.close()

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads_n)]
    for t in threads:
        t.start()
    _wait_at(ready, stop, threads, errors, "heartbeat storm")
    start, first = time.perf_counter(), beats[0]
    time.sleep(seconds)
    rate = (beats[0] - first) / (time.perf_counter() - start)
    stop.set()
    for t in threads:
        t.join(60)
    if errors:
        raise RuntimeError("heartbeat storm failed") from errors[0]
    return revoked[0], rate


# ---- driver ------------------------------------------------------------------------------------------------


def _league_config(path: pathlib.Path, slots: int) -> pathlib.Path:
    path.write_text(yaml.safe_dump({
        "league": {
            "active_players": {"main_player": 1, "main_exploiter": 1, "league_exploiter": 1, "naive_sp_player": 1},
            "max_active_player_job": slots,
        },
    }))
    return path


def _median_result(runs: list[LoadResult]) -> LoadResult:
    """The median of each figure over rounds (a round disturbed by the shared machine weighs little)."""
    return LoadResult(
        round_trips_per_s=statistics.median(r.round_trips_per_s for r in runs),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        calls=sum(r.calls for r in runs),
        server_cpu_us_per_rt=statistics.median(r.server_cpu_us_per_rt for r in runs),
    )


def _measure(
    servers: dict[str, ServerProcess], counts: list[int], seconds: float, rounds: int
) -> dict[str, tuple[dict[int, LoadResult], dict[float, LoadResult]]]:
    """Closed-loop loads at each worker count, then the paced 64-worker loads, against every server.

    Interleaved: each load runs `rounds` times against each server in turn, so a burst of load from elsewhere
    on the machine hits both sides of a ratio alike; each figure is the median over the rounds.
    """
    closed: dict[str, dict[int, list[LoadResult]]] = {name: {} for name in servers}
    paced: dict[str, dict[float, list[LoadResult]]] = {name: {} for name in servers}
    for _ in range(rounds):
        for n in counts:
            for name, server in servers.items():
                result = run_load(server.address, n, seconds, None, f"{name}-closed", server.popen.pid)
                closed[name].setdefault(n, []).append(result)
        for pace in PACES:
            for name, server in servers.items():
                result = run_load(server.address, 64, seconds, pace, f"{name}-paced", server.popen.pid)
                paced[name].setdefault(pace, []).append(result)
    return {
        name: (
            {n: _median_result(runs) for n, runs in closed[name].items()},
            {pace: _median_result(runs) for pace, runs in paced[name].items()},
        )
        for name in servers
    }


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke check)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per load (medians reported)")
    parser.add_argument(
        "--pin-servers", dest="pin", type=lambda cpu: ["taskset", "-c", cpu], default=[], metavar="CPU",
        help="run both servers on this CPU only (taskset): measures them without cross-core GIL hand-offs",
    )
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-aio-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_echo:
        sys.exit(serve_echo())
    if args.serve_aio_echo:
        sys.exit(serve_aio_echo())
    exit_on_sigterm()  # its servers run in sessions of their own: a SIGTERM unwinds and stops them
    seconds = 1.0 if args.quick else 2.0
    rounds = 1 if args.quick else args.rounds
    storm_seconds = 3.0 if args.quick else 12.0
    counts = [1, 8, 64]
    with tempfile.TemporaryDirectory(prefix="bench-coordinator-") as tmp_dir:
        rows = _run(args, pathlib.Path(tmp_dir), seconds, rounds, storm_seconds, counts)
    print_rows("Coordinator RPC", rows)
    return rows


def _run(args: argparse.Namespace, tmp: pathlib.Path, seconds: float, rounds: int, storm_seconds: float,
         counts: list[int]) -> list[BenchRow]:
    this = str(pathlib.Path(__file__).resolve())
    echo_cmd = [*args.pin, sys.executable, this, "--serve-echo"]
    aio_echo_cmd = [*args.pin, sys.executable, this, "--serve-aio-echo"]
    coordinator_argv = ["--config", str(_league_config(tmp / "league.yaml", 64)), "--shared-root", str(tmp),
                        "--state", str(tmp / "state-rt.sqlite"), "--port", "0", "--without-learners",
                        "--lease-timeout", "30", "--log-level", "WARNING"]
    with contextlib.ExitStack() as running:
        servers = {
            "echo": running.enter_context(server_process(echo_cmd, tmp / "echo.log")),
            "aio-echo": running.enter_context(server_process(aio_echo_cmd, tmp / "aio-echo.log")),
            "coordinator": running.enter_context(
                server_process([*args.pin, *coordinator_command(*coordinator_argv)], tmp / "coordinator.log")
            ),
        }
        results = _measure(servers, counts, seconds, rounds)
    storm_argv = ["--config", str(_league_config(tmp / "storm.yaml", 250)), "--shared-root", str(tmp),
                  "--state", str(tmp / "state-hb.sqlite"), "--port", "0", "--without-learners",
                  "--lease-timeout", "3", "--log-level", "WARNING"]
    with coordinator_process(storm_argv, tmp / "storm.log") as coord:
        revoked, beat_rate = heartbeat_storm(coord.address, 1000, storm_seconds, interval_s=1.0)
        channel, stub = league_stub(coord.address)
        with channel:
            expired = stub.GetStatus(pb.GetStatusRequest()).counters.jobs_expired

    (echo_closed, echo_paced), (coord_closed, coord_paced) = results["echo"], results["coordinator"]
    aio_echo_closed = results["aio-echo"][0]
    rows: list[BenchRow] = []
    for n in counts:
        c, e = coord_closed[n], echo_closed[n]
        goal = n in (8, 64)
        rows.append(BenchRow(
            f"GetJob+FinishJob round trips/s, {n} workers (closed loop)", c.round_trips_per_s, "rt/s", ECHO,
            e.round_trips_per_s, ">= 0.7x echo" if goal else "(reported)",
            (c.round_trips_per_s >= 0.7 * e.round_trips_per_s) if goal else None,
        ))
        rows.append(BenchRow(
            f"GetJob+FinishJob round trips/s, {n} workers (closed loop)", c.round_trips_per_s, "rt/s", AIO_ECHO,
            aio_echo_closed[n].round_trips_per_s, "(context: against the coordinator's own server kind)",
        ))
        rows.append(BenchRow(f"server CPU per round trip, {n} workers (closed loop)", c.server_cpu_us_per_rt, "us",
                             ECHO, e.server_cpu_us_per_rt, "(reported)"))
        rows.append(BenchRow(f"per-call p50, {n} workers (closed loop)", c.p50_ms, "ms", ECHO, e.p50_ms, "(reported)"))
        rows.append(BenchRow(f"per-call p99, {n} workers (closed loop)", c.p99_ms, "ms", ECHO, e.p99_ms, "(reported)"))
    for pace in PACES:
        c, e = coord_paced[pace], echo_paced[pace]
        load = f"64 workers paced, one round trip each per {pace:g} s"
        rows.append(BenchRow(f"per-call p50, {load}", c.p50_ms, "ms", ECHO, e.p50_ms, "(reported)"))
        rows.append(BenchRow(f"per-call p99, {load}", c.p99_ms, "ms", ECHO, e.p99_ms, "<= 10 ms", c.p99_ms <= 10.0))
    rows.append(BenchRow("leases expired or revoked, 1000 workers heartbeating every 1 s (lease 3 s)",
                         float(expired + revoked), "leases", "none expected", 0.0, "0", expired + revoked == 0))
    rows.append(BenchRow("heartbeats/s served, 1000 workers", beat_rate, "calls/s", "offered (1000 workers / 1 s)",
                         1000.0, "(reported)"))
    return rows


if __name__ == "__main__":
    main()
