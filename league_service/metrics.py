"""Prometheus metrics of the coordinator: RPC latency by method, and the league's counters and gauges.

The league figures are read from the coordinator when Prometheus scrapes (a custom collector), so there is one
source of truth — the coordinator's own counters, which survive restarts — instead of a second set of
increments to keep in step. Each coordinator has its own registry, so several can live in one test process.
/metrics is served on the RPC `--host` and, when the coordinator has a token, asks for the same bearer token
(Prometheus: `authorization: {credentials_file: ...}`), as every RPC does: else the counts and per-method
latencies were open to anyone who could reach a port whose RPCs need the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from common.rpc import AddressInUseError, BindError, bearer_refusal, bearer_token, join_host_port

# Unary calls here take ~0.1-10 ms; long-polling GetJob up to the call's deadline.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class LeagueFigures:
    """What the coordinator reports at each scrape."""

    jobs_issued: int
    jobs_finished: int
    jobs_expired: int
    jobs_failed: int
    jobs_given_up: int
    matches: int
    episodes: int
    snapshots: int
    mutations: int
    active_players: int
    historical_players: int
    jobs_in_flight: int
    jobs_pending: int
    workers_alive: int


class LeagueCollector(Collector):
    def __init__(self, figures: Callable[[], LeagueFigures]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        f = self._figures()
        yield _counter("league_jobs_issued", "Jobs leased to workers.", f.jobs_issued)
        yield _counter("league_jobs_finished", "Jobs finished by their worker (completed or released).", f.jobs_finished)
        yield _counter("league_jobs_expired", "Leases that ran out before their job finished.", f.jobs_expired)
        yield _counter("league_jobs_failed", "Jobs their worker reported as failed.", f.jobs_failed)
        yield _counter("league_jobs_given_up", "Collect jobs given up after max_job_attempts failed attempts.",
                       f.jobs_given_up)
        # Self-play episodes are matches too, but the payoff does not record them (a player's rate against itself
        # is 0.5): this counter is `league status`'s "matches", above the payoff's games played.
        yield _counter("league_matches", "Matches (episodes) of finished jobs, self-play included (the payoff "
                       "records no self-play).", f.matches)
        yield _counter("league_episodes", "Episodes accepted from finished jobs.", f.episodes)
        yield _counter("league_snapshots", "Historical players snapshotted from active ones.", f.snapshots)
        yield _counter("league_mutations", "Active players reset to their initial checkpoint.", f.mutations)
        players = GaugeMetricFamily("league_players", "Players in the league.", labels=["state"])
        players.add_metric(["active"], f.active_players)
        players.add_metric(["historical"], f.historical_players)
        yield players
        yield GaugeMetricFamily("league_jobs_in_flight", "Jobs under a lease now.", value=f.jobs_in_flight)
        yield GaugeMetricFamily("league_jobs_pending", "Launched jobs waiting for a worker.", value=f.jobs_pending)
        yield GaugeMetricFamily("league_workers_alive", "Workers heard from within a lease timeout.", value=f.workers_alive)


def _counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times every unary-unary call by method and counts calls by method and status code (grpc.aio server).

    gRPC asks the interceptor for a handler on every call: the wrapped handler of each method is built once and
    reused (a method's handler never changes), and the OK counter of each method is resolved once. A handler
    that raises (not an abort) counts as UNKNOWN, which is what the client gets.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._latency = Histogram(
            "league_rpc_latency_seconds", "Server-side latency of unary RPCs.", ["method"],
            registry=registry, buckets=_LATENCY_BUCKETS,
        )
        self._calls = Counter("league_rpc_calls", "Unary RPCs by method and status code.", ["method", "code"], registry=registry)
        # full method name -> (the handler wrapped, the wrapper)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        full_name = handler_call_details.method
        cached = self._wrapped.get(full_name)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapper = self._wrap(_method_name(full_name), handler)
        self._wrapped[full_name] = (handler, wrapper)
        return wrapper

    def count_unauthenticated(self, full_method: str) -> None:
        """Count a call the token check refused (`ServerOptions.on_unauthenticated`): it answers before this
        interceptor sees the call, and a worker with a stale token would otherwise not show in the metrics."""
        self._calls.labels(_method_name(full_method), grpc.StatusCode.UNAUTHENTICATED.name).inc()

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner = handler.unary_unary
        latency = self._latency.labels(method)
        calls = self._calls
        ok = calls.labels(method, grpc.StatusCode.OK.name)

        async def timed(request, context: grpc.aio.ServicerContext):
            start = time.perf_counter()
            allowed = context.time_remaining()
            failed = cancelled = False
            try:
                return await inner(request, context)
            except asyncio.CancelledError:  # the client went away (or the server stops): no answer was given
                cancelled = True
                raise
            except Exception:
                failed = True
                raise
            finally:
                latency.observe(time.perf_counter() - start)
                code = context.code()
                if cancelled and code is None:
                    calls.labels(method, cut_off_code(context.time_remaining(), allowed).name).inc()
                elif code is None or code is grpc.StatusCode.OK:
                    (calls.labels(method, grpc.StatusCode.UNKNOWN.name) if failed and code is None else ok).inc()
                else:
                    calls.labels(method, code.name).inc()

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


DEADLINE_SLACK_S = 1.0
"""How close to its deadline a cancelled call counts as past it: the server's deadline starts when the call
arrives, later than the client's, so the client's own deadline cancel can reach a busy server with time left."""


def cut_off_code(time_remaining: float | None, time_allowed: float | None = None) -> grpc.StatusCode:
    """The status the client saw when the core cancelled a handler: its deadline passing (DEADLINE_EXCEEDED, a
    slow coordinator) or the client going away (CANCELLED). The core cancels in both cases and does not say
    which, so a cancel within `DEADLINE_SLACK_S` of the deadline is taken as the deadline (under load one came
    in with 1 ms left and was counted CANCELLED). `time_allowed`: what the handler had left when it started; the
    slack is at most half of it, else every cancel of a call with a deadline of a second or less (a leaving
    learner's Heartbeat) counted DEADLINE_EXCEEDED, however early the client went."""
    slack = DEADLINE_SLACK_S if time_allowed is None else min(DEADLINE_SLACK_S, time_allowed / 2)
    if time_remaining is not None and time_remaining <= slack:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


def _method_name(full_method: str) -> str:
    """The `method` label of a call: `GetJob` of `/league.v1.LeagueService/GetJob`."""
    return full_method.rsplit("/", 1)[-1]


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def bearer_token_required(app: WsgiApp, token: str) -> WsgiApp:
    """`app` behind `Authorization: Bearer <token>` (the scheme in any case, the token compared exactly and in
    constant time: `common.rpc.bearer_refusal`, as the RPCs); 401 without it, as the RPCs answer UNAUTHENTICATED."""
    expected = bearer_token(token)

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        got = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")  # WSGI: latin-1 strings
        refusal = bearer_refusal(got, expected)
        if refusal is None:
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", 'Bearer realm="league metrics"')])
        return [f"{refusal}\n".encode()]

    return guarded


CLIENT_TIMEOUT_S = 30.0
"""How long a /metrics client may keep its connection without a byte either way (a scrape takes milliseconds;
Prometheus times one out after its scrape_timeout, 10 s by default). Each connection holds a thread: without
a bound, a client that connected and sent nothing (no token needed for that) held one for ever, and enough of
them would take every thread the coordinator's process may start."""


MAX_CONNECTIONS = 32
"""/metrics connections served at once (a thread each); more are closed at once. Without a bound, 300 idle
connections (no token needed to open one) made 160 threads (a review); enough would take every thread the
process may start, and the coordinator's calls that run in threads with them."""


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr per scrape; a client silent for CLIENT_TIMEOUT_S, or connected that long in all, is
    dropped (the socket timeout is per read: a byte every 29 s kept a connection for ever)."""

    timeout = CLIENT_TIMEOUT_S  # (socketserver sets it on the connection)

    def handle(self) -> None:
        deadline = threading.Timer(CLIENT_TIMEOUT_S, self._cut)
        deadline.daemon = True
        deadline.start()
        try:
            super().handle()
        except OSError:  # (TimeoutError and ConnectionError among them)
            self.close_connection = True  # stalled, cut or gone: nothing to answer (not a traceback on stderr)
        finally:
            deadline.cancel()

    def _cut(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _BoundedThreadingServer(ThreadingWSGIServer):
    """ThreadingWSGIServer with at most MAX_CONNECTIONS connections (threads) at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed at once, no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class MetricsServer:
    """The /metrics HTTP endpoint on its own thread, behind `token` when one is given; `close()` stops it."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, token: str | None = None) -> None:
        app = make_wsgi_app(registry)
        if token is not None:
            app = bearer_token_required(app, token)
        try:
            family, addr = _best_family(host, port)
            server_class = type("MetricsHttpServer", (_BoundedThreadingServer,), {"address_family": family})
            self._server = make_server(addr, port, app, server_class, handler_class=_QuietHandler)
        except OSError as err:  # name the metrics port: the process listens on two
            where = f"--metrics-port: {join_host_port(host, port)}"
            if err.errno == errno.EADDRINUSE:
                raise AddressInUseError(err.errno, f"{where} is in use by another process") from err
            raise BindError(err.errno, f"{where}: {err.strerror or err}") from err
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        self.port: int = self._server.server_port
        self._closed = threading.Event()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _best_family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and address to bind `host` with (an IPv6 host needs AF_INET6), as prometheus_client's
    own server picks them. An IPv6 address in brackets (`--host [::1]`, which gRPC takes for the RPCs) is looked up
    without them: getaddrinfo knows no such name, so the coordinator refused to start with --metrics-port."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family, sockaddr[0]
