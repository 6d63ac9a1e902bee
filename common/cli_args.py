"""argparse types for the numbers and addresses flags take, so that a bad value is a usage error naming the flag.

Why: without them `--port 70000` bound port 4464 (gRPC wraps it) and `--lease-timeout 0` or `--seed -1`
ended in a traceback from deep inside the process.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from common.config import MAX_DURATION_S, is_device
from common.durable_files import out_of_space
from common.job_limits import MAX_ENV_NUM
from common.ports import check_host_port, check_target
from common.rpc import COORDINATOR_ENV_VAR, SHARED_ROOT_ENV_VAR

MAX_TIMEOUT_S = 3600.0
"""The longest deadline a client flag takes: a huge one (1e300 s) overflows into an immediate DEADLINE_EXCEEDED."""


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {value}")
    return value


def address(text: str) -> str:
    """A server's HOST:PORT, port 1 to 65535 (gRPC wraps a larger one: :99999 connected to port 34463), or a
    gRPC target URI such as dns:///host:port."""
    try:
        check_target(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def host_port(text: str) -> str:
    """HOST:PORT that other machines dial (a server's advertised address): a host and a port 1 to 65535."""
    try:
        check_host_port(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def path(text: str) -> Path:
    """A file or directory flag, `~` expanded (see `path_text`). An empty value is refused: Path("") is the current
    directory, so `--run-dir ""` ran the league in (and `--shared-root ""` published into) wherever the command was
    started."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (give a path; . for the current directory)")
    return Path(path_text(text))


def file_path(text: str) -> Path:
    """`path` for a flag naming a file to write: a value ending in "/" names a directory, which Path() forgets
    (`--out exports/` wrote a file named `exports`; a review)."""
    if text.endswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r} ends in '/', a directory: name the file to write")
    return path(text)


def path_text(text: str) -> str:
    """A path flag's value with a leading `~` or `~user` expanded, as the shell does for `--flag ~/x` but not for
    `--flag=~/x`: that one made a directory named `~` where the command was started. Expanded here, at parsing,
    so the processes `league run` starts get the expanded paths."""
    return os.path.expanduser(text)


_DNS_LABEL = re.compile(r"(\*|[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)")


def tls_server_name(text: str) -> str:
    """A DNS name for `--tls-server-name` (what gRPC checks the server's certificate against instead of the host
    dialled): refused here, at parsing, rather than as a handshake failure at every call."""
    labels = text.rstrip(".").split(".")
    if not text or len(text) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise argparse.ArgumentTypeError(f"not a DNS name: {text!r:.80}")
    return text


def add_tls_server_name(parser: argparse.ArgumentParser, servers: str) -> None:
    parser.add_argument(
        "--tls-server-name", type=tls_server_name, default=None, metavar="NAME",
        help=f"the name {servers} TLS certificates are checked against instead of the host dialled (a certificate "
             "that names a DNS name only, reached by IP address or by another name); needs --tls-ca",
    )


def tls_server_name_refusal(args: argparse.Namespace) -> str | None:
    """Why --tls-server-name cannot be used as given, or None: it only means something over TLS."""
    if args.tls_server_name is not None and args.tls_ca is None:
        return "--tls-server-name: needs --tls-ca (it names what the servers' TLS certificates are checked against)"
    return None


MAX_SEED = 2**32 - 1


def seed(text: str) -> int:
    """A seed, 0 to 2**32 - 1: numpy refuses a negative one, and a huge one failed only once games began."""
    value = _int(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_SEED}, got {value}")
    return value


def device(text: str) -> str:
    """Where a learner trains: auto, cpu, cuda, or cuda:N for one GPU of several (a learner per GPU on a node)."""
    if is_device(text):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N (a GPU's index), got {text!r}")


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def int_within(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        value = _int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be within [{low:,}, {high:,}], got {value:,}")
        return value

    return parse


def env_num(text: str) -> int:
    """Environments per job, 1 to MAX_ENV_NUM."""
    value = _int(text)
    if not 1 <= value <= MAX_ENV_NUM:
        raise argparse.ArgumentTypeError(f"must be within [1, {MAX_ENV_NUM}], got {value}")
    return value


def positive_seconds(text: str) -> float:
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return _at_most_max_duration(value, text)


def _at_most_max_duration(value: float, text: str) -> float:
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_DURATION_S:g} seconds, got {text}")
    return value


def positive_seconds_or_none(text: str) -> float | None:
    """A timeout that may be switched off: seconds > 0, or `none`."""
    if text.strip().lower() == "none":
        return None
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, or 'none', got {text}")
    return _at_most_max_duration(value, text)


def timeout_seconds(text: str) -> float:
    """A client call's deadline: finite, > 0 and at most MAX_TIMEOUT_S (checked first: `--timeout 1e8` was told
    the general limit, 1e+07 s, and then refused again at 3600)."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TIMEOUT_S:g} seconds, got {text}")
    return value


def non_negative_seconds(text: str) -> float:
    value = _float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return _at_most_max_duration(value, text)


def add_stop_timeout(parser: argparse.ArgumentParser, default_s: float, gives_up_on: str) -> None:
    """A worker's `--stop-timeout`: the backstop of its stop, after which its main thread hands the job back."""
    parser.add_argument("--stop-timeout", type=positive_seconds, default=default_s, metavar="SECONDS",
                        help=f"after SIGTERM, give up on {gives_up_on} this long (stuck): release the job from the "
                             f"main thread and exit 1 (default {default_s:g})")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Every service's log line, through LogFormatter (`2026-11-28 15:01:20,123+0100 INFO league.learner: ...`).
`league run` reads its processes' logs by it (league_cli/processes.LOG_LINE_START): the ERROR lines it prints and
the exception a restarted worker died of."""


class LogFormatter(logging.Formatter):
    """LOG_FORMAT's time with its UTC offset after the milliseconds: local time alone could not order the lines of
    hosts in different time zones (nor those either side of a DST change). The local time is kept (rather than UTC)
    so a line still reads as the clock on the wall of the host that wrote it."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return super().formatTime(record, datefmt) + time.strftime("%z", self.converter(record.created))


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """`--log-level`, any case; another value is a usage error (it was a traceback from `logging`)."""
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                        help="log lines at this level and above (default INFO)")


def configure_logging(level: str) -> None:
    """Log to stderr at `level` in LOG_FORMAT (the one format `league run` parses)."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def coordinator_refusal(value: str | None) -> str | None:
    """Why a worker's --coordinator (default: $LEAGUE_COORDINATOR) cannot be dialled, or None. Checked in the
    worker's main rather than by argparse, so that a bad value from the environment names the variable too."""
    if not value:
        return f"--coordinator (or ${COORDINATOR_ENV_VAR}) is required"
    try:
        check_target(value)
    except ValueError as err:
        return f"--coordinator (or ${COORDINATOR_ENV_VAR}): {err}"
    return None


def shared_root_refusal(value: Path | None, writes: str | None = None) -> str | None:
    """Why a process's --shared-root (default: $LEAGUE_SHARED_ROOT) cannot be used, or None. A bad value from the
    environment was reported as "--shared-root /x is not a directory", naming a flag that was not given.

    ``writes``: what the process writes there (a learner its checkpoints, the coordinator its snapshots), when it
    does: then a root it cannot create a file in (a read-only mount, no permission) is refused as well. Before,
    the learner and the coordinator served on a read-only root, and every publish and snapshot failed for as long
    as they ran (an ERROR every 30 s, actors waiting for a first version that never came). A full disk is not
    refused: it may pass, and a publish that meets it is retried."""
    if value is None:
        return f"--shared-root (or ${SHARED_ROOT_ENV_VAR}) is required"
    if not value.is_dir():
        return f"--shared-root (or ${SHARED_ROOT_ENV_VAR}) {value} is not a directory"
    if writes is not None:
        try:  # (os.access says nothing of what an NFS server refuses)
            fd, probe = tempfile.mkstemp(dir=value, prefix=".league-write-probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            if not out_of_space(err):
                return (f"--shared-root (or ${SHARED_ROOT_ENV_VAR}) {value}: cannot write in it "
                        f"({err.strerror or err}); {writes}")
    return None
