"""The actor's job loop: register, pull a job, play it, stream the launch player's data, report, repeat.

One job at a time:
1. GetJob (long poll; backoff while the coordinator is away) and check it (`JobPlan`; a bad job is FAILED).
2. Start the job's heartbeat; a revoked lease abandons the job without FinishJob.
3. Reset (or build) the env manager, load the players' policies (`PolicyPool`), open the trajectory sender
   of a collect job, and play (`Rollout`). A step-budget job of the same match as the last one (a solo
   league's) plays on the episodes that job left under way instead of resetting (`carry_shape`).
4. Wait until the learner acknowledged every chunk, then FinishJob(COMPLETED) with every episode's result —
   or FinishJob(RELEASED) when the actor is stopping (SIGTERM), FAILED on an error. A job the stop cut short
   is released without results: the episodes it finished are the short ones (the long ones were still
   running), and counting them would skew the payoff and a solo player's returns toward short games.

Faults: an env that crashes or hangs (`env_step_timeout_s`) is rebuilt by the env manager
and its episode is dropped, up to `env_max_retry` times per env and job; past that, or on any other error in a
job, the job is finished FAILED with the error and its traceback, and the actor takes the next job. The
coordinator decides whether the job is tried again (league_service/LEASES.md, "Failing jobs").

`request_stop()` (the SIGTERM handler) ends the job after the current step; `run` then returns. It also
interrupts the env manager (EnvManagers.interrupt), so a stop does not wait for envs that take long to build or
a step that hangs: those steps are dropped. An env stuck where no interrupt gets in (C code in the actor's own
process) keeps the job thread; the process shell then calls `release_stuck_job` and exits (cli.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from actor_service.coordinator_client import CoordinatorClient
from actor_service.env_managers import EnvManagers, ManagerKind
from actor_service.envs import EnvError
from actor_service.envs.env_manager.failure import EnvManagerInterrupted
from actor_service.heartbeat import JobHeartbeat
from actor_service.job import JobError, JobKind, JobPlan
from actor_service.job_tally import JobTally
from actor_service.policy_pool import (
    Policy,
    PolicyPool,
    PolicySettings,
    UnloadableOpponentError,
    model_signature,
)
from actor_service.rollout import (
    EnvCarry,
    EpisodeRecord,
    Rollout,
    RolloutEnd,
    RolloutResult,
    RolloutTarget,
    seat_bots,
)
from actor_service.stop import StopSignal
from actor_service.trajectory_sender import SenderSettings, SenderStats, TrajectorySender
from common.busy_clock import StallWatch
from common.envs.base import EnvInfo, Outcome
from common.envs.policy_view import UnsupportedEnvError
from common.proto.league.v1 import league_pb2
from common.root_marker import ROOT_MARKER_WAIT_S, check_shared_root
from common.rpc import job_heartbeat_interval
from common.tensor_codec import ChunkHeader
from common.timed_store import TimedCheckpointStore

log = logging.getLogger(__name__)

_OUTCOMES = {
    None: league_pb2.OUTCOME_UNSPECIFIED,
    Outcome.WIN: league_pb2.OUTCOME_WIN,
    Outcome.DRAW: league_pb2.OUTCOME_DRAW,
    Outcome.LOSS: league_pb2.OUTCOME_LOSS,
}


def default_worker_id(role: str = "actor") -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ActorSettings:
    coordinator: str
    """host:port of the coordinator."""
    shared_root: Path
    """Where checkpoints are (the same shared filesystem the learners publish to)."""
    worker_id: str = field(default_factory=default_worker_id)
    env_num: int | None = None
    """Overrides every job's env_num."""
    manager: ManagerKind = "subprocess"
    env_cpus: int | None = None
    """CPUs the subprocess env manager sizes itself for (None: all this process may run on); see
    SubprocessEnvManagerConfig.cpus."""
    token: str | None = field(default=None, repr=False)  # (never in a printed settings object)
    tls_ca: Path | None = None
    tls_server_name: str | None = None
    """The name the coordinator's and learners' TLS certificates are checked against (None: the host dialled)."""
    max_jobs: int | None = None
    """Return after this many jobs (None: until stopped)."""
    get_job_wait_s: float = 5.0
    """GetJob long-poll length."""
    env_max_retry: int = 2
    """Failures each env may have per job (it is rebuilt each time) before the job fails."""
    env_step_timeout_s: float | None = 60.0
    """A step taking longer is a hung env: it is rebuilt (subprocess manager: its worker process is killed;
    serial manager: it is interrupted in process). An env operation still stuck this long past its own timeout
    (a hang the manager cannot break) makes the heartbeat stop renewing the job's lease, so the job expires
    and is issued again elsewhere."""
    env_reset_timeout_s: float | None = 300.0
    """The same for building and resetting envs."""
    checkpoint_read_timeout_s: float | None = 120.0
    """A checkpoint read (manifest or weights) still under way after this long is stuck (a network filesystem
    whose server went away): the heartbeat stops renewing the job's lease, so the job is issued again elsewhere.
    Generous: a large checkpoint on a slow share legitimately takes seconds."""
    shutdown_flush_s: float = 5.0
    """On SIGTERM, how long queued trajectories may take to reach the learner before the job is released."""
    policies: PolicySettings = PolicySettings()
    sender: SenderSettings = SenderSettings()

    def __post_init__(self) -> None:
        if self.env_num is not None and self.env_num < 1:
            raise ValueError(f"env_num must be >= 1, got {self.env_num}")
        if self.env_cpus is not None and self.env_cpus < 1:
            raise ValueError(f"env_cpus must be >= 1, got {self.env_cpus}")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {self.max_jobs}")
        if not self.worker_id:
            raise ValueError("worker_id is empty")
        if self.env_max_retry < 0:
            raise ValueError(f"env_max_retry must be >= 0, got {self.env_max_retry}")
        for name in ("env_step_timeout_s", "env_reset_timeout_s", "checkpoint_read_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value}")


@dataclass(frozen=True)
class JobReport:
    """How one job went, for logs and tests."""

    job_id: str
    status: str  # completed | released | failed | abandoned | refused (FinishJob came too late) | unreported
    episodes: int
    env_steps: int
    agent_steps: int
    players: tuple[str, ...] = ()
    sender: SenderStats | None = None
    """The trajectory stream of a collect job (None: nothing streamed)."""
    error: str = ""
    env_failures: int = 0
    """Env failures the job survived (each env was rebuilt and its episode dropped)."""

    @property
    def chunks_sent(self) -> int:
        return self.sender.chunks_acked if self.sender is not None else 0


class Actor:
    def __init__(self, settings: ActorSettings) -> None:
        self.settings = settings
        self._stop = StopSignal()
        self._store = TimedCheckpointStore(settings.shared_root)
        self._client = CoordinatorClient(
            settings.coordinator, settings.worker_id, stop=self._stop, token=settings.token, tls_ca=settings.tls_ca,
            tls_server_name=settings.tls_server_name,
        )
        self._managers = EnvManagers(settings.manager, settings.env_max_retry, settings.env_step_timeout_s,
                                     settings.env_reset_timeout_s, settings.env_cpus)
        self._stop.add_listener(self._managers.interrupt)
        self._pool: PolicyPool | None = None
        self._heartbeat: JobHeartbeat | None = None
        self._job: JobPlan | None = None  # the job being played, and its rollout once it has one ...
        self._rollout: Rollout | None = None  # ... for `release_stuck_job`, from another thread
        self._playing = False  # the job thread is setting up or playing a job (not yet winding it down)
        self._carry: _Carry | None = None  # the last job's episodes under way, when the next may play on
        self.reports: deque[JobReport] = deque(maxlen=KEPT_REPORTS)
        """The newest jobs' reports (an actor runs for weeks: all of them would grow without bound)."""
        self.jobs_run = 0

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    def request_stop(self) -> None:
        """Finish the current step, release the job, then leave `run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def playing(self) -> bool:
        """The job thread is setting up or playing a job: a stop ends that within an env step (or cuts the env
        call short). What follows, the job's wind-down (its last trajectories, the heartbeat's end, the
        release), is bounded by its own timeouts (~11 s in all). Safe from any thread."""
        return self._playing

    def env_stalled_s(self) -> float:
        """How long the env manager's call under way has run past its deadline (its timeout, or the stop's
        interrupt) without getting back from the env; 0 if none. Safe from any thread."""
        return self._managers.stalled_s()

    def stuck_read(self) -> str | None:
        """Whether the job thread's checkpoint read has hung so long that its job went back to the league (the
        heartbeat stopped renewing it at --checkpoint-read-timeout, and two leases have passed since): the
        actor is of no use until the filesystem answers, and waiting in silence hides it. Says how long, else
        None. Safe from any thread."""
        limit = self.settings.checkpoint_read_timeout_s
        reading = self._store.busy_s()
        if limit is None or not reading:
            return None
        plan = self._job
        lease_s = plan.lease_timeout_s if plan is not None else 0.0
        if reading <= limit + 2 * lease_s:
            return None
        return (f"stuck in a checkpoint read for {reading:.0f} s (--checkpoint-read-timeout {limit:g} s; its job "
                "went back to the league): a hung network filesystem?")

    def stuck_env(self) -> str | None:
        """Whether an env call has run past its timeout, out of reach of the manager's interrupt (an in-process
        env blocked in a wait or in C code: the watchdog breaks off only pure-Python loops on the job thread),
        for two leases since: its job went back to the league (the heartbeat stops renewing a stalled env's
        lease), and the actor played nothing again until someone stopped it, in silence (a review). Says how
        long, else None. Safe from any thread."""
        stalled = self.env_stalled_s()
        plan = self._job
        lease_s = plan.lease_timeout_s if plan is not None else 0.0
        if not stalled or stalled <= 2 * lease_s:
            return None
        return (f"stuck in an env call {stalled:.0f} s past its timeout, which could not interrupt it (an env "
                "blocked in a wait or in C code: use --manager subprocess for such envs, whose workers are killed)")

    def release_stuck_job(self) -> str | None:
        """For the process shell, when a stop could not get the job thread back from an env call (an env stuck
        in C code in this process): release the job from the calling thread, so that its slot is free now
        rather than when its lease expires; without results, as any job a stop cut short (`unreported`).
        Returns FinishJob's outcome (`_finish`), None without a job. The job thread must not get back
        meanwhile: the process exits right after."""
        plan, rollout = self._job, self._rollout
        if plan is None:
            return None
        episodes = reportable(plan, rollout)
        env_steps = rollout.env_steps if rollout is not None else 0
        agent_steps = rollout.agent_steps if rollout is not None else 0
        log.warning("job %s: releasing it from outside its stuck thread with %d episode(s)", plan.job_id,
                    len(episodes))
        # One try: the process exits right after, and a coordinator away (often the same outage as a hung
        # share) must not keep it retrying for ever; the lease expires then.
        return self._finish(plan.job_id, league_pb2.FINISH_STATUS_RELEASED, episodes, env_steps, agent_steps,
                            once=True)

    def _check_shared_root(self, expected: str) -> None:
        check_shared_root(Path(self.settings.shared_root), expected, self._stop.wait, ROOT_MARKER_WAIT_S)

    def run(self) -> list[JobReport]:
        """Serve jobs until stopped (or `max_jobs` are done); returns the reports of the last `KEPT_REPORTS` jobs
        (`jobs_run` counts them all)."""
        tally = JobTally()
        try:
            registration = self._client.register()
            if registration is None:
                return list(self.reports)
            self._check_shared_root(registration.shared_root_id)
            while not self._stop.is_set():
                if self.settings.max_jobs is not None and self.jobs_run >= self.settings.max_jobs:
                    break
                job = self._client.next_job(self.settings.get_job_wait_s)
                if job is None:
                    break
                if (again := self._client.registration) is not registration and again is not None:
                    # Registered again (a coordinator that forgot this worker, or a new one at the address): the
                    # root was checked only at the first, and a league on another root had its jobs played (a
                    # review); its heartbeat interval is the one now.
                    if again.league_id != registration.league_id:
                        log.warning("the coordinator at %s now serves league %s, not %s", self._client.address,
                                    again.league_id, registration.league_id)
                    if again.shared_root_id != registration.shared_root_id:
                        self._check_shared_root(again.shared_root_id)
                    registration = again
                report = self._run_job(job, registration.heartbeat_interval_s)
                usual = report.status == "completed" and not report.error and not report.env_failures
                log.log(logging.DEBUG if usual else logging.INFO,
                        "job %s %s: %d episodes, %d env steps, %d agent steps, %d chunks%s", report.job_id,
                        report.status, report.episodes, report.env_steps, report.agent_steps, report.chunks_sent,
                        f" ({report.error})" if report.error else "")
                self.reports.append(report)
                self.jobs_run += 1
                if summary := tally.add(report.status, report.episodes, report.env_steps, report.agent_steps):
                    log.info("%s", summary)
        finally:
            if summary := tally.take():
                log.info("%s", summary)
            try:
                self._managers.close()
            except Exception as err:  # an env's own close failing: its job is over, the stop is not a failure
                log.warning("closing the envs: %s: %s", type(err).__name__, err)
            finally:
                self._client.leave()  # its jobs are finished or released by now (else their leases stay)
                self._client.close()
        return list(self.reports)

    # ---- one job -----------------------------------------------------------------------------------------

    def _run_job(self, job: league_pb2.Job, heartbeat_interval_s: float) -> JobReport:
        try:
            plan = JobPlan.from_proto(job, self.settings.env_num)
        except JobError as err:
            log.error("job %s cannot run: %s", job.job_id, err)
            self._finish(job.job_id, league_pb2.FINISH_STATUS_FAILED, (), 0, 0, str(err))
            return JobReport(job.job_id, "failed", 0, 0, 0, tuple(p.player_id for p in job.players), error=str(err))
        revoked = StopSignal()

        def on_revoked(reason: str) -> None:
            log.warning("job %s revoked: %s; abandoning it", plan.job_id, reason)
            revoked.set()

        interval = job_heartbeat_interval(heartbeat_interval_s, plan.lease_timeout_s)
        heartbeat = self._heartbeat = JobHeartbeat(
            self._client, plan.job_id, interval, on_revoked, self._stall_watches()).start()
        sender: TrajectorySender | None = None
        rollout: Rollout | None = None
        self._job = plan
        self._playing = True
        try:
            sender = self._sender(plan)
            if sender is not None:
                revoked.add_listener(sender.abort)  # a writer blocked on a full queue must not wait for the learner
            carry, self._carry = self._carry, None  # the previous job's episodes under way, used up here or lost
            rollout = self._rollout = self._new_rollout(plan, sender, revoked, carry)
            result = rollout.run()
            self._playing = False
            if result.end is RolloutEnd.REVOKED:
                return self._abandoned(plan, result, sender)
            report = self._report(plan, result, sender, revoked)
            if report.status == "completed" and (shape := carry_shape(plan)) is not None:
                self._carry = (shape, rollout.carry_out())
            return report
        except Exception as err:  # whatever broke the job fails the job, not the actor
            self._playing = False
            return self._after_error(plan, rollout, sender, revoked, err)
        finally:
            self._playing = False
            self._job = self._rollout = None
            heartbeat.close(STOP_FINISH_S if self._stop.is_set() else None)
            self._heartbeat = None
            if sender is not None:
                sender.close()

    def _stall_watches(self) -> list[StallWatch]:
        """What the job thread may be stuck in where no timeout breaks it off: the job's heartbeat lets the
        lease go past these limits, so that the league issues the job to another actor."""
        watches = []
        if self.settings.env_step_timeout_s is not None:
            watches.append(StallWatch("its env has been stuck past its timeout for", self._managers.stalled_s,
                                      self.settings.env_step_timeout_s))
        if self.settings.checkpoint_read_timeout_s is not None:
            watches.append(StallWatch("a checkpoint read has taken", self._store.busy_s,
                                      self.settings.checkpoint_read_timeout_s))
        return watches

    def _sender(self, plan: JobPlan) -> TrajectorySender | None:
        if plan.kind is not JobKind.COLLECT:
            return None
        if not plan.learner_endpoint:
            log.warning("collect job %s names no learner (coordinator without learners): nothing is streamed",
                        plan.job_id)
            return None
        header = ChunkHeader(plan.job_id, plan.launch_player, self.worker_id, 0, 0)
        return TrajectorySender(plan.learner_endpoint, header, stop=self._stop,
                                settings=self.settings.sender.within(plan.adder.chunks_in_flight),
                                token=self.settings.token, tls_ca=self.settings.tls_ca,
                                tls_server_name=self.settings.tls_server_name)

    def _new_rollout(
        self, plan: JobPlan, sender: TrajectorySender | None, revoked: StopSignal, carry: _Carry | None,
    ) -> Rollout:
        env_num = min(plan.env_num, plan.episode_num) if plan.episode_num > 0 else plan.env_num
        seed = job_seed(plan.job_id)
        bots = seat_bots(plan.player_bots, env_num, seed) if any(plan.player_bots) else None
        manager = None
        if carry is not None and carry[0] == carry_shape(plan):
            manager = self._managers.resume(plan.env_name, plan.env_kwargs, env_num)
        carried = carry[1] if manager is not None and carry is not None else None
        if manager is None:
            manager = self._managers.acquire(plan.env_name, plan.env_kwargs, env_num, seed, bots)
        else:
            log.debug("job %s plays on the %d episodes under way", plan.job_id, env_num)
        info = manager.env_info
        pool = self._pool_for(plan, info)
        launch = pool.launch_policy(plan.launch, cancel=revoked)
        policies: list[Policy | None] = [launch] + [
            None if slot.bot else pool.opponent_policy(slot, launch) for slot in plan.players[1:]
        ]
        opponents = [f"{slot.player_id} ({slot.bot})" if policy is None else f"{slot.player_id} v{policy.version}"
                     for slot, policy in zip(plan.players[1:], policies[1:], strict=True)]
        log.debug("job %s: %s v%d vs %s on %d x %s", plan.job_id, plan.launch_player, launch.version,
                 opponents or "nobody", env_num, plan.env_name)
        target = RolloutTarget(tuple(s.player_id for s in plan.players), plan.episode_num, plan.env_steps,
                               plan.forward_kwargs, plan.adder.unroll_len)
        return Rollout(manager, info, target, policies, stop=self._stop, revoked=revoked, sink=sender,
                       reload=lambda: pool.maybe_reload(launch), seat_offset=seed, carry=carried)

    def _pool_for(self, plan: JobPlan, info: EnvInfo) -> PolicyPool:
        if self._pool is None or self._pool.signature != model_signature(plan.policy, info):
            self._pool = PolicyPool(self._store, plan.policy, info, self.settings.policies, self._stop)
        return self._pool

    def _report(
        self, plan: JobPlan, result: RolloutResult, sender: TrajectorySender | None, revoked: StopSignal
    ) -> JobReport:
        stopping = result.end is RolloutEnd.STOPPED
        if sender is not None:
            # Every chunk acknowledged before the results count; a stop meanwhile bounds the wait.
            log.debug("job %s: rollout ended (%d episodes); waiting for the learner to take %d chunk(s)",
                      plan.job_id, len(result.episodes), sender.held)
            flushed = sender.flush(until_stop=True)
            if not flushed and not revoked.is_set():
                flushed = sender.flush(self.settings.shutdown_flush_s)
            if revoked.is_set():
                return self._abandoned(plan, result, sender)
            if not flushed:
                # A stop came while chunks were on their way: the job did not complete (COMPLETED would also
                # end its player's failure streak). Its episodes are released, and still counted: all of them
                # finished, before the stop.
                log.warning("job %s: %d chunk(s) not delivered before shutdown", plan.job_id, sender.held)
                stopping = True
        episodes = result.episodes if result.end is RolloutEnd.COMPLETED else unreported(plan, result.episodes)
        status = league_pb2.FINISH_STATUS_RELEASED if stopping else league_pb2.FINISH_STATUS_COMPLETED
        outcome = self._finish(plan.job_id, status, episodes, result.env_steps, result.agent_steps)
        name = _ended_as("released" if stopping else "completed", outcome)
        return self._job_report(plan, name, episodes, result.env_steps, result.agent_steps, sender,
                                env_failures=result.failed_episodes)

    def _abandoned(self, plan: JobPlan, result: RolloutResult, sender: TrajectorySender | None) -> JobReport:
        if sender is not None:
            sender.abort()
        return self._job_report(plan, "abandoned", result.episodes, result.env_steps, result.agent_steps, sender,
                                env_failures=result.failed_episodes)

    def _after_error(
        self, plan: JobPlan, rollout: Rollout | None, sender: TrajectorySender | None, revoked: StopSignal,
        err: Exception,
    ) -> JobReport:
        """The job broke. Stopping (env workers killed with the actor's process group, say): release it, with
        its episodes if it had reached its bound (`unreported`); else FAILED. The env manager is kept: the next
        job resets every env (or rebuilds the manager if an env failure closed it)."""
        if sender is not None:
            sender.abort()
        episodes = reportable(plan, rollout)
        env_steps = rollout.env_steps if rollout is not None else 0
        agent_steps = rollout.agent_steps if rollout is not None else 0
        env_failures = rollout.failed_episodes if rollout is not None else 0
        message = failure_text(err, plan.env_name, traceback_of_others=False)
        if revoked.is_set():
            log.warning("job %s revoked while failing (%s); abandoned", plan.job_id, message)
            return self._job_report(plan, "abandoned", episodes, env_steps, agent_steps, sender, message,
                                    env_failures)
        if self._stop.is_set():
            if isinstance(err, EnvManagerInterrupted):  # the stop itself cut the envs short: no news (it was a
                # WARNING at the end of an ordinary `league run`: a job taken as the budget ended)
                log.info("job %s cut short by the stop (%s); releasing it", plan.job_id, message)
            else:
                log.warning("job %s broke while stopping (%s); releasing it", plan.job_id, message)
            outcome = self._finish(plan.job_id, league_pb2.FINISH_STATUS_RELEASED, episodes, env_steps, agent_steps)
            return self._job_report(plan, _ended_as("released", outcome), episodes, env_steps, agent_steps, sender,
                                    message, env_failures)
        if isinstance(err, UnsupportedEnvError):  # a config problem, said in full by its message
            log.error("job %s failed: %s", plan.job_id, message)
        else:
            # The reason on the line itself: `league run` shows a worker's ERROR lines, not their tracebacks.
            log.error("job %s failed: %s", plan.job_id, message.splitlines()[0], exc_info=err)
        unloadable = (err.player_id,) if isinstance(err, UnloadableOpponentError) else ()
        outcome = self._finish(plan.job_id, league_pb2.FINISH_STATUS_FAILED, (), env_steps, agent_steps,
                               failure_text(err, plan.env_name), unloadable)
        return self._job_report(plan, _ended_as("failed", outcome), (), env_steps, agent_steps, sender, message,
                                env_failures)

    @staticmethod
    def _job_report(
        plan: JobPlan, status: str, episodes: tuple[EpisodeRecord, ...], env_steps: int, agent_steps: int,
        sender: TrajectorySender | None, error: str = "", env_failures: int = 0,
    ) -> JobReport:
        return JobReport(plan.job_id, status, len(episodes), env_steps, agent_steps,
                         tuple(p.player_id for p in plan.players), sender.stats if sender is not None else None, error,
                         env_failures)

    def _finish(
        self, job_id: str, status: int, episodes: tuple[EpisodeRecord, ...], env_steps: int, agent_steps: int,
        error: str = "", unloadable_player_ids: tuple[str, ...] = (), once: bool = False,
    ) -> str:
        """FinishJob; returns "counted", "refused" (the coordinator no longer holds the job for us, or refused
        its report: then the job is finished as failed, with the refusal) or
        "unreported" (the coordinator did not answer: the lease expires and the job is issued again). A
        stopping actor (or ``once``) tries once, within STOP_FINISH_S, so that a stop is quick whatever the
        coordinator does."""
        if self._heartbeat is not None:
            # The job ends here: no heartbeat may name it afterwards (one still in flight is answered as revoked,
            # which changes nothing once stopping). A stop during this wait bounds it too.
            self._heartbeat.close(stop=self._stop, stop_wait_s=STOP_FINISH_S)
        stopping = self._stop.is_set()  # after the wait: a SIGTERM that came during it counts
        request = league_pb2.FinishJobRequest(
            worker_id=self.worker_id, job_id=job_id, status=status, episodes=[episode_result(e) for e in episodes],
            env_steps=env_steps, agent_steps=agent_steps, error=bounded_text(error, MAX_ERROR_CHARS),
            unloadable_player_ids=unloadable_player_ids,
        )
        try:
            reply = self._client.finish_job(request, once_within_s=STOP_FINISH_S if stopping or once else None,
                                            stop_grace_s=STOP_FINISH_S)
        except grpc.RpcError as err:  # the coordinator away past the retries: expected, no traceback needed
            code = err.code().name if isinstance(err, grpc.Call) else type(err).__name__
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            if code == grpc.StatusCode.INVALID_ARGUMENT.name and status != league_pb2.FINISH_STATUS_FAILED:
                # The report itself is refused (a result the coordinator cannot take): no retry gets it through,
                # and its lease is renewed by nobody now. Failed with the refusal, so that its slot is free at once
                # and the league sees why, rather than an expiry a lease later.
                log.error("FinishJob of %s refused its report (%s); finishing the job as failed", job_id, details)
                self._finish(job_id, league_pb2.FINISH_STATUS_FAILED, (), env_steps, agent_steps,
                             f"the coordinator refused the job's report: {details}", once=once)
                return "refused"
            log.error("FinishJob of %s failed (%s: %s); its lease will expire and the job be issued again", job_id,
                      code, details)
            return "unreported"
        return "refused" if reply is None else "counted"


_Carry = tuple[str, tuple[EnvCarry, ...]]
"""A completed step-budget job's shape (`carry_shape`) and its envs' episodes under way."""


def _ended_as(status: str, outcome: str) -> str:
    """A job report's status: `status` when its FinishJob counted, else what became of it ("refused",
    "unreported"): a job the coordinator refused was reported as failed or released in the log and the summary."""
    return status if outcome == "counted" else outcome


def carry_shape(plan: JobPlan) -> str | None:
    """What a step-budget job's episodes under way need to go on in the next job: the same envs, players and
    policy (its recurrent state included). None for a job whose episodes cannot go on: one of `episode_num`
    episodes (it reports the first ones started, and ends when they have), or one with reference bots (seated
    per job by its seed)."""
    if plan.episode_num > 0 or any(plan.player_bots):
        return None
    shape = {"kind": plan.kind.value, "env": plan.env_name, "kwargs": plan.env_kwargs, "env_num": plan.env_num,
             "players": [p.player_id for p in plan.players], "policy": plan.policy}
    return json.dumps(shape, sort_keys=True, default=str)


def reportable(plan: JobPlan, rollout: Rollout | None) -> tuple[EpisodeRecord, ...]:
    """The episodes a job that broke or is being released reports: all of them if its rollout had reached its
    bound, else none (`unreported`)."""
    if rollout is None:
        return ()
    episodes = tuple(rollout.episodes)
    return episodes if rollout.reached_bound else unreported(plan, episodes)


def unreported(plan: JobPlan, episodes: tuple[EpisodeRecord, ...]) -> tuple[EpisodeRecord, ...]:
    """A job cut short (by a stop) reports no episode: the ones it finished are those that were short, while
    the longer ones it had started were still running, so their results would favour short games (a solo
    player's mean return fell by a third at the end of a run when they counted). Its trajectories were sent
    and train as usual; the league just learns no results from it. Returns the empty tuple."""
    if episodes:
        log.info("job %s was cut short: its %d finished episode(s) are not reported (the ones still running are "
                 "the longer ones; the finished ones alone would favour short episodes)", plan.job_id,
                 len(episodes))
    return ()


KEPT_REPORTS = 1000
"""Job reports an actor keeps (~0.6 KB each)."""


STOP_FINISH_S = 3.0
"""A stopping actor's FinishJob, and its wait for a heartbeat in flight, each give up after this: with the
shutdown flush (5 s) a stop takes at most ~11 s, within `league run`'s 15 s and Kubernetes' 30 s of grace."""


MAX_ERROR_CHARS = 4096


def failure_text(err: BaseException, env_name: str = "", traceback_of_others: bool = True) -> str:
    """What FinishJob(FAILED) says: the error and its traceback. An env manager's EnvError already carries
    the env's own traceback (from its worker process) in its message, and the env's name (``env_name``) in front,
    since the manager knows its envs by index only; an env no policy can play is a config problem its message
    says in full; other errors get their traceback here (unless not ``traceback_of_others``: the log line)."""
    if isinstance(err, EnvError) and env_name:
        return f"{type(err).__name__} ({env_name}): {err}"
    if isinstance(err, (EnvError, UnsupportedEnvError)) or not traceback_of_others:
        return f"{type(err).__name__}: {err}"
    return "".join(traceback.format_exception(err)).rstrip()


def bounded_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, keeping its first line and its end (a traceback's last frames), as
    UTF-8 a protobuf string takes: an env's error naming a file whose name is no UTF-8 (decoded with surrogate
    escapes) made FinishJob's request raise UnicodeEncodeError, which ended the actor; restarted, it played the
    job again and died the same way, the league seeing no failure (a review)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    head = text.split("\n", 1)[0][: limit // 2]
    marker = "\n[...]\n"
    return head + marker + text[-(limit - len(head) - len(marker)):]


def episode_result(record: EpisodeRecord) -> league_pb2.EpisodeResult:
    """An episode as FinishJob reports it: the job's players in seat order (launch player first)."""
    return league_pb2.EpisodeResult(
        length=record.length,
        players=[
            league_pb2.PlayerOutcome(player_id=pid, outcome=_OUTCOMES[outcome], episode_return=ret)
            for pid, outcome, ret in zip(record.player_ids, record.outcomes, record.returns, strict=True)
        ],
    )


def job_seed(job_id: str) -> int:
    """Env seeds of a job (env i gets seed + i): different for every job, the same for a re-run of one."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "little")
