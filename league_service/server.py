"""The gRPC face of the coordinator: each method translates request -> coordinator call -> reply.

Bad requests become status codes here and nowhere else: NotFoundError -> NOT_FOUND, InvalidArgumentError ->
INVALID_ARGUMENT, FailedPreconditionError -> FAILED_PRECONDITION (messages name the field). Oversize messages
are refused by gRPC itself (RESOURCE_EXHAUSTED) from the server's max receive size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import grpc
from prometheus_client import CollectorRegistry

from common.proto.league.v1 import league_pb2, league_pb2_grpc
from common.rpc import ServerOptions, ServingServer, make_server
from league_service import wire
from league_service.coordinator import Coordinator
from league_service.coordinator_messages import FinishReport
from league_service.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, RequestError
from league_service.leases import JobEndStatus
from league_service.metrics import LeagueCollector, MetricsServer, RpcMetricsInterceptor
from league_service.status import STATUS_MAX_BYTES

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVICE_NAME = league_pb2.DESCRIPTOR.services_by_name["LeagueService"].full_name
# A long-polling GetJob answers this long before the caller's deadline, so the reply still arrives in time.
DEADLINE_MARGIN_S = 0.2

_STATUS_CODES: tuple[tuple[type[RequestError], grpc.StatusCode], ...] = (
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
)


def _answer(context: grpc.ServicerContext, call: Callable[[], T]) -> T:
    """Run `call`; a RequestError aborts the RPC with its status code and message."""
    try:
        return call()
    except RequestError as err:
        code = next((c for cls, c in _STATUS_CODES if isinstance(err, cls)), grpc.StatusCode.INVALID_ARGUMENT)
        log.debug("refused with %s: %s", code.name, err)
        context.abort(code, str(err))
        raise  # context.abort always raises; this keeps the type checker informed


class LeagueServicer(league_pb2_grpc.LeagueServiceServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self._c = coordinator

    def RegisterWorker(self, request, context):
        return _answer(context, lambda: wire.registration_reply(self._c.register_worker(*wire.parse_register(request))))

    def Heartbeat(self, request, context):
        return _answer(context, lambda: wire.heartbeat_reply(self._c.heartbeat(*wire.parse_heartbeat(request))))

    def GetJob(self, request, context):
        def call():
            worker_id, role, endpoint, wait_s = wire.parse_get_job(request)
            remaining = context.time_remaining()
            if remaining is not None:
                wait_s = max(0.0, min(wait_s, remaining - DEADLINE_MARGIN_S))
            grant = self._c.get_job(worker_id, role, endpoint, wait_s)
            try:
                return wire.get_job_reply(grant)
            except (TypeError, ValueError) as err:
                # A value protobuf cannot hold (the config check keeps them out; this is the server's own guard).
                # The job is leased already: fail it now with the reason, so the usual retry and give-up rules
                # apply, instead of leaving it leased to a worker that never heard of it until the lease expires.
                reason = f"the coordinator cannot encode this job: {type(err).__name__}: {err}"
                log.error("job %s for %s: %s", grant.job_id, worker_id, reason)
                self._c.finish_job(FinishReport(worker_id=worker_id, job_id=grant.job_id,
                                                status=JobEndStatus.FAILED, episodes=(), env_steps=0,
                                                agent_steps=0, error=reason))
                context.abort(grpc.StatusCode.INTERNAL, reason)
                raise

        return _answer(context, call)

    def FinishJob(self, request, context):
        return _answer(context, lambda: wire.finish_reply(self._c.finish_job(wire.parse_finish(request))))

    def UpdatePlayer(self, request, context):
        return _answer(context, lambda: wire.update_reply(self._c.update_player(wire.parse_update(request))))

    def GetStatus(self, request, context):
        return _answer(context, lambda: wire.status_reply(self._c.status()))


@dataclass
class CoordinatorServer:
    """A coordinator served over gRPC (and /metrics when asked); `stop()` shuts all of it down in order."""

    coordinator: Coordinator
    serving: ServingServer
    metrics: MetricsServer | None

    @property
    def address(self) -> str:
        return self.serving.address

    @property
    def port(self) -> int:
        return self.serving.port

    def stop(self, grace_s: float = 5.0) -> None:
        """Health NOT_SERVING, long polls answered, in-flight calls finish within `grace_s`, then close."""
        self.serving.set_serving(False)
        self.coordinator.begin_shutdown()
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
    options = replace(
        options,
        interceptors=(*options.interceptors, RpcMetricsInterceptor(registry)),
        max_send_bytes=max(options.max_send_bytes, STATUS_MAX_BYTES),  # replies: the status grows with the league
    )
    coordinator.start()
    try:
        serving = make_server(
            options,
            lambda server: league_pb2_grpc.add_LeagueServiceServicer_to_server(LeagueServicer(coordinator), server),
            [SERVICE_NAME],
        )
    except BaseException:
        coordinator.close()
        raise
    metrics = None
    if metrics_port is not None:
        try:
            metrics = MetricsServer(registry, options.host, metrics_port)
        except BaseException:
            serving.stop(0)
            coordinator.close()
            raise
    return CoordinatorServer(coordinator, serving, metrics)
