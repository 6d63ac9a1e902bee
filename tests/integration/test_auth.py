"""Bearer-token auth and TLS on a real coordinator; the refusal to serve an open address without a token."""

import dataclasses
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from actor_service.actor import Actor, ActorSettings
from common.proto.league.v1 import league_pb2 as pb
from common.proto.league.v1 import league_pb2_grpc
from common.rpc import ServerTls, check_exposure, check_server_tls, load_token, make_channel
from league_service.config import config_from_dict
from league_service.coordinator_testing import league_stub, running_coordinator, small_league_config
from learner_service.learner_testing import running_learner

TOKEN = "s3cret-token"
REPO = Path(__file__).resolve().parents[2]


def status_code(stub, **kw):
    try:
        stub.GetStatus(pb.GetStatusRequest(), **kw)
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


@pytest.fixture
def token_server(tmp_path):
    with running_coordinator(small_league_config(), tmp_path, token=TOKEN) as server:
        yield server


def test_calls_without_the_right_token_are_unauthenticated(token_server):
    address = token_server.address
    for token, expected in ((None, "missing"), ("wrong", "wrong"), (TOKEN + "x", "wrong")):
        channel, stub = league_stub(address, token=token)
        with channel:
            code, details = status_code(stub)
            assert code == grpc.StatusCode.UNAUTHENTICATED and expected in details
    channel, stub = league_stub(address, token=TOKEN)
    with channel:
        assert status_code(stub)[0] == grpc.StatusCode.OK
        # The token travels as plain metadata, so it is checked on an insecure channel too (not silently dropped).
        code, _ = status_code(stub, metadata=(("x-other", "1"),))
        assert code == grpc.StatusCode.OK
    with grpc.insecure_channel(address) as channel:  # the scheme in any case (RFC 7235), the token exactly
        stub = league_pb2_grpc.LeagueServiceStub(channel)
        assert status_code(stub, metadata=(("authorization", f"bearer {TOKEN}"),), timeout=10)[0] == grpc.StatusCode.OK
        code, _ = status_code(stub, metadata=(("authorization", f"bearer {TOKEN.upper()}"),), timeout=10)
        assert code == grpc.StatusCode.UNAUTHENTICATED


def test_health_stays_open_and_reflection_needs_the_token(token_server):
    channel = grpc.insecure_channel(token_server.address)
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_metrics_need_the_token_when_the_coordinator_has_one(tmp_path):
    """/metrics was plain HTTP without the token: the league's counts and per-method RPC latencies were open to
    whoever reached a coordinator whose every RPC needs it. (Without a token it stays open: test_coordinator.py.)"""
    with running_coordinator(small_league_config(), tmp_path, token=TOKEN, metrics_port=0) as server:
        url = f"http://127.0.0.1:{server.metrics.port}/metrics"
        for header, says in ((None, "missing"), (f"Bearer {TOKEN}x", "wrong"), ("Bearer wrong", "wrong"),
                             (TOKEN, "wrong"), (f"Basic {TOKEN}", "wrong"), ("Bearer \u00e9", "wrong")):
            request = urllib.request.Request(url, headers={} if header is None else {"Authorization": header})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=5)
            with err.value:
                assert err.value.code == 401 and err.value.headers["WWW-Authenticate"].startswith("Bearer")
                assert err.value.read() == f"{says} bearer token\n".encode()
        for scheme in ("Bearer", "bearer"):  # the scheme in any case (RFC 7235), as the RPCs take it
            request = urllib.request.Request(url, headers={"Authorization": f"{scheme} {TOKEN}"})
            with urllib.request.urlopen(request, timeout=5) as reply:
                assert reply.status == 200 and b"league_jobs_issued_total" in reply.read()


def _self_signed(tmp_path, subject_alt_names: str, name: str = "cert"):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", f"/CN={subject_alt_names.split(',')[0].split(':')[1]}", "-addext",
         f"subjectAltName={subject_alt_names}"],
        check=True, capture_output=True,
    )
    return cert, key


@pytest.fixture
def self_signed(tmp_path):
    return _self_signed(tmp_path, "DNS:localhost,IP:127.0.0.1")


@pytest.fixture
def dns_only_cert(tmp_path):
    """A certificate for a service name only (as a cluster's internal CA issues), reached here by IP address."""
    return _self_signed(tmp_path, "DNS:league.internal", "dns-only")


def test_an_encrypted_tls_key_is_refused_naming_it(tmp_path, self_signed):
    """OpenSSL asked for its passphrase on the terminal (start-up hung) or, without one, failed with a bare
    OSError and a traceback; gRPC cannot use an encrypted key anyway."""
    cert, key = self_signed
    encrypted = tmp_path / "enc_key.pem"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:secret", "-out", str(encrypted)],
                   check=True, capture_output=True)
    with pytest.raises(ValueError, match="--tls-key: .* is encrypted"):
        check_server_tls(cert, encrypted)
    check_server_tls(cert, key)


def test_tls_with_token(tmp_path, self_signed):
    cert, key = self_signed
    with running_coordinator(small_league_config(), tmp_path, token=TOKEN, tls=ServerTls(cert, key)) as server:
        address = f"localhost:{server.port}"
        channel, stub = league_stub(address, token=TOKEN, tls_ca=cert)
        with channel:
            assert status_code(stub)[0] == grpc.StatusCode.OK
        channel, stub = league_stub(address, tls_ca=cert)
        with channel:
            assert status_code(stub)[0] == grpc.StatusCode.UNAUTHENTICATED
        channel, stub = league_stub(address, token=TOKEN, default_deadline_s=2.0)  # plaintext to a TLS port
        with channel:
            assert status_code(stub)[0] == grpc.StatusCode.UNAVAILABLE


def test_a_league_trains_over_tls_end_to_end(tmp_path, self_signed):
    """With TLS on, actors stream to the learners over TLS too (one CA for both servers), and the learner's
    trajectory server serves it: trajectories arrive and are acknowledged."""
    cert, key = self_signed
    config = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": "CartPole-v1", "env_num": 2, "episode_num": 2},
    })
    config = dataclasses.replace(config, policy={"algorithm": "ppo"})
    root = tmp_path / "shared"
    root.mkdir()
    with running_coordinator(config, root, token=TOKEN, tls=ServerTls(cert, key)) as server:
        address = f"localhost:{server.port}"
        with running_learner(address, root, token=TOKEN, tls_ca=cert, tls_cert=cert, tls_key=key):
            actor = Actor(ActorSettings(coordinator=address, shared_root=root, worker_id="actor-tls", manager="base",
                                        token=TOKEN, tls_ca=cert, max_jobs=2, get_job_wait_s=1.0))
            reports = actor.run()
    assert [r.status for r in reports] == ["completed", "completed"]
    for report in reports:
        assert report.sender is not None and report.sender.chunks_written > 0
        assert report.sender.chunks_acked == report.sender.chunks_written


def test_workers_and_tools_check_certificates_against_tls_server_name(tmp_path, dns_only_cert):
    """Without --tls-server-name a certificate that names a DNS name only fails the handshake when its server is
    dialled by IP; with it, actors (to the coordinator and the learner), learners, status and health work."""
    cert, key = dns_only_cert
    config = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": "CartPole-v1", "env_num": 2, "episode_num": 2},
    })
    config = dataclasses.replace(config, policy={"algorithm": "ppo"})
    root = tmp_path / "shared"
    root.mkdir()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "league_cli", *argv], capture_output=True, text=True,
                              timeout=120, cwd=REPO)

    with running_coordinator(config, root, token=TOKEN, tls=ServerTls(cert, key)) as server:
        address = f"127.0.0.1:{server.port}"
        status = ["status", "--addr", address, "--token-file", str(token_file), "--tls-ca", str(cert), "--json"]
        refused = cli(*status, "--timeout", "3")
        assert refused.returncode != 0 and "TLS" in refused.stderr, refused.stderr
        assert cli(*status, "--tls-server-name", "league.internal").returncode == 0
        health = ["health", "--addr", address, "--tls-ca", str(cert)]
        assert cli(*health, "--tls-server-name", "league.internal").returncode == 0
        assert cli(*health, "--timeout", "3").returncode == 1
        no_ca = cli("health", "--addr", address, "--tls-server-name", "league.internal")
        assert no_ca.returncode == 1 and "--tls-server-name: needs --tls-ca" in no_ca.stderr
        assert "not a DNS name" in cli(*health, "--tls-server-name", "league internal").stderr

        with running_learner(address, root, token=TOKEN, tls_ca=cert, tls_server_name="league.internal",
                             tls_cert=cert, tls_key=key):
            actor = Actor(ActorSettings(coordinator=address, shared_root=root, worker_id="actor-tls", manager="base",
                                        token=TOKEN, tls_ca=cert, tls_server_name="league.internal", max_jobs=1,
                                        get_job_wait_s=1.0))
            reports = actor.run()
    assert [r.status for r in reports] == ["completed"]
    assert reports[0].sender.chunks_written > 0 and reports[0].sender.chunks_acked == reports[0].sender.chunks_written


def test_a_learner_that_reaches_the_coordinator_over_tls_must_serve_tls(tmp_path, self_signed):
    cert, key = self_signed
    with running_coordinator(small_league_config(), tmp_path, token=TOKEN, tls=ServerTls(cert, key)) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "learner_service.cli", "learner", "--coordinator", f"localhost:{server.port}",
             "--shared-root", str(tmp_path), "--tls-ca", str(cert)],
            capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "LEAGUE_TOKEN": TOKEN},
        )
    assert proc.returncode == 2, proc.stderr
    assert "--tls-cert/--tls-key" in proc.stderr and "Traceback" not in proc.stderr


def test_a_learner_the_coordinator_refuses_stops_with_one_line_and_exit_2(token_server, tmp_path):
    """Without the token (or at an address that is no coordinator) a learner exited 1 with a traceback, which
    supervisors restart for ever; the actor said it in one line and exited 2. Now the learner does too."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "learner_service.cli", "learner", "--coordinator", token_server.address,
         "--shared-root", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "refused this learner: UNAUTHENTICATED" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_open_addresses_need_a_token_or_insecure():
    with pytest.raises(ValueError, match="non-loopback"):
        check_exposure("0.0.0.0", None, insecure=False)
    check_exposure("0.0.0.0", TOKEN, insecure=False)
    check_exposure("0.0.0.0", None, insecure=True)
    for host in ("127.0.0.1", "localhost", "::1"):
        check_exposure(host, None, insecure=False)


def test_the_coordinator_cli_refuses_an_open_address_without_a_token(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "league_service.cli", "coordinator", "--shared-root", str(tmp_path),
         "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode != 0 and "non-loopback" in proc.stderr


def test_an_open_address_from_the_config_is_refused_naming_the_config_key(tmp_path, monkeypatch, capsys):
    """The coordinator's address comes from --host or, without it, from coordinator.bind_address: the refusal
    named "host" either way, a flag the user had not given and a key their config does not have."""
    import argparse

    from league_service.cli import add_coordinator_arguments, coordinator_main

    monkeypatch.delenv("LEAGUE_TOKEN", raising=False)
    config = tmp_path / "league.yaml"
    config.write_text("coordinator: {bind_address: '0.0.0.0:0'}\n")
    parser = argparse.ArgumentParser()
    add_coordinator_arguments(parser)
    assert coordinator_main(parser.parse_args(["--shared-root", str(tmp_path), "--config", str(config)])) == 2
    err = capsys.readouterr().err
    assert "coordinator.bind_address: refusing to listen on non-loopback address '0.0.0.0'" in err
    assert coordinator_main(parser.parse_args(["--shared-root", str(tmp_path), "--host", "0.0.0.0"])) == 2
    assert "--host: refusing to listen on non-loopback address '0.0.0.0'" in capsys.readouterr().err


def test_token_comes_from_file_or_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("LEAGUE_TOKEN", raising=False)
    assert load_token(None) is None
    monkeypatch.setenv("LEAGUE_TOKEN", " from-env \n")
    assert load_token(None) == "from-env"
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert load_token(path) == "from-file"
    path.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        load_token(path)
    monkeypatch.setenv("LEAGUE_TOKEN", "")  # set and empty, as compose writes an unset variable: no auth
    assert load_token(None) is None
    monkeypatch.setenv("LEAGUE_TOKEN", "   \n")  # blanks turned auth off without a word (a review)
    with pytest.raises(ValueError, match=r"\$LEAGUE_TOKEN holds only whitespace"):
        load_token(None)


@pytest.mark.parametrize(("token", "says"), [
    ("s\u00e9cret", "printable ASCII.*holds '\u00e9'"), ("line1\nline2", "printable ASCII.*holds '\\\\n'"),
    ("a\tb", "no line breaks, tabs or accents.*holds '\\\\t'"), ("x" * 17_000, "more than 4096"),
])
def test_a_token_grpc_cannot_carry_is_refused_where_it_is_read(tmp_path, monkeypatch, token, says):
    """Accepted, it made every call fail (INTERNAL "Invalid metadata", or RESOURCE_EXHAUSTED), naming nothing."""
    path = tmp_path / "token"
    path.write_text(token + "\n")
    with pytest.raises(ValueError, match=f"--token-file: {path}: .*{says}"):
        load_token(path)
    monkeypatch.setenv("LEAGUE_TOKEN", token)
    with pytest.raises(ValueError, match=f"LEAGUE_TOKEN: .*{says}"):
        load_token(None)


def test_make_channel_gives_every_call_a_deadline(token_server):
    channel = make_channel(token_server.address, token=TOKEN, default_deadline_s=0.5)
    with channel:
        stub = league_pb2_grpc.LeagueServiceStub(channel)
        stub.RegisterWorker(pb.RegisterWorkerRequest(worker_id="a", role=pb.WORKER_ROLE_ACTOR))
        # No learner is bound, so no collect job comes: a long poll asking for 60 s is cut to the channel's
        # 0.5 s default deadline and answered in time (not DEADLINE_EXCEEDED).
        reply = stub.GetJob(pb.GetJobRequest(worker_id="a", role=pb.WORKER_ROLE_ACTOR, wait_s=60))
        assert not reply.HasField("job") and reply.retry_after_s > 0


def test_a_call_refused_for_its_token_is_never_decoded():
    """The refusing handler kept the method's request decoder: a caller without the token made the coordinator
    parse 4 MiB of two million empty messages on its only event-loop thread (160 ms a call) for the refusal (a
    review). Its requests reach the refusal as bytes."""
    from common.aio_server import _aio_abort_handler
    from common.rpc import _abort_handler

    like = grpc.unary_unary_rpc_method_handler(lambda r, c: r, request_deserializer=pb.FinishJobRequest.FromString,
                                               response_serializer=pb.FinishJobResponse.SerializeToString)
    for make in (_abort_handler, _aio_abort_handler):
        refusal = make(like, grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
        assert refusal.request_deserializer is None
        assert refusal.response_serializer is like.response_serializer


def test_settings_objects_never_print_the_token():
    """ServerOptions, LearnerSettings and ActorSettings printed `token='...'` in their text form (a review)."""
    from pathlib import Path

    from common.rpc import ServerOptions
    from learner_service.config import LearnerSettings

    for settings in (ServerOptions(token="s3cret-token"),
                     LearnerSettings("127.0.0.1:1", Path("/tmp"), "w", token="s3cret-token"),
                     ActorSettings("127.0.0.1:1", Path("/tmp"), token="s3cret-token")):
        assert "s3cret-token" not in repr(settings) and settings.token == "s3cret-token"


@pytest.mark.parametrize("worker", ["actor", "learner"])
def test_a_worker_whose_tls_never_fits_stops_with_exit_2_before_any_answer(tmp_path, self_signed, worker):
    """Without --tls-ca against a coordinator over TLS, a worker retried its registration for ever, logging
    warnings, where a wrong token stops it with exit 2 (a review). Handshakes that fail again and again before any
    coordinator ever answered are its settings, not an outage."""
    import time

    cert, key = self_signed
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "LEAGUE_TOKEN": TOKEN}
    with running_coordinator(small_league_config(), tmp_path, token=TOKEN, tls=ServerTls(cert, key)) as server:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", f"{worker}_service.cli", worker, "--coordinator", server.address,
             "--shared-root", str(tmp_path)],
            capture_output=True, text=True, timeout=180, env=env,
        )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "TLS settings do not fit the coordinator's" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 120
