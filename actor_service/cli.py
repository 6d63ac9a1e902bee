"""`league actor`: argument parsing and the process shell around `Actor`.

`add_arguments(parser)` / `main(args) -> int` are what league_cli/main.py hooks in; `python -m actor_service.cli
actor ...` runs the same without the `league` entry point.

The process: the job loop runs on a worker thread; the main thread only waits for it and turns SIGTERM / SIGINT
into `Actor.request_stop()` — the current step finishes (or is cut short, if its envs are slow), the job is
released (without results: a job cut short would report only its short episodes), the env workers are closed,
and the process exits 0. An env stuck in C code
in this process (`--manager base`) can hold the job thread where no interrupt gets in: once it has been stuck
for `STUCK_AFTER_STOP_S` since the stop, the main thread releases the job itself and the process exits 1. The
same happens, with the job thread's stack in the log, when the job thread is still setting up or playing its job
`--stop-timeout` seconds after the stop (stuck in a checkpoint read from a hung network filesystem, say): no
stop waits for ever. Without a stop, a job thread stuck in a checkpoint read two leases past
`--checkpoint-read-timeout` (its job went back to the league by then), or in an env call two leases past its
timeout that the manager could not interrupt (`--manager base`: an env blocked in a wait or in C code), ends the
process the same way, so that a supervisor restarts it and the failure shows, rather than an actor that waits in
silence.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from common import cli_args
from common.exit_codes import FAILURE_EXIT, SETUP_ERROR_EXIT
from common.quick_exit import skip_final_collections_at_exit
from common.rpc import COORDINATOR_ENV_VAR, SHARED_ROOT_ENV_VAR, RegistrationError, env_path
from common.thread_stack import stack_of

log = logging.getLogger("league.actor")

STUCK_AFTER_STOP_S = 3.0
"""How long after a stop the env manager's call may stay stuck (cut short, and its env not back) before the
process gives up on the job thread. A stop that is not stuck in an env has its own bounds (Actor)."""
DEFAULT_STOP_TIMEOUT_S = 10.0
"""How long after a stop the job thread may still be setting up or playing its job (a stop ends that within an
env step): inside `league run`'s 15 s of grace with the main thread's release (3 s at most). The job's
wind-down that follows (its last trajectories, the heartbeat's end, the release: ~11 s at most) has bounds of
its own and is not cut short."""
JOIN_SLICE_S = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator", default=os.environ.get(COORDINATOR_ENV_VAR),
                        help=f"coordinator HOST:PORT (default: ${COORDINATOR_ENV_VAR})")
    parser.add_argument("--shared-root", type=cli_args.path, default=env_path(SHARED_ROOT_ENV_VAR),
                        help=f"directory of checkpoints shared with the learners (default: ${SHARED_ROOT_ENV_VAR})")
    parser.add_argument("--env-num", type=cli_args.env_num, default=None, help="environments per job (overrides the job's env_num)")
    parser.add_argument("--manager", choices=("subprocess", "base"), default="subprocess",
                        help="run envs in worker processes (subprocess, the default) or in the actor process (base)")
    parser.add_argument("--env-cpus", type=cli_args.positive_int, default=None, metavar="N",
                        help="CPUs the subprocess manager sizes itself for: its worker processes, and whether they "
                             "busy-wait (default: every CPU this process may run on). Give this actor's share "
                             "where other busy processes share the machine, or a container's CPU quota")
    parser.add_argument("--worker-id", default=None, help="worker id (default: actor-<hostname>-<pid>)")
    parser.add_argument("--token-file", type=cli_args.path, default=None, help="bearer token (else $LEAGUE_TOKEN)")
    parser.add_argument("--tls-ca", type=cli_args.path, default=None, help="PEM CA certificate: connect with TLS")
    cli_args.add_tls_server_name(parser, "the coordinator's and the learners'")
    parser.add_argument("--max-jobs", type=cli_args.positive_int, default=None, help="exit after this many jobs")
    parser.add_argument("--env-max-retry", type=cli_args.non_negative_int, default=2,
                        help="failures each env may have per job (it is rebuilt each time) before the job fails "
                             "(default 2)")
    parser.add_argument("--env-step-timeout", type=cli_args.positive_seconds_or_none, default=60.0, metavar="SECONDS",
                        help="an env step taking longer is a hung env and is rebuilt (subprocess manager: its "
                             "worker is killed, and the automatic reset after an episode's last step counts as part "
                             "of that step; base: interrupted in process); 'none': no limit (default 60)")
    parser.add_argument("--env-reset-timeout", type=cli_args.positive_seconds_or_none, default=300.0, metavar="SECONDS",
                        help="the same for building and resetting envs (default 300)")
    parser.add_argument("--checkpoint-read-timeout", type=cli_args.positive_seconds_or_none, default=120.0, metavar="SECONDS",
                        help="a checkpoint read still under way after this long (a hung network filesystem) lets "
                             "the job's lease expire, so the job goes to another actor; 'none': no limit (default 120)")
    cli_args.add_stop_timeout(parser, DEFAULT_STOP_TIMEOUT_S, "a job thread still setting up or playing its job")
    cli_args.add_log_level(parser)


def main(args: argparse.Namespace) -> int:
    skip_final_collections_at_exit()  # (torch's objects) the actor's exit ~1.3 s sooner: see common/quick_exit.py
    cli_args.configure_logging(args.log_level)
    if (refusal := cli_args.coordinator_refusal(args.coordinator)) is not None:
        return _refuse(refusal)
    if (refusal := cli_args.shared_root_refusal(args.shared_root)) is not None:
        return _refuse(refusal)
    if (refusal := cli_args.tls_server_name_refusal(args)) is not None:
        return _refuse(refusal)
    # Imported only now, so `league --help` and argument errors do not pay for torch.
    import torch

    from actor_service.actor import Actor, ActorSettings, default_worker_id
    from actor_service.coordinator_client import CoordinatorError
    from common.rpc import check_tls_ca, load_token

    try:
        if args.tls_ca is not None:
            check_tls_ca(args.tls_ca)
        settings = ActorSettings(
            coordinator=args.coordinator,
            shared_root=args.shared_root,
            worker_id=args.worker_id or default_worker_id("actor"),
            env_num=args.env_num,
            manager=args.manager,
            env_cpus=args.env_cpus,
            token=load_token(args.token_file),
            tls_ca=args.tls_ca,
            tls_server_name=args.tls_server_name,
            max_jobs=args.max_jobs,
            env_max_retry=args.env_max_retry,
            env_step_timeout_s=args.env_step_timeout,
            env_reset_timeout_s=args.env_reset_timeout,
            checkpoint_read_timeout_s=args.checkpoint_read_timeout,
        )
    except (ValueError, OSError) as err:
        return _refuse(str(err))
    # Actors act on small batches, several actor processes share the cores: one intra-op thread each.
    torch.set_num_threads(1)
    actor = Actor(settings)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            actor.run()
        except BaseException as err:  # handed to the main thread, which reports it and exits non-zero
            failure.append(err)

    worker = threading.Thread(target=serve, name="actor-jobs")
    previous = {sig: signal.signal(sig, lambda signum, _frame: _on_signal(actor, signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        worker.start()
        stuck = _wait_for_jobs(worker, actor, args.stop_timeout)  # signal handlers run here while it waits
    finally:
        for sig, handler in previous.items():
            # After a stop, the rest of a burst (Ctrl-C twice; one SIGTERM per thread of a supervisor killed
            # outright) is ignored until the process exits: with the handlers put back, a repeat killed it in its
            # interpreter's shutdown, exit -2 or -15 after a clean stop (a review).
            signal.signal(sig, signal.SIG_IGN if actor.stopping else handler)
    if stuck is not None:
        log.error("the job thread is %s; exiting without it", stuck)
        try:
            actor.release_stuck_job()
        finally:
            logging.shutdown()
            # Not a normal exit: the interpreter would wait for the stuck thread's locks at shutdown.
            os._exit(FAILURE_EXIT)
    if failure:
        err = failure[0]
        if isinstance(err, CoordinatorError | RegistrationError):  # (the learner's too: a reply no retry changes)
            return _refuse(str(err))
        log.error("the actor stopped on an error", exc_info=err)
        return FAILURE_EXIT
    log.info("actor %s stopped after %d job(s)", settings.worker_id, actor.jobs_run)
    return 0


def _wait_for_jobs(worker: threading.Thread, actor, stop_timeout_s: float) -> str | None:
    """Wait for the job thread to end; if it is stuck after a stop instead, where and how (for the log)."""
    stopped_at: float | None = None
    while True:
        worker.join(JOIN_SLICE_S)
        if not worker.is_alive():
            return None
        if (stuck := actor.stuck_read() or actor.stuck_env()) is not None:  # no stop needed: exit so a
            return f"{stuck}, at:\n{stack_of(worker)}"  # supervisor restarts it and the failure shows
        if not actor.stopping:
            continue
        if stopped_at is None:
            stopped_at = time.monotonic()  # within JOIN_SLICE_S of the signal
        stalled = actor.env_stalled_s()
        if stalled > STUCK_AFTER_STOP_S:
            return (f"still in an env call {stalled:.1f} s after the stop, which could not interrupt it (an env "
                    "stuck in C code: use --manager subprocess for such envs)")
        waited = time.monotonic() - stopped_at
        if waited > stop_timeout_s and actor.playing:  # a job's wind-down has bounds of its own
            return (f"still setting up or playing its job {waited:.1f} s after the stop (--stop-timeout), "
                    f"at:\n{stack_of(worker)}")


def _on_signal(actor, signum: int) -> None:
    if actor.stopping:  # a repeat (a supervisor killed outright can signal once per thread it had): said already
        return
    log.info("%s: finishing the current step, then releasing the job", signal.Signals(signum).name)
    actor.request_stop()


def _refuse(message: str) -> int:
    print(f"league actor: {message}", file=sys.stderr)
    return SETUP_ERROR_EXIT


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m actor_service.cli")
    _sub = _parser.add_subparsers(dest="command", required=True)
    add_arguments(_sub.add_parser("actor", help="pull jobs from the coordinator and play them"))
    sys.exit(main(_parser.parse_args()))
