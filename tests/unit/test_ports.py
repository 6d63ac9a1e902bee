"""restartable_port: free ports outside the range the OS gives outgoing connections; check_host_port: an
address a server advertises for others to dial."""

import errno
import random
import re
import socket

import pytest

from common.ports import check_host_port, ephemeral_range, restartable_port


def test_the_port_is_free_and_below_the_ephemeral_range():
    low, high = ephemeral_range()
    assert 0 < low <= high
    for seed in range(20):
        port = restartable_port(rng=random.Random(seed))
        assert port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_offered():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        class Always(random.Random):
            def randrange(self, *_args):
                return port

        assert restartable_port(rng=Always(), attempts=3) != port  # falls back to one the OS picks


@pytest.mark.parametrize(("address", "says"), [
    ("node-a", "expected HOST:PORT, got 'node-a'"),
    ("node-a:0", "the port must be from 1 to 65535"),
    ("node-a:65536", "the port must be from 1 to 65535"),
    (":7000", "with a host"),
    ("dns:///node-a", "a gRPC target URI that ends with its port"),  # dialled on 443
    ("dns:///node-a::0", "a gRPC target URI that ends with its port"),  # a host 'node-a::0', dialled on 443
    ("dns:///node-a::99999", "a gRPC target URI that ends with its port"),
    ("ipv6:::0", "a gRPC target URI that ends with its port"),
    ("node a:7000", "expected HOST:PORT"),
    ("", "expected HOST:PORT"),
])
def test_an_advertised_address_is_a_host_and_a_port(address, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_host_port(address)


def test_advertised_addresses_others_can_dial_are_taken():
    for address in ("node-a:7000", "10.0.0.1:1", "[::1]:65535", "learner-0.league.svc:50061", "dns:///node-a:7000",
                    "ipv4:10.0.0.1:50061", "unix:/run/learner.sock"):
        check_host_port(address)


def test_a_host_name_the_idna_codec_refuses_is_a_bind_error_not_a_traceback():
    """`--host 10.0.0..1` (an empty label) made getaddrinfo raise UnicodeError, not gaierror: the coordinator ended
    in a traceback, exit 1, restarted by its supervisor into the same failure (a review)."""
    from common.ports import bind_error

    for host in ("10.0.0..1", "a" * 64 + ".example"):
        err = bind_error(host, 0)
        assert isinstance(err, OSError) and "not a valid host name" in str(err)


def test_a_name_of_several_addresses_binds_when_one_of_them_does(monkeypatch):
    """`--host localhost` where ::1 is not on the machine (IPv6 off): gRPC listens on 127.0.0.1, and the probe
    before it must not refuse the name for its first address that fails (a review)."""
    from common.ports import bind_error

    stream = socket.SOCK_STREAM
    addresses = [(socket.AF_INET, stream, 6, "", ("192.0.2.1", 0)), (socket.AF_INET, stream, 6, "", ("127.0.0.1", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: addresses)
    assert bind_error("two-addresses", 0, any_address=True) is None
    first = bind_error("two-addresses", 0)
    assert first is not None and first.errno == errno.EADDRNOTAVAIL
    addresses.pop()
    none = bind_error("two-addresses", 0, any_address=True)
    assert none is not None and none.errno == errno.EADDRNOTAVAIL
