"""restartable_port: free ports outside the range the OS gives outgoing connections."""

import random
import socket

from common.ports import ephemeral_range, restartable_port


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
