"""`league` — one command, one subcommand per process kind.

Each subcommand lives in the package that owns it and is imported only when chosen, so `league status`
does not pay for torch, and the three services stay independent of one another.
"""

from __future__ import annotations

import contextlib
import sys

try:  # (a Ctrl-C here, as the command starts, must say what main() says for one during the command's imports)
    import argparse
    import importlib
    import os
    import signal
    import threading
    from collections.abc import Iterator
    from dataclasses import dataclass

    from common.closed_output import discard_output
    from common.exit_codes import INTERRUPTED_EXIT
    from common.quick_exit import skip_final_collections_at_exit
    from league_cli.processes import follow_supervisor
except KeyboardInterrupt:
    # These imports take a few tenths of a second (more on a busy machine), before main() can catch anything: a
    # Ctrl-C pressed then was a KeyboardInterrupt traceback out of `import subprocess`.
    print("league: interrupted", file=sys.stderr)
    raise SystemExit(130) from None


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    # "module:function" taking (argparse subparser) to add arguments; None while not built yet.
    add_arguments: str | None
    # "module:function" taking the parsed Namespace and returning an exit code.
    entry: str | None


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("coordinator", "serve the league (LeagueService) for actors, learners and tools",
               "league_service.cli:add_coordinator_arguments", "league_service.cli:coordinator_main"),
    Subcommand("actor", "pull collect jobs, play matches, stream trajectories to learners",
               "actor_service.cli:add_arguments", "actor_service.cli:main"),
    Subcommand("learner", "train one active player on the trajectories actors stream to it",
               "learner_service.cli:add_arguments", "learner_service.cli:main"),
    Subcommand("status", "show the league: players, payoff, ratings, jobs, workers",
               "league_service.cli:add_status_arguments", "league_service.cli:status_main"),
    Subcommand("run", "run a whole league locally (coordinator, learners, actors) until its budget",
               "league_cli.run:add_arguments", "league_cli.run:run_main"),
    Subcommand("eval", "play a checkpoint against a reference bot (random, MCTS) and print win/draw/loss",
               "league_cli.eval:add_arguments", "league_cli.eval:main"),
    Subcommand("export", "write a checkpoint's policy as a standalone file (torch.export) that runs with torch alone",
               "league_cli.export:add_arguments", "league_cli.export:main"),
    Subcommand("import", "publish weights trained elsewhere (a state dict) as a checkpoint a league can start from",
               "league_cli.weights_import:add_arguments", "league_cli.weights_import:main"),
    Subcommand("health", "check a server's gRPC health (exit 0 when SERVING)",
               "league_cli.health:add_arguments", "league_cli.health:main"),
    Subcommand("plot", "write PNGs of the win-rate matrix and rating curves from a run's status history",
               "league_cli.plot:add_arguments", "league_cli.plot:plot_main"),
)


def _resolve(ref: str):
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="league",
        description="League training for reinforcement learning: coordinator, actors and learners over gRPC.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for cmd in SUBCOMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.add_arguments is not None:
            _resolve(cmd.add_arguments)(p)
        p.set_defaults(_subcommand=cmd, _parser=p)
    return parser


def _printable_paths() -> None:
    """Output that cannot crash on a path whose name is not UTF-8 (`run\xff`, from a Latin-1 file system):
    where the locale makes stdout strict (en_US.UTF-8; C.UTF-8 escapes such bytes), `league plot` printed the
    plots it had written into such a directory and died of UnicodeEncodeError, a traceback. Such a character is
    printed escaped instead (`run\udcff`), as Python prints it to stderr already."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):  # a detached or closed stream: left as it is
                stream.reconfigure(errors="backslashreplace")


RUN_SIGTERM_AT_START_UP = b"league run: stopped by SIGTERM during start-up, before any process was started\n"


def _run_stopped_at_start_up(_signum: int, _frame: object) -> None:
    """Say it in one line, then die of the signal as before (exit 143 to a shell, nothing cleaned up that was not
    before). `os.write`: a print here could land inside a write the main thread had under way (a reentrant
    call); a stderr that cannot take the line costs only the line."""
    with contextlib.suppress(OSError):
        os.write(2, RUN_SIGTERM_AT_START_UP)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def _sigterm_said_at_start_up(command: str | None) -> Iterator[None]:
    """`league run`: a SIGTERM before the run installs its own handler (imports, config, run directory: a second
    or more) ended it with exit 143 and not a word, so whoever stopped it could not tell that it had started at
    all. No process is started before that handler is in place, so none is left. Only for `run`: a worker that
    `league run` stops while it still imports is told apart by its death by SIGTERM, and stays silent. A SIGTERM
    that was ignored, or handled by someone else, is left so."""
    if (command != "run" or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _run_stopped_at_start_up)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _standard_streams_open() -> None:
    """Open /dev/null onto standard descriptors the command was started without (`league run <&- >&-`). Closed,
    the next file opened took its number: the run lock took fd 0, and every process `league run` started had
    its stdin (/dev/null) put there, so none of them held the lock and a second run in the directory was let in
    after a kill; with stdout closed, `sys.stdout` is None and the first print raised (a review)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` itself, unless a lower one is too
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 (the process's own, for its life)


def main(argv: list[str] | None = None) -> int:
    _standard_streams_open()
    skip_final_collections_at_exit()  # a learner, actor or eval exits ~1.3 s sooner (common/quick_exit.py)
    words = sys.argv[1:] if argv is None else argv
    with _sigterm_said_at_start_up(words[0] if words else None):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    follow_supervisor()
    _printable_paths()
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # the subcommand's parser reports it: its usage, and `league health`'s exit 1 (see health.py)
            args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
        cmd: Subcommand = args._subcommand
        if cmd.entry is None:
            print(f"league {cmd.name}: not built yet in this version of the package.", file=sys.stderr)
            return 2
        return int(_resolve(cmd.entry)(args) or 0)
    except BrokenPipeError:
        # Its output's reader went away (`league eval --json | head -1`): nothing more to say, nowhere to say it
        # (a traceback, or "Exception ignored" and exit 120 when the flush at exit failed again).
        discard_output()
        return 0
    except KeyboardInterrupt:
        # Ctrl-C before a command installs its own handler (while torch and gRPC import, which takes seconds):
        # nothing was started yet, so there is nothing to stop and no traceback worth showing. Commands that
        # run processes handle SIGINT themselves once they start them.
        print("league: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
