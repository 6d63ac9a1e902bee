import threading

import grpc
import pytest

from common.rpc import (
    AUTH_METADATA_KEY,
    BearerTokenInterceptor,
    RetryPolicy,
    call_idempotent,
    format_listen_line,
    is_loopback,
    join_host_port,
    parse_listen_line,
    write_port_file,
)
from league_service.metrics import bearer_token_required


class Failure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


class Flaky:
    """A stub method that fails with `codes` in turn, then answers."""

    def __init__(self, *codes: grpc.StatusCode) -> None:
        self.codes = list(codes)
        self.timeouts: list[float] = []

    def __call__(self, request, timeout):
        self.timeouts.append(timeout)
        if self.codes:
            raise Failure(self.codes.pop(0))
        return f"reply to {request}"


FAST = RetryPolicy(attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)


def test_retries_unavailable_and_passes_the_deadline():
    method = Flaky(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert call_idempotent(method, "req", timeout=1.5, policy=FAST) == "reply to req"
    assert method.timeouts == [1.5, 1.5, 1.5]


def test_gives_up_after_the_policys_attempts():
    method = Flaky(*[grpc.StatusCode.UNAVAILABLE] * 5)
    with pytest.raises(Failure):
        call_idempotent(method, "req", policy=FAST)
    assert len(method.timeouts) == 3


def test_does_not_retry_other_codes():
    method = Flaky(grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(Failure):
        call_idempotent(method, "req", policy=FAST)
    assert len(method.timeouts) == 1


def test_stop_cuts_the_backoff_short():
    stop = threading.Event()
    stop.set()
    method = Flaky(grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(Failure):
        call_idempotent(method, "req", policy=RetryPolicy(initial_backoff_s=60, max_backoff_s=60), stop=stop)
    assert len(method.timeouts) == 1


def test_backoffs_grow_to_the_cap():
    import random

    policy = RetryPolicy(attempts=6, initial_backoff_s=0.1, max_backoff_s=0.4, multiplier=2.0)
    caps = [0.1, 0.2, 0.4, 0.4, 0.4]
    delays = list(policy.backoffs(random.Random(0)))
    assert len(delays) == 5 and all(0 <= d <= c for d, c in zip(delays, caps, strict=True))
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


def test_listen_line_round_trip_and_other_lines():
    line = format_listen_line("coordinator", "127.0.0.1:5000")
    assert parse_listen_line(line + "\n") == ("coordinator", "127.0.0.1:5000")
    assert parse_listen_line("INFO something else") is None
    assert parse_listen_line("LISTENING service=x") is None


def test_port_file_is_written_whole(tmp_path):
    path = tmp_path / "sub" / "port"
    write_port_file(path, 4321)
    assert path.read_text() == "4321\n"
    assert [p.name for p in path.parent.iterdir()] == ["port"]


def test_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.com")
    assert join_host_port("::1", 80) == "[::1]:80" and join_host_port("h", 1) == "h:1"


def test_on_retry_hears_of_each_retry_with_the_failed_attempts_so_far():
    heard = []
    method = Flaky(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    call_idempotent(method, "req", policy=FAST, on_retry=lambda n, err, delay: heard.append((n, err.code(), delay)))
    assert [(n, code) for n, code, _ in heard] == [(1, grpc.StatusCode.UNAVAILABLE),
                                                   (2, grpc.StatusCode.DEADLINE_EXCEEDED)]
    assert all(0 <= delay <= FAST.max_backoff_s for _, _, delay in heard)
    heard.clear()
    with pytest.raises(Failure):  # the last attempt's failure is not followed by a retry
        call_idempotent(Flaky(*[grpc.StatusCode.UNAVAILABLE] * 5), "req", policy=FAST,
                        on_retry=lambda n, err, delay: heard.append(n))
    assert heard == [1, 2]


def test_an_on_retry_hook_that_raises_changes_nothing_about_the_retries(caplog):
    def broken_hook(failed, err, delay):
        raise KeyError("hook bug")

    method = Flaky(grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)
    assert call_idempotent(method, "req", policy=FAST, on_retry=broken_hook) == "reply to req"
    assert len(method.timeouts) == 3  # both retries made, the third call answered
    assert "on_retry hook failed" in caplog.text


def test_a_listen_line_stdout_cannot_take_costs_the_line_not_the_server(monkeypatch, caplog, capsys):
    """A learner or coordinator whose stdout is a log file on a full disk died at start with a traceback from
    printing its LISTENING line, while its logging on the same file drops what it cannot write and goes on."""
    import logging
    import os

    from common.rpc import announce_listening

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    announce_listening("learner", "127.0.0.1:5000")
    assert parse_listen_line(capsys.readouterr().out) == ("learner", "127.0.0.1:5000")
    with open("/dev/full", "w") as full:
        monkeypatch.setattr("sys.stdout", full)
        with caplog.at_level(logging.ERROR):
            announce_listening("learner", "127.0.0.1:5000")
        monkeypatch.undo()
        try:
            full.close()
        except OSError:  # what is still buffered for /dev/full
            pass
    assert "the learner listens on 127.0.0.1:5000, but its LISTENING line could not be written" in caplog.text


TOKEN = "s3cret-token"


def _grpc_refusal(authorization: str | None) -> str | None:
    metadata = () if authorization is None else ((AUTH_METADATA_KEY, authorization),)
    details = type("Details", (), {"method": "/league.v1.LeagueService/GetStatus", "invocation_metadata": metadata})
    return BearerTokenInterceptor(TOKEN).refusal(details())


def _metrics_refusal(authorization: str | None) -> str | None:
    answered: list[str] = []
    app = bearer_token_required(lambda environ, start_response: [b"metrics"], TOKEN)
    environ = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}
    body = b"".join(app(environ, lambda status, headers: answered.append(status)))
    return None if body == b"metrics" else body.decode().strip()


@pytest.mark.parametrize("refusal", [_grpc_refusal, _metrics_refusal], ids=["grpc", "metrics"])
def test_the_bearer_scheme_is_matched_in_any_case_and_the_token_exactly(refusal):
    """RFC 7235 and 6750: the auth scheme is case-insensitive, so `bearer <token>` (as some HTTP clients and
    scrapers send it) is the same credentials; it was refused as a wrong token. The token itself is not."""
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        assert refusal(f"{scheme} {TOKEN}") is None, scheme
    assert refusal(f"Bearer  {TOKEN}") is None  # 1*SP between scheme and token (RFC 6750)
    assert refusal(None) == "missing bearer token"
    for wrong in (TOKEN, f"Bearer {TOKEN.upper()}", f"Bearer {TOKEN}x", f"Basic {TOKEN}", f"Bearerx {TOKEN}",
                  f"Bearer{TOKEN}", "Bearer", "Bearer ", f"Bearer {TOKEN} ", f"{TOKEN} Bearer"):
        assert refusal(wrong) == "wrong bearer token", wrong


def test_grpcs_error_for_a_reply_that_could_not_be_sent_is_one_info_line(caplog):
    """grpc.aio logs ERROR with a traceback when a reply finds its client gone (a deadline that passed, a cancel):
    a coordinator under short-deadline calls logged them as if it had failed (a review). One INFO line, without
    the traceback, naming the other cause too (a reply over the send limit), which must not vanish."""
    import logging

    from common.aio_server import _quiet_replies_to_gone_clients

    _quiet_replies_to_gone_clients()
    core = logging.getLogger("grpc._cython.cygrpc")
    message = "ExecuteBatchError raised in core by servicer method [/league.v1.LeagueService/GetStatus]"
    try:
        raise RuntimeError("Failed execute_batch")
    except RuntimeError:
        with caplog.at_level(logging.INFO):
            core.exception(message)
            core.error("something else")
    (said, other) = caplog.records
    assert (said.levelname, said.exc_info, other.levelname) == ("INFO", None, "ERROR")
    assert said.getMessage().startswith("a reply of [/league.v1.LeagueService/GetStatus] could not be sent: its "
                                        "client had gone")
    assert "larger than the send limit" in said.getMessage()
