"""What a failed call's status most likely means, in the one line a user reads (common/rpc.py hints)."""

import grpc

from common.rpc import not_a_coordinator_hint, tls_hint


def test_tls_failures_are_named_as_such_not_left_as_an_outage():
    """A certificate that expired or names another host retried for ever as "coordinator unreachable", with
    gRPC's reason dropped (a review)."""
    for details in ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake "
                    "failed: SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED",
                    "Hostname Verification Check failed.", "certificate has expired"):
        assert "a TLS failure" in tls_hint(details)
    assert "without --tls-ca" in tls_hint("failed to connect to all addresses; last error: UNAVAILABLE: Socket closed")
    assert tls_hint("failed to connect to all addresses; last error: Connection refused") == ""
    assert tls_hint(None) == ""


def test_unimplemented_says_the_address_may_be_no_coordinator():
    assert "a league coordinator?" in not_a_coordinator_hint(grpc.StatusCode.UNIMPLEMENTED, "h:1")
    assert not_a_coordinator_hint(grpc.StatusCode.UNAVAILABLE, "h:1") == ""
