"""How an env failure travels from where it happened to the caller of the manager."""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass

import cloudpickle


class EnvError(RuntimeError):
    """An env failed and the manager gave up on it (retries spent); the manager is closed.

    `__cause__` is the env's own exception where there was one; its `__cause__` in turn carries the
    traceback text from the env's process.
    """

    def __init__(self, message: str, env_id: int) -> None:
        super().__init__(message)
        self.env_id = env_id


class EnvManagerClosedError(RuntimeError):
    """A call on a manager that was closed (by `close()` or after an `EnvError`)."""


class EnvManagerInterrupted(RuntimeError):
    """`interrupt()` cut a manager's call short (the actor is stopping): the envs are left mid-operation, so the
    manager is good only for `close()`."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in another process, as text (as concurrent.futures does)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class EnvFailure:
    """One failure of one env: an exception (`stage` step/reset/build), a hang or a dead process."""

    env_id: int
    stage: str
    description: str
    traceback: str = ""
    exception: BaseException | None = None

    @classmethod
    def capture(cls, env_id: int, stage: str, exc: BaseException, *, for_pickling: bool = False) -> EnvFailure:
        """Record `exc`; with `for_pickling`, keep the exception object only if it survives a round trip
        through pickle (the reply carrying it must unpickle in the parent)."""
        exception: BaseException | None = exc
        if for_pickling:
            try:
                exception = pickle.loads(_dump_exception(exc))
            except Exception:
                exception = None
        return cls(env_id, stage, repr(exc), "".join(traceback.format_exception(exc)), exception)

    def __reduce__(self) -> tuple:
        """Pickled with its exception through cloudpickle: an exception class defined in the user's `__main__`
        (or next to an env class sent by value) does not pickle by reference from a worker, whose `__main__` is
        not the parent's; plain pickle lost the env's exception there, and with it the error's `__cause__`."""
        blob = None
        if self.exception is not None:
            try:
                blob = _dump_exception(self.exception)
            except Exception:
                blob = None
        return (_restore_failure, (self.env_id, self.stage, self.description, self.traceback, blob))

    def to_error(self, failures: int, max_retry: int) -> EnvError:
        message = (
            f"env {self.env_id} failed {failures} time(s), more than max_retry={max_retry}; "
            f"last failure during {self.stage}: {self.description}"
        )
        if self.traceback:
            message += f"\n--- env traceback ---\n{self.traceback.rstrip()}"
        error = EnvError(message, self.env_id)
        if self.exception is not None and self.traceback and self.exception.__traceback__ is None:
            self.exception.__cause__ = RemoteTraceback(self.traceback)
        error.__cause__ = self.exception
        return error


def _dump_exception(exc: BaseException) -> bytes:
    return cloudpickle.dumps(exc)


def _restore_failure(env_id: int, stage: str, description: str, traceback_text: str, blob: bytes | None
                     ) -> EnvFailure:
    exception = None
    if blob is not None:
        try:
            exception = pickle.loads(blob)
        except Exception:
            exception = None
    return EnvFailure(env_id, stage, description, traceback_text, exception)
