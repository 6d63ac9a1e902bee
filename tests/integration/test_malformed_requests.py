"""Bytes that are not a valid request message, against a real coordinator and a real learner on 127.0.0.1:
INVALID_ARGUMENT naming the method and the message type (gRPC's own answer was INTERNAL on the learner and
UNKNOWN on the coordinator, even without a token), the token check still first, and the server keeps serving. `common.rpc_services`
does it; the streaming shapes no service of ours has yet are checked on plain servers at the end."""

from __future__ import annotations

import asyncio
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry

from common.aio_server import make_aio_server
from common.config import load_yaml
from common.envs import make_env
from common.envs.policy_view import policy_specs
from common.proto.league.v1 import league_pb2 as pb
from common.proto.league.v1 import league_pb2_grpc
from common.rpc import ServerOptions, make_channel
from common.rpc_services import add_service
from league_service.config import config_from_dict
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from league_service.metrics import RpcMetricsInterceptor
from learner_service.learner_testing import running_learner, synthetic_chunk

REPO = Path(__file__).resolve().parents[2]
ACTOR = pb.WORKER_ROLE_ACTOR
TOKEN = "s3cret-token"
GARBAGE = b"\xff\xff\xff"
LEAGUE = pb.DESCRIPTOR.services_by_name["LeagueService"]

# A valid request of each method, to cut short: the last field (a string or a double) loses its last bytes.
VALID = {
    "RegisterWorker": pb.RegisterWorkerRequest(worker_id="actor", role=ACTOR, hostname="host"),
    "Heartbeat": pb.HeartbeatRequest(worker_id="actor", job_ids=["job-1"]),
    "GetJob": pb.GetJobRequest(worker_id="actor", role=ACTOR, wait_s=0.5),
    "FinishJob": pb.FinishJobRequest(worker_id="actor", job_id="job-1", status=1, error="boom"),
    "UpdatePlayer": pb.UpdatePlayerRequest(worker_id="actor", player_id="p", checkpoint_path="p/ckpt.pt"),
    # No fields: any field cut short (here an unknown one) makes it invalid.
    "GetStatus": pb.RegisterWorkerRequest(worker_id="actor"),
}


def truncated(message) -> bytes:
    return message.SerializeToString()[:-2]


def raw_unary(channel: grpc.Channel, method: str):
    """`method` of LeagueService taking and returning bytes as they are on the wire."""
    return channel.unary_unary(f"/{LEAGUE.full_name}/{method}", request_serializer=None, response_deserializer=None)


def refusal(call, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, timeout=10)
    return err.value.code(), err.value.details()


def test_the_cases_are_not_valid_messages():
    for method in LEAGUE.methods:
        request_type = getattr(pb, method.input_type.name)
        for data in (GARBAGE, truncated(VALID[method.name])):
            with pytest.raises(DecodeError):
                request_type.FromString(data)


# ---- the coordinator (grpc.aio) -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    with running_coordinator(small_league_config(), tmp_path_factory.mktemp("shared"), needs_learner=False) as server:
        yield server


@pytest.mark.parametrize("method", [m.name for m in LEAGUE.methods])
@pytest.mark.parametrize("case", ["garbage", "truncated"])
def test_the_coordinator_refuses_requests_that_are_not_valid_messages_and_keeps_serving(coordinator, method, case):
    data = GARBAGE if case == "garbage" else truncated(VALID[method])
    input_type = LEAGUE.methods_by_name[method].input_type.full_name
    channel, stub = league_stub(coordinator.address)
    with channel:
        code, details = refusal(raw_unary(channel, method), data)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert details == f"{method}: the request is not a valid {input_type} message"
        # Still serving, on the same channel: valid calls are answered.
        stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="actor", role=ACTOR))
        stub.Heartbeat(pb.HeartbeatRequest(worker_id="actor"))
        assert stub.GetStatus(pb.GetStatusRequest()).league_id
        assert raw_unary(channel, "GetStatus")(b"", timeout=10)  # the same raw path, valid bytes
    assert coordinator.coordinator.failure is None


def test_the_token_is_checked_before_the_request_is(tmp_path):
    with running_coordinator(small_league_config(), tmp_path, needs_learner=False, token=TOKEN) as server:
        for token, expected in (
            (None, (grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")),
            ("wrong", (grpc.StatusCode.UNAUTHENTICATED, "wrong bearer token")),
            (TOKEN, (grpc.StatusCode.INVALID_ARGUMENT,
                     "GetJob: the request is not a valid league.v1.GetJobRequest message")),
        ):
            channel, _ = league_stub(server.address, token=token)
            with channel:
                assert refusal(raw_unary(channel, "GetJob"), GARBAGE) == expected


class _Servicer(league_pb2_grpc.LeagueServiceServicer):
    async def Heartbeat(self, request, context):
        return pb.HeartbeatResponse(lease_deadline=1.0)


def test_rpc_metrics_count_the_refusals_as_invalid_argument():
    registry = CollectorRegistry()
    serving = make_aio_server(
        ServerOptions(interceptors=(RpcMetricsInterceptor(registry),)),
        lambda server, _loop: add_service(server, _Servicer(), LEAGUE),
        [LEAGUE.full_name],
    )
    try:
        channel = make_channel(serving.address)
        with channel:
            assert refusal(raw_unary(channel, "Heartbeat"), GARBAGE)[0] == grpc.StatusCode.INVALID_ARGUMENT
            league_pb2_grpc.LeagueServiceStub(channel).Heartbeat(pb.HeartbeatRequest(worker_id="a"), timeout=10)
    finally:
        serving.stop(0)
    calls = {code: registry.get_sample_value("league_rpc_calls_total", {"method": "Heartbeat", "code": code})
             for code in ("OK", "INVALID_ARGUMENT")}
    assert calls == {"OK": 1, "INVALID_ARGUMENT": 1}


# ---- the learner (threaded server, a client stream) ---------------------------------------------------------

PLAYER = "solo_active_player_default_0"
PUSH = f"/{pb.DESCRIPTOR.services_by_name['LearnerService'].full_name}/PushTrajectories"


def _cartpole_chunk(seq: int) -> pb.TrajectoryChunk:
    env = make_env("CartPole-v1")
    try:
        specs = policy_specs(env.info())[0]
    finally:
        env.close()
    return synthetic_chunk(specs, 2, player_id=PLAYER, seq=seq)


def test_the_learner_refuses_a_stream_message_that_is_not_a_valid_chunk_and_keeps_serving(tmp_path):
    data = load_yaml(REPO / "configs" / "solo_cartpole.yaml")
    data["learner"] = {**data["learner"], "batch_size": 1024}  # no training: only the data plane is tested
    good, next_good = _cartpole_chunk(0), _cartpole_chunk(1)
    with pytest.raises(DecodeError):
        pb.TrajectoryChunk.FromString(truncated(next_good))
    with running_coordinator(config_from_dict(data), tmp_path, lease_timeout_s=3.0, token=TOKEN) as coordinator:
        with running_learner(coordinator.address, tmp_path, token=TOKEN) as learner:
            learner.learner.wait_published(PLAYER, 0, 60)
            channel = make_channel(learner.address, token=TOKEN, max_message_bytes=64 * 2**20)
            with channel:
                push = channel.stream_unary(PUSH, request_serializer=None, response_deserializer=None)
                for bad in (GARBAGE, truncated(next_good)):
                    code, details = refusal(push, iter([good.SerializeToString(), bad]))
                    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
                    assert details == ("PushTrajectories: message 2 of the stream is not a valid "
                                       "league.v1.TrajectoryChunk message")
                # Still serving: the chunk before the bad message was taken (a resend is a duplicate).
                summary = league_pb2_grpc.LearnerServiceStub(channel).PushTrajectories(iter([good, next_good]),
                                                                                         timeout=30)
                assert (summary.chunks_accepted, summary.chunks_duplicate) == (1, 1)
            # Without the token: refused for that, whatever the stream holds.
            channel = make_channel(learner.address)
            with channel:
                push = channel.stream_unary(PUSH, request_serializer=None, response_deserializer=None)
                assert refusal(push, iter([GARBAGE])) == (grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
            assert not learner.failure


# ---- the shapes no service of ours has yet (server streams), on both kinds of server ------------------------

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
REFLECTION = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
WATCH = "/grpc.health.v1.Health/Watch"
INFO = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
WATCH_REFUSAL = "Watch: the request is not a valid grpc.health.v1.HealthCheckRequest message"
INFO_REFUSAL = ("ServerReflectionInfo: message 2 of the stream is not a valid "
                "grpc.reflection.v1alpha.ServerReflectionRequest message")
LIST = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()


class _Health(health_pb2_grpc.HealthServicer):
    def Watch(self, request, context):
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _Reflection(reflection_pb2_grpc.ServerReflectionServicer):
    def ServerReflectionInfo(self, request_iterator, context):
        for _ in request_iterator:
            yield reflection_pb2.ServerReflectionResponse(valid_host="h")


class _AioHealth(health_pb2_grpc.HealthServicer):
    async def Watch(self, request, context):
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _AioReflection(reflection_pb2_grpc.ServerReflectionServicer):
    async def ServerReflectionInfo(self, request_iterator, context):
        async for _ in request_iterator:
            yield reflection_pb2.ServerReflectionResponse(valid_host="h")


def test_server_streams_of_a_threaded_server_refuse_messages_that_are_not_valid():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_service(server, _Health(), HEALTH)
    add_service(server, _Reflection(), REFLECTION)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch, info = channel.unary_stream(WATCH), channel.stream_stream(INFO)
            for call, refused_with in ((lambda: list(watch(GARBAGE, timeout=10)), WATCH_REFUSAL),
                                       (lambda: list(info(iter([LIST, GARBAGE]), timeout=10)), INFO_REFUSAL)):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refused_with)
            assert len(list(watch(b"", timeout=10))) == 1 and len(list(info(iter([LIST, LIST]), timeout=10))) == 2
    finally:
        server.stop(0)


def test_server_streams_of_an_asyncio_server_refuse_messages_that_are_not_valid():
    async def check() -> None:
        server = grpc.aio.server()
        add_service(server, _AioHealth(), HEALTH)
        add_service(server, _AioReflection(), REFLECTION)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                watch, info = channel.unary_stream(WATCH), channel.stream_stream(INFO)
                for call, refused_with in ((lambda: watch(GARBAGE, timeout=10), WATCH_REFUSAL),
                                           (lambda: info(iter([LIST, GARBAGE]), timeout=10), INFO_REFUSAL)):
                    with pytest.raises(grpc.RpcError) as err:
                        _ = [reply async for reply in call()]
                    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, refused_with)
                assert len([r async for r in watch(b"", timeout=10)]) == 1
                assert len([r async for r in info(iter([LIST, LIST]), timeout=10)]) == 2
        finally:
            await server.stop(0)

    asyncio.run(check())
