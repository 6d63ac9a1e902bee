"""Errors the coordinator raises for bad requests; the servicer maps each class to one gRPC status code.

They carry the offending field's name so a client sees *what* was wrong, not just that something was.
"""

from __future__ import annotations


class RequestError(Exception):
    """A request the league refuses; `field` names the part of the request at fault ("" when none)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class NotFoundError(RequestError):
    """An id (worker, job, player) the league does not know."""


class InvalidArgumentError(RequestError, ValueError):
    """A malformed request: a missing field, a negative or non-finite number, a path outside the shared root."""


class FailedPreconditionError(RequestError):
    """A well-formed request the league's state does not allow now (an expired lease, a job of another worker)."""


class WorkerIdInUseError(RequestError):
    """The worker id belongs to another process now: two processes were started with the same --worker-id
    (ALREADY_EXISTS; the one refused stops, naming the other)."""


class StateWriteError(RequestError, RuntimeError):
    """The coordinator could not commit its state, so it acknowledges nothing more: UNAVAILABLE (worth
    retrying), since the process exits and its restart on the durable state serves the retry."""

    def __init__(self) -> None:
        super().__init__("", "the coordinator could not write its state (it restarts on its durable state)")
