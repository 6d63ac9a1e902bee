"""Bounds on a collect job that both ends must agree on: the coordinator checks configs against them, the
actor checks jobs and plays within them; and on the ids every service takes from the network."""

from __future__ import annotations

import re

MAX_ID_CHARS = 256
"""The longest worker, job or player id a service accepts. The coordinator issues none longer; a learner keeps the
(worker id, job id) of the streams it has seen (to drop resent chunks), and kept ids of megabytes before."""

MAX_CHECKPOINT_VERSION = 10**10 - 1
"""The largest checkpoint version: the store names a version's file with ten digits (a version above was written
and never seen again), and the coordinator takes no report above it (a reset numbers its checkpoint one above
the player's, so a report is at most one below)."""

VERSION_FILE = re.compile(r"v([0-9]{10})\.pt", re.ASCII)
"""A checkpoint version's file name in its player's directory, matched whole (`fullmatch`): a Unicode-digit
pattern took Arabic-Indic digits, and `$` a trailing newline, so a planted name of ten such digits counted as a
version above every real one. Here, not in the store, so the coordinator's snapshot copier reads it without
importing torch."""

MANIFEST_SUFFIX = ".json"
"""A published checkpoint's manifest is ``<its path>.json``; beside a version's weights may lie its training state
(``.train``) and a pin (``.pin``). Here, not in the store, for the coordinator (no torch)."""
TRAINING_STATE_SUFFIX = ".train"
PIN_SUFFIX = ".pin"

STATUS_MAX_BYTES = 256 * 2**20
"""Largest GetStatus reply the coordinator sends and status clients take (tools, `league run`, and learners,
which read their player's totals from it when they bind). The status lists every player, payoff entry and
registered worker, so it outgrows gRPC's default 4 MB in a long league (~6,000 historical players, or ~5,000
workers with long ids); requests keep the small default limit."""

MAX_ENV_NUM = 4096
"""The most environments one actor runs for a job (`env.env_num`, `run.env_num_per_actor`, `league actor
--env-num`; the wire field is an int32): each is a live env (a process of its own with the subprocess manager)
and a row of every policy forward and trajectory chunk."""

MAX_EPISODES_PER_JOB = 5_000
"""The most episodes one job reports. Every episode travels in the job's FinishJob (~80 bytes for two players
with the default ids, ~420 with the longest ids allowed), which must fit gRPC's 4 MiB message limit: a job of
60,000 episodes was refused RESOURCE_EXHAUSTED at every attempt, and its games were never counted. A job with an
env-step budget (`env.episode_num: 0`) ends early once it has played this many episodes."""


def shown_id(text: str, limit: int = 80) -> str:
    """An id or key a peer sent, for an error message or a log line: quoted and escaped (no control characters
    reach a terminal or forge a log line) and cut to `limit` characters (a 20 MB id made a 20 MB log record, and a
    status detail over gRPC's metadata limit, which the peer saw as RESOURCE_EXHAUSTED and retried)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
