"""`league learner`: argument parsing and the process shell (signals, exit codes).

`add_arguments(parser)` / `main(args) -> int` are what league_cli/main.py hooks in;
`python -m learner_service.cli learner ...` runs the same without the `league` entry point.

The process prints one parseable line once its server is bound (`LISTENING service=learner address=HOST:PORT`),
then trains until SIGTERM/SIGINT: stop accepting data, publish a final checkpoint, UpdatePlayer,
FinishJob(RELEASED) (one short try each: a coordinator that does not answer does not hold up the stop), health
NOT_SERVING, exit 0. Exit 2: bad arguments or a learn job it cannot train;
exit 1: a failure while training, or a stop the learner thread did not finish within `--stop-timeout` (a
final checkpoint stuck on a hung network filesystem, say): the main thread then logs where the learner thread
is, hands the learn job back itself and exits without it, so no stop waits for ever.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time

from common import cli_args
from common.exit_codes import ADDRESS_IN_USE_EXIT, FAILURE_EXIT, SETUP_ERROR_EXIT
from common.quick_exit import skip_final_collections_at_exit
from common.rpc import (
    COORDINATOR_ENV_VAR,
    SHARED_ROOT_ENV_VAR,
    AddressInUseError,
    announce_listening,
    check_server_tls,
    check_tls_ca,
    env_path,
    load_token,
)
from common.signal_flag import SignalFlag
from common.thread_stack import stack_of

log = logging.getLogger("league.learner")

DEFAULT_STOP_TIMEOUT_S = 20.0
"""How long after a stop the learner thread may take to train on what it accepted, publish its final checkpoint,
report and release: a second or two on a healthy share, ~10 s against a coordinator that does not answer.
Inside the 30 s of grace the deploy manifests give learners, so that a stuck learner hands its player back
before the supervisor's SIGKILL."""
STOP_TRAIN_S = 5.0
"""The most of a stop spent training on what the learner accepted (a quarter of `--stop-timeout` if less):
the rest of it is for the final checkpoint, report and release."""
JOIN_SLICE_S = 0.2


def default_worker_id() -> str:
    return f"learner-{socket.gethostname()}-{os.getpid()}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator", default=os.environ.get(COORDINATOR_ENV_VAR),
                        help=f"coordinator HOST:PORT (default ${COORDINATOR_ENV_VAR})")
    parser.add_argument("--shared-root", type=cli_args.path, default=env_path(SHARED_ROOT_ENV_VAR),
                        help=f"directory of checkpoints and TensorBoard logs (default ${SHARED_ROOT_ENV_VAR})")
    parser.add_argument("--host", default="127.0.0.1", help="address the trajectory server listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=cli_args.port, default=0, help="port of the trajectory server; 0, the default, picks a free one")
    parser.add_argument("--advertise", type=cli_args.host_port, default=None,
                        help="HOST:PORT actors stream to (default: host:bound port)")
    parser.add_argument("--worker-id", default=None,
                        help="keep it across restarts to get the same player back (default learner-<host>-<pid>)")
    parser.add_argument("--token-file", type=cli_args.path, default=None, help="bearer token (else $LEAGUE_TOKEN)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback --host without a token (trajectories then arrive unauthenticated)")
    parser.add_argument("--tls-ca", type=cli_args.path, default=None, help="CA certificate to verify the coordinator (TLS)")
    cli_args.add_tls_server_name(parser, "the coordinator's")
    parser.add_argument("--tls-cert", type=cli_args.path, default=None,
                        help="PEM certificate chain of the trajectory server (with --tls-key; needed with --tls-ca)")
    parser.add_argument("--tls-key", type=cli_args.path, default=None, help="PEM private key (with --tls-cert)")
    parser.add_argument("--device", type=cli_args.device, default="auto", metavar="{auto,cpu,cuda,cuda:N}",
                        help="where to train (default auto: cuda when there is a GPU; cuda:N picks one of several)")
    parser.add_argument("--publish-timeout", type=cli_args.positive_seconds_or_none, default=300.0,
                        metavar="SECONDS",
                        help="a checkpoint publish or read still under way after this long (a hung network "
                             "filesystem) lets the learn job's lease expire, so the player can go to another "
                             "learner; 'none': no limit (default 300)")
    parser.add_argument("--env-build-timeout", type=cli_args.positive_seconds_or_none, default=300.0,
                        metavar="SECONDS",
                        help="building a job's env to read its spaces may take this long before the job counts as "
                             "one the learner cannot set up, and the learner exits 2 (an env constructor that "
                             "hangs; not one blocked in C code that holds Python's GIL); 'none': no limit "
                             "(default 300)")
    parser.add_argument("--stream-idle-timeout", type=cli_args.positive_seconds, default=60.0, metavar="SECONDS",
                        help="cancel a trajectory stream whose client sent nothing for this long, so frozen or "
                             "stray clients cannot hold the learner's stream slots (actors send again) (default 60)")
    cli_args.add_stop_timeout(parser, DEFAULT_STOP_TIMEOUT_S,
                              "a learner thread that has not finished its final checkpoint, report and release")
    cli_args.add_log_level(parser)


def main(args: argparse.Namespace) -> int:
    skip_final_collections_at_exit()  # (torch's objects) the learner's exit ~1.3 s sooner: common/quick_exit.py
    # Imported here so that `league --help` does not pay for torch.
    from common.computation.computation_task import describe_device, resolve_device
    from common.rpc import RegistrationError
    from learner_service.config import LearnerSettings
    from learner_service.learner import CoordinatorRefused, JobSetupError, Learner, WorkerIdTaken

    cli_args.configure_logging(args.log_level)
    if (refusal := cli_args.coordinator_refusal(args.coordinator)) is not None:
        return _refuse(refusal)
    refusal = cli_args.shared_root_refusal(args.shared_root, writes="the learner publishes its checkpoints there")
    if refusal is not None:
        return _refuse(refusal)
    if (refusal := cli_args.tls_server_name_refusal(args)) is not None:
        return _refuse(refusal)
    try:
        device = resolve_device(args.device)  # `cuda` on a machine without one: refuse now, not at the first job
    except ValueError as err:
        return _refuse(f"--device: {err}")
    try:
        if args.tls_ca is not None:
            check_tls_ca(args.tls_ca)
        if args.tls_cert is not None and args.tls_key is not None:
            check_server_tls(args.tls_cert, args.tls_key)
        settings = LearnerSettings(
            coordinator=args.coordinator,
            shared_root=args.shared_root,
            worker_id=args.worker_id or default_worker_id(),
            host=args.host,
            port=args.port,
            advertise=args.advertise or "",
            token=load_token(args.token_file),
            insecure=args.insecure,
            tls_ca=args.tls_ca,
            tls_server_name=args.tls_server_name,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            device=args.device,
            publish_timeout_s=args.publish_timeout,
            stream_idle_timeout_s=args.stream_idle_timeout,
            env_build_timeout_s=args.env_build_timeout,
            stop_train_s=min(STOP_TRAIN_S, args.stop_timeout / 4),
        )
        learner = Learner(settings)
    except (ValueError, OSError) as err:
        return _refuse(str(err))
    try:
        address = learner.start()
    except AddressInUseError as err:
        learner.close()
        print(f"league learner: {err}", file=sys.stderr)
        return ADDRESS_IN_USE_EXIT
    except (ValueError, OSError, RuntimeError) as err:
        learner.close()
        return _refuse(str(err))

    wake = SignalFlag()  # set by the signal handlers and by the learner's thread
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            learner.run()
        except BaseException as err:  # reported by the main thread below
            failure.append(err)
        finally:
            wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: wake.set())
    worker = threading.Thread(target=serve, name="learner", daemon=True)
    announce_listening("learner", address)
    log.info("learner %s serving trajectories on %s (advertised %s), coordinator %s, training on %s",
             settings.worker_id, address, learner.data_endpoint, settings.coordinator, describe_device(device))
    worker.start()
    try:
        wake.wait()
        if not failure:
            log.info("stopping: final checkpoint, report, release")
        learner.request_stop()
        if (stuck := _join_within(worker, args.stop_timeout)) is not None:
            log.error("the learner thread is still at its stop %.1f s after it (--stop-timeout), at:\n%s\n"
                      "exiting without it", args.stop_timeout, stuck)
            try:
                learner.release_stuck_job()
            finally:
                logging.shutdown()
                # Not a normal exit: the interpreter would wait for the stuck thread, and the learner thread
                # must not publish once its job is handed back.
                os._exit(FAILURE_EXIT)
    finally:
        learner.close()
    if failure:
        err = failure[0]
        if isinstance(err, JobSetupError):  # the league's config, not a bug: its reason, on one line
            log.debug("the job's setup failed", exc_info=err)
            log.error("learner cannot run this league: %s", err)
            return SETUP_ERROR_EXIT
        if isinstance(err, WorkerIdTaken | CoordinatorRefused | RegistrationError):
            log.error("learner stops: %s", err)
            return SETUP_ERROR_EXIT
        log.error("learner failed", exc_info=err)
        return FAILURE_EXIT
    return 0


def _join_within(worker: threading.Thread, timeout_s: float) -> str | None:
    """Wait up to `timeout_s` for the learner thread; None once it ended, else where it is stuck. Joined in
    slices so that the signal handlers run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        worker.join(min(JOIN_SLICE_S, left))
        if not worker.is_alive():
            return None
    return None if not worker.is_alive() else stack_of(worker)


def _refuse(message: str) -> int:
    print(f"league learner: {message}", file=sys.stderr)
    return SETUP_ERROR_EXIT


def cli(argv: list[str] | None = None) -> int:
    """`python -m learner_service.cli learner ...` (the same as `league learner ...`)."""
    parser = argparse.ArgumentParser(prog="learner_service.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_arguments(sub.add_parser("learner", help="train one active player"))
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
