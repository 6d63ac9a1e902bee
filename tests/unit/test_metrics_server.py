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
