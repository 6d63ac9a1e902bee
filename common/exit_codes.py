"""Exit statuses of the `league` worker processes, shared with what supervises them (`league run`).

A supervisor restarts a worker that failed while running, but not one that exits with `SETUP_ERROR_EXIT`:
that worker was given bad arguments or a job it cannot set up (a policy section it refuses, an env that
does not exist, a model the env's observations do not fit), and a restart would fail the same way. A server
whose port is taken exits with `ADDRESS_IN_USE_EXIT`, which says so.
"""

from __future__ import annotations

FAILURE_EXIT = 1
"""Failed while running (a crash, a lost coordinator, a learner error mid-training): worth a restart."""

SETUP_ERROR_EXIT = 2
"""Bad arguments or a job it cannot set up: restarting would fail the same way (argparse's status too)."""

ADDRESS_IN_USE_EXIT = 3
"""Another process holds the port it was told to listen on. Not a setup error: the port may be free again, or
the worker can be started on another one (`league run` restarts a learner on a free port)."""

INTERRUPTED_EXIT = 130
"""A shell's code for a command ended by Ctrl-C (128 + SIGINT): `league` stopped before it was under way."""
