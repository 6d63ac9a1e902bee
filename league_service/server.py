"""The gRPC face of the coordinator: each method translates request -> coordinator call -> reply.

Served by grpc.aio on one event-loop thread (common/aio_server.py): a threaded server hands every call to a
pool thread and back, which under load cost more than the league's own work, and held a thread per long
poll. Long-polling GetJobs wait on an asyncio event the coordinator's ready listener sets (`JobsReady`), and
replies wait for their commit on the loop (`DurableReplies`, one commit per turn for every call in it).

Bad requests become status codes here and nowhere else: NotFoundError -> NOT_FOUND, InvalidArgumentError ->
INVALID_ARGUMENT, FailedPreconditionError -> FAILED_PRECONDITION (messages name the field). Oversize messages
are refused by gRPC itself (RESOURCE_EXHAUSTED) from the server's max receive size, and bytes that are not a
valid request message by `common.rpc_services` (INVALID_ARGUMENT, naming the method and the message type).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

import grpc
from prometheus_client import CollectorRegistry

from common.aio_server import AioServingServer, make_aio_server
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import PROCESS_METADATA_KEY, ServerOptions
from common.rpc_services import add_service
from league_service import wire
from league_service.coordinator import Coordinator
from league_service.coordinator_messages import FinishReport, JobWait, NoJob
from league_service.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    RequestError,
    StateWriteError,
    WorkerIdInUseError,
)
from league_service.leases import JobEndStatus, WorkerRole
from league_service.metrics import LeagueCollector, MetricsServer, RpcMetricsInterceptor
from league_service.status import STATUS_MAX_BYTES

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVICE = league_pb2.DESCRIPTOR.services_by_name["LeagueService"]
SERVICE_NAME = SERVICE.full_name
# A long-polling GetJob answers this long before the caller's deadline, so the reply still arrives in time.
DEADLINE_MARGIN_S = 0.2
UNDELIVERABLE_S = 0.02
"""A GetJob grant with less than this left of its call's deadline is released, not sent: the reply would arrive
after the worker gave up on the call."""
MAX_PROCESS_CHARS = 256

_STATUS_CODES: tuple[tuple[type[RequestError], grpc.StatusCode], ...] = (
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (WorkerIdInUseError, grpc.StatusCode.ALREADY_EXISTS),
    (StateWriteError, grpc.StatusCode.UNAVAILABLE),
)


MAX_DETAIL_CHARS = 1000
"""The longest status detail a refusal sends. Details echo what the request held (a checkpoint path of 4,096
characters, a list of players): over gRPC's 16 KiB metadata limit (non-ASCII is percent-encoded, ~6 bytes a
character) the client saw RESOURCE_EXHAUSTED instead of the refusal, and retried it for ever (a review)."""


def status_detail(message: str) -> str:
    if len(message) <= MAX_DETAIL_CHARS:
        return message
    return f"{message[:MAX_DETAIL_CHARS]}... ({len(message)} characters)"


async def _refuse(context: grpc.aio.ServicerContext, err: RequestError) -> None:
    code = next((c for cls, c in _STATUS_CODES if isinstance(err, cls)), grpc.StatusCode.INVALID_ARGUMENT)
    detail = status_detail(str(err))
    log.debug("refused with %s: %s", code.name, detail)
    await context.abort(code, detail)


def _process_of(context: grpc.aio.ServicerContext) -> str:
    """The calling process (PROCESS_METADATA_KEY, sent by every client of this project); "" when absent or not
    a short printable text (grpcurl, other clients: no one-process-per-worker-id check for them)."""
    for key, value in context.invocation_metadata() or ():
        if key == PROCESS_METADATA_KEY:
            return value if isinstance(value, str) and len(value) <= MAX_PROCESS_CHARS and value.isprintable() else ""
    return ""


class JobsReady:
    """Wakes the GetJobs long-polling on the event loop when the coordinator may have jobs for their role.

    `notify` is the coordinator's ready listener: it runs on whichever thread made jobs ready (under the
    coordinator's lock) and only schedules the wake-up on the loop, once per burst of offers, and only while
    someone waits. A poll counts as waiting (`waiting`) and takes its role's event *before* it looks for a
    job, so an offer made on another thread between its look and its wait still wakes it: the offer sees it
    counted, and the wake-up, run on the loop, sets the event it holds.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events = {role: asyncio.Event() for role in WorkerRole}
        self._waiting = dict.fromkeys(WorkerRole, 0)
        self._scheduled: set[WorkerRole] = set()

    def notify(self, role: WorkerRole) -> None:
        if self._waiting[role] and role not in self._scheduled:
            self._scheduled.add(role)
            try:
                self._loop.call_soon_threadsafe(self._wake, role)
            except RuntimeError:  # the loop is closed: the server stopped, nobody waits any more
                pass

    def _wake(self, role: WorkerRole) -> None:
        self._scheduled.discard(role)
        event, self._events[role] = self._events[role], asyncio.Event()
        event.set()

    @contextlib.contextmanager
    def waiting(self, role: WorkerRole) -> Iterator[None]:
        """Count a long poll of `role` as waiting for as long as it looks and waits."""
        self._waiting[role] += 1
        try:
            yield
        finally:
            self._waiting[role] -= 1

    def event(self, role: WorkerRole) -> asyncio.Event:
        """The event the next wake-up of `role` sets: take it before looking for a job."""
        return self._events[role]

    @staticmethod
    async def wait(event: asyncio.Event, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), max(timeout_s, 0.0))
        except TimeoutError:
            pass


class DurableReplies:
    """Group commit on the event loop: replies wait for their changes to be committed, many calls per commit.

    The coordinator runs with `defer_durability()`: its calls record changes and return. A handler then awaits
    `wait()` before it replies. The first handler that finds its changes not yet committed schedules one
    commit for the loop's next turn; every handler that runs before it (the calls gRPC delivered in this turn)
    waits for that same commit, which takes everything recorded by then. No thread hand-off either way: a
    commit thread that let the loop go on meanwhile measured slower (two hand-offs per commit, GIL traffic).
    """

    def __init__(self, coordinator: Coordinator, loop: asyncio.AbstractEventLoop) -> None:
        self._c = coordinator
        self._loop = loop
        # The replies waiting for the commit scheduled for the loop's next turn (None: none scheduled). One
        # future each, not one shared: a call cancelled meanwhile (its client left) cancels only its own.
        self._next: list[asyncio.Future[None]] | None = None

    async def wait(self) -> None:
        """Return once everything recorded so far (this handler's changes included) is committed."""
        if self._c.durable(self._c.durable_ticket()):
            return
        if self._next is None:
            self._next = []
            self._loop.call_soon(self._commit)
        future = self._loop.create_future()
        self._next.append(future)
        await future

    def _commit(self) -> None:
        waiting, self._next = self._next, None
        assert waiting is not None
        error: BaseException | None = None
        try:
            self._c.commit_until(self._c.durable_ticket())
        except BaseException as err:  # every waiting reply fails with it (the coordinator stays failed)
            error = err
        for future in waiting:
            if future.done():  # cancelled
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


class LeagueServicer(league_pb2_grpc.LeagueServiceServicer):
    """Served on the event loop. Calls that only take the coordinator's lock run inline (one loop thread, no
    hand-off per call) and wait for their commit with `DurableReplies`; UpdatePlayer (checks the checkpoint
    file) and GetStatus (builds a reply that grows with the league) run on a thread so they never hold up
    the loop; every reply waits for what was recorded before it to be committed."""

    def __init__(self, coordinator: Coordinator, ready: JobsReady, durable: DurableReplies) -> None:
        self._c = coordinator
        self._ready = ready
        self._durable = durable

    async def _answer_durably(self, context: grpc.aio.ServicerContext, call: Callable[[], T]) -> T:
        """Run `call`; its reply, or its refusal (`_refuse_durably`), waits until everything recorded before it
        is committed."""
        try:
            reply = call()
        except RequestError as err:
            await self._refuse_durably(context, err)
            raise  # context.abort always raises; this keeps the type checker informed
        await self._wait_durable(context)
        return reply

    async def _refuse_durably(self, context: grpc.aio.ServicerContext, err: RequestError) -> None:
        """Abort with `err` once everything recorded before it is committed. A refusal can rest on a change its
        own call made: a FinishJob finds its lease expired, records the expiry and is refused. Sent before that
        commit, a crash took the expiry back, the restarted coordinator would have counted the finish, and the
        worker had already dropped its results (a review). A commit that failed makes it UNAVAILABLE instead."""
        await self._wait_durable(context)
        await _refuse(context, err)

    async def _wait_durable(self, context: grpc.aio.ServicerContext) -> None:
        """Until everything recorded so far is committed; a commit that failed aborts with UNAVAILABLE."""
        try:
            await self._durable.wait()
        except StateWriteError as err:
            await _refuse(context, err)
            raise

    async def RegisterWorker(self, request, context):
        process = _process_of(context)
        return await self._answer_durably(context, lambda: wire.registration_reply(
            self._c.register_worker(*wire.parse_register(request), process=process)))

    async def Heartbeat(self, request, context):
        process = _process_of(context)

        def answer():
            worker_id, job_ids, leaving = wire.parse_heartbeat(request)
            return wire.heartbeat_reply(self._c.heartbeat(worker_id, job_ids, process=process, leaving=leaving))

        return await self._answer_durably(context, answer)

    async def GetJob(self, request, context):
        loop = asyncio.get_running_loop()
        try:
            worker_id, role, endpoint, wait_s = wire.parse_get_job(request)
            process = _process_of(context)
            remaining = context.time_remaining()
            if remaining is not None:
                wait_s = max(0.0, min(wait_s, remaining - DEADLINE_MARGIN_S))
            give_up = loop.time() + self._c.job_wait_s(wait_s)
            with self._ready.waiting(role):
                while True:
                    event = self._ready.event(role)  # before looking: an offer made after the look wakes us
                    found = self._c.poll_job(worker_id, role, endpoint, last=loop.time() >= give_up, process=process)
                    if not isinstance(found, JobWait):
                        break
                    timeout = give_up - loop.time()
                    if found.recheck_in_s is not None:
                        timeout = min(timeout, found.recheck_in_s)
                    await self._ready.wait(event, timeout)
        except RequestError as err:
            await self._refuse_durably(context, err)
            raise
        try:
            await self._wait_durable(context)  # the lease (or what a NoJob answer saw) is committed before the reply
        except asyncio.CancelledError:  # the call ended meanwhile (its deadline, the client's cancel)
            if not isinstance(found, NoJob):
                self._c.release_undelivered(worker_id, found.job_id, process)
            raise
        remaining = context.time_remaining()
        if remaining is not None and remaining <= UNDELIVERABLE_S and not isinstance(found, NoJob):
            self._c.release_undelivered(worker_id, found.job_id, process)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                "the job was leased too close to the call's deadline to be delivered: released")
        try:
            return wire.get_job_reply(found)
        except (TypeError, ValueError) as err:
            # A value protobuf cannot hold (the config check keeps them out; this is the server's own guard).
            # The job is leased already: fail it now with the reason, so the usual retry and give-up rules
            # apply, instead of leaving it leased to a worker that never heard of it until the lease expires.
            reason = f"the coordinator cannot encode this job: {type(err).__name__}: {err}"
            assert not isinstance(found, NoJob)  # a NoJob always encodes
            log.error("job %s for %s: %s", found.job_id, worker_id, reason)
            try:
                self._c.finish_job(FinishReport(worker_id=worker_id, job_id=found.job_id, status=JobEndStatus.FAILED,
                                                episodes=(), env_steps=0, agent_steps=0, error=reason))
            except RequestError as refusal:
                # The lease ended while the grant was being committed (it expired in a disk stall, or the
                # worker's leaving heartbeat released it): its end is counted already; the worker still hears
                # why it got no job, not an UNKNOWN from the refusal escaping the handler.
                log.warning("job %s for %s could not be failed (%s): its lease had ended", found.job_id, worker_id,
                            refusal)
            await context.abort(grpc.StatusCode.INTERNAL, reason)
            raise

    async def _answer_durably_in_thread(self, context: grpc.aio.ServicerContext, call: Callable[[], T]) -> T:
        """`_answer_durably` for a call that reads files or takes long: in a thread, not on the event loop."""
        try:
            reply = await asyncio.to_thread(call)
        except RequestError as err:
            await self._refuse_durably(context, err)
            raise
        await self._wait_durable(context)
        return reply

    async def FinishJob(self, request, context):
        process = _process_of(context)
        answer = (self._answer_durably_in_thread if request.unloadable_player_ids  # their checkpoints are read
                  else self._answer_durably)
        return await answer(context, lambda: wire.finish_reply(self._c.finish_job(wire.parse_finish(request), process)))

    async def UpdatePlayer(self, request, context):
        process = _process_of(context)
        return await self._answer_durably_in_thread(
            context, lambda: wire.update_reply(self._c.update_player(wire.parse_update(request), process)))

    async def GetStatus(self, request, context):
        # Durable like every reply: it showed the matches, expiries and snapshots of a commit still under way
        # (that a crash then took back), and kept answering from memory after a failed write, where every other
        # call said UNAVAILABLE.
        return await self._answer_durably_in_thread(context, lambda: wire.status_reply(self._c.status()))


@dataclass
class CoordinatorServer:
    """A coordinator served over gRPC (and /metrics when asked); `stop()` shuts all of it down in order."""

    coordinator: Coordinator
    serving: AioServingServer
    metrics: MetricsServer | None
    _stopping: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return self.serving.address

    @property
    def port(self) -> int:
        return self.serving.port

    def stop(self, grace_s: float = 5.0, drain_s: float = 0.0) -> None:
        """Health NOT_SERVING, long polls answered, in-flight calls finish within `grace_s`, then close.

        For `drain_s` first the server still answers while saying NOT_SERVING: health `Check` probes (and load
        balancers) see NOT_SERVING rather than a refused connection, GetJob answers "shutting down", and
        workers' finishes, updates and heartbeats are still acknowledged. Without a drain only `Watch`ers see it.
        A second call (a signal handler's, then a `finally`'s) returns once the first one has stopped it all.
        """
        with self._stopping:
            if self._stopped:
                return
            self._stopped = True
            self._stop(grace_s, drain_s)

    def _stop(self, grace_s: float, drain_s: float) -> None:
        self.serving.set_serving(False)
        self.coordinator.begin_shutdown()
        if drain_s > 0:
            time.sleep(drain_s)
        try:
            self.serving.stop(grace_s)
            if self.metrics is not None:
                self.metrics.close()
        finally:
            self.coordinator.close()


def serve_coordinator(
    coordinator: Coordinator, options: ServerOptions, *, metrics_port: int | None = None
) -> CoordinatorServer:
    """Start serving `coordinator` (already constructed, not yet started) per `options`."""
    registry = CollectorRegistry()
    registry.register(LeagueCollector(coordinator.figures))
    rpc_metrics = RpcMetricsInterceptor(registry)
    options = replace(
        options,
        interceptors=(*options.interceptors, rpc_metrics),
        on_unauthenticated=rpc_metrics.count_unauthenticated,
        max_send_bytes=max(options.max_send_bytes, STATUS_MAX_BYTES),  # replies: the status grows with the league
    )

    def register(server: grpc.aio.Server, loop: asyncio.AbstractEventLoop) -> None:
        ready = JobsReady(loop)
        coordinator.set_ready_listener(ready.notify)
        coordinator.defer_durability()  # DurableReplies waits instead, on the loop
        servicer = LeagueServicer(coordinator, ready, DurableReplies(coordinator, loop))
        add_service(server, servicer, SERVICE)  # a request that is not a valid message: INVALID_ARGUMENT

    coordinator.start()
    try:
        serving = make_aio_server(options, register, [SERVICE_NAME])
    except BaseException:
        coordinator.close()
        raise
    metrics = None
    if metrics_port is not None:
        try:
            metrics = MetricsServer(registry, options.host, metrics_port, options.token)
        except BaseException:
            serving.stop(0)
            coordinator.close()
            raise
    return CoordinatorServer(coordinator, serving, metrics)
