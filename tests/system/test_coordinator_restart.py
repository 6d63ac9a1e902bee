"""`kill -9` the coordinator while actors finish jobs, restart it on the same state, and check the books:
no accepted match lost or counted twice, workers carry on without registering again."""

import threading
from dataclasses import dataclass, field

import grpc
import yaml

from common.ports import restartable_port
from common.proto.league.v1 import league_pb2 as pb
from common.rpc import RetryPolicy, call_idempotent
from league_service.coordinator_testing import SMALL_LEAGUE, coordinator_process, league_stub, outcomes_for

ACTORS = 3
# Patient enough to ride out a coordinator restart (a few seconds).
THROUGH_RESTART = RetryPolicy(attempts=200, initial_backoff_s=0.05, max_backoff_s=0.25)


def free_port() -> int:
    """A port for a server the test restarts on it: outside the range outgoing connections are given."""
    return restartable_port()


@dataclass
class Books:
    """What the actors were told: job id -> (episodes counted, a match between two different players)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counted: dict[str, tuple[int, bool]] = field(default_factory=dict)
    first_acks: int = 0
    refused: int = 0
    errors: list[BaseException] = field(default_factory=list)
    progress: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.progress = threading.Condition(self.lock)

    def record(self, job: pb.Job, ack: pb.FinishJobResponse) -> None:
        cross = job.players[0].player_id != job.players[1].player_id
        with self.lock:
            known = self.counted.get(job.job_id)
            assert known is None or known[0] == ack.episodes_counted
            assert not (known is not None and not ack.duplicate), f"job {job.job_id} accepted twice"
            self.counted[job.job_id] = (ack.episodes_counted, cross)
            self.first_acks += 1
            self.progress.notify_all()

    def wait_for(self, acks: int, timeout_s: float = 60.0) -> None:
        with self.lock:
            assert self.progress.wait_for(lambda: self.first_acks >= acks or self.errors, timeout_s), "no progress"
            assert not self.errors, self.errors


def actor(address: str, worker_id: str, books: Books, stop: threading.Event) -> None:
    channel, stub = league_stub(address, default_deadline_s=3.0)
    try:
        call_idempotent(stub.RegisterWorker, pb.RegisterWorkerRequest(worker_id=worker_id, role=pb.WORKER_ROLE_ACTOR),
                        policy=THROUGH_RESTART, stop=stop)
        while not stop.is_set():
            try:
                reply = stub.GetJob(pb.GetJobRequest(worker_id=worker_id, role=pb.WORKER_ROLE_ACTOR, wait_s=1.0))
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                stop.wait(0.1)  # the coordinator is restarting
                continue
            if not reply.HasField("job"):
                continue
            job = reply.job
            request = pb.FinishJobRequest(worker_id=worker_id, job_id=job.job_id, status=pb.FINISH_STATUS_COMPLETED,
                                          episodes=outcomes_for(job, [True, False]), env_steps=14)
            try:
                ack = call_idempotent(stub.FinishJob, request, policy=THROUGH_RESTART)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                with books.lock:
                    books.refused += 1
                continue
            books.record(job, ack)
    except BaseException as exc:
        with books.lock:
            books.errors.append(exc)
            books.progress.notify_all()
    finally:
        channel.close()


def test_kill_9_and_restart_lose_and_double_count_nothing(tmp_path):
    config = tmp_path / "league.yaml"
    config.write_text(yaml.safe_dump(dict(SMALL_LEAGUE)))
    port = free_port()
    argv = ["--config", str(config), "--shared-root", str(tmp_path), "--port", str(port),
            "--lease-timeout", "5", "--without-learners", "--seed", "0"]
    log = tmp_path / "coordinator.log"
    books, stop = Books(), threading.Event()
    threads = []
    proc = None
    try:
        with coordinator_process(argv, log) as first:
            address = first.address
            threads = [threading.Thread(target=actor, args=(address, f"actor-{i}", books, stop)) for i in range(ACTORS)]
            for t in threads:
                t.start()
            books.wait_for(15)
            first.kill()  # SIGKILL mid-traffic
        for round_ in (2, 3):
            with coordinator_process(argv, log) as proc:
                books.wait_for(15 * round_)
                if round_ == 2:
                    proc.kill()
                    continue
                stop.set()
                for t in threads:
                    t.join(30)
                assert not books.errors, books.errors
                channel, stub = league_stub(proc.address)
                with channel:
                    # A finish whose reply was lost is sent again after the restarts: acknowledged, not recounted.
                    job_id, (counted, _) = next(iter(books.counted.items()))
                    again = stub.FinishJob(pb.FinishJobRequest(worker_id="actor-0", job_id=job_id,
                                                               status=pb.FINISH_STATUS_COMPLETED))
                    assert again.duplicate and again.episodes_counted == counted
                    status = stub.GetStatus(pb.GetStatusRequest())
                accepted = sum(n for n, _ in books.counted.values())
                assert status.counters.matches == accepted
                assert status.counters.jobs_finished == len(books.counted)
                games = sum(e.games for e in status.payoff if e.home < e.away)
                assert games == sum(n for n, cross in books.counted.values() if cross)
                assert {w.worker_id for w in status.workers} == {f"actor-{i}" for i in range(ACTORS)}
                for p in status.players:
                    assert p.slots_used <= p.slots_limit
    finally:
        stop.set()
        for t in threads:
            t.join(30)
