"""SubprocessEnvManager: envs in worker processes, several per worker, stepped asynchronously.

Each worker process (started with `spawn`: gRPC channels do not survive fork) runs a group of envs and steps
the whole group in one message, which is what makes light envs fast: the per-message pipe round trip is
shared by the group. Observations go through shared memory; large ones are handed to the caller in place,
without a copy, from a small pool of slots per env that are written again only once the caller no longer
holds them (shared_memory.py). `step` returns once `wait_num` envs have results or `timeout` has passed; the
others stay in flight and come back from a later call. A process expecting a message soon busy-waits on a
doorbell in shared memory instead of sleeping in a system call (waking a sleeper costs more than a light
env's step; see doorbell.py), where it has a CPU to spare.

Sizing: the defaults suit light envs (CartPole, board games: well under 100 us a step). For heavy envs
(~100 us a step and more, e.g. an Atari-like 84x84x4 frame) set `num_workers` to the CPU count: see
SubprocessEnvManagerConfig. The manager cannot tell the two apart before it has started its workers.

Faults: an env exception is sent back with the env's traceback and the env is rebuilt inside its worker;
a worker that dies (e.g. SIGKILL) or gives no reply within `step_timeout`/`reset_timeout` is killed and
started again with its envs. Each env may fail `max_retry` times; then the manager closes and raises. A dead
worker is reaped as soon as it is found: by the next `step` (or other call) that waits for replies, within
`_SWEEP_S` even while the other workers keep it busy; an idle manager finds it at its next call. A worker
dies with the manager's process (worker.py), and a manager left open at interpreter exit is closed then
(`_close_open_managers`).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import math
import multiprocessing
import multiprocessing.util
import os
import pickle
import queue
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import cloudpickle
import numpy as np

from actor_service.envs.env_manager import shared_memory
from actor_service.envs.env_manager.base import (
    _BOOLS,
    BaseEnvManager,
    EnvFactory,
    EnvManagerConfig,
    EnvState,
    _Lifecycle,
    is_int_count,
)
from actor_service.envs.env_manager.doorbell import Doorbells, SpinBudget
from actor_service.envs.env_manager.failure import EnvFailure
from actor_service.envs.env_manager.pipe import MessagePipe, UnreadableMessageError
from actor_service.envs.env_manager.shared_memory import RESET_SLOT, STEP_SLOT, ObsBuffer, pool_size_for
from actor_service.envs.env_manager.shm_blocks import remove_orphaned_blocks
from actor_service.envs.env_manager.worker import (
    RESET_DONE,
    RESET_FOLLOWS,
    STEP,
    WORKER_IGNORED_SIGNALS,
    AckReply,
    AttachCommand,
    CloseCommand,
    ReadyReply,
    ResetCommand,
    ResetReply,
    StartFailedReply,
    worker_main,
)
from common.envs.base import NO_INFO, TimeStep

logger = logging.getLogger(__name__)

_POLL_EVENTS = select.POLLIN | select.POLLHUP | select.POLLERR
# While waiting for replies, how often the manager also looks for workers that died or ran past their deadline
# (`_sweep`). A wait that finds its reply by busy-waiting on a doorbell makes no poll, and a dead worker rings
# no doorbell: without this, a worker killed while the others kept answering stayed an unreaped zombie, its envs
# in flight, until a reset (an actor's next job) had to wait for it.
_SWEEP_S = 0.05
# The longest a wait for replies sleeps before it looks at `interrupt()`'s flag again (a caller stopping while a
# worker builds a slow env, or hangs until its deadline a minute away, waits no longer than this).
_INTERRUPT_CHECK_S = 0.1
# How long a worker whose pipe closed (EOF) has to finish exiting before it is killed: its own exit code names the
# failure (`os._exit(3)` in an extension, say), not the kill's.
_EXIT_GRACE_S = 1.0

# Held strongly until `close`: a manager dropped without `close` must still be closed at exit (its workers
# ignore SIGTERM, and one stuck in an env, or started with `fork`, never reads EOF: multiprocessing's exit hook
# would join it for ever).
_open_managers: set[SubprocessEnvManager] = set()


def _close_open_managers() -> None:
    """At interpreter exit, close the managers a program left open (an exception escaped before its `close`).
    Registered after multiprocessing's own exit hook (imported above), so it runs first: that hook SIGTERMs
    daemon processes and then joins them without a timeout, and workers ignore SIGTERM and never read EOF
    while this process holds their pipes, so the program hung at exit for ever."""
    for manager in list(_open_managers):
        try:
            manager.close()
        except Exception:
            logger.exception("closing an env manager left open at exit raised")


atexit.register(_close_open_managers)
# A child forked from this process (os.fork) has copies of the managers, not the managers: closing them at its
# exit would close the parent's workers.
os.register_at_fork(after_in_child=_open_managers.clear)


def _start_with_stop_signals_blocked(process: BaseProcess) -> None:
    """Start a worker with SIGINT and SIGTERM blocked in the starting thread: the child inherits the mask (through
    `exec` too, with `spawn`), so a Ctrl-C sent to the actor's process group while the worker still starts stays
    pending until `worker_main` ignores both signals and unblocks them, as it would ignore one a moment later.
    Before, such a Ctrl-C was a KeyboardInterrupt traceback out of the worker's unpickling and a dead worker. (As
    the standard library's resource tracker is started. Not for `forkserver`, whose server this may start: it
    would keep the mask.)"""
    if getattr(process, "_start_method", None) == "forkserver":
        process.start()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORED_SIGNALS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _Launcher:
    """Starts worker processes from a thread that lives as long as this process. A worker's parent-death signal
    (worker._follow_parent) is tied by the kernel to the *thread* that forked it: started from a thread that
    ends (a per-job or pool thread driving the manager, or the call that found a worker dead), the worker was
    SIGKILLed then, with the manager still in use; or, if the thread ended before the worker's prctl, it
    lived on, tied to whichever thread the kernel handed it to. The main thread starts its workers itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue | None = None
        self._pid = 0

    def start(self, process: BaseProcess) -> None:
        if threading.current_thread() is threading.main_thread():
            _start_with_stop_signals_blocked(process)
            return
        with self._lock:
            if self._requests is None or self._pid != os.getpid():  # none yet, or forked: no thread here
                self._requests, self._pid = queue.SimpleQueue(), os.getpid()
                threading.Thread(target=self._serve, args=(self._requests,), name="env-worker-launcher",
                                 daemon=True).start()
            requests = self._requests
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        requests.put((process, started))
        started.result()  # raises what process.start() raised

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            process, started = requests.get()
            try:
                _start_with_stop_signals_blocked(process)
            except BaseException as exc:  # handed to the caller
                started.set_exception(exc)
            else:
                started.set_result(None)


_launcher = _Launcher()


@dataclass(frozen=True)
class SubprocessEnvManagerConfig(EnvManagerConfig):
    """Adds to EnvManagerConfig:

    - `num_workers`: worker processes; envs are split evenly among them. Default: one fewer than the CPUs
      (at least one, at most one per env), leaving a CPU to the parent, which acts for every env. Fewer
      workers than envs means several envs per worker and fewer messages.
    - `num_splits`: each worker's envs are stepped in this many separate messages. With 2, a worker steps
      one half while the parent handles the other half's results, so neither side waits for the other
      (double buffering). Default: 2 where every process has a CPU of its own (see below), else 1 (the
      parent then shares a CPU with a worker, and each extra message costs both a wake-up).
    - `wait_num`: `step` returns once this many envs have results. Default: the envs of one split (one
      message), so `step` returns as soon as any worker answers. Set it to the env count to step in lockstep.
    - `timeout`: seconds after which `step` returns with whatever has arrived (at least one env), if
      `wait_num` envs are not ready by then (default: no limit).
    - `step_timeout` (from EnvManagerConfig): here, seconds a worker may take for one step command (all its
      envs in it) before it is deemed hung and killed. None: no limit.
    - `reset_timeout` (from EnvManagerConfig): the same for starting a worker process and resetting its envs,
      and for the automatic reset after an episode ended of an env whose last reset took over 1 ms (it
      follows the step's reply, worker.py). A faster one runs inside the step command (no extra message),
      under `step_timeout`: one that suddenly hangs there is a hung step.
    - `shared_memory`: observations through shared memory when they are numpy arrays.
    - `close_timeout`: seconds `close` lets workers exit on their own before killing them.
    - `start_method`: multiprocessing start method; `spawn` because gRPC does not survive `fork`.
    - `spin_s`: at most how long a process waiting for a message busy-waits on a shared-memory doorbell
      before it sleeps in a system call (waking a sleeping process costs tens of microseconds on these
      machines, more than a light env's step). Each process spins only while recent messages came within
      this time (it halves its spin after each longer wait) and not at all right after another process
      wanted its CPU (`doorbell.SpinBudget`), so a slow caller (long inference between steps) soon stops
      workers from spinning. Workers spin for commands when there are no more workers than CPUs; the
      parent spins for replies only where every process has a CPU of its own, else it sleeps (spinning,
      it would hold a CPU that a worker needs). 0: nobody spins. The default, 1 ms, covers the parent's
      turnaround where it shares a CPU with a worker stepping heavy envs (its wake-up, the rest of that
      worker's time slice, its own work: 0.1-0.3 ms measured on 2 cores); with 0.2 ms workers gave up
      spinning and slept too often (84x84x4 env: 1.49-1.55x one bare env, against 1.56-1.62x).

    - `cpus`: how many CPUs the manager sizes itself for (the worker count, splits and spinning above). None:
      every CPU this process may run on. Set it where other busy processes share those CPUs, or where a
      container's CPU quota is smaller than the CPUs it sees (quotas do not show in the CPU affinity): several
      actors on one machine each sized for the whole machine start too many workers, split their envs in
      halves and busy-wait for replies, all for CPUs the others are using (`league run` gives each of its
      actors its share).

    "Every process has a CPU of its own" means workers + 1 <= CPUs (the parent is the +1).

    Sizing (measured on 2 cores, BENCHMARKS.md): the defaults (there: one worker, two halves, spinning)
    suit light envs (CartPole, board games: well under 100 us a step), where moving steps between
    processes is the cost. For heavy envs (an Atari-like 84x84x4 frame and ~100 us of work a step) set
    `num_workers` to the CPU count: then the envs are the cost, and every CPU steps envs while the parent
    fits in between (one message per worker and step; workers spin for commands, the parent sleeps). The
    manager does not choose this itself: how heavy the envs are shows only once they run in their workers,
    and envs cannot move between workers afterwards.
    """

    num_workers: int | None = None
    num_splits: int | None = None
    wait_num: int | None = None
    timeout: float | None = None
    shared_memory: bool = True
    close_timeout: float = 2.0
    start_method: str = "spawn"
    spin_s: float = 1e-3
    cpus: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("num_workers", "num_splits", "wait_num", "cpus"):
            value = getattr(self, name)
            if value is not None and (not is_int_count(value) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
            if value is not None:
                object.__setattr__(self, name, int(value))  # a numpy integer as the int it stands for
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {self.timeout!r}")
        if not self.spin_s >= 0:
            raise ValueError(f"spin_s must be >= 0 seconds, got {self.spin_s!r}")
        if not self.close_timeout >= 0:
            raise ValueError(f"close_timeout must be >= 0 seconds, got {self.close_timeout!r}")
        if self.start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"start_method {self.start_method!r} is not one of {multiprocessing.get_all_start_methods()}")


def _deadline(timeout: float | None) -> float:
    """When a reply due within `timeout` seconds from now is overdue (None: never)."""
    return math.inf if timeout is None else time.monotonic() + timeout


class _Worker:
    """Parent-side handle of one worker process and the commands it has not answered yet."""

    def __init__(self, index: int, env_ids: tuple[int, ...], process: BaseProcess, conn: MessagePipe) -> None:
        self.index = index
        self.env_ids = env_ids
        self.pid = process.pid
        self.process = process
        self.sentinel = process.sentinel
        self.conn = conn
        self.pending: deque[tuple[str, float | None]] = deque()  # (what, timeout), oldest first
        self.deadline = math.inf  # by when the oldest pending command must be answered
        self.obs_specs: tuple | None = None  # from the ready reply

    def sent(self, what: str, timeout: float | None) -> None:
        """A command was sent: the worker starts on it at once if it had nothing pending."""
        if not self.pending:
            self.deadline = _deadline(timeout)
        self.pending.append((what, timeout))

    def answered(self) -> None:
        """The oldest pending command was answered: the worker starts on the next one now."""
        self.pending.popleft()
        self.deadline = _deadline(self.pending[0][1]) if self.pending else math.inf

    def resetting(self, timeout: float | None) -> None:
        """The step reply just answered said an automatic reset follows: the worker sends its reply before it
        starts on the commands pending, and has `timeout` (the reset timeout) from now for it."""
        self.pending.appendleft(("automatic reset", timeout))
        self.deadline = _deadline(timeout)

    def describe(self) -> str:
        return f"env worker {self.index} (pid {self.pid}, envs {list(self.env_ids)})"


_PLAIN_ACTIONS = (int, float, np.integer, np.floating)
"""Actions that always pickle (the hot path checks no further)."""


class SubprocessEnvManager(BaseEnvManager):
    """Same interface and trajectories as BaseEnvManager; envs run in `num_workers` processes."""

    def __init__(self, env_fns: Sequence[EnvFactory], config: SubprocessEnvManagerConfig | None = None) -> None:
        config = config or SubprocessEnvManagerConfig()
        if not isinstance(config, SubprocessEnvManagerConfig):
            raise TypeError(f"config must be a SubprocessEnvManagerConfig, got {type(config).__name__}")
        super().__init__(env_fns, config)
        self._sconfig = config
        cpus = config.cpus or len(os.sched_getaffinity(0))
        num_workers = min(config.num_workers or max(1, cpus - 1), self.env_num)
        own_cpus = num_workers < cpus  # every process (the parent too) can have a CPU of its own
        num_splits = config.num_splits or (2 if own_cpus else 1)
        self._worker_spin_s = config.spin_s if num_workers <= cpus else 0.0
        self._parent_spin_s = config.spin_s if own_cpus else 0.0
        self._spin_budget: SpinBudget | None = None  # the parent's
        groups = np.array_split(np.arange(self.env_num), num_workers)
        self._groups = [tuple(int(i) for i in group) for group in groups]
        self._worker_of = [0] * self.env_num
        self._split_of = [0] * self.env_num
        split_size = 1
        for index, group in enumerate(self._groups):
            for split, envs in enumerate(np.array_split(np.asarray(group), min(num_splits, len(group)))):
                split_size = max(split_size, len(envs))
                for env_id in envs:
                    self._worker_of[env_id] = index
                    self._split_of[env_id] = index * num_splits + split
        self._num_splits = num_splits
        self._wait_num = config.wait_num or split_size
        self._ctx = multiprocessing.get_context(config.start_method)
        self._workers: list[_Worker | None] = [None] * num_workers
        self._closing: list[_Worker] = []  # asked to close, not reaped yet (a `close` cut short finishes them)
        self._poller = select.poll()
        self._fd_owner: dict[int, _Worker] = {}
        self._restarts = 0  # bumped whenever a worker is replaced: fd numbers may then be reused
        self._buffer: ObsBuffer | None = None
        self._doorbells: Doorbells | None = None
        self._step_slot = [STEP_SLOT] * self.env_num  # where each env's step in flight writes its observation
        # The seed from `seed()` each env's reset in flight was sent with: a failed one is rebuilt from it (it
        # played nothing from it), as the serial manager's is (`BaseEnvManager._recover`).
        self._unplayed_seeds: dict[int, int] = {}
        self._waiting_until = math.inf  # the reply deadline `_pump` is waiting towards (inf: not waiting)
        self._sweep_at = 0.0  # when `_pump` next looks for dead and hung workers (_sweep)
        _open_managers.add(self)

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def num_splits(self) -> int:
        return self._num_splits

    @property
    def wait_num(self) -> int:
        return self._wait_num

    @property
    def worker_spin_s(self) -> float:
        """How long workers may busy-wait for a command (0: they sleep until it arrives)."""
        return self._worker_spin_s

    @property
    def parent_spin_s(self) -> float:
        """How long `step` may busy-wait for replies (0: it sleeps until one arrives)."""
        return self._parent_spin_s

    def stalled_s(self) -> float:
        """How long the manager has been past the reply deadline it waits for without acting on it (0 if
        none): a hung worker is killed at its deadline, so this stays near 0 unless the parent itself is
        stuck. Safe to call from any thread."""
        return max(0.0, time.monotonic() - self._waiting_until)

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes."""
        return [w.pid for w in self._workers if w is not None]

    # ---- public calls ----------------------------------------------------------------------------------
    def step(self, actions: Mapping[int, Any]) -> dict[int, TimeStep]:
        """Send the actions, then return the timesteps of at least `wait_num` envs in flight (or whatever
        arrived within `timeout`, at least one); the other envs stay in flight and come back from a later
        call. An env whose episode ended and whose reset is slow (over 1 ms) is reset in its worker after it
        has returned its last timestep, so it is back in `ready_env` once that reset has landed (during this
        call or a later one). `step({})` collects envs still in flight; with none, it waits until an env
        being reset is ready (returning {}), and returns at once if nothing is under way."""
        if self._lifecycle is not _Lifecycle.RUNNING or self._interrupted:
            self._check_running()
        batches: dict[int, list[tuple[int, Any, bool, int]]] = {}
        split_of = self._split_of
        next_obs = self._next_obs
        in_flight = self._in_flight
        endless = self._episode_num == math.inf
        buffer = self._buffer
        pooled = buffer is not None and bool(buffer.pool_slots)
        step_slot = self._step_slot
        undelivered = self._results  # timesteps not returned yet (landed during a partial reset)
        for env_id, action in actions.items():  # before anything changes: a send that fails leaves it as it was
            if not isinstance(action, _PLAIN_ACTIONS):
                self._check_sendable(env_id, action, "action")
        for env_id, action in actions.items():
            if env_id not in next_obs or env_id in in_flight or env_id in undelivered or isinstance(env_id, _BOOLS):
                raise ValueError(self._not_ready_message(env_id))
            if isinstance(action, np.integer):
                # A numpy integer pickles ~20x slower than a Python int, and an env sees the same value. Other
                # numpy scalars go as they are: float32 arithmetic differs from a Python float's, and the
                # serial manager hands the env what the caller gave.
                action = int(action)
            slot = step_slot[env_id] = buffer.free_slot(env_id) if pooled else STEP_SLOT
            batch = batches.get(split_of[env_id])
            if batch is None:
                batch = batches[split_of[env_id]] = []
            batch.append((env_id, action, endless or self._resets_on_done(env_id), slot))
        in_flight.update(actions)
        for items in batches.values():
            worker = self._workers[self._worker_of[items[0][0]]]
            self._send(worker, (STEP, tuple(items)), "step", self._sconfig.step_timeout)
        results = self._results
        want = min(self._wait_num, len(results) + len(self._in_flight))
        if want:
            if not self._pump(lambda: len(results) >= want, self._sconfig.timeout):
                self._pump(lambda: bool(results) or not self._in_flight, None)
        else:  # `step({})` with nothing stepping: wait for an env being reset or rebuilt, if any
            ready = len(self.ready_env)
            self._pump(lambda: bool(results) or len(self.ready_env) > ready, None)
        self._results = {}
        return results

    def close(self) -> None:
        """Stop every worker (asked first, killed after `close_timeout`), reap them, free shared memory.

        Interrupted (a Ctrl-C while it waits for the workers), it still kills and reaps them and frees the
        memory before the interrupt goes on; should even that be cut short, the manager stays registered for
        the exit hook and a later `close` finishes it. (It was marked closed first: a second close did nothing,
        the blocks stayed in /dev/shm, and multiprocessing's exit hook waited for ever on the workers, which
        ignore SIGTERM; a review.)"""
        if self._lifecycle is _Lifecycle.CLOSED and not self._closing and self._buffer is None \
                and self._doorbells is None:
            return
        self._lifecycle = _Lifecycle.CLOSED
        fresh = [w for w in self._workers if w is not None and w not in self._closing]
        self._closing.extend(fresh)  # before they leave `_workers`: an interrupt between loses none
        self._workers = [None] * len(self._workers)
        for worker in fresh:
            try:
                worker.conn.send(CloseCommand())
            except OSError:
                pass  # the worker is already gone; it is reaped below like the others
        try:
            deadline = time.monotonic() + self._sconfig.close_timeout
            for worker in fresh:
                worker.process.join(max(0.0, deadline - time.monotonic()))
        finally:
            while self._closing:
                self._stop(self._closing[0])  # (killed now if the wait was cut short)
                self._closing.pop(0)
            self._next_obs.clear()  # (observations from pool slots: the block is unmapped once nobody holds them)
            self._results.clear()
            if self._buffer is not None:
                self._buffer.close()
                self._buffer = None
            if self._doorbells is not None:
                self._doorbells.close()
                self._doorbells = None
            _open_managers.discard(self)

    # ---- launch and reset ------------------------------------------------------------------------------
    def _launch(self, reset_params: Mapping[int, Mapping[str, Any]] | None) -> None:
        self._set_reset_params(self._reset_map(reset_params))
        remove_orphaned_blocks()  # of managers whose whole process group was SIGKILLed (shm_blocks.py)
        if self._worker_spin_s > 0 or self._parent_spin_s > 0:
            self._doorbells = Doorbells.create(len(self._workers))
        if self._parent_spin_s > 0:
            self._spin_budget = SpinBudget(self._parent_spin_s)
        for index in range(len(self._workers)):
            self._start_worker(index)
        self._pump(lambda: all(w.obs_specs is not None for w in self._workers), None)
        obs_spec = self.env_info.obs_spec
        same_specs = all(spec == obs_spec for w in self._workers for spec in w.obs_specs)
        if self._sconfig.shared_memory and same_specs and shared_memory.supports(obs_spec):
            self._buffer = ObsBuffer.create(obs_spec, self.env_num, pool_size_for(obs_spec, self.env_num))
            for worker in self._workers:
                self._send(worker, AttachCommand(self._buffer.layout), "attach", self._sconfig.reset_timeout)
            self._pump(self._idle, None)
        self._reset_envs(range(self.env_num))

    def _reset_envs(self, env_ids: Sequence[int]) -> None:
        env_ids = list(env_ids)
        # What the last job left is settled first: steps in flight land (so no stale reply follows the reset),
        # workers that died while idle are replaced. The failures of the envs being reset found here are not
        # counted: reset starts their fresh max_retry budget, and found only by the reset's own command, a
        # death between jobs was the new job's first failure (with max_retry 0, the job failed at once).
        self._uncounted = frozenset(env_ids)
        try:
            self._pump(self._idle, None)
            self._replace_dead_idle_workers(self._uncounted)
        finally:
            self._uncounted = frozenset()
        seeds = self._take_seeds(env_ids)
        self._unplayed_seeds.update({env_id: seeds[env_id] for env_id in env_ids if seeds[env_id] is not None})
        self._start_reset(env_ids)
        wanted = set(env_ids)
        for worker in self._workers:
            ids = [env_id for env_id in worker.env_ids if env_id in wanted]
            if ids:
                self._send_reset(worker, ids, seeds, rebuild=False)
        self._pump(lambda: all(self._state[env_id] is EnvState.RUN for env_id in env_ids), None)
        for env_id in env_ids:
            self._results.pop(env_id, None)

    def play_on(self) -> bool:
        """As the base's, and False when a worker died while idle (between jobs: the OOM killer, say): replacing
        it rebuilds its envs, whose episodes under way are then gone; a reset replaces it uncounted."""
        if any(w is not None and not w.pending and not w.process.is_alive() for w in self._workers):
            return False
        return super().play_on()

    def _idle(self) -> bool:
        return not any(w.pending for w in self._workers)

    def _replace_dead_idle_workers(self, resetting: frozenset[int]) -> None:
        """Replace the workers that died while no command was pending (between jobs: the OOM killer, say);
        `resetting`: the envs of the reset about to be sent (it starts them)."""
        for worker in list(self._workers):
            if worker is not None and not worker.pending and not worker.process.is_alive():
                self._worker_failed(worker, None, resetting=resetting)

    def _send_reset(self, worker: _Worker, env_ids: Sequence[int], seeds: Sequence[int | None], rebuild: bool) -> None:
        command = ResetCommand(
            tuple(env_ids),
            tuple(seeds[env_id] for env_id in env_ids),
            tuple(self._reset_params[env_id] for env_id in env_ids),
            rebuild=rebuild,
        )
        self._send(worker, command, "rebuild" if rebuild else "reset", self._sconfig.reset_timeout)

    # ---- workers ---------------------------------------------------------------------------------------
    def _start_worker(self, index: int) -> _Worker:
        env_ids = self._groups[index]
        factories = cloudpickle.dumps({env_id: self._env_fns[env_id] for env_id in env_ids})
        (reader, writer), child_ends = MessagePipe.channel(self._ctx)
        layout = self._buffer.layout if self._buffer is not None else None
        bells = self._doorbells
        doorbell = None
        if bells is not None:
            bells.clear(index)  # the slot's last worker (if any) is dead and reaped
            doorbell = (bells.address(index), self._worker_spin_s)
        # A forkserver worker's parent is the fork server, not this process (worker._follow_parent).
        parent_pid = None if self._sconfig.start_method == "forkserver" else os.getpid()
        process = self._ctx.Process(
            target=worker_main,
            args=(child_ends, env_ids, factories, layout, doorbell, parent_pid),
            name=f"env-worker-{index}",
            daemon=True,
        )
        _launcher.start(process)
        for end in child_ends:  # the child has its own copies; ours would hide its exit (no EOF)
            end.close()
        conn = MessagePipe(reader, writer, bells.parent_end(index) if bells is not None else None)
        worker = _Worker(index, env_ids, process, conn)
        self._workers[index] = worker
        for fd in (conn.fileno(), worker.sentinel):
            self._poller.register(fd, _POLL_EVENTS)
            self._fd_owner[fd] = worker
        worker.sent("start", self._sconfig.reset_timeout)
        return worker

    def _stop(self, worker: _Worker, exit_grace_s: float = 0.0) -> int | None:
        """Kill (if still running) and reap a worker, and forget its file descriptors; returns the exit code.
        ``exit_grace_s``: how long a worker that is exiting on its own has to end before it is killed."""
        for fd in (worker.conn.fileno(), worker.sentinel):
            if self._fd_owner.get(fd) is worker:
                self._poller.unregister(fd)
                del self._fd_owner[fd]
        if exit_grace_s > 0 and worker.process.is_alive():
            worker.process.join(exit_grace_s)
        if worker.process.is_alive():
            # Its envs' own processes (a game server, a simulator) first listed: killed, the worker never ran
            # their close, and they outlived it, reparented, one more at each hang (a review).
            children = _descendants(worker.process.pid)
            worker.process.kill()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        worker.process.join()
        code = worker.process.exitcode
        worker.process.close()
        worker.conn.close()
        return code

    def _check_sendable(self, env_id: int, value: Any, what: str) -> None:
        """An action or reset argument that cannot be pickled failed inside the send, after the command was
        counted as sent: its envs stayed in flight, and the next call killed the healthy worker as hung (a
        review). Refused before anything changes, naming the env."""
        if isinstance(value, np.ndarray) and value.dtype.kind != "O":
            return
        try:
            # Loaded too: an object that pickles but cannot be built again from its pickle (an exception whose
            # __init__ takes other arguments than its args) crashed the worker, which took its other envs with
            # it, charged with a failure that did not name the value (a review).
            pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
        except Exception as err:
            raise ValueError(f"{what} of env {env_id} cannot be sent to its worker process (it is pickled): "
                             f"{type(err).__name__}: {err}") from None

    def _send(self, worker: _Worker, command: Any, what: str, timeout: float | None) -> None:
        worker.sent(what, timeout)
        try:
            worker.conn.send(command)
        except OSError:
            # The worker died; its sentinel is readable, so the next _pump handles it as a failure.
            logger.debug("%s: send failed, the worker is gone", worker.describe())

    def _worker_failed(self, worker: _Worker, reason: str | None, failure: EnvFailure | None = None, *,
                       resetting: frozenset[int] = frozenset()) -> None:
        """Replace a dead or hung worker; each of its envs counts one failure (and may raise). `reason` None:
        the process died (its exit code says how). `failure`: the env exception that made it give up (building
        that env, before any env of the worker ran): only that env is charged, as in the serial manager.
        `resetting`: envs a reset about to be sent will start, left to it."""
        # A pipe read at its end (EOF) can come before the exit it announces is done: the worker killed then was
        # reported "killed by signal 9" instead of its own exit code.
        code = self._stop(worker, _EXIT_GRACE_S if reason is None else 0.0)
        if reason is None:
            reason = f"exited with code {code}" + (f" (killed by signal {-code})" if code is not None and code < 0 else "")
        self._workers[worker.index] = None
        self._restarts += 1
        active = [env_id for env_id in worker.env_ids if self._state[env_id] is not EnvState.DONE]
        restart_reset = [env_id for env_id in active if self._state[env_id] is not EnvState.INIT]
        if failure is not None and failure.env_id in active:  # charged first: if retries run out, it raises
            active.remove(failure.env_id)
            active.insert(0, failure.env_id)
        for env_id in active:
            if failure is not None and failure.env_id == env_id:
                self._count_failure(env_id, failure)
            elif failure is None or self._state[env_id] is EnvState.RUN:
                self._count_failure(env_id, EnvFailure(env_id, "worker", f"{worker.describe()} {reason}"))
            if env_id not in restart_reset:
                self._state[env_id] = EnvState.INIT
        try:
            new = self._start_worker(worker.index)
        except BaseException:
            # No process for the slot (the OS refused one: out of memory, processes or file descriptors): a
            # manager left open with a hole would fail every later call with an AttributeError, and an actor
            # keeps its manager from job to job unless it is closed.
            logger.error("%s: could not start a replacement; closing the env manager", worker.describe())
            self.close()
            raise
        restart_reset = [env_id for env_id in restart_reset if env_id not in resetting]
        if restart_reset:
            self._send_reset(new, restart_reset, self._rebuild_seeds(restart_reset), rebuild=False)

    # ---- receiving -------------------------------------------------------------------------------------
    def _pump(self, satisfied: Callable[[], bool], wait_s: float | None) -> bool:
        """Handle worker replies, deaths and hangs until `satisfied()` or `wait_s` seconds have passed.
        Returns `satisfied()`; also returns when no worker has anything pending."""
        end = math.inf if wait_s is None else time.monotonic() + wait_s
        try:
            return self._pump_until(satisfied, end)
        finally:
            self._waiting_until = math.inf

    def _pump_until(self, satisfied: Callable[[], bool], end: float) -> bool:
        workers = self._workers
        while not satisfied():
            self._check_interrupted()
            busy = [w for w in workers if w is not None and w.pending]
            if not busy:
                return False
            first_deadline = math.inf
            buffered = None
            for worker in busy:
                if worker.conn.has_message():  # read along with an earlier reply: no need to poll
                    buffered = worker
                    break
                if worker.deadline < first_deadline:
                    first_deadline = worker.deadline
            if buffered is not None:
                self._on_readable(buffered)
                continue
            now = time.monotonic()
            if now >= self._sweep_at:
                self._sweep_at = now + _SWEEP_S
                if self._sweep(now):
                    continue
            self._waiting_until = first_deadline
            limit = min(first_deadline, end, now + _INTERRUPT_CHECK_S)
            budget = self._spin_budget
            if budget is not None:
                started = now
                find = self._signalled_finder(busy)
                signalled = find()  # often already rung (the worker was quicker): no spin to set up
                if signalled is None:
                    signalled = budget.spin(find, limit)
                    now = time.monotonic()
                if signalled is not None:
                    budget.waited(now - started)
                    self._on_readable(signalled)
                    continue
            events = self._poller.poll(None if limit == math.inf else max(0, math.ceil((limit - now) * 1000)))
            if budget is not None:
                budget.waited(time.monotonic() - started)
            if not events:
                now = time.monotonic()
                self._fail_overdue(busy, now)
                if now >= end:
                    return satisfied()
                continue
            restarts = self._restarts
            for fd, _ in events:
                worker = self._fd_owner.get(fd)
                if worker is None:
                    continue
                if fd == worker.sentinel:
                    self._on_exit(worker)
                else:
                    self._on_readable(worker)
                if self._restarts != restarts:
                    break  # fds may now belong to a new worker: poll again
        return True

    def _sweep(self, now: float) -> bool:
        """Without waiting: replace the workers that have exited (their sentinel is readable) and those past
        their reply deadline at `now`. Returns whether any was replaced. `_pump` calls this every `_SWEEP_S`,
        because its busy-wait returns on the first doorbell rung and then polls nothing: with other workers
        answering, it would never see a dead worker (which rings no doorbell) nor check a hung one's deadline."""
        restarts = self._restarts
        while True:
            exited = None
            for fd, _ in self._poller.poll(0):
                worker = self._fd_owner.get(fd)
                if worker is not None and fd == worker.sentinel:
                    exited = worker
                    break
            if exited is None:
                break
            self._on_exit(exited)  # replaces it (fds may now be reused: poll afresh)
        self._fail_overdue([w for w in self._workers if w is not None and w.pending], now)
        return self._restarts != restarts

    def _fail_overdue(self, busy: Sequence[_Worker], now: float) -> None:
        """Kill and replace the workers of `busy` whose oldest command is unanswered past its deadline. A reply
        already in the pipe is an answer: the deadline ran out while the caller did not wait (an actor between
        steps or jobs), not while the worker worked."""
        for worker in busy:
            if worker.deadline <= now and not worker.conn.poll():
                what, timeout = worker.pending[0]
                self._worker_failed(worker, f"gave no reply to {what} within {timeout} s (hung); killed it")

    @staticmethod
    def _signalled_finder(busy: list[_Worker]) -> Callable[[], _Worker | None]:
        """A function returning a busy worker that has rung its doorbell, else None. A dead worker never
        rings: it is found by the poll that follows the busy-wait."""
        if len(busy) == 1:
            worker = busy[0]
            signalled = worker.conn.signalled
            return lambda: worker if signalled() else None
        conns = [(w, w.conn.signalled) for w in busy]

        def find() -> _Worker | None:
            for worker, signalled in conns:
                if signalled():
                    return worker
            return None

        return find

    def _on_readable(self, worker: _Worker) -> None:
        try:
            reply = worker.conn.recv()
        except (EOFError, OSError):
            self._worker_failed(worker, None)
            return
        except UnreadableMessageError as err:
            self._worker_failed(worker, _unreadable_reply(err))
            return
        if type(reply) is tuple:  # a step reply: the hot path, without _on_reply's dispatch
            worker.answered()
            self._on_step_reply(worker, reply[1], reply[2], reply[3])
            return
        self._on_reply(worker, reply)

    def _on_exit(self, worker: _Worker) -> None:
        """The process ended: take the replies it sent before, then treat it as failed."""
        while worker.pending and worker.conn.poll():
            try:
                reply = worker.conn.recv()
            except (EOFError, OSError):
                break
            except UnreadableMessageError as err:
                self._worker_failed(worker, _unreadable_reply(err))
                return
            self._on_reply(worker, reply)
            if self._workers[worker.index] is not worker:
                return
        self._worker_failed(worker, None)

    def _on_reply(self, worker: _Worker, reply: Any) -> None:
        worker.answered()
        if type(reply) is tuple:
            self._on_step_reply(worker, reply[1], reply[2], reply[3])
        elif type(reply) is ResetReply:
            for env_id, obs in reply.observations:
                self._unplayed_seeds.pop(env_id, None)
                self._on_reset(env_id, self._buffer.read(env_id, RESET_SLOT) if self._buffer is not None else obs)
            for failure in reply.failures:
                self._rebuild(worker, failure)
        elif type(reply) is ReadyReply:
            worker.obs_specs = tuple(info.obs_spec for info in reply.infos)
            if self._env_info is None:
                self._env_info = reply.infos[0]
        elif type(reply) is StartFailedReply:
            failure = reply.failure
            self._worker_failed(worker, f"could not build env {failure.env_id}: {failure.description}", failure)
        elif type(reply) is not AckReply:
            raise TypeError(f"{worker.describe()} sent an unknown reply {reply!r}")

    def _on_step_reply(self, worker: _Worker, plain: tuple, results: tuple, failures: tuple) -> None:
        """`plain`: (env_id, reward, ...) of the steps that ended no episode, had no info and left their
        observation in shared memory (worker.py); `results`: the other steps, in full."""
        buffer = self._buffer
        views = buffer.single_views if buffer is not None else None
        step_slot = self._step_slot
        in_flight = self._in_flight
        timesteps = self._results
        next_obs = self._next_obs
        if plain:
            pairs = iter(plain)
            for env_id, reward in zip(pairs, pairs, strict=True):
                in_flight.discard(env_id)
                slot = step_slot[env_id]
                if views:  # the observation is one array; pool slots are handed out as they are
                    obs = views[slot][env_id] if slot else views[STEP_SLOT][env_id].copy()
                else:
                    obs = buffer.read(env_id, slot)
                timesteps[env_id] = TimeStep(obs, reward, False, False, NO_INFO)
                next_obs[env_id] = obs
        resetting = False
        for env_id, reward, terminated, truncated, info, obs, reset, reset_obs in results:
            in_flight.discard(env_id)
            if views:  # the usual case: the observation is one array; pool slots are handed out as they are
                slot = step_slot[env_id]
                obs = views[slot][env_id] if slot else views[STEP_SLOT][env_id].copy()
            elif buffer is not None:
                obs = buffer.read(env_id, step_slot[env_id])
            ts = timesteps[env_id] = TimeStep(obs, reward, terminated, truncated, NO_INFO if info is None else info)
            if terminated or truncated:
                if reset == RESET_DONE and buffer is not None:
                    reset_obs = buffer.read(env_id, RESET_SLOT)
                # RESET_FOLLOWS: the env is RESET until the worker's reset reply
                self._after_step(env_id, ts, reset == RESET_DONE, reset_obs)
                resetting = resetting or reset == RESET_FOLLOWS
            else:
                next_obs[env_id] = obs
        if resetting:
            worker.resetting(self._sconfig.reset_timeout)
        for failure in failures:
            self._rebuild(self._workers[self._worker_of[failure.env_id]], failure)

    def _rebuild(self, worker: _Worker, failure: EnvFailure) -> None:
        """An env raised: count it (may raise), then have its worker build it anew and reset it."""
        self._count_failure(failure.env_id, failure)
        self._send_reset(worker, [failure.env_id], self._rebuild_seeds([failure.env_id]), rebuild=True)

    def _rebuild_seeds(self, env_ids: Sequence[int]) -> list[int | None]:
        """As the base's, but an env whose seeded reset failed starts from that seed again."""
        seeds = super()._rebuild_seeds([env_id for env_id in env_ids if env_id not in self._unplayed_seeds])
        for env_id in env_ids:
            if env_id in self._unplayed_seeds:
                seeds[env_id] = self._unplayed_seeds[env_id]
        return seeds


def _descendants(pid: int) -> list[int]:
    """The processes `pid` started and theirs, from /proc (Linux; [] elsewhere, or for a process gone). One that
    left its parent (a daemon's double fork) is not found."""
    found: list[int] = []
    parents = [pid]
    while parents:
        parent = parents.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as listing:
                    children = [int(child) for child in listing.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            parents.extend(children)
    return found


def _unreadable_reply(err: UnreadableMessageError) -> str:
    """The failure reason of a worker whose reply could not be unpickled: its envs stayed in flight, and the next
    call killed the worker as hung, or waited for ever without a step timeout (a review)."""
    return (f"sent a reply that cannot be unpickled here ({err}): an env's observation, reward or step info holds "
            "an object that pickles but cannot be built again from its pickle; killed it")
