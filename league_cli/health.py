"""`league health --addr HOST:PORT`: exit 0 when a server's gRPC health service answers SERVING.

Why a command of our own: docker compose healthchecks need a probe that runs inside the image (no
`grpc_health_probe` binary there), and it must not pay for torch: it imports grpc, the health stubs and the
shared RPC plumbing (common/rpc.py) only.
The health service is open without a token (see common/rpc.py), so no secret is needed to probe.
`python -m league_cli.health ...` runs the same without the subcommand being wired.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common import cli_args
from common.rpc import check_tls_ca

DEFAULT_TIMEOUT_S = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--addr", type=cli_args.address, required=True, help="server HOST:PORT (a coordinator or a learner)")
    parser.add_argument("--service", default="", help='service name to check (default "": the whole server)')
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=f"deadline of the check, seconds (default {DEFAULT_TIMEOUT_S:g})"
    )
    parser.add_argument("--tls-ca", type=cli_args.path, default=None, help="CA certificate to verify the server (TLS)")
    cli_args.add_tls_server_name(parser, "the server's")

    def usage_error(message: str) -> NoReturn:  # argparse's own exits 2, which Docker reserves (see main)
        parser.print_usage(sys.stderr)
        parser.exit(1, f"{parser.prog}: error: {message}\n")

    parser.error = usage_error  # type: ignore[method-assign]


def main(args: argparse.Namespace) -> int:
    """0 when SERVING; 1 (with the reason on stderr) when not serving, unreachable or unknown, and for a bad
    flag or file too: Docker reserves a healthcheck's exit 2 ("do not use"), so this probe never exits 2."""
    if not 0 < args.timeout <= cli_args.MAX_TIMEOUT_S:
        raise SystemExit(f"league health: --timeout must be > 0 and at most {cli_args.MAX_TIMEOUT_S:g} seconds, got {args.timeout}")
    if (refusal := cli_args.tls_server_name_refusal(args)) is not None:
        raise SystemExit(f"league health: {refusal}")
    try:
        request = health_pb2.HealthCheckRequest(service=args.service)
    except ValueError as err:  # bytes that are no UTF-8 text ($'\xff'): a UnicodeEncodeError traceback
        reason = getattr(err, "reason", err)
        raise SystemExit(f"league health: --service {args.service!r}: not a service name ({reason})") from err
    if args.tls_ca is not None:
        try:
            check_tls_ca(args.tls_ca)
        except ValueError as err:
            raise SystemExit(f"league health: {err}") from err
        creds = grpc.ssl_channel_credentials(root_certificates=Path(args.tls_ca).read_bytes())
        options = [] if args.tls_server_name is None else [("grpc.ssl_target_name_override", args.tls_server_name)]
        channel = grpc.secure_channel(args.addr, creds, options=options)
    else:
        channel = grpc.insecure_channel(args.addr)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=args.timeout)
    except grpc.RpcError as err:
        details = err.details() or (f"the server has no health status for service {args.service!r}"
                                    if err.code() == grpc.StatusCode.NOT_FOUND else "no details")
        print(f"league health: {args.addr}: {err.code().name}: {details}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"league health: {args.addr}: {status}", file=sys.stderr)
        return 1
    print(f"{args.addr}: {status}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="league health", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
