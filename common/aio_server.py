"""A grpc.aio server on its own event-loop thread, with the same face as `common.rpc.ServingServer`.

Why: in gRPC's threaded server every call is handed from gRPC's polling thread to a pool thread and back, and
with many clients these hand-offs (and the GIL traffic they cause) cost more than the coordinator's own work
(BENCHMARKS.md, Coordinator RPC). On an asyncio server a call runs on the loop thread that read it. Handlers
that only take a lock and touch memory run inline; slow ones (filesystem, large replies) go to a thread.

Everything else is as `make_server`: the same channel options, health (open without a token) and reflection,
bearer-token auth, TLS. Callers stay synchronous: `make_aio_server` returns once the server listens, and
`stop` returns once it has stopped; the loop runs on a daemon thread named "grpc-aio".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.rpc import (
    BearerTokenInterceptor,
    ServerOptions,
    bind_port,
    enable_reflection,
    handler_like,
    join_host_port,
    server_channel_options,
)

T = TypeVar("T")

CALL_THREAD_PREFIX = "grpc-aio-call"
"""The names of the threads calls run in (`asyncio.to_thread`), before the server's number."""
_numbers = itertools.count()


class AioBearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """`BearerTokenInterceptor` for grpc.aio servers (the same check, an asyncio handler that refuses)."""

    def __init__(self, token: str, on_refused: Callable[[str], None] | None = None) -> None:
        self._check = BearerTokenInterceptor(token)
        self._on_refused = on_refused

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        reason = None if handler is None else self._check.refusal(handler_call_details)
        if reason is None:
            return handler
        if self._on_refused is not None:  # only methods the server has (handler is not None): bounded names
            self._on_refused(handler_call_details.method)
        return _aio_abort_handler(handler, grpc.StatusCode.UNAUTHENTICATED, reason)


def _aio_abort_handler(like: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape as `like` that fails every call with `code`."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, details)

    return handler_like(like, abort, decode=False)  # (the refusal needs no request: parsing it cost the loop)


@dataclass
class AioServingServer:
    """A started asyncio server and its loop thread; thread-safe to control from any other thread."""

    server: grpc.aio.Server
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    host: str
    port: int
    health: Any  # grpc_health.v1.health.aio.HealthServicer
    service_names: tuple[str, ...]
    call_threads: str = CALL_THREAD_PREFIX
    """The name prefix of this server's call threads."""
    _stopped: bool = field(default=False, repr=False)

    def stuck_calls(self, wait_s: float = 0.0) -> list[threading.Thread]:
        """The threads of calls (`asyncio.to_thread`: a status, a checkpoint check) still running after `stop`,
        waited for up to `wait_s` in all: a read of a hung filesystem never returns, and the interpreter's exit
        joins them (a stop took as long as the stuck read, however short its grace; a review)."""
        deadline = time.monotonic() + wait_s
        while True:  # (all of them at once: idle ones end as soon as they see the pool shut down)
            stuck = [t for t in threading.enumerate() if t.name.startswith(self.call_threads) and t.is_alive()]
            if not stuck or time.monotonic() >= deadline:
                return stuck
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    @property
    def address(self) -> str:
        return join_host_port(self.host, self.port)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the server's loop and wait for its result (from any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING

        async def set_all() -> None:
            for name in ("", *self.service_names):
                await self.health.set(name, status)

        self.call(set_all())

    def stop(self, grace_s: float | None = 5.0) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight calls finish within `grace_s`, end the loop."""
        if self._stopped:
            return
        self._stopped = True

        async def shutdown() -> None:
            await self.health.enter_graceful_shutdown()
            await self.server.stop(grace_s)

        try:
            self.call(shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server stopped (True) or `timeout_s` passed (False)."""
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


class _ReplyToGoneClientFilter(logging.Filter):
    """grpc.aio logs ERROR with a traceback when a reply cannot be sent ("ExecuteBatchError raised in core by
    servicer method"): its client gone (a call's deadline passed or it was cancelled meanwhile), the client's
    doing, read as a fault of the server in its log (a review: a storm of short deadlines left nine). The same
    comes of a reply larger than the send limit (the server's own fault: the coordinator's limit is set by its
    largest reply), which must not vanish. One INFO line without the traceback, naming both."""

    PREFIX = "ExecuteBatchError raised in core by servicer method"

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(self.PREFIX)):
            return True
        record.msg = (f"{record.getMessage().replace(self.PREFIX, 'a reply of', 1)} could not be sent: its client had "
                      "gone (its deadline passed, or it cancelled), or the reply was larger than the send limit")
        record.args = None
        record.levelno, record.levelname, record.exc_info, record.exc_text = logging.INFO, "INFO", None, None
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


_GRPC_CORE_LOGGER = "grpc._cython.cygrpc"


def _quiet_replies_to_gone_clients() -> None:
    core = logging.getLogger(_GRPC_CORE_LOGGER)
    if not any(isinstance(f, _ReplyToGoneClientFilter) for f in core.filters):
        core.addFilter(_ReplyToGoneClientFilter())


def make_aio_server(
    options: ServerOptions,
    register: Callable[[grpc.aio.Server, asyncio.AbstractEventLoop], None],
    service_names: Sequence[str],
) -> AioServingServer:
    """Start a loop thread, build, bind and start an asyncio server on it with health (SERVING) and reflection.

    `register(server, loop)` adds the servicers (it runs on the loop thread, so it may create asyncio objects).
    `options.interceptors` must be grpc.aio.ServerInterceptor instances.
    """
    _quiet_replies_to_gone_clients()
    loop = asyncio.new_event_loop()
    # Its own, so that the stop need not wait for a call stuck in a thread (loop.shutdown_default_executor joins
    # every one of them, with no bound).
    call_threads = f"{CALL_THREAD_PREFIX}-{next(_numbers)}-"
    executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix=call_threads)
    loop.set_default_executor(executor)
    started: concurrent.futures.Future[AioServingServer] = concurrent.futures.Future()
    names = tuple(service_names)

    async def start() -> tuple[grpc.aio.Server, int, Any]:
        interceptors: list[grpc.aio.ServerInterceptor] = list(options.interceptors)
        if options.token is not None:
            interceptors.insert(0, AioBearerTokenInterceptor(options.token, options.on_unauthenticated))
        server = grpc.aio.server(interceptors=interceptors, options=server_channel_options(options))
        try:
            register(server, loop)
            health_servicer = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            enable_reflection(server, names)
            port = bind_port(server, options)
            await server.start()
        except BaseException:
            await server.stop(None)
            raise
        return server, port, health_servicer

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            server, port, health_servicer = loop.run_until_complete(start())
        except BaseException as err:
            started.set_exception(err)
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()
            return
        started.set_result(AioServingServer(server, loop, threading.current_thread(), options.host, port,
                                            health_servicer, names, call_threads))
        try:
            loop.run_forever()
        finally:
            _cancel_leftovers(loop, executor)
            loop.close()

    thread = threading.Thread(target=run, name="grpc-aio", daemon=True)
    thread.start()
    serving = started.result()
    serving.set_serving(True)
    return serving


def _cancel_leftovers(loop: asyncio.AbstractEventLoop, executor: concurrent.futures.ThreadPoolExecutor) -> None:
    """Cancel tasks still pending when the loop stops (calls cut off after the grace) and let them unwind; calls
    running in threads are not waited for (`AioServingServer.stuck_calls` names them)."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    executor.shutdown(wait=False, cancel_futures=True)
