"""The coordinator's /metrics HTTP server (league_service.metrics.MetricsServer) on the hosts --host takes."""

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from league_service.metrics import MetricsServer


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="needs an IPv6 loopback")
def test_a_bracketed_ipv6_host_is_served_as_the_rpcs_are():
    """`--host [::1]` serves the RPCs (gRPC takes the brackets), but with --metrics-port the coordinator refused
    to start: "cannot listen on [::1]:0: [Errno -2] --metrics-port: [::1]:0: Name or service not known"."""
    registry = CollectorRegistry()
    Counter("probe", "a figure to scrape", registry=registry).inc()
    server = MetricsServer(registry, "[::1]", 0)
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.port}/metrics", timeout=5) as reply:
            assert reply.status == 200 and b"probe_total 1.0" in reply.read()
    finally:
        server.close()
        server.close()  # idempotent


def test_a_client_that_connects_and_sends_nothing_is_dropped(monkeypatch, capfd):
    """Each connection holds a thread of the coordinator's process: one that sent nothing (or half a request),
    which needs no token, held it for ever, so enough such clients would take every thread the process may
    start. Now it is dropped after CLIENT_TIMEOUT_S, while other scrapes are answered meanwhile."""
    from league_service import metrics

    assert metrics._QuietHandler.timeout == metrics.CLIENT_TIMEOUT_S <= 60  # (socketserver's default: None, no bound)
    monkeypatch.setattr(metrics._QuietHandler, "timeout", 0.3)
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0)
    try:
        stalled = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
        stalled[0].sendall(b"GET /metrics HTTP/1.0\r\n")  # never the blank line that ends the request
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
            assert reply.status == 200
        for client in stalled:
            with client:
                assert client.recv(1024) == b""  # closed by the server (a socket.timeout here: held for ever)
    finally:
        server.close()
    assert "Traceback" not in capfd.readouterr().err  # a dropped client is no error of the coordinator's


def test_a_trickling_client_is_dropped_and_connections_are_capped(monkeypatch, capfd):
    """The timeout was per read: a byte every 29 s kept a connection (and its thread) for ever; and connections
    had no cap: 300 idle ones made 160 threads (a review). A connection is cut after CLIENT_TIMEOUT_S in all, and
    past MAX_CONNECTIONS more are closed at once, while a scrape is answered once one is free."""
    import threading
    import time

    from league_service import metrics

    monkeypatch.setattr(metrics, "CLIENT_TIMEOUT_S", 0.6)
    monkeypatch.setattr(metrics._QuietHandler, "timeout", 0.6)
    monkeypatch.setattr(metrics, "MAX_CONNECTIONS", 3)
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0)
    try:
        trickler = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        stop = threading.Event()

        def trickle() -> None:
            with trickler:
                for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 100:
                    if stop.wait(0.2):
                        return
                    try:
                        trickler.sendall(bytes([byte]))
                    except OSError:
                        return

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(2)]
        time.sleep(0.1)
        over = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # a fourth: closed at once
        with over:
            # A whole request, so an answer would come if it were let in (an idle one is also closed, after the
            # handler's timeout: `recv() == b""` alone held with no cap at all).
            try:
                over.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                answer = over.recv(1024)
            except ConnectionResetError:
                answer = b""
            assert answer == b"", answer[:80]
        started = time.monotonic()
        thread.join(10)
        assert time.monotonic() - started < 5  # cut at its deadline, not after the 100 bytes' 20 s
        for client in idle:
            client.close()
        time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
            assert reply.status == 200
    finally:
        stop.set()
        server.close()
    assert "Traceback" not in capfd.readouterr().err


def test_a_metrics_port_refused_for_another_reason_than_in_use_is_named_alone(monkeypatch):
    """A port below 1024 for a user without the right to it: the coordinator said "cannot listen on
    127.0.0.1:0: [Errno 13] --metrics-port: 127.0.0.1:80: Permission denied", the RPC address first (a review).
    A BindError is printed as it is, naming the metrics port only."""
    import errno

    from common.rpc import BindError

    bind = socket.socket.bind

    def refuse_80(sock, address):
        if isinstance(address, tuple) and address[1] == 80:
            raise PermissionError(errno.EACCES, "Permission denied")
        return bind(sock, address)

    monkeypatch.setattr(socket.socket, "bind", refuse_80)
    with pytest.raises(BindError) as refused:
        MetricsServer(CollectorRegistry(), "127.0.0.1", 80)
    assert str(refused.value) == "--metrics-port: 127.0.0.1:80: Permission denied"
