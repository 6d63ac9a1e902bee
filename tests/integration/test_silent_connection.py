"""A connection that goes silent (a NAT or firewall drops it, a peer's host vanishes without a reset) is given
up within the client's ping timeout, and calls go out on a new one. gRPC's default is a minute: an actor's
heartbeats timed out on the dead connection for 60 s, past its 30 s lease, while the coordinator was reachable
on a new connection all along (a review). Here a proxy on 127.0.0.1 stops forwarding on the connections it
has (keeping their sockets open) while new ones forward."""

from __future__ import annotations

import socket
import threading
import time

import grpc

from common.proto.league.v1 import league_pb2 as pb
from common.proto.league.v1 import league_pb2_grpc
from common.rpc import make_channel
from league_service.coordinator_testing import running_coordinator, small_league_config

DEFAULT_LEASE_S = 30.0


class _SilencingProxy:
    """Forwards TCP to `target`; `silence()` swallows from then on what the connections open so far carry."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._silenced_before = -1.0
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def silence(self) -> None:
        self._silenced_before = time.monotonic()

    def close(self) -> None:
        self._closed = True
        for s in [self._listener, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            born = time.monotonic()
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, born), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, born: float) -> None:
        while True:
            try:
                data = a.recv(65536)
            except OSError:
                return
            if not data:
                return
            if born < self._silenced_before:
                continue  # the connection is silent: nothing arrives, nothing is refused
            try:
                b.sendall(data)
            except OSError:
                return


def test_calls_leave_a_silent_connection_well_within_a_lease(tmp_path):
    with running_coordinator(small_league_config(), tmp_path, needs_learner=False) as server:
        host, port = server.address.rsplit(":", 1)
        proxy = _SilencingProxy((host, int(port)))
        channel = make_channel(f"127.0.0.1:{proxy.port}")
        try:
            stub = league_pb2_grpc.LeagueServiceStub(channel)
            stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            proxy.silence()
            silenced = time.monotonic()
            failures = []
            while time.monotonic() - silenced < 2 * DEFAULT_LEASE_S:
                try:
                    stub.GetStatus(pb.GetStatusRequest(), timeout=2)
                    break
                except grpc.RpcError as err:
                    failures.append(err.code())
                    time.sleep(0.5)
            recovered_after = time.monotonic() - silenced
            assert failures, "the proxy did not silence the connection"
            # (gRPC's own ping timers decide, not this machine's speed: a ping every 10 s, answered within 10 s,
            # so at most ~20 s here; a minute before, and up to 40 s with pings every 30 s.)
            assert recovered_after < DEFAULT_LEASE_S, (recovered_after, failures[-3:])
        finally:
            channel.close()
            proxy.close()
