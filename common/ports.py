"""Ports for servers that must come back on the same address after a restart.

Why: a port the OS picks for a server (port 0) comes from the ephemeral range, the same range it gives the
local end of every outgoing connection. Once such a server dies, a connection made meanwhile (an actor's
channel, say, which lives as long as the actor) can be given its port, and the server cannot come back on
it. Ports below that range are never handed to outgoing connections, so one found free there stays free for
the server's restarts unless another program binds it on purpose.
"""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default
_LOWEST = 10000  # below this: ports that well-known services are configured to use


def ephemeral_range() -> tuple[int, int]:
    """(low, high) of the ports this machine gives outgoing connections (Linux's setting, else its default)."""
    try:
        low, high = (int(part) for part in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def restartable_port(host: str = "127.0.0.1", *, attempts: int = 200, rng: random.Random | None = None) -> int:
    """A port free on `host` now and below the ephemeral range, so no outgoing connection can take it while
    the server on it restarts. Falls back to one the OS picks (ephemeral) when none is found."""
    rng = rng or random.Random()
    low, _ = ephemeral_range()
    if low - 1 > _LOWEST:
        for _ in range(attempts):
            port = rng.randrange(_LOWEST, low)
            if bind_error(host, port) is None:
                return port
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def bind_error(host: str, port: int, *, any_address: bool = False) -> OSError | None:
    """Why a server could not listen on host:port now (None: it could), found by binding a plain socket the
    way gRPC binds (SO_REUSEADDR: a port in TIME_WAIT is free). A host that does not resolve gives the
    resolver's error. A name of several addresses (`localhost`: 127.0.0.1 and ::1): the first that fails, or with
    ``any_address`` None once one of them binds, as gRPC listens on those it can ("Only 1 addresses added out of
    total 2 resolved")."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        return err
    except UnicodeError as err:  # a name the IDNA codec refuses (`10.0.0..1`, a label over 63 characters): it
        # ended the coordinator in a traceback, exit 1, restarted into the same failure (a review)
        return OSError(errno.EINVAL, f"not a valid host name ({err})")
    first: OSError | None = None
    for family, kind, proto, _, sockaddr in addresses:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:  # (a family this kernel lacks, IPv6 turned off: gRPC binds the others)
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as err:
                if not any_address:
                    return err
                first = first or err
                continue
            if any_address:
                return None
    return first


def _port_number(text: str) -> int | None:
    """The number `text` gives as a port (ASCII digits only; any longer than five stands as 65536, out of
    range), or None when it is not one."""
    if not (text.isascii() and text.isdigit()):
        return None
    return int(text) if len(text) <= 5 else 65536


def split_host_port(address: str, *, min_port: int = 0) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` (``[v6 address]:PORT`` too). ValueError unless the port is a number from
    `min_port` to 65535: gRPC takes a larger one modulo 65536 (``:99999`` listened on 34463)."""
    host, colon, port_text = address.rpartition(":")
    port = _port_number(port_text)
    if not colon or port is None:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    if not min_port <= port <= 65535:
        raise ValueError(f"the port must be from {min_port} to 65535, got {port_text}")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"an IPv6 host goes in brackets ([::1]:50051), got {address!r}")
    return host.strip("[]"), port


def check_host_port(address: str) -> None:
    """An address a server advertises for others to dial: HOST:PORT with a host and a port from 1 to 65535, or
    a gRPC target URI, with its port where its scheme has one (dns:///node-a:50061, ipv4:10.0.0.1:50061). Without
    a port (`node-a`) every dial failed UNAVAILABLE and was retried for good, and dns:///node-a is dialled on
    443. ValueError otherwise."""
    check_target(address)  # something a client can dial, its ports real where it gives them
    lowered = address.lower()
    if lowered.startswith(GRPC_TARGET_SCHEMES):
        port = _port_number(address.rpartition(":")[2])
        if lowered.startswith(("dns:", "ipv4:", "ipv6:")) and not (
            port is not None and 1 <= port <= 65535
        ):  # check_target skips a port after '::' (host::0): gRPC would take the whole as a host and dial 443
            raise ValueError(f"expected a gRPC target URI that ends with its port (dns:///host:port), got "
                             f"{address!r}")
        return
    if not split_host_port(address, min_port=1)[0]:
        raise ValueError(f"expected HOST:PORT with a host, got {address!r}")


GRPC_TARGET_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")
"""gRPC's name-resolver targets (dns:///host:port, unix:/path, ...), taken as they are."""


def check_target(address: str) -> None:
    """A server address a client dials: HOST:PORT with a port from 1 to 65535, or a gRPC target URI
    (`GRPC_TARGET_SCHEMES`: dns:///host:port, ipv4:a:p,b:p, unix:/path, ...). ValueError otherwise."""
    if not address or not address.isprintable() or any(c.isspace() for c in address):
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    scheme = next((s for s in GRPC_TARGET_SCHEMES if address.lower().startswith(s)), None)
    if scheme is None:
        split_host_port(address, min_port=1)
        return
    rest = address[len(scheme):]
    if not rest.strip("/"):
        raise ValueError(f"{address!r} names no server after {scheme!r}")
    if scheme in ("dns:", "ipv4:", "ipv6:"):
        for item in rest.rsplit("/", 1)[-1].split(","):
            host, colon, port = item.rpartition(":")
            if colon and port.isdigit() and not host.endswith(":"):  # a port given: it must be a real one
                split_host_port(item, min_port=1)
