"""gRPC plumbing every process shares: servers, channels, auth, deadlines, retries.

Why one module: the same decisions (message size limits, keepalive, how the token travels, that every call has a
deadline) must hold on both ends of every connection, so they live in one place and both ends import them.

- Servers come from `make_server` (threaded) or `common.aio_server.make_aio_server` (grpc.aio, the
  coordinator's), which also register the gRPC health service (open to probes without a token) and server
  reflection (behind the token, like every other method).
- Channels come from `make_channel`. A client interceptor gives every call a deadline (`DEFAULT_DEADLINE_S`
  unless the caller passes `timeout=`) and sends the bearer token as plain call metadata. gRPC's call
  credentials are silently dropped on insecure channels, so metadata is the one path that works on both.
- `call_idempotent` retries a call with exponential backoff and jitter, for idempotent calls only;
  `stoppable` makes each attempt end when a stop event is set, not only the backoff between them.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import itertools
import logging
import math
import os
import random
import re
import secrets
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.config import MAX_DURATION_S
from common.durable_files import atomic_write
from common.ports import bind_error

log = logging.getLogger(__name__)

# Every client call without an explicit timeout gets this deadline.
DEFAULT_DEADLINE_S = 10.0
# Control-plane messages are small; a larger one is a bug or an attack (RESOURCE_EXHAUSTED).
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
TOKEN_ENV_VAR = "LEAGUE_TOKEN"
# Where the `league` commands find the coordinator and the shared root when no flag says (README: Commands).
COORDINATOR_ENV_VAR = "LEAGUE_COORDINATOR"
SHARED_ROOT_ENV_VAR = "LEAGUE_SHARED_ROOT"
AUTH_METADATA_KEY = "authorization"
PROCESS_METADATA_KEY = "league-process"
"""Metadata every call of this project's clients carries: which process sent it. The coordinator lets one
process at a time use a worker id (two processes started with the same --worker-id would both hold its jobs)."""
_process_id: tuple[int, str] = (-1, "")


def process_id() -> str:
    """This process, for PROCESS_METADATA_KEY: readable in an error message, unique even where pids repeat
    (containers); made anew in a forked child."""
    global _process_id
    pid = os.getpid()
    if _process_id[0] != pid:
        _process_id = (pid, f"{socket.gethostname()}/pid {pid}/{secrets.token_hex(4)}")
    return _process_id[1]


# Health checks stay open so load balancers and `grpc_health_probe` work without a secret.
OPEN_METHOD_PREFIXES: tuple[str, ...] = ("/grpc.health.v1.Health/",)
# Printed by servers once bound, so parents (tests, `league run`) can find the port.
LISTEN_LINE_PREFIX = "LISTENING"

_KEEPALIVE_CLIENT_OPTIONS: tuple[tuple[str, int], ...] = (
    # After a server outage gRPC's own reconnect schedule can stretch to ~2 minutes; workers must rejoin a
    # restarted coordinator or learner within seconds.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    # A ping every 10 s (servers accept one every 10 s, and never punish more): a silent connection is found at
    # most this plus ping_timeout_ms (below) after it went silent, within a 30 s lease (at 30 s, up to 40 s).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A connection that goes silent (a NAT or firewall dropping it, a peer's host gone without a reset) is given
    # up once a ping goes unanswered this long. gRPC's default is a minute, and keepalive_timeout_ms does not
    # shorten it here: heartbeats timed out on the dead connection for 60 s, past a 30 s lease, while the
    # coordinator was reachable on a new one.
    ("grpc.http2.ping_timeout_ms", 10_000),
)
_KEEPALIVE_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
)

T = TypeVar("T")


# --------------------------------------------------------------------------------------------------------
# Tokens, addresses, exposure
# --------------------------------------------------------------------------------------------------------


def env_path(name: str) -> Path | None:
    """The path in environment variable `name`, `~` expanded as in a path flag (compose and k8s env files do not
    expand it, so `~/league` was a folder named `~` in the working directory), or None when it is unset or empty
    (a flag's default)."""
    value = os.environ.get(name)
    return Path(os.path.expanduser(value)) if value else None


def load_token(token_file: str | os.PathLike[str] | None) -> str | None:
    """The bearer token from `token_file`, else from $LEAGUE_TOKEN, else None (no auth)."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"--token-file: cannot read {token_file}: {_reason(err)}") from err
        if not token:
            raise ValueError(f"--token-file: {token_file} is empty")
        return _sendable_token(token, f"--token-file: {token_file}")
    raw = os.environ.get(TOKEN_ENV_VAR, "")
    token = raw.strip()
    if raw and not token:  # set to blanks (an env file's `LEAGUE_TOKEN= `): no auth, said nowhere (a review)
        raise ValueError(f"${TOKEN_ENV_VAR} holds only whitespace: give the token, or unset it for no auth")
    return _sendable_token(token, f"${TOKEN_ENV_VAR}") if token else None


MAX_TOKEN_CHARS = 4096
"""gRPC refuses call metadata over 16 KiB in all (RESOURCE_EXHAUSTED on every call); real tokens are far
shorter."""


def _sendable_token(token: str, source: str) -> str:
    """A token gRPC can carry in a header: printable ASCII (a non-ASCII character or a second line made every
    call fail INTERNAL "Invalid metadata", naming nothing), within `MAX_TOKEN_CHARS`."""
    if not (token.isascii() and token.isprintable()):
        bad = next(c for c in token if not (c.isascii() and c.isprintable()))
        raise ValueError(f"{source}: the token must be one line of printable ASCII characters (no line breaks, "
                         f"tabs or accents); it holds {bad!r}")
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"{source}: the token has {len(token)} characters, more than {MAX_TOKEN_CHARS}")
    return token


class _EncryptedKeyError(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKeyError


def check_server_tls(cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> None:
    """Refuse a certificate chain and key that cannot be read or do not make a pair, naming the files.

    gRPC itself only says "Failed to bind to address" for a bad PEM, which sends people looking at the port.
    """
    _check_readable("--tls-cert", cert_path)
    _check_readable("--tls-key", key_path)
    try:
        # A passphrase callback that refuses: without one OpenSSL prompts on the terminal (start-up hung) or, with
        # no terminal, fails with a bare OSError (a traceback). gRPC cannot use an encrypted key either way.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path, password=_no_passphrase)
    except _EncryptedKeyError as err:
        raise ValueError(f"--tls-key: {key_path} is encrypted (it asks for a passphrase); gRPC needs an "
                         f"unencrypted PEM key (`openssl pkey -in KEY -out PLAIN`)") from err
    except ssl.SSLError as err:
        raise ValueError(
            f"--tls-cert/--tls-key: {cert_path} and {key_path} are not a PEM certificate chain and its private key"
            f"{_ssl_detail(err)}"
        ) from err
    dates = _certificate_dates(cert_path)[:1]  # the server's own certificate comes first in its chain
    if dates:
        not_before, not_after = dates[0]
        _refuse_out_of_dates("--tls-cert", cert_path, "its certificate", not_before, not_after)
        left_s = not_after - time.time()
        if left_s < CERT_EXPIRY_WARNING_S:
            log.warning("--tls-cert: %s expires in %.1f days (%s): clients refuse it from then on",
                        cert_path, left_s / 86400, _utc(not_after))


def check_tls_ca(ca_path: str | os.PathLike[str]) -> None:
    """Refuse a CA file that cannot be read or holds no PEM certificate (gRPC would fail each handshake later)."""
    _check_readable("--tls-ca", ca_path)
    try:
        ssl.create_default_context(cafile=os.fspath(ca_path))
    except ssl.SSLError as err:
        raise ValueError(f"--tls-ca: {ca_path} holds no PEM CA certificate{_ssl_detail(err)}") from err
    dates = _certificate_dates(ca_path)
    now = time.time()
    if dates and not any(not_before <= now <= not_after for not_before, not_after in dates):
        # (One valid CA among expired ones, as in a system bundle, still verifies the servers it signed.)
        not_before, not_after = max(dates, key=lambda d: d[1])
        what = "its certificate" if len(dates) == 1 else (
            f"every one of its {len(dates)} certificates is out of its dates, the latest")
        _refuse_out_of_dates("--tls-ca", ca_path, what, not_before, not_after)


CERT_EXPIRY_WARNING_S = 7 * 86400.0
"""A server certificate expiring sooner than this is said at start (a WARNING): every client refuses it once
it has expired, and the servers keep it until they restart."""

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def _certificate_dates(path: str | os.PathLike[str]) -> list[tuple[float, float]]:
    """(notBefore, notAfter) of each PEM certificate in `path`, in epoch seconds; [] where this Python cannot
    decode certificates (CPython's ssl has no public parser; its test hook is used where it exists).

    Why: a certificate out of its dates passes every start-up check (it loads, it pairs with its key) and then
    fails every handshake, which clients see as UNAVAILABLE and retry for ever."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return []
    try:
        blocks = _PEM_CERT.findall(Path(path).read_bytes())
    except OSError:
        return []
    dates = []
    with tempfile.TemporaryDirectory(prefix="league-cert-") as tmp:
        one = Path(tmp) / "cert.pem"
        for block in blocks:
            one.write_bytes(block + b"\n")
            try:
                fields = decode(str(one))
                dates.append((ssl.cert_time_to_seconds(fields["notBefore"]),
                              ssl.cert_time_to_seconds(fields["notAfter"])))
            except (ssl.SSLError, KeyError, ValueError, TypeError):
                continue  # not decodable here: OpenSSL's own load above has judged the file
    return dates


def _refuse_out_of_dates(flag: str, path: str | os.PathLike[str], what: str, not_before: float,
                         not_after: float) -> None:
    now = time.time()
    if now > not_after:
        raise ValueError(f"{flag}: {path}: {what} expired on {_utc(not_after)} (this machine's clock says "
                         f"{_utc(now)}): every TLS handshake with it fails; renew it")
    if now < not_before:
        raise ValueError(f"{flag}: {path}: {what} is not valid before {_utc(not_before)} (this machine's clock "
                         f"says {_utc(now)}): every TLS handshake with it fails until then")


def _utc(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_s))


def _check_readable(flag: str, path: str | os.PathLike[str]) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise ValueError(f"{flag}: cannot read {path}: {_reason(err)}") from err


def _reason(err: BaseException) -> str:
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)


def _ssl_detail(err: ssl.SSLError) -> str:
    """OpenSSL's reason when it says more than "PEM lib" (e.g. KEY_VALUES_MISMATCH)."""
    return f" ({err.reason})" if err.reason and err.reason != "PEM lib" else ""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, insecure: bool, field: str = "--host") -> None:
    """Refuse to serve a non-loopback address without a token unless the operator said `--insecure`. `field`
    names where `host` came from (a flag, or a config key such as `coordinator.bind_address`)."""
    if token is None and not insecure and not is_loopback(host):
        raise ValueError(
            f"{field}: refusing to listen on non-loopback address {host!r} without a token "
            f"(give --token-file or ${TOKEN_ENV_VAR}, or --insecure to serve without auth)"
        )


_TLS_SIGNS = ("handshake", "certificate", "hostname verification", "ssl", "wrong_version_number", "tls")


def tls_hint(details: str | None) -> str:
    """What an UNAVAILABLE's details say of TLS: a failed handshake (a certificate expired, for another name, or
    from another CA; TLS on one side only) looked like a network outage, retried for ever with only the code
    logged (a review)."""
    text = (details or "").lower()
    if any(sign in text for sign in _TLS_SIGNS):
        return " (a TLS failure: check --tls-ca and the server's certificate, its dates and the names it covers)"
    if "socket closed" in text:
        return " (a server over TLS dialled without --tls-ca does this too)"
    return ""


def not_a_coordinator_hint(code: grpc.StatusCode | None, address: str) -> str:
    """What an UNIMPLEMENTED answer to a league call most likely means: the address is a learner's (its data
    port) or another gRPC server's, whose "Method not found!" alone did not say so."""
    if code is not grpc.StatusCode.UNIMPLEMENTED:
        return ""
    return f" (is {address} a league coordinator? a learner's port serves trajectories only)"


class RegistrationError(RuntimeError):
    """A RegisterWorker reply a worker cannot run by (not a coordinator of this version, or not ours)."""


TLS_FAILURES_BEFORE_CONTACT = 5
"""Failed TLS handshakes in a row, before any coordinator ever answered a worker, after which it stops (exit 2): no
outage fails so, its TLS settings do (no --tls-ca, a CA that did not sign the server's certificate). Retried for
ever, a worker that could never join showed only warnings, where a wrong token stops it (a review)."""


class FirstContactTlsCounter:
    """Counts the handshakes a worker's registration failed, until a coordinator first answers it."""

    def __init__(self) -> None:
        self.failures = 0
        self.answered = False

    def check(self, what: str, address: str, details: str | None) -> None:
        """Count a transient failure of `what`; raise `RegistrationError` once TLS failed too often before any
        answer (a failure that is no handshake's starts the count again)."""
        hint = tls_hint(details)
        if self.answered or not hint:
            self.failures = 0
            return
        self.failures += 1
        if self.failures >= TLS_FAILURES_BEFORE_CONTACT:
            raise RegistrationError(f"{what} at {address}: {details}{hint}; {self.failures} tries in a row failed so "
                                    "before any coordinator answered this worker: its TLS settings do not fit the "
                                    "coordinator's")


def check_registration(address: str, heartbeat_interval_s: float, lease_timeout_s: float) -> None:
    """The heartbeat interval and lease of a RegisterWorker reply, checked: workers time their heartbeats and
    leases by them, and a zero or NaN would fail them later, far from the cause."""
    if not 0 < heartbeat_interval_s < lease_timeout_s <= MAX_DURATION_S:  # False for a NaN
        raise RegistrationError(
            f"the coordinator at {address} answered RegisterWorker with heartbeat_interval_s={heartbeat_interval_s} "
            f"and lease_timeout_s={lease_timeout_s} (expected 0 < heartbeat interval < lease <= "
            f"{MAX_DURATION_S:g}): is it a league coordinator of this version?"
        )


MIN_HEARTBEAT_INTERVAL_S = 0.01
"""No job's heartbeat goes out more often: a lease of a nanosecond (a coordinator's bug; configs only bound it
above 0) made an actor send ~7,600 heartbeats a second (a review)."""


def job_heartbeat_interval(registered_s: float, lease_timeout_s: float) -> float:
    """How often a job's heartbeat goes out: as registration said, and at least three times per the job's own
    lease. A worker registers once, so a coordinator restarted with a shorter lease (which still knows the
    worker), or one whose lease is barely longer than its heartbeat interval, would otherwise see a lease
    expire between two heartbeats. Never below `MIN_HEARTBEAT_INTERVAL_S`."""
    if math.isfinite(lease_timeout_s) and lease_timeout_s > 0:
        registered_s = min(registered_s, lease_timeout_s / 3)
    return max(registered_s, MIN_HEARTBEAT_INTERVAL_S)


def join_host_port(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def format_listen_line(service: str, address: str) -> str:
    return f"{LISTEN_LINE_PREFIX} service={service} address={address}"


def announce_listening(service: str, address: str) -> None:
    """Print the LISTENING line (`format_listen_line`) on stdout. A stdout that cannot take it (a log file on a
    full disk) costs the line, not the server: the print's OSError ended the coordinator and the learner with a
    traceback at start, while their logging, on the same file, drops what it cannot write and goes on."""
    try:
        print(format_listen_line(service, address), flush=True)
    except OSError as err:
        log.error("the %s listens on %s, but its %s line could not be written to stdout: %s", service, address,
                  LISTEN_LINE_PREFIX, err.strerror or err)


def parse_listen_line(line: str) -> tuple[str, str] | None:
    """(service, address) from a line written by `format_listen_line`, None for any other line."""
    parts = line.strip().split()
    if len(parts) != 3 or parts[0] != LISTEN_LINE_PREFIX:
        return None
    fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    if set(fields) != {"service", "address"}:
        return None
    return fields["service"], fields["address"]


def write_port_file(path: str | os.PathLike[str], port: int) -> None:
    """Write the port atomically (`common.durable_files`) so a reader never sees a half-written number."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, f"{port}\n".encode())


# --------------------------------------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerTls:
    cert_path: Path
    key_path: Path

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(Path(self.key_path).read_bytes(), Path(self.cert_path).read_bytes())])


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = field(default=None, repr=False)  # (never in a printed settings object)
    tls: ServerTls | None = None
    # make_server: threads serving calls (a call that blocks, such as a long poll, holds one). Not used by
    # make_aio_server, whose calls run on one event loop.
    max_workers: int = 128
    max_receive_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_send_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # grpc.ServerInterceptor for make_server, grpc.aio.ServerInterceptor for make_aio_server (common/aio_server.py).
    interceptors: tuple[Any, ...] = ()
    # make_aio_server: called with the full method name of every call the token check refuses. That check runs
    # before the `interceptors`, so a metrics interceptor among them never sees those calls.
    on_unauthenticated: Callable[[str], None] | None = None


def handler_like(like: grpc.RpcMethodHandler, behavior: Callable[..., Any], decode: bool = True
                 ) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape and message types as `like` that runs `behavior`; not `decode`:
    its requests reach `behavior` as bytes, never parsed (a refusal has no use for them)."""
    kw = {"request_deserializer": like.request_deserializer if decode else None,
          "response_serializer": like.response_serializer}
    if like.request_streaming and like.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, **kw)
    if like.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, **kw)
    if like.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, **kw)
    return grpc.unary_unary_rpc_method_handler(behavior, **kw)


def _abort_handler(like: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape as `like` that fails every call with `code`."""

    def abort(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, details)

    # Not decoded: a caller without the token made the server parse 4 MiB of two million empty messages (160 ms
    # of the coordinator's only event-loop thread) for the refusal (a review).
    return handler_like(like, abort, decode=False)


BEARER_SCHEME = "Bearer"


def bearer_credentials(token: str) -> str:
    """The `authorization` value our clients send: `Bearer <token>`."""
    return f"{BEARER_SCHEME} {bearer_token(token)}"


def bearer_token(token: str) -> str:
    """`token` as the servers check it (`bearer_refusal`): never empty, which would let `Bearer ` through."""
    if not token:
        raise ValueError("token: must not be empty")
    return token


def bearer_refusal(got: bytes, token: str) -> str | None:
    """Why a request whose `authorization` value is `got` is refused (missing or wrong token), or None to let it
    through. The scheme is matched whatever its case (RFC 7235, 6750: `bearer <token>` is the same credentials; a
    client that sends it was refused as "wrong"), the token exactly and in constant time: the RPCs and /metrics
    check the same token."""
    scheme, _, credentials = got.partition(b" ")
    token_matches = hmac.compare_digest(credentials.lstrip(b" "), token.encode())
    if token_matches and scheme.lower() == BEARER_SCHEME.lower().encode():
        return None
    return "wrong bearer token" if got else "missing bearer token"


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Fails every call without `authorization: Bearer <token>` (the scheme in any case) with UNAUTHENTICATED
    (health stays open)."""

    def __init__(self, token: str, open_prefixes: Sequence[str] = OPEN_METHOD_PREFIXES) -> None:
        self._expected = bearer_token(token)
        self._open_prefixes = tuple(open_prefixes)

    def refusal(self, handler_call_details: grpc.HandlerCallDetails) -> str | None:
        """Why this call is refused (missing or wrong token), or None to let it through."""
        if handler_call_details.method.startswith(self._open_prefixes):
            return None
        metadata = handler_call_details.invocation_metadata or ()
        got = next((v for k, v in metadata if k == AUTH_METADATA_KEY), "")
        return bearer_refusal(got.encode() if isinstance(got, str) else bytes(got), self._expected)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        reason = None if handler is None else self.refusal(handler_call_details)
        if reason is None:
            return handler
        return _abort_handler(handler, grpc.StatusCode.UNAUTHENTICATED, reason)


@dataclass
class ServingServer:
    """A started server: its bound address, and the health status probes see."""

    server: grpc.Server
    host: str
    port: int
    health: health.HealthServicer
    service_names: tuple[str, ...]
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return join_host_port(self.host, self.port)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            self.health.set(name, status)

    def stop(self, grace_s: float | None = 5.0) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight calls finish within `grace_s`, then return."""
        if self._stopped:
            return
        self._stopped = True
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()

    def wait(self, timeout_s: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout_s)


def server_channel_options(options: ServerOptions) -> list[tuple[str, int]]:
    """The channel options every server of the project uses (sync or asyncio)."""
    return [
        ("grpc.max_receive_message_length", options.max_receive_bytes),
        ("grpc.max_send_message_length", options.max_send_bytes),
        ("grpc.so_reuseport", 0),
        *_KEEPALIVE_SERVER_OPTIONS,
    ]


def enable_reflection(server: grpc.Server | grpc.aio.Server, service_names: Sequence[str]) -> None:
    """Reflection for `service_names`, the health service and reflection itself (grpcurl lists them all)."""
    reflection.enable_server_reflection(
        (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )


class BindError(OSError):
    """A server cannot listen where it was asked to: its message names the host or the port at fault."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()  # the message, without "[Errno 99] " before it


class AddressInUseError(BindError):
    """Another process holds the port: worth telling apart from a bad address, since trying again later or
    on another port can work (`league run` restarts a learner whose old port was taken on a free one)."""


def bind_port(server: grpc.Server | grpc.aio.Server, options: ServerOptions) -> int:
    """Bind per `options` (TLS when given); the port bound (the free one picked for port 0). Raises
    AddressInUseError when another process holds the port, OSError for any other failure."""
    bind = join_host_port(options.host, options.port)
    # What fails is told before gRPC tries it: gRPC logs a line of its own to stderr first ("Failed to add port
    # to server: address lookup failed ...", beside ours). A port in use, or a host none of whose addresses binds
    # (a name of several binds those it can, as gRPC does: `localhost` with IPv6 off; a review).
    if options.port and isinstance(in_use := _bind_problem(options, bind), AddressInUseError):
        raise in_use
    if (problem := _bind_problem(options, bind, any_address=True)) is not None:
        raise problem
    try:
        if options.tls is not None:
            port = server.add_secure_port(bind, options.tls.credentials())
        else:
            port = server.add_insecure_port(bind)
    except RuntimeError as err:  # gRPC's "Failed to bind to address ...", which names no reason
        raise _bind_failure(options, bind) from err
    if port == 0:
        raise _bind_failure(options, bind)
    return port


def _bind_failure(options: ServerOptions, bind: str) -> OSError:
    """Why gRPC could not bind (it names no reason)."""
    return _bind_problem(options, bind) or BindError(errno.EINVAL, f"port: could not bind {bind}")


def _bind_problem(options: ServerOptions, bind: str, *, any_address: bool = False) -> OSError | None:
    """Why a server cannot listen on `bind`, found by binding a plain socket as gRPC does; None if it can. The
    message names the host when it is the host's fault (a name that does not resolve, an address of another
    machine): "port: could not bind nosuchhost:0" sent users after the port (a review)."""
    host = options.host.strip("[]")
    err = bind_error(host, options.port, any_address=any_address)
    if err is None:
        return None
    if isinstance(err, socket.gaierror):
        return BindError(errno.EINVAL, f"host {host!r}: no such address ({err.strerror}): cannot listen on {bind}")
    if err.errno == errno.EADDRINUSE:
        return AddressInUseError(err.errno, f"port: {bind} is in use by another process")
    if err.errno == errno.EADDRNOTAVAIL:
        return BindError(err.errno, f"host {host!r} is no address of this machine: cannot listen on {bind} (0.0.0.0 "
                                    "listens on all of them)")
    if err.errno == errno.EINVAL and err.strerror and "host name" in err.strerror:  # (bind_error's IDNA refusal)
        return BindError(err.errno, f"host {host!r}: {err.strerror}: cannot listen on {bind}")
    return BindError(err.errno, f"port: could not bind {bind}: {err.strerror}")


def make_server(
    options: ServerOptions,
    register: Callable[[grpc.Server], None],
    service_names: Sequence[str],
) -> ServingServer:
    """Build, bind and start a server with health (SERVING) and reflection for `service_names`."""
    interceptors: list[grpc.ServerInterceptor] = list(options.interceptors)
    if options.token is not None:
        interceptors.insert(0, BearerTokenInterceptor(options.token))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=options.max_workers, thread_name_prefix="grpc-server"),
        interceptors=interceptors,
        options=server_channel_options(options),
    )
    register(server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = tuple(service_names)
    enable_reflection(server, names)
    port = bind_port(server, options)
    server.start()
    serving = ServingServer(server=server, host=options.host, port=port, health=health_servicer, service_names=names)
    serving.set_serving(True)
    return serving


# --------------------------------------------------------------------------------------------------------
# Client side
# --------------------------------------------------------------------------------------------------------


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: Any


class _ClientDefaultsInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Gives every call a deadline, the process metadata and, when there is a token, the authorization."""

    def __init__(self, default_deadline_s: float, token: str | None) -> None:
        if not default_deadline_s > 0:
            raise ValueError(f"default_deadline_s: must be > 0, got {default_deadline_s}")
        self._deadline = default_deadline_s
        self._auth: tuple[tuple[str, str], ...] = ((PROCESS_METADATA_KEY, process_id()),)
        if token:
            self._auth += ((AUTH_METADATA_KEY, bearer_credentials(token)),)

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        metadata = tuple(d.metadata or ()) + self._auth
        return _CallDetails(
            method=d.method,
            timeout=d.timeout if d.timeout is not None else self._deadline,
            metadata=metadata,
            credentials=d.credentials,
            wait_for_ready=getattr(d, "wait_for_ready", None),
            compression=getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def make_channel(
    address: str,
    *,
    token: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_server_name: str | None = None,
    default_deadline_s: float = DEFAULT_DEADLINE_S,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A channel whose every call has a deadline and carries the token; TLS when `tls_ca` is given."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *_KEEPALIVE_CLIENT_OPTIONS,
    ]
    if tls_ca is not None:
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, _ClientDefaultsInterceptor(default_deadline_s, token))


TRANSIENT_CODES: frozenset[grpc.StatusCode] = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
"""Failures that mean "the coordinator is away or overloaded for now": a worker waits and tries again. CANCELLED
too: a coordinator that is stopping answers it to calls it had received but not started (an actor took it for a
refusal, and exited 2 at a routine restart). Actors and learners each defined this set (three times)."""

SERVER_FAULT_CODES: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
"""The server failed the call itself (an exception in a handler, a reply it could not encode), where a refusal of
the request has a code of its own. A worker asking for work (RegisterWorker, GetJob) logs it as an error and asks
again after a backoff: an actor exited on one (exit 2, which `league run` does not restart), and a job the
coordinator could not encode, answered INTERNAL and issued again, took down one actor per attempt (a review)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter; only for idempotent calls."""

    attempts: int | None = 5
    """None: retry until the call succeeds, fails otherwise, or the caller's stop is set."""
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    retry_codes: frozenset[grpc.StatusCode] = frozenset(
        {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    )

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts: must be >= 1 or None, got {self.attempts}")
        if not (0 < self.initial_backoff_s <= self.max_backoff_s):
            raise ValueError("initial_backoff_s: must be > 0 and <= max_backoff_s")

    def backoffs(self, rng: random.Random | None = None) -> Iterable[float]:
        rng = rng or random.Random()
        cap = self.initial_backoff_s
        for _ in itertools.count() if self.attempts is None else range(self.attempts - 1):
            yield rng.uniform(0, cap)
            cap = min(self.max_backoff_s, cap * self.multiplier)


STOP_POLL_S = 0.05
"""How often a `stoppable` call in flight looks at its stop event."""


def stoppable(method: Any, stop: threading.Event) -> Callable[..., Any]:
    """`method` (a unary stub method) as an attempt for `call_idempotent` that `stop` ends: the call goes out as a
    future, and is cancelled when `stop` is set while it is in flight (it raises its RpcError, CANCELLED). A
    server that is hung, not gone (SIGSTOPped, partitioned), otherwise holds the caller for the whole deadline of
    the attempt under way, however soon the stop came."""

    def attempt(request: Any, timeout: float) -> Any:
        future = method.future(request, timeout=timeout)
        done = threading.Event()
        future.add_done_callback(lambda _future: done.set())
        while not done.wait(STOP_POLL_S):
            if stop.is_set() and future.cancel():
                raise future from None  # the call itself is the RpcError (CANCELLED)
        return future.result()

    return attempt


def call_idempotent(
    method: Callable[..., T],
    request: Any,
    *,
    timeout: float = DEFAULT_DEADLINE_S,
    policy: RetryPolicy = RetryPolicy(),
    stop: threading.Event | None = None,
    on_retry: Callable[[int, grpc.RpcError, float], None] | None = None,
) -> T:
    """Call `method(request, timeout=...)`, retrying retryable failures with backoff until the policy gives up.

    `stop` (set on shutdown) cuts the backoff short and re-raises the last error; the attempt in flight runs to
    its deadline unless `method` is wrapped in `stoppable`. `on_retry(failed_attempts, error, delay_s)` is called
    before each retry's backoff (to log it as the caller sees fit).
    """
    if policy.attempts is None and stop is None:
        raise ValueError("call_idempotent: a policy without an attempt limit needs a `stop` that ends it")
    stop = stop or threading.Event()
    delays = iter(policy.backoffs())
    failed = 0
    while True:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as err:
            code = err.code() if callable(getattr(err, "code", None)) else None
            delay = next(delays, None)
            if code not in policy.retry_codes or delay is None:
                raise
            failed += 1
            log.debug("retrying after %s in %.3fs", code, delay)
            if on_retry is not None:
                try:
                    on_retry(failed, err, delay)
                except Exception:  # a hook that reports the retry must not change whether it happens
                    log.exception("on_retry hook failed; retrying anyway")
            if stop.wait(delay):
                raise
