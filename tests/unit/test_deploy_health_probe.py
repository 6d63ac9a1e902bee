"""The healthcheck probe the compose files run (`python -m league_cli.health`): a real gRPC server with the
health service (as every league server has it), serving, not serving, and gone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.rpc import ServerOptions, make_server
from league_cli import health


@pytest.fixture
def server():
    serving = make_server(
        ServerOptions(host="127.0.0.1", port=0, token="secret"), lambda s: None, ["test.Service"]
    )
    try:
        yield serving
    finally:
        serving.stop(0)


def test_serving_server_passes_without_a_token(server, capsys):
    assert health.cli(["--addr", server.address]) == 0
    assert "SERVING" in capsys.readouterr().out


def test_not_serving_server_fails(server, capsys):
    server.set_serving(False)
    assert health.cli(["--addr", server.address, "--service", "test.Service"]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err


def test_a_service_the_server_does_not_know_is_named_in_the_failure(server, capsys):
    assert health.cli(["--addr", server.address, "--service", "bogus"]) == 1
    assert "NOT_FOUND: the server has no health status for service 'bogus'" in capsys.readouterr().err


def test_a_service_name_that_is_no_text_is_said_in_one_line(server, capsys):
    """Bytes that are no UTF-8 (`--service $'\\xff'`, which Python reads as a surrogate) raised UnicodeEncodeError
    out of the probe, a traceback (a review)."""
    with pytest.raises(SystemExit) as refused:
        health.cli(["--addr", server.address, "--service", "\udcff"])
    assert refused.value.code == "league health: --service '\\udcff': not a service name (surrogates not allowed)"


def test_unreachable_server_fails_within_the_timeout(server, capsys):
    address = server.address
    server.stop(0)
    assert health.cli(["--addr", address, "--timeout", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err


def test_bad_timeout_is_refused():
    with pytest.raises(SystemExit, match="--timeout must be > 0"):
        health.cli(["--addr", "127.0.0.1:1", "--timeout", "0"])


@pytest.mark.parametrize("argv", [["--addr", "127.0.0.1:99999"], ["--addr", "127.0.0.1:1", "--tls-ca", ""],
                                  ["--addr", "127.0.0.1:1", "--bogus"]])
def test_a_bad_flag_exits_1_not_the_exit_2_docker_reserves(argv, capsys):
    with pytest.raises(SystemExit) as info:
        health.cli(argv)
    assert info.value.code == 1
    assert "league health: error: " in capsys.readouterr().err


def test_module_runs_as_the_compose_healthcheck_does_without_importing_torch(server):
    code = (
        "import runpy, sys; sys.argv = ['league_cli.health', '--addr', sys.argv[1]];"
        "rc = 0\n"
        "try:\n    runpy.run_module('league_cli.health', run_name='__main__')\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "assert 'torch' not in sys.modules, 'the probe must stay light'\n"
        "sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, server.address], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    direct = subprocess.run(
        [sys.executable, "-m", "league_cli.health", "--addr", server.address],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert direct.returncode == 0 and "SERVING" in direct.stdout
