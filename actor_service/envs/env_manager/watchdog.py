"""Hang detection for envs run in this process (BaseEnvManager): a watchdog thread that interrupts an env
operation (build, seed + reset, step, close) running past its timeout, so the manager can count the env as
failed and rebuild it.

How the interrupt gets in, by the thread that runs the operation:
- the main thread: the watchdog sends it `INTERRUPT_SIGNAL` (a real-time signal: SIGALRM and the interval
  timer belong to others, pytest-timeout for one), whose handler raises `EnvHangInterrupt`. A signal also
  breaks blocking calls (sleep, lock and Event waits, socket reads), so a hang in Python code or in such a
  wait is interrupted. The handler is installed by watchdogs created in the main thread.
- any other thread: `PyThreadState_SetAsyncExc` raises `EnvHangInterrupt` at the thread's next bytecode. A
  hang in Python code (a loop) is interrupted; a thread blocked in a system call or in C code is not, until
  that call returns.

Limits: a hang inside C code that never returns (holding the GIL, or, outside the main thread, any blocking
call) cannot be interrupted in process. The operation still counts as a hang if it ever returns, and
`overdue_s` grows meanwhile, which lets a caller give up on the manager (the actor stops renewing its job's
lease). Envs that may hang in C code belong in the SubprocessEnvManager: a hung worker process is killed.

Timing: `begin` reads no clock (a clock read cost more than the rest of the bookkeeping of a light env's
step). The watchdog thread polls instead, `POLLS_PER_TIMEOUT` times per timeout, and times an operation from
the poll that first sees it: an env is interrupted between `timeout` and `timeout * (1 + 2 / POLLS_PER_TIMEOUT)`
after its operation began.

`EnvHangInterrupt` is a BaseException, so an env's `except Exception` does not swallow it.
"""

from __future__ import annotations

import ctypes
import logging
import math
import queue
import signal
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

INTERRUPT_SIGNAL = signal.SIGRTMIN + 5

POLLS_PER_TIMEOUT = 8

# After an interrupt, how long (at least 1 s, at most the operation's timeout) before the watchdog reports
# that it did not get in.
_STUCK_REPORT_MIN_S = 1.0

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc  # (thread id, exception type or NULL to clear)


class EnvHangInterrupt(BaseException):
    """Raised inside an env operation that ran past its timeout (see the module doc)."""


# An operation: (env_id, stage, timeout_s, thread_ident, claim). A plain tuple: one is made for every
# env step. `claim` is a one-item list; whoever pops the item first owns the operation's end: the thread that
# ran it (it finished in time) or the watchdog (it interrupts it). `list.pop` is atomic under the GIL.
_Op = tuple[int, str, float, int, list]
_ENV_ID, _STAGE, _TIMEOUT, _THREAD, _CLAIM = range(5)


def _describe(op: _Op, late: bool = False) -> str:
    return f"env {op[_ENV_ID]} {op[_STAGE]} ran past its {op[_TIMEOUT]:g} s timeout" + (" (returned late)" if late else "")


class _MainThreadSignal:
    """The process-wide handler of INTERRUPT_SIGNAL: raises in the main thread for the operation a watchdog
    flagged, and does nothing for a signal whose operation has been dealt with already."""

    lock = threading.Lock()
    users = 0
    previous: Any = None
    flagged: _Op | None = None

    @classmethod
    def acquire(cls) -> bool:
        """Install the handler; False when not called from the main thread (only it may install one)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        with cls.lock:
            previous = signal.signal(INTERRUPT_SIGNAL, cls.handle)
            if previous != cls.handle:  # (a release from another thread may have left ours installed)
                cls.previous = previous
            cls.users += 1
        return True

    @classmethod
    def release(cls) -> None:
        """Restore the previous handler once the last user is gone (from the main thread; from another
        thread the handler stays: with nothing flagged it does nothing)."""
        with cls.lock:
            cls.users -= 1
            if cls.users == 0 and threading.current_thread() is threading.main_thread():
                signal.signal(INTERRUPT_SIGNAL, cls.previous if cls.previous is not None else signal.SIG_DFL)

    @classmethod
    def installed(cls) -> bool:
        return signal.getsignal(INTERRUPT_SIGNAL) == cls.handle

    @classmethod
    def handle(cls, signum: int, frame: object) -> None:
        op, cls.flagged = cls.flagged, None
        if op is not None:
            raise EnvHangInterrupt(_describe(op))


class Watchdog:
    """Watches the env operations of one manager (run one at a time) from a thread of its own.

    The manager brackets each operation:

        op = watchdog.begin(env_id, stage, timeout_s)
        try:
            result = env_call()
        except BaseException as exc:
            raise watchdog.raised(op, exc)
        watchdog.end(op)

    An interrupted operation surfaces as EnvHangInterrupt: raised by the interrupt itself (its traceback shows
    where the env hung), or by `raised`/`end` when the interrupt was swallowed or could not get in (the call
    returned late). The manager then calls `settle()` before anything else, so that no interrupt stays
    pending for later code.

    A loop over many light env steps may inline `begin` and `end` (BaseEnvManager.step does: two method calls
    cost a light env a few percent): publish `op = (env_id, stage, timeout_s, thread_ident, [True])` as
    `current`, call `poll_for(timeout_s)` if `timeout_s < polling_for`, and after the call pop `op[-1]`; an IndexError there
    means the watchdog claimed the operation: `raise watchdog.late(op)`.
    """

    def __init__(self, name: str) -> None:
        self.current: _Op | None = None  # the operation under way, or the last one
        # Wake-ups for the watchdog thread. A SimpleQueue, not an Event: its `put` is one C call, so an
        # interrupt that lands right after it cannot leave a lock held (Event.set runs Python code under a lock).
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        # The shortest timeout of any operation so far: the watchdog thread polls at its pace (inf: it waits to
        # be woken), also while the manager is idle, so that `begin` wakes it only for a shorter timeout.
        self.polling_for = math.inf
        self._seen: _Op | None = None  # the operation the watchdog thread is timing ...
        self._seen_at = 0.0  # ... since the poll that first saw it
        self._closed = False
        self._lock = threading.Lock()  # held by the watchdog from claiming an operation to sending its interrupt
        self._interrupted: _Op | None = None  # the last operation the watchdog interrupted ...
        self._settled: _Op | None = None  # ... once its thread has dealt with that
        self._reported: _Op | None = None  # ... once the watchdog has said that the interrupt did not get in
        self._cut: tuple[_Op, float] | None = None  # the operation `cut_short` asked to interrupt, and when
        self._signal = _MainThreadSignal.acquire()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- the manager's side (begin/end run around every env step: keep them cheap) -------------------------
    def begin(self, env_id: int, stage: str, timeout_s: float, thread: int | None = None) -> _Op:
        """`thread`: the calling thread's ident, if the caller has it at hand (saves looking it up)."""
        op = (env_id, stage, timeout_s, thread or threading.get_ident(), [True])
        self.current = op
        if timeout_s < self.polling_for:  # the watchdog polls too seldom for this one (or not at all)
            self.poll_for(timeout_s)
        return op

    def poll_for(self, timeout_s: float) -> None:
        """Make the watchdog thread poll at the pace `timeout_s` needs, from now on. Set here, by the manager's
        thread, not by the watchdog's: that one may not get the GIL for a long while when light env steps run
        back to back, and until it did, every step would wake it again (measured: a wake-up per step)."""
        self.polling_for = timeout_s
        self._wake.put(None)

    def end(self, op: _Op) -> None:
        """The env call returned."""
        try:
            op[_CLAIM].pop()
        except IndexError:  # the watchdog claimed it: an interrupt was sent, or is being sent
            raise self.late(op) from None

    def late(self, op: _Op) -> EnvHangInterrupt:
        """For an operation whose env call returned after the watchdog had claimed it: settles the interrupt
        and returns the EnvHangInterrupt to raise."""
        self.settle()
        return EnvHangInterrupt(_describe(op, late=True))

    def raised(self, op: _Op, exc: BaseException) -> BaseException:
        """The env call raised `exc`: what to raise instead, an EnvHangInterrupt if the watchdog interrupted
        the call (`exc` itself, if that is the interrupt), else `exc`."""
        try:
            op[_CLAIM].pop()
        except IndexError:
            self.settle()
            if isinstance(exc, EnvHangInterrupt):
                return exc
            hang = EnvHangInterrupt(_describe(op, late=True))
            hang.__context__ = exc
            return hang
        return exc

    def settle(self) -> None:
        """After an interrupt: wait until it has been sent, then drop it if it has not got in yet, so that it
        cannot surface in later code. Idempotent."""
        with self._lock:  # the watchdog holds it while it sends
            op = self._interrupted
        if op is None or self._settled is op:
            return
        if _MainThreadSignal.flagged is op:
            _MainThreadSignal.flagged = None
        if op[_THREAD] != threading.main_thread().ident:
            _set_async_exc(ctypes.c_ulong(op[_THREAD]), None)
        self._settled = op

    def interrupted(self) -> tuple[str, float]:
        """(stage, timeout) of the operation last interrupted, to describe the failure."""
        op = self._interrupted
        return ("step", math.nan) if op is None else (op[_STAGE], op[_TIMEOUT])

    def cut_short(self) -> None:
        """Interrupt the operation under way now, as if its timeout had passed (the manager's caller is
        stopping); its deadline, for `overdue_s`, is now. Safe from any thread and from a signal handler: the
        watchdog thread sends the interrupt."""
        op = self.current
        if op is not None and op[_CLAIM]:
            self._cut = (op, time.monotonic())
            self._wake.put(None)

    def overdue_s(self) -> float:
        """How long the operation under way has run past its deadline (its timeout, or a `cut_short`) without
        its thread getting back from the env (0 if none): stays near 0 while interrupts get in, grows while an
        env hangs where none does. Safe to call from any thread."""
        op = self.current
        if op is None or self._settled is op or not (op[_CLAIM] or self._interrupted is op):
            return 0.0
        return max(0.0, time.monotonic() - self._deadline(op))

    def _deadline(self, op: _Op) -> float:
        """When `op` was due: its timeout after the poll that first saw it, or when it was cut short (inf: not
        seen yet, not cut)."""
        deadline = self._seen_at + op[_TIMEOUT] if op is self._seen else math.inf
        cut = self._cut
        return min(deadline, cut[1]) if cut is not None and cut[0] is op else deadline

    def _was_cut(self, op: _Op) -> bool:
        """Whether `cut_short` asked to interrupt `op` (rather than its timeout)."""
        cut = self._cut
        return cut is not None and cut[0] is op

    def _describe(self, op: _Op) -> str:
        if self._was_cut(op):
            return f"env {op[_ENV_ID]} {op[_STAGE]} was cut short (the manager was interrupted)"
        return _describe(op)

    def close(self) -> None:
        """Stop the watchdog thread and release the signal handler. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self._signal:
            self._signal = False
            _MainThreadSignal.release()

    # ---- the watchdog thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        wake = self._wake
        while True:
            while not wake.empty():
                wake.get_nowait()
            if self._closed:
                return
            op = self.current
            now = time.monotonic()
            until = math.inf
            if op is not None and op[_CLAIM]:  # running
                if self._was_cut(op):
                    self._interrupt(op)
                    continue
                if op is not self._seen:  # it began since the last poll
                    self._seen, self._seen_at = op, now
                elif now - self._seen_at >= op[_TIMEOUT]:
                    self._interrupt(op)
                    continue
            if self.polling_for < math.inf:
                until = now + self.polling_for / POLLS_PER_TIMEOUT
            if op is not None and op is self._interrupted and self._settled is not op and self._reported is not op:
                due = self._deadline(op)
                report_at = due + min(max(_STUCK_REPORT_MIN_S, op[_TIMEOUT]), 60.0)
                if now < report_at:
                    until = min(until, report_at)
                else:
                    self._reported = op
                    logger.error(
                        "%s and is still in it %.1f s after the interrupt: it is blocked where no interrupt gets "
                        "in (C code, or a system call outside the main thread); it counts as failed if it ever "
                        "returns. Envs that can hang like this belong in a SubprocessEnvManager.",
                        self._describe(op), now - due,
                    )
                    continue
            try:
                wake.get(timeout=None if until == math.inf else until - now)
            except queue.Empty:
                pass  # time for the next poll

    def _interrupt(self, op: _Op) -> None:
        with self._lock:
            try:
                op[_CLAIM].pop()
            except IndexError:
                return  # it ended just now
            self._interrupted = op
            if op[_THREAD] == threading.main_thread().ident and _MainThreadSignal.installed():
                _MainThreadSignal.flagged = op
                signal.pthread_kill(op[_THREAD], INTERRUPT_SIGNAL)
                how = "signalled the main thread"
            else:
                _set_async_exc(ctypes.c_ulong(op[_THREAD]), ctypes.py_object(EnvHangInterrupt))
                how = f"raised EnvHangInterrupt in thread {op[_THREAD]}"
        # A cut is what a stopping caller asked for (an actor's SIGTERM lands in a step most of the time), not a
        # fault: said at INFO. A timeout is the env's fault; one that does not come back is reported as an ERROR.
        (logger.info if self._was_cut(op) else logger.warning)("%s: %s", self._describe(op), how)
