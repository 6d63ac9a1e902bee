"""`league coordinator` and `league status`: argument parsing and the process shell.

Each subcommand is a pair `add_*_arguments(parser)` / `*_main(args) -> int` that league_cli/main.py hooks in;
`python -m league_service.cli coordinator ...` runs the same without the `league` entry point.

The coordinator process: bind, print one parseable line (`LISTENING service=coordinator address=HOST:PORT`,
and the port to `--port-file` atomically), serve until SIGTERM/SIGINT, then health NOT_SERVING (for `--drain`
seconds still answering: probes see it, workers' finishes are acknowledged, no job is handed out), in-flight
calls finish within the grace period, state is already durable, exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import re
import signal
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from common import cli_args
from common.closed_output import discard_output, raise_broken_pipe
from common.durable_files import full_disk_note
from common.exit_codes import ADDRESS_IN_USE_EXIT, FAILURE_EXIT, SETUP_ERROR_EXIT
from common.ports import check_target, split_host_port
from common.rpc import (
    COORDINATOR_ENV_VAR,
    SHARED_ROOT_ENV_VAR,
    AddressInUseError,
    BindError,
    ServerOptions,
    ServerTls,
    announce_listening,
    check_exposure,
    check_server_tls,
    check_tls_ca,
    env_path,
    join_host_port,
    load_token,
    make_channel,
    not_a_coordinator_hint,
    tls_hint,
    write_port_file,
)
from common.signal_flag import SignalFlag
from common.thread_stack import stack_of

if TYPE_CHECKING:
    from league_service.coordinator import Coordinator
    from league_service.server import CoordinatorServer

log = logging.getLogger("league.coordinator")

DEFAULT_STATUS_ADDR = "127.0.0.1:50051"
FAILURE_POLL_S = 0.5  # how soon a failed background thread ends the process
STOP_POLL_S = 0.1  # how soon Ctrl-C ends a `league status --watch` waiting for the coordinator's answer
DEFAULT_DRAIN_S = 1.0  # long enough for a health probe or a worker's finish in flight (`league run`: 0)
STUCK_CALL_WAIT_S = 1.0  # how long the stop waits for calls still running in threads once the grace is over


# ---- league coordinator -------------------------------------------------------------------------------------


def add_coordinator_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=cli_args.path, default=None, help="league YAML (default: the embedded league)")
    shared_root = env_path(SHARED_ROOT_ENV_VAR)
    parser.add_argument("--shared-root", type=cli_args.path, default=shared_root, required=shared_root is None,
                        help=f"directory of checkpoints (and state) (default: ${SHARED_ROOT_ENV_VAR})")
    parser.add_argument("--state", type=cli_args.path, default=None, help="SQLite state file (default: SHARED_ROOT/league_state.sqlite)")
    parser.add_argument("--host", default=None, help="address to listen on (default: from coordinator.bind_address)")
    parser.add_argument("--port", type=cli_args.port, default=None, help="port; 0 picks a free one (default: from config)")
    parser.add_argument("--port-file", type=cli_args.path, default=None, help="write the bound port here (atomically)")
    parser.add_argument("--token-file", type=cli_args.path, default=None, help="bearer token clients must send (else $LEAGUE_TOKEN)")
    parser.add_argument("--insecure", action="store_true", help="allow a non-loopback address without a token")
    parser.add_argument("--tls-cert", type=cli_args.path, default=None, help="PEM certificate chain (with --tls-key)")
    parser.add_argument("--tls-key", type=cli_args.path, default=None, help="PEM private key (with --tls-cert)")
    parser.add_argument("--metrics-port", type=cli_args.port, default=None, help="serve Prometheus /metrics on this port (on --host; asks for the token when there is one)")
    parser.add_argument("--lease-timeout", type=cli_args.positive_seconds, default=None, help="seconds (default: coordinator.lease_timeout_s)")
    parser.add_argument("--without-learners", action="store_true", help="hand out collect jobs with no learner bound")
    parser.add_argument("--seed", type=cli_args.non_negative_int, default=None, help="seed of the league's opponent choice")
    parser.add_argument("--fsync", action="store_true", help="flush every commit to disk (survive power loss)")
    parser.add_argument("--grace", type=cli_args.non_negative_seconds, default=5.0,
                        help="seconds in-flight calls get at shutdown (default 5)")
    parser.add_argument("--drain", type=cli_args.non_negative_seconds, default=DEFAULT_DRAIN_S,
                        help="seconds between SIGTERM and closing the port, answering with health NOT_SERVING "
                             f"(default {DEFAULT_DRAIN_S:g})")
    cli_args.add_log_level(parser)


def coordinator_main(args: argparse.Namespace) -> int:
    # Imported here so `league status` does not pay for the league core.
    from common.config import ConfigError
    from common.exclusive_lock import LockedError
    from league_service.config import battle_only_note, greedy_dqn_note, load_config
    from league_service.coordinator import Coordinator, CoordinatorSettings
    from league_service.env_fit import cut_episodes_note
    from league_service.league_errors import LeagueStateError
    from league_service.server import serve_coordinator

    cli_args.configure_logging(args.log_level)
    if (args.tls_cert is None) != (args.tls_key is None):
        return _refuse("--tls-cert and --tls-key go together")
    refusal = cli_args.shared_root_refusal(args.shared_root,
                                           writes="the coordinator writes the league's snapshots there")
    if refusal is not None:
        return _refuse(refusal)
    if args.port_file is not None:
        # Its directory is made (or refused) before serving: written once the server listened, a path through a
        # file failed with a traceback (exit 1).
        try:
            args.port_file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return _refuse(f"--port-file {args.port_file}: cannot make its directory {args.port_file.parent}: "
                           f"{err.strerror or err}")
        if args.port_file.is_dir() and not args.port_file.is_symlink():  # os.replace swaps a link itself
            return _refuse(f"--port-file {args.port_file} is a directory")
        try:  # the writer makes a temporary file there and renames it: try that much now
            fd, probe = tempfile.mkstemp(dir=args.port_file.parent, prefix=f".{args.port_file.name}.")
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            return _refuse(f"--port-file {args.port_file}: cannot write in {args.port_file.parent}: "
                           f"{err.strerror or err}")
    try:
        cfg = load_config(args.config)
        default_host, default_port = split_host_port(cfg.coordinator.bind_address)  # checked at load
        host = args.host if args.host is not None else default_host
        port = args.port if args.port is not None else default_port
        if args.metrics_port is not None and args.metrics_port == port != 0:
            # Both on --host: the bind failed as "in use by another process" (exit 3, a taken port) against this
            # very process's RPC port, which no retry or restart frees.
            raise ValueError(f"--metrics-port: {port} is the RPC port (--port or coordinator.bind_address) too; "
                             "give /metrics a port of its own")
        token = load_token(args.token_file)
        check_exposure(host, token, args.insecure,
                       field="--host" if args.host is not None else "coordinator.bind_address")
        if args.tls_cert is not None:
            check_server_tls(args.tls_cert, args.tls_key)
    except ValueError as err:  # ConfigError, a bad token or TLS file, an open address without a token
        return _refuse(str(err))
    for note in (greedy_dqn_note(cfg), cut_episodes_note(cfg), battle_only_note(cfg)):
        if note is not None:
            log.warning("%s", note)
    if args.state is not None and not args.state.parent.is_dir():
        # Made for it, a mistyped or unmounted state volume started an empty league on another disk, silently
        # (a review); the shared root is refused the same way.
        where = "is not a directory" if args.state.parent.exists() else "does not exist"
        return _refuse(f"--state {args.state}: its directory {args.state.parent} {where}: create it, or mount the "
                       "state's volume, first")
    settings = CoordinatorSettings(
        shared_root=args.shared_root,
        state_path=args.state,
        lease_timeout_s=args.lease_timeout,
        needs_learner=not args.without_learners,
        rng_seed=args.seed,
        fsync=args.fsync,
    )
    tls = ServerTls(args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    stop = SignalFlag()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    state_existed = settings.resolved_state_path.exists()
    try:
        coordinator = Coordinator(cfg, settings)
    except LockedError as err:  # another coordinator serves this state
        return _refuse(str(err))
    except ConfigError as err:  # what only the shared root can tell (a pretrained checkpoint that is not there)
        return _refuse(str(err))
    except (LeagueStateError, sqlite3.DatabaseError, OSError, ValueError) as err:
        # A state file of another league, or not a state file at all: say which, without a traceback.
        if full := full_disk_note(settings.resolved_state_path.parent):
            # On a full disk SQLite cannot make the WAL's shared-memory file and says only "disk I/O error" (exit
            # 2 said: this state can never be used). Space may come back: a failure (exit 1), naming the disk.
            print(f"league coordinator: state {settings.resolved_state_path}: {err}{full}", file=sys.stderr)
            return FAILURE_EXIT
        return _refuse(f"state {settings.resolved_state_path}: {err}")
    try:
        server = serve_coordinator(
            coordinator,
            ServerOptions(host=host, port=port, token=token, tls=tls),
            metrics_port=args.metrics_port,
        )
    except AddressInUseError as err:
        _close_unserved(coordinator, settings.resolved_state_path, state_existed)
        print(f"league coordinator: {err}", file=sys.stderr)
        return ADDRESS_IN_USE_EXIT
    except BindError as err:  # (it names the address)
        _close_unserved(coordinator, settings.resolved_state_path, state_existed)
        return _refuse(str(err))
    except (RuntimeError, OSError) as err:
        _close_unserved(coordinator, settings.resolved_state_path, state_existed)
        return _refuse(f"cannot listen on {join_host_port(host, port)}: {err}")
    # Everything built so far lives as long as the process: keep it out of full GC passes (shorter pauses).
    gc.freeze()
    failure: BaseException | None = None
    try:
        if args.port_file is not None:
            try:
                write_port_file(args.port_file, server.port)
            except OSError as err:
                # Its directory was checked before serving, so a full disk, most likely: whoever waits for the
                # file (`league run`) would never learn the port. A traceback said so before, exit 1 all the same.
                failure = err
                log.error("--port-file %s: cannot write the port (%s); exiting: nobody could find this "
                          "coordinator", args.port_file, err.strerror or err)
        if failure is None:  # (else exit 1, through the same stop as any other)
            announce_listening("coordinator", server.address)
            log.info(
                "serving league %s on %s (%s, %s)%s", server.coordinator.league_id, server.address,
                "TLS" if tls else "plaintext", "token auth" if token else "no auth",
                f", metrics on :{server.metrics.port}" if server.metrics else "",
            )
            failure = _wait_for_stop_or_failure(stop, server.coordinator)
            if failure is None:
                log.info("shutting down (drain %.1fs, grace %.1fs)", args.drain, args.grace)
            else:
                log.error("the coordinator cannot go on (%r); exiting: restarted on the same state, it continues "
                          "from everything it acknowledged", failure)
    finally:
        # No drain after a failure: a coordinator that cannot keep its books must stop answering at once.
        closed = _stop_server(server, args.grace, 0.0 if failure is not None else args.drain, failure)
        if args.port_file is not None:
            _remove_port_file(args.port_file, server.port)
    code = 0 if failure is None and closed else FAILURE_EXIT
    if stuck := server.serving.stuck_calls(STUCK_CALL_WAIT_S):
        # The interpreter's exit would join them: a call stuck in a read of a hung filesystem held the exit for
        # as long, whatever --grace said (a review). Their replies were cut off at the grace, the state is closed.
        log.error("exiting without %d call(s) still running in threads after the stop, at:\n%s", len(stuck),
                  "\n".join(stack_of(thread) for thread in stuck))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _close_unserved(coordinator: Coordinator, state_path: Path, state_existed: bool) -> None:
    """Close a coordinator that never served; a state file this start created goes too. Kept, it was "restored"
    by the next start as a league of its own (a CLI review: a taken port, then a start with the config mended,
    restored the league made from the first one)."""
    coordinator.close()
    if state_existed:
        return
    from league_service.store import STATE_SIDE_FILES

    for path in (state_path, *(state_path.with_name(state_path.name + s) for s in STATE_SIDE_FILES)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _remove_port_file(path: Path, port: int) -> None:
    """Nobody listens on the port any more: a reader (`league status --run-dir`) then finds no file, instead of
    dialling a port another program may have taken. Left alone if it names another port (a newer coordinator's)."""
    with contextlib.suppress(OSError, ValueError):
        if int(Path(path).read_text().strip()) == port:
            Path(path).unlink()


def _stop_server(server: CoordinatorServer, grace_s: float, drain_s: float, failure: BaseException | None) -> bool:
    """Stop serving and close the coordinator; False when closing raised (a background failure, re-raised by
    close(): logged once, here or where it was found)."""
    try:
        server.stop(grace_s, drain_s)
    except Exception as err:
        if failure is None:
            log.exception("the coordinator failed while shutting down")
        else:
            log.debug("closing after the failure: %r", err)
        return False
    return True


def _wait_for_stop_or_failure(stop: SignalFlag, coordinator: Coordinator) -> BaseException | None:
    """Wait for a stop signal, or for a failure of a background thread (a commit of the state that failed, a
    dead league or expiry thread), which is returned. Such a coordinator cannot keep its books, so it must not go
    on answering (with health SERVING) as if it could: it exits, and its supervisor restarts it on the durable
    state, which holds everything it ever acknowledged."""
    while not stop.wait(FAILURE_POLL_S):
        if coordinator.failure is not None:
            return coordinator.failure
    return None


def _refuse(message: str) -> int:
    print(f"league coordinator: {message}", file=sys.stderr)
    return SETUP_ERROR_EXIT


# ---- league status ------------------------------------------------------------------------------------------


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--addr", type=cli_args.address, default=None,
                       help=f"coordinator HOST:PORT (default: ${COORDINATOR_ENV_VAR}, else {DEFAULT_STATUS_ADDR})")
    where.add_argument("--run-dir", type=cli_args.path, default=None,
                       help="the coordinator of the `league run` going on in this directory")
    parser.add_argument("--token-file", type=cli_args.path, default=None, help="bearer token (else $LEAGUE_TOKEN)")
    parser.add_argument("--tls-ca", type=cli_args.path, default=None, help="CA certificate to verify the coordinator (TLS)")
    cli_args.add_tls_server_name(parser, "the coordinator's")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--watch", type=cli_args.positive_seconds, nargs="?", const=2.0, default=None, metavar="SECONDS",
        help="refresh in place every SECONDS (default 2)",
    )
    parser.add_argument("--timeout", type=cli_args.timeout_seconds, default=5.0,
                        help=f"deadline of each status call, seconds (default 5, at most {cli_args.MAX_TIMEOUT_S:g})")


RUN_PORT_FILE = "coordinator.port"  # `league run` keeps its coordinator's port in this file of its run directory


class RunNotGoing(ValueError):
    """A `league run` directory with no coordinator listening: its run ended, or has not come up yet. A single
    `league status` exits 1 on it (a matter of timing, as an address that does not answer), a watch waits."""


def _status_address(args: argparse.Namespace) -> str:
    """--addr, or the port `league run` keeps in its run directory, or $LEAGUE_COORDINATOR, or the default."""
    if args.run_dir is not None:
        port_file = args.run_dir / RUN_PORT_FILE
        try:
            port = int(port_file.read_text().strip())
        except FileNotFoundError:
            if not args.run_dir.is_dir():
                raise ValueError(f"--run-dir: {args.run_dir} is not a directory") from None
            history = args.run_dir / "status_history.jsonl"
            if history.is_file():  # a run that ended: its port file goes with its coordinator
                raise RunNotGoing(
                    f"--run-dir: no `league run` is going on in {args.run_dir}, or its coordinator is starting "
                    f"({port_file} is removed when a run ends, and written once its coordinator listens): for a run "
                    f"that ended, `league plot --history {history}` shows how it went, {_eval_hint(args.run_dir)}"
                ) from None
            raise RunNotGoing(f"--run-dir: {port_file} does not exist (is a `league run` going on there?)") from None
        except (OSError, ValueError) as err:
            raise ValueError(f"--run-dir: cannot read the coordinator's port from {port_file}: {err}") from None
        if not 1 <= port <= 65535:  # gRPC wraps a larger one: 99999 asked whatever listened on port 34463
            raise ValueError(f"--run-dir: {port_file} holds {port}, not a port from 1 to 65535")
        return f"127.0.0.1:{port}"
    if args.addr:
        return args.addr
    address = os.environ.get(COORDINATOR_ENV_VAR)
    if not address:
        return DEFAULT_STATUS_ADDR
    try:
        check_target(address)
    except ValueError as err:
        raise ValueError(f"${COORDINATOR_ENV_VAR}: {err}") from None
    return address


def _history_league_id(history: Path) -> str:
    """The league of a run directory's newest status record ("" when there is none to read yet): the league the
    run going on there (or the one killed last) serves. The newest, not the first: a run whose state was lost
    starts a new league in the same directory, its history appended to (README: it carries that league on)."""
    try:
        with history.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - HISTORY_TAIL_BYTES))
            tail = file.read(HISTORY_TAIL_BYTES)
    except OSError:
        return ""
    found = _LEAGUE_ID.findall(tail)
    return found[-1].decode() if found else ""


HISTORY_TAIL_BYTES = 4 * 2**20
"""The end of a history searched for its newest record's league id (a record is ~3.4 KB a historical player)."""
_LEAGUE_ID = re.compile(rb'"league_id":\s*"([0-9A-Za-z_-]{1,128})"')


def _eval_hint(run_dir: Path) -> str:
    """How to see how strong an ended run's players grew: `league eval --run-dir` plays a battle league's
    snapshots against bots; a solo league's (single-player envs) has none to play, so its player's checkpoint."""
    import yaml

    from common.job_limits import VERSION_FILE

    try:
        league_type = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("league", {}).get("league_type")
    except (OSError, yaml.YAMLError, AttributeError):
        league_type = None
    if league_type != "solo":
        return f"`league eval --run-dir {run_dir}` how strong its players grew"
    try:
        players = sorted(e.name for e in os.scandir(run_dir / "shared")  # (not its tensorboard folder)
                         if e.is_dir() and any(VERSION_FILE.fullmatch(name) for name in os.listdir(e.path)))
    except OSError:
        players = []
    checkpoint = run_dir / "shared" / (players[0] if len(players) == 1 else "<player>")
    return f"`league eval --checkpoint {checkpoint}` how well its player plays"


def status_main(args: argparse.Namespace) -> int:
    from rich.live import Live
    from rich.text import Text

    from league_service.status_view import render_status, status_console, status_to_json

    try:
        token = load_token(args.token_file)
        if args.tls_ca is not None:
            check_tls_ca(args.tls_ca)
        if (refusal := cli_args.tls_server_name_refusal(args)) is not None:
            raise ValueError(refusal)
    except ValueError as err:
        print(f"league status: {err}", file=sys.stderr)
        return SETUP_ERROR_EXIT
    try:
        address: str | None = _status_address(args)
    except RunNotGoing as gone:
        if args.watch is None:
            print(f"league status: {gone}", file=sys.stderr)
            return 1
        address = None  # a watch opened as the run starts waits for its coordinator (it exited 2 at once)
    except ValueError as err:
        print(f"league status: {err}", file=sys.stderr)
        return SETUP_ERROR_EXIT
    console = status_console()
    console.on_broken_pipe = raise_broken_pipe  # rich's own exits 1; a closed pipe ends the command below
    source = _StatusSource(args, address, token)
    fetch = source.fetch

    try:
        if args.watch is None:
            try:
                status = fetch()
            except grpc.RpcError as err:
                hint = _status_hint(args, err, source.address)
                print(f"league status: {source.address}: {err.code().name}: {err.details()}{hint}",
                      file=sys.stderr)
                return 1
            except RunNotGoing as gone:
                print(f"league status: {gone}", file=sys.stderr)
                return 1
            if args.json:
                print(status_to_json(status))
            else:
                console.print(render_status(status))
            sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
            return 0
        # Ctrl-C (or SIGTERM) sets `stop` instead of raising KeyboardInterrupt wherever the main thread is:
        # inside a gRPC call the interrupt could be swallowed and the watch would never end.
        stop = SignalFlag()

        def frame():
            try:
                status = fetch(stop)
            except grpc.RpcError as err:  # (as text: the details may hold [brackets] rich would read as markup)
                return Text(f"{source.address}: {err.code().name}: {err.details()} (retrying)")
            except RunNotGoing as gone:
                return Text(f"{gone}; waiting for one")
            return None if status is None else render_status(status)

        previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            # A line saying why there is no status is said once until it changes (or a status comes): said at
            # every interval, an idle watch at 2 s wrote ~43k of them a day (a review).
            said: str | None = None
            if args.json:  # JSON Lines for programs: one status per line, plain (no wrapping, no markup)
                while not stop.is_set():
                    line = None
                    try:
                        if (status := fetch(stop)) is not None:
                            print(status_to_json(status, compact=True), flush=True)
                            said = None
                    except grpc.RpcError as err:
                        line = f"league status: {source.address}: {err.code().name}: {err.details()} (retrying)"
                    except RunNotGoing as gone:
                        line = f"league status: {gone}; waiting for one"
                    if line is not None and line != said:
                        print(line, file=sys.stderr, flush=True)
                        said = line
                    stop.wait(args.watch)
                return 0
            if not console.is_terminal:  # a pipe or a file: one frame after another
                while not stop.is_set():
                    shown = frame()
                    if isinstance(shown, Text) and shown.plain == said:
                        shown = None
                    elif shown is not None:
                        said = shown.plain if isinstance(shown, Text) else None
                    if shown is not None:
                        console.print(shown)
                        sys.stdout.flush()
                    stop.wait(args.watch)
                return 0
            with Live(console=console, auto_refresh=False, screen=False) as live:
                while not stop.is_set():
                    if (shown := frame()) is not None:
                        live.update(shown, refresh=True)
                    stop.wait(args.watch)
            return 0
        finally:
            for s, handler in previous.items():
                # After a Ctrl-C, its repeat is ignored until the process exits (put back, it was a
                # KeyboardInterrupt in the shutdown; as the actor's, a review).
                signal.signal(s, signal.SIG_IGN if stop.is_set() else handler)
    except BrokenPipeError:  # `league status --json | head -1`: the reader has what it wanted, nothing failed
        discard_output()
        return 0
    finally:
        source.close()


def _status_hint(args: argparse.Namespace, err: grpc.RpcError, address: str) -> str:
    """What a failed GetStatus most likely means, for the one line `league status` prints."""
    if hint := not_a_coordinator_hint(err.code(), address) or tls_hint(err.details()):
        return hint
    if err.code() != grpc.StatusCode.UNAVAILABLE:
        return ""
    if args.run_dir is not None:
        return f" (is a `league run` going on there? {args.run_dir / RUN_PORT_FILE} may be left from one that was killed)"
    if not args.addr and not os.environ.get(COORDINATOR_ENV_VAR):  # the default address: no coordinator there
        return " (for a `league run`, give --run-dir DIR: it serves on a port of its own)"
    return ""


class _StatusSource:
    """GetStatus of a coordinator. One found through a `league run` directory is looked up there again when it
    does not answer: run again in the directory, the league serves on another port, and a watch kept calling
    the old one."""

    def __init__(self, args: argparse.Namespace, address: str | None, token: str | None) -> None:
        """`address` None: a run directory whose coordinator is not listening yet, looked up at each fetch."""
        self._args = args
        self._token = token
        self._channel: Any = None
        self.address = str(args.run_dir)
        if address is not None:
            self._connect(address)

    def _connect(self, address: str) -> None:
        from common.proto.league.v1 import league_pb2_grpc
        from league_service.status import STATUS_MAX_BYTES

        if self._channel is not None:
            self._channel.close()
        self.address = address
        self._channel = make_channel(address, token=self._token, tls_ca=self._args.tls_ca,
                                     tls_server_name=self._args.tls_server_name, max_message_bytes=STATUS_MAX_BYTES)
        self._stub = league_pb2_grpc.LeagueServiceStub(self._channel)

    def fetch(self, stop: SignalFlag | None = None) -> Any:
        """The coordinator's status; None once `stop` is set while waiting for it (a watch's Ctrl-C ended the
        watch only after the call's deadline, --timeout, when the coordinator did not answer)."""
        if self._channel is None:
            try:
                self._connect(_status_address(self._args))
            except ValueError:  # (RunNotGoing, or the directory gone meanwhile: no run can come up there)
                raise RunNotGoing(self._not_going()) from None
        try:
            return self._of_the_run(self._get_status(stop))
        except grpc.RpcError as err:
            if self._args.run_dir is None or err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            try:
                moved = _status_address(self._args)
            except ValueError:
                if (self._args.run_dir / RUN_PORT_FILE).exists():
                    raise err from None
                # The run ended (its port file goes with its coordinator): said so, where a watch kept showing the
                # old port's UNAVAILABLE at every refresh (a review).
                raise RunNotGoing(self._not_going()) from None
            if moved == self.address:
                raise
            self._connect(moved)
            return self._of_the_run(self._get_status(stop))

    def _of_the_run(self, status: Any) -> Any:
        """``status``, when it is the run directory's league's: a run killed outright leaves its port file, and
        whatever listens on that port later (another league's coordinator) was shown as the run's, exit 0 (a
        review). The run's league is the one of its status history's newest record."""
        if status is None or self._args.run_dir is None:
            return status
        run_league = _history_league_id(self._args.run_dir / "status_history.jsonl")  # (at each call: it may move)
        if run_league and status.league_id != run_league:
            port_file = self._args.run_dir / RUN_PORT_FILE
            served = self.address
            self._channel.close()
            self._channel = None  # looked up again at the next fetch (a watch waits for the run to come back)
            raise RunNotGoing(f"{served} (the port in {port_file}) serves league {status.league_id}, not this run "
                              f"directory's league {run_league}: the run that wrote it ended without "
                              "removing it (killed?); no `league run` is going on there")
        return status

    def _not_going(self) -> str:
        return f"no `league run` is going on in {self._args.run_dir} now (it ended, or its coordinator is starting)"

    def _get_status(self, stop: SignalFlag | None) -> Any:
        from common.proto.league.v1 import league_pb2

        if stop is None:
            return self._stub.GetStatus(league_pb2.GetStatusRequest(), timeout=self._args.timeout)
        call = self._stub.GetStatus.future(league_pb2.GetStatusRequest(), timeout=self._args.timeout)
        while not call.done():
            if stop.wait(STOP_POLL_S):
                call.cancel()
                return None
        return call.result()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m league_service.cli {coordinator,status} ...` (the same as `league coordinator|status`)."""
    parser = argparse.ArgumentParser(prog="league_service.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_coordinator_arguments(sub.add_parser("coordinator", help="serve the league"))
    add_status_arguments(sub.add_parser("status", help="show the league"))
    args = parser.parse_args(argv)
    return coordinator_main(args) if args.command == "coordinator" else status_main(args)


if __name__ == "__main__":
    sys.exit(main())
