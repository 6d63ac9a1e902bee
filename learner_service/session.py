"""One learn job's binding to a player: its lease kept alive, training on its queue, reports and resets.

    LeaseKeeper     heartbeats the job from the moment it is granted; tells the session if it is revoked, and
                    whether the lease is held (renewed within a lease): nothing is published while it is not
    LearnSession    run(): UpdatePlayer for the starting checkpoint, then train on the queue until ended
                    (stop, revoked, lost); release(): the learner stops - train on what was accepted, final
                    checkpoint, UpdatePlayer, FinishJob(RELEASED)

Every UpdatePlayer reply may say the league reset (mutated) the player: `apply_reset` continues from the reset
checkpoint with a fresh trainer, numbering versions above everything published.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from common.busy_clock import StallGate, StallWatch
from common.checkpoint_store import CheckpointError, CheckpointRef
from common.learner_config import LearnerConfig
from common.lease_clock import lease_now
from common.proto.league.v1 import league_pb2
from common.rpc import SERVER_FAULT_CODES, TRANSIENT_CODES, job_heartbeat_interval
from learner_service.chunks import PreparedChunk
from learner_service.heap_trim import HeapTrimmer
from learner_service.intake import ChunkQueue
from learner_service.league_client import BindingLost, LeagueClient, LearnJob, Registration
from learner_service.publisher import CheckpointPublisher
from learner_service.servicer import DataPlane, Intake
from learner_service.telemetry import Telemetry
from learner_service.trainer import IterationReport, Trainer, build_task, build_trainer

log = logging.getLogger(__name__)

MAX_RESETS_PER_REPORT = 3
PROGRESS_LOG_EVERY_S = 10.0
MIN_UNPUBLISHED_UPDATES = 8
"""While publishing fails, training goes on for at most max(this, 2 x publish period) updates beyond the
version actors act with, then waits for a publish to work. Without a bound a full disk let the learner train
on data ever more versions old (1,000+ in a CartPole run, which collapsed to the worst return and stayed there
after space came back); waiting holds the actors back instead (their pushes wait on the full queue)."""
WAIT_TO_PUBLISH_MIN_S = 1.0
DIVERGED_WINDOW = 40
"""When half of the last this many updates (or more) were rolled back, the session gives up with
`UpdatesDiverge`: a learning rate far too high, or rewards too large for float32 losses, diverge at most updates
(the others keep absurd but finite weights), and rolling back for ever trained nothing while the player's status
just stood still. A rare diverged update is rolled back and forgotten."""
LEASE_MARGIN = 0.1
"""A session stops publishing this fraction of a lease before the coordinator may expire it (LeaseKeeper): time
for a checkpoint being written to land, and for clocks that run at slightly different rates."""


class UpdatesDiverge(Exception):
    """Half of the last `DIVERGED_WINDOW` updates made the weights non-finite: the player's settings (or its
    env's rewards) cannot be trained as they are."""


class SessionEnd(enum.Enum):
    STOPPED = "stopped"  # the learner stops: publish, report, release
    REVOKED = "revoked"  # the coordinator took the lease back
    LOST = "lost"  # the coordinator refused our report or forgot this worker


@dataclass(frozen=True)
class SessionContext:
    """What a session uses of the learner process around it."""

    client: LeagueClient
    plane: DataPlane
    shared_root: Path
    device: str
    stopping: Callable[[], bool]
    """True once the learner was asked to stop."""
    on_published: Callable[[str, CheckpointRef], None]
    """Told every checkpoint the session publishes (player id, reference)."""


class LeaseKeeper:
    """Heartbeats one learn job from the moment it is granted (building a model can outlast a short lease)
    until `close`; tells the attached session when the coordinator revoked or forgot the job; and says whether
    the lease is `held`: renewed within the lease's duration (less `LEASE_MARGIN`).

    Why `held`: a coordinator that hears nothing for `lease_timeout_s` lets the lease expire and may give the
    player to another learner, while this one, cut off from the coordinator but not from the actors or the
    shared filesystem, would go on publishing the same player's checkpoints: two writers, each numbering
    versions on from what it saw. So the session publishes nothing while the lease is not held. It is counted
    from when the last confirmed heartbeat was sent (the coordinator renewed the lease no earlier than that).
    The session itself goes on: a coordinator that restarts restores its leases with fresh deadlines, and a
    confirmed heartbeat then resumes publishing with nothing lost; one that let the lease go says so when it is
    reached again (revoked), and only then does the session end.
    """

    def __init__(
        self, client: LeagueClient, job: LearnJob, registration: Registration, watches: Sequence[StallWatch] = (),
    ) -> None:
        """`watches` (a publish stuck on a hung filesystem): past any of their limits renewals stop, so the lease
        expires and the league may bind the player to another learner."""
        self._client = client
        self._job = job
        self._gate = StallGate(watches, f"learn job {job.job_id} ({job.player_id})",
                               "the league can bind the player to another learner", log)
        self._registered_interval = registration.heartbeat_interval_s
        self._pace(job.lease_timeout_s if job.lease_timeout_s > 0 else registration.lease_timeout_s)
        self._confirmed_at = job.requested_at  # lease_now() of the last renewal the coordinator confirmed
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._lost: SessionEnd | None = None
        self._on_lost: Callable[[SessionEnd], None] | None = None
        self._thread = threading.Thread(target=self._run_guarded, name="learner-heartbeat", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _pace(self, lease_s: float) -> None:
        """Heartbeat at least three times per lease, and count the lease as held for `lease_s` less the margin
        (the lease the coordinator grants now: a restarted one may grant a shorter lease than at first)."""
        self._granted_s = lease_s
        self._interval = max(job_heartbeat_interval(self._registered_interval, lease_s), 0.05)
        self._call_timeout = min(10.0, max(1.0, 3 * self._interval))
        self._lease_s = lease_s * (1 - LEASE_MARGIN) if lease_s > 0 else math.inf

    def close(self, wait_s: float | None = None) -> None:
        """Stop heartbeating. `wait_s`: wait at most this long for a heartbeat call under way (a stopping
        learner must not wait out a call to a coordinator that does not answer; the thread ends after it)."""
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(wait_s)

    @property
    def lease_timeout_s(self) -> float:
        """The lease the coordinator grants, as its newest answer said (at first: as the job said)."""
        return self._granted_s

    def attach(self, on_lost: Callable[[SessionEnd], None]) -> None:
        """Call ``on_lost`` when the lease is lost (at once if it already was)."""
        with self._lock:
            self._on_lost = on_lost
            lost = self._lost
        if lost is not None:
            on_lost(lost)

    @property
    def held(self) -> bool:
        """Neither revoked nor refused, and renewed within the lease: publishing is safe."""
        with self._lock:
            lost = self._lost
        return lost is None and lease_now() < self._confirmed_at + self._lease_s

    def _lose(self, reason: SessionEnd) -> None:
        with self._lock:
            self._lost = reason
            on_lost = None if self._closed.is_set() else self._on_lost  # a late answer after close: nobody's
        if on_lost is not None:
            on_lost(reason)

    def _run_guarded(self) -> None:
        """`_run`, whose death by an unexpected error (a bug, a reply it cannot read) ends the session: else the
        learner trained on with no lease, publishing nothing, and never heard that its job was revoked."""
        try:
            self._run()
        except Exception:
            log.exception("heartbeat of learn job %s (%s) failed; asking for a job again", self._job.job_id,
                          self._job.player_id)
            self._lose(SessionEnd.LOST)

    def _run(self) -> None:
        lapsed = False
        while True:
            remaining = self._confirmed_at + self._lease_s - lease_now()
            if remaining <= 0 and not lapsed:
                lapsed = True
                # A WARNING: a coordinator restarted (by `league run`, say) restores its leases, and this learner
                # goes on; one that let the lease go says so when reached (revoked). At ERROR, every restart put
                # one alarming line per learner in the run's output (a review).
                log.warning("no heartbeat of learn job %s (%s) confirmed for %.1f s: the coordinator may have let "
                            "the lease expire and given the player to another learner; publishing nothing until it "
                            "confirms the lease again", self._job.job_id, self._job.player_id,
                            lease_now() - self._confirmed_at)
            if self._closed.wait(self._interval if lapsed else min(self._interval, remaining)):
                return
            if self._gate.stuck() is not None:
                continue
            sent = lease_now()
            try:
                renewal = self._client.heartbeat(self._job.job_id, self._call_timeout)
            except grpc.RpcError as err:
                if self._closed.is_set():
                    return
                if err.code() in TRANSIENT_CODES:
                    log.info("heartbeat: %s (coordinator away?)", err.code().name)
                    continue
                if err.code() in SERVER_FAULT_CODES:  # the coordinator failed the call: no word on the lease
                    log.error("heartbeat of learn job %s failed in the coordinator (%s: %s); trying again",
                              self._job.job_id, err.code().name, err.details())
                    continue
                log.error("heartbeat refused: %s: %s; asking for a job again", err.code().name, err.details())
                self._lose(SessionEnd.LOST)
                return
            if renewal is None:
                if self._closed.is_set():  # the learner finished the job itself meanwhile (its release): no news
                    return
                log.warning("the coordinator revoked learn job %s (%s)", self._job.job_id, self._job.player_id)
                self._lose(SessionEnd.REVOKED)
                return
            if renewal.lease_timeout_s is not None and renewal.lease_timeout_s != self._granted_s:
                log.info("learn job %s: the coordinator's lease is %.1f s (was %.1f s)", self._job.job_id,
                         renewal.lease_timeout_s, self._granted_s)
                self._pace(renewal.lease_timeout_s)
            self._confirmed_at = sent
            if lapsed:
                lapsed = False
                log.warning("the coordinator confirmed the lease of learn job %s (%s) again: publishing resumes",
                            self._job.job_id, self._job.player_id)


class LearnSession:
    """One binding to a player: trains on its queue until ended."""

    def __init__(
        self, context: SessionContext, job: LearnJob, lease: LeaseKeeper, trainer: Trainer,
        publisher: CheckpointPublisher, config: LearnerConfig, seed: int,
    ) -> None:
        self._context = context
        self.job = job
        self.lease = lease
        self.trainer = trainer
        self.publisher = publisher
        self.config = config
        self._publish_every = config.publish_period(trainer.spec.policy.algorithm)
        self._waiting_to_publish = False
        self._report_unanswered = False  # the last UpdatePlayer went unanswered: nothing newer is published
        self.seed = seed
        self.queue = ChunkQueue(config.queue_chunks, config.queue_bytes)
        self.telemetry = Telemetry(Path(context.shared_root) / "tensorboard" / job.player_id,
                                   every_s=config.tensorboard_every_s,
                                   # past the resumed steps: a point at them is of the weights resumed from
                                   purge_from=trainer.progress.agent_steps + 1)
        self._ended = threading.Event()
        self._intake: Intake | None = None  # this session's, once `run` opens it on the data plane
        self._end_lock = threading.Lock()
        self.end_reason: SessionEnd | None = None
        self._ended_at: float | None = None  # time.monotonic() of the first `end`
        self._iteration_s = 0.0  # how long the last train iteration took
        self.rollbacks = 0
        """Updates undone because they made the weights non-finite."""
        self._recent_rollbacks: deque[bool] = deque(maxlen=DIVERGED_WINDOW)  # per update: rolled back?
        self._unloadable_reset: str | None = None  # the reset checkpoint last found unloadable (logged once)
        self.pre_reset_dropped = 0
        """Chunks dropped since the last reset for having been acted before it."""
        self.stale_dropped = 0
        """Chunks dropped for being older than `learner.max_staleness` versions."""
        self._last_log = time.monotonic()
        self.heap_trimmer = HeapTrimmer()
        """Gives the heap's free memory back to the OS every few seconds of training (see `heap_trim`)."""

    @property
    def client(self) -> LeagueClient:
        return self._context.client

    def end(self, reason: SessionEnd) -> None:
        """End the session (any thread); the first reason given wins."""
        with self._end_lock:
            if self.end_reason is None:
                self.end_reason = reason
                self._ended_at = time.monotonic()
        # Its own intake, before the loop can see the end: a late close of whatever intake was current closed
        # the next session's (this one's loop had ended and the learner bound again).
        if (intake := self._intake) is not None:
            self._context.plane.close(intake)
        self._ended.set()

    def run(self) -> SessionEnd:
        plane = self._context.plane
        self._intake = Intake(self.job.player_id, self.trainer.preparer, self.queue)
        plane.open(self._intake)
        if self._ended.is_set():  # ended while it opened: `end` found no intake of its own to close
            plane.close(self._intake)
        if self.publisher.last is not None:
            self._context.on_published(self.job.player_id, self.publisher.last)
        log.info("taking trajectories of %s (learner version %d)", self.job.player_id, self.trainer.version)
        self.lease.attach(self.end)
        try:
            if self._context.stopping():
                self.end(SessionEnd.STOPPED)
            else:
                if self.publisher.last is not None and not self.publisher.failing:  # else the first publish reports
                    self._report(self.publisher.last)
                self._train_until_ended()
        except BindingLost as err:
            log.warning("%s: %s", self.job.player_id, err)
            self.end(SessionEnd.LOST)
        except BaseException:
            self.end(SessionEnd.LOST)
            raise
        finally:
            self._ended.set()
            if self.end_reason is not SessionEnd.STOPPED:
                self._keep_queued()
                self.telemetry.close()
        assert self.end_reason is not None
        return self.end_reason

    def release(self, train_s: float = math.inf) -> None:
        """The learner stops: train on what was accepted, a final checkpoint, UpdatePlayer, FinishJob(RELEASED).
        Without the lease held by then (no heartbeat confirmed for nearly a lease), nothing more is published.

        `train_s` bounds the training: a DQN learner owes replay updates for every queued chunk (tens of
        seconds of them), and a stop that outlasts its supervisor's grace (league run's 15 s) is killed
        before its final checkpoint, losing all it trained since the last one. What is left untrained when
        the time is up is dropped, and the log says how much. The time counts from the stop (the iteration under
        way then, which cannot be cut short, spends it too), and no iteration starts that would end past it by the
        last one's length: a reviewer's PPO iterations of 8192 samples x 10 epochs took ~5 s each under load, and two
        of them ran past the learner's own --stop-timeout."""
        deadline = (self._ended_at if self._ended_at is not None else time.monotonic()) + train_s
        try:
            chunks = self.queue.drain()
            left: list[PreparedChunk] = []
            for taken, chunk in enumerate(chunks):  # one at a time, so batches keep their usual size
                if time.monotonic() >= deadline:
                    left = chunks[taken:]
                    break
                if not self._trainable(chunk):
                    continue
                self.trainer.add(chunk)
                self._train_ready(publish=False, deadline=deadline)
            else:
                # Batches the session had ready when it was told to stop, then what is held short of a batch:
                # the actors were told it arrived, and will not send it again.
                self._train_ready(publish=False, rest=True, deadline=deadline)
            self._log_pre_reset_dropped()
            if self.stale_dropped:
                log.info("%s: %d chunk(s) dropped in this session for acting more than %s version(s) before the "
                         "learner's (learner.max_staleness)", self.job.player_id, self.stale_dropped,
                         self.config.max_staleness)
            if left or self.trainer.untrained_samples or self.trainer.owes_updates:
                self._log_cut_short(train_s, left)
            if self._report_unanswered and self.publisher.last is not None and self.lease.held:
                # Asked again first, as training does before it publishes anything newer (`_publish_and_report`):
                # the lost answer may have been a reset, and a final version above it would be played as the
                # reset player's weights (a review).
                self._report(self.publisher.last, patient=False)
            if not self.lease.held:
                log.warning("%s: no final checkpoint: no heartbeat was confirmed within the lease, so the player may "
                            "be another learner's by now", self.job.player_id)
            elif self._report_unanswered:
                log.warning("%s: no final checkpoint: the coordinator answered no report of version %d (its answer "
                            "may hold a reset); the player's next learner resumes from that version",
                            self.job.player_id, self.publisher.last_version)
            else:
                if self.trainer.adopt_average():
                    log.info("%s: its last checkpoint, version %d, is the moving average of its weights "
                             "(learner.average_decay %g)", self.job.player_id, self.trainer.version,
                             self.trainer.config.average_decay)
                ref = self._publish() if self.trainer.version > self.publisher.last_version else None
                current = ref or self.publisher.last  # None: nothing of the player was ever published
                # A failed or withdrawn final publish leaves the league's view as it is.
                if current is not None and (ref is not None or not self.publisher.failing):
                    self._report(current, patient=False)
        except BindingLost as err:
            log.warning("%s: final report refused (%s); releasing anyway", self.job.player_id, err)
        except UpdatesDiverge as err:  # while training what was accepted: FinishJob was skipped (a review)
            log.error("%s: %s; releasing with the last published checkpoint", self.job.player_id, err)
        finally:
            self.telemetry.close()
        # No more heartbeats: one under way that lands after the finish is answered "revoked", which a stopping
        # learner logged as a WARNING at the end of an ordinary run.
        self.lease.close(wait_s=0)
        self.client.finish(self.job.job_id, league_pb2.FINISH_STATUS_RELEASED, patient=False)
        log.info("released %s at version %d (%d agent steps, %d train iterations)", self.job.player_id,
                 self.publisher.last_version, self.trainer.progress.agent_steps, self.trainer.progress.train_iteration)

    # ---- training -------------------------------------------------------------------------------------
    def _train_until_ended(self) -> None:
        while not self._ended.is_set():
            if self._held_back():
                self._wait_to_publish()
                continue
            chunk = self.queue.get()
            if chunk is None:  # closed: by `end` (Learner.request_stop ends the session before it closes the plane)
                return
            self._consume(chunk)

    def _consume(self, chunk: PreparedChunk) -> None:
        if not self._trainable(chunk):
            return
        self.trainer.add(chunk)
        self._train_ready(publish=True)

    def _keep_queued(self) -> None:
        """The chunks still queued when the session ended otherwise than by a stop go to its trainer, which the
        learner keeps: trained if the league binds the player here again (as a partition's revoked lease does,
        first of all), dropped with the trainer if it binds another. They were dropped with the queue, and those
        of streams already answered were never sent again: up to `queue_chunks` lost at each revocation (a
        review). (`run` has set the end reason by now: a session that failed ended LOST.)"""
        assert self.end_reason is not None
        queued = self.queue.drain()
        if not queued:
            return
        kept = [chunk for chunk in queued if self._trainable(chunk)]
        for chunk in kept:
            self.trainer.add(chunk)
        log.info("%s: %d received chunk(s) not trained on yet (session %s) stay with the trainer", self.job.player_id,
                 len(kept), self.end_reason.value)

    def _trainable(self, chunk: PreparedChunk) -> bool:
        """Whether a received chunk is trained on: not acted before the last reset (not even observed then), and
        not older than `learner.max_staleness` (observed: its episodes' returns stay whole)."""
        if self._acted_before_reset(chunk):
            return False
        self.telemetry.observe(chunk, self.trainer.version)
        return not self._too_stale(chunk)

    def _too_stale(self, chunk: PreparedChunk) -> bool:
        """A chunk acted more than `learner.max_staleness` versions ago: dropped (`LearnerConfig.max_staleness`).
        Seen by the telemetry first, which keeps its episodes' returns whole and shows the staleness received."""
        bound = self.config.max_staleness
        # One version ahead: played under a reset the learner applies at its next report (telemetry.observe).
        # More: a version this learner never reached, whose staleness is unknown (a wrong version, another
        # league's checkpoint): trained under the bound all the same (a review).
        if bound is None or -1 <= self.trainer.version - chunk.header.policy_version <= bound:
            return False
        if not self.stale_dropped:
            log.info("%s: dropping chunks acted more than %d version(s) before the learner's (learner.max_staleness; "
                     "TensorBoard's staleness/dropped is the share dropped)", self.job.player_id, bound)
        self.stale_dropped += 1
        self.telemetry.dropped_stale(chunk)
        return True

    def _acted_before_reset(self, chunk: PreparedChunk) -> bool:
        """A chunk the weights thrown away by the league's last reset acted: not trained on (the reset player's
        updates would follow the old policy's games, with importance ratios against another network), and not
        counted in its agent steps. Logged once per reset."""
        if chunk.header.policy_version >= self.trainer.lineage_from:
            return False
        if not self.pre_reset_dropped:
            log.info("%s: dropping chunks acted before the reset (policy version below %d): the reset player "
                     "trains on its own games", self.job.player_id, self.trainer.lineage_from)
        self.pre_reset_dropped += 1
        return True

    def _log_pre_reset_dropped(self) -> None:
        if self.pre_reset_dropped:
            log.info("%s: %d chunk(s) acted before version %d (the reset's) were dropped", self.job.player_id,
                     self.pre_reset_dropped, self.trainer.lineage_from)

    def _log_cut_short(self, train_s: float, untrained: Sequence[PreparedChunk]) -> None:
        samples = sum(chunk.agent_steps for chunk in untrained) + self.trainer.untrained_samples
        # INFO for a replay learner: its replay, every sample of which is as lost, goes at every stop (README), and
        # this WARNING showed in every clean stop of a DQN league (a review).
        log.log(logging.INFO if self.trainer.replays else logging.WARNING,
                "%s: the stop's %.1f s of training ran out: %d accepted sample(s) not trained on%s%s",
                self.job.player_id, train_s, samples,
                " (replay updates they owed skipped)" if self.trainer.owes_updates else "",
                " (the replay is not kept across a stop either)" if self.trainer.replays else "")

    def _train_ready(self, publish: bool, rest: bool = False, deadline: float = math.inf) -> None:
        """Train while a batch is ready; publish + report every ``publish_every`` iterations when ``publish``.
        ``rest``: then what is held short of a batch too, as a last, smaller one. No iteration starts that would
        end past ``deadline`` (time.monotonic) if it took as long as the last one."""
        while not (publish and self._held_back()) and time.monotonic() + self._iteration_s < deadline:
            started = time.monotonic()
            report = self.trainer.train_ready(rest)
            if report is None:
                return
            self._iteration_s = time.monotonic() - started
            if not self.trainer.weights_finite():
                self._roll_back(report)
                continue
            self._recent_rollbacks.append(False)
            self.trainer.update_average()
            writes = self.telemetry.writes
            scalars = self.telemetry.iteration(report, self.trainer.progress, self.trainer.buffered_samples)
            written = self.telemetry.writes != writes
            # Not once the session ended: a stop that lands during the iteration is the release's to publish and
            # report (one short try each); a patient report here waited out 4 x 10 s against a coordinator that
            # does not answer, past the learner's --stop-timeout. A revoked or lost session publishes nothing.
            if publish and not self._ended.is_set() and self.publisher.due(report.train_iteration,
                                                                            self._publish_every):
                if self.lease.held:  # else the player may be another learner's by now: never two writers
                    self._publish_and_report()
            if written:  # else the scalars are those of an earlier iteration (up to tensorboard_every_s old)
                self._log_progress(scalars)
            elif self.telemetry.every_s > PROGRESS_LOG_EVERY_S:  # no write may come for that long: the line
                self._log_progress(None)  # has the window since the last write, which ends at this iteration
            self.heap_trimmer.maybe_trim()
            if publish and self._ended.is_set():
                return

    def _held_back(self) -> bool:
        """Publishing fails, or may not be done (the lease is unconfirmed: the coordinator away), and the trainer
        is as far ahead of the actors' version as training may go. (Cut off from its coordinator, with actors
        still pushing, a learner trained without bound on ever older data: a review.)"""
        limit = max(MIN_UNPUBLISHED_UPDATES, 2 * self._publish_every)
        return ((self.publisher.failing or not self.lease.held or self._report_unanswered)
                and self.trainer.version - self.publisher.last_version >= limit)

    def _wait_to_publish(self) -> None:
        """Training waits: retry publishing on the publisher's backoff until it works or the session ends."""
        if not self._waiting_to_publish:
            self._waiting_to_publish = True
            log.warning("%s: training waits until %s: %d updates are not published (actors act with version %d), "
                        "and training further ahead of them would learn from ever older data", self.job.player_id,
                        "publishing works again" if self.publisher.failing else
                        "the coordinator confirms the lease again (publishing waits for it)" if not self.lease.held
                        else "the coordinator answers its report of version "
                             f"{self.publisher.last_version} (publishing waits for it)",
                        self.trainer.version - self.publisher.last_version, self.publisher.last_version)
        if self._ended.wait(max(WAIT_TO_PUBLISH_MIN_S, self.publisher.retry_in())):
            return
        if self.lease.held:  # else the player may be another learner's by now: never two writers
            self._publish_and_report()
            if not self._held_back():
                self._waiting_to_publish = False

    def _log_progress(self, scalars: dict[str, float] | None) -> None:
        """The progress line, at most every PROGRESS_LOG_EVERY_S, at an iteration whose scalars were just written:
        its rate, staleness and return are of the same window as its iteration and agent steps. Logged at every
        iteration with the last written scalars, a line paired iteration 56 with the samples/s and return of
        iteration 24 (the write 5 s before). None: the figures of the window since the last write (writes further
        apart than PROGRESS_LOG_EVERY_S: with tensorboard_every_s 600 the line came every 10 minutes)."""
        now = time.monotonic()
        if now - self._last_log < PROGRESS_LOG_EVERY_S:
            return
        self._last_log = now
        if scalars is None:  # between writes further apart than the line's period (tensorboard_every_s)
            scalars = self.telemetry.window_scalars()
        progress = self.trainer.progress
        log.info(
            "%s: iteration %d, version %d, %d agent steps, %.0f samples/s, staleness %.1f, return %s",
            self.job.player_id, progress.train_iteration, self.trainer.version, progress.agent_steps,
            scalars.get("throughput/samples_per_s", 0.0), scalars.get("staleness/mean", 0.0),
            f"{scalars['episode/return_mean']:.2f}" if "episode/return_mean" in scalars else "-",
        )

    def _roll_back(self, report: IterationReport) -> None:
        """The update made the weights NaN/inf: never publish them; continue from the last published weights
        (those the trainer started from, if it has published nothing yet: a league reset whose publish failed)
        with a fresh optimizer (the data of that batch is gone; rows held for the next batch, and a DQN
        player's replay, are kept), numbering on from the current version."""
        start = self.trainer.unpublished_start
        if start is None:
            ref = self._current_ref()
            weights = self.publisher.load_for(ref.path, self.trainer.spec.policy)
            origin = f"the weights of version {ref.version}"
        else:
            weights, origin = start.weights, "the weights it started from (not published yet)"
        log.error("%s: train iteration %d diverged (non-finite weights; stats %s): back to %s with a fresh "
                  "optimizer (%d roll-backs before)", self.job.player_id, report.train_iteration, report.stats,
                  origin, self.rollbacks)
        updates = self.trainer.algorithm_updates
        self.trainer.replace_task(build_task(
            self.trainer.spec, seed=self.seed, device=self._context.device, weights=weights,
            version=self.trainer.version,
        ))
        self.trainer.restore_algorithm_updates(updates)
        self.rollbacks += 1
        self._recent_rollbacks.append(True)
        diverged = sum(self._recent_rollbacks)
        if 2 * diverged >= DIVERGED_WINDOW:
            raise UpdatesDiverge(
                f"{self.job.player_id}: {diverged} of the last {len(self._recent_rollbacks)} updates made the weights "
                f"non-finite and were rolled back (stats of the last: {report.stats}); lower the learning rate "
                f"(policy.{self.trainer.spec.policy.algorithm}.learning_rate), or check the scale of the env's "
                "rewards")

    # ---- reporting and resets -------------------------------------------------------------------------
    def _publish(self) -> CheckpointRef | None:
        """Publish the trainer's weights; None when storage failed (a full disk: logged, training goes on)."""
        ref = self.publisher.try_publish(self.trainer)
        if ref is not None:
            self._context.on_published(self.job.player_id, ref)
        return ref

    def _publish_and_report(self) -> None:
        """Publish the trainer's weights and report them (storage failing: logged, and the publisher retries on a
        backoff).

        While the last report went unanswered, that version is reported again instead, and nothing newer is
        published until the league answers: the lost answer may have been a reset. Published on meanwhile, the
        weights the reset throws away went out under versions above the reset's number, which actors of jobs
        leased after the reset took for the reset player's newer weights and played, and their games counted as
        the reset player's (a review)."""
        if self._report_unanswered:
            self._report(self._current_ref())
            return
        ref = self._publish()
        if ref is not None:
            self._report(ref)

    def _current_ref(self) -> CheckpointRef:
        if self.publisher.last is None:
            raise RuntimeError(f"{self.job.player_id}: nothing published yet")
        return self.publisher.last

    def _report(self, ref: CheckpointRef, patient: bool = True) -> None:
        """UpdatePlayer for ``ref``; when the league reset the player, reload and report the reset weights.
        Not `patient`: one short try per call (the learner is stopping)."""
        for _ in range(MAX_RESETS_PER_REPORT):
            reply = self.client.update_player(self.job.player_id, self.trainer.progress, ref.path, ref.version,
                                              patient=patient, stop=self._ended)
            self._report_unanswered = reply is None
            if reply is None or not reply.mutated:
                return
            try:
                ref = self.apply_reset(reply.reset_checkpoint_path, reply.reset_checkpoint_version)
            except CheckpointError as err:
                self._reset_unloadable(reply.reset_checkpoint_path, err)
                return
            if ref is None:  # not published (storage failed): the league keeps naming the reset checkpoint
                return
        log.error("%s: the league reset the player %d times in a row; carrying on", self.job.player_id,
                  MAX_RESETS_PER_REPORT)

    def _reset_unloadable(self, path: str, err: CheckpointError) -> None:
        """The league's reset checkpoint cannot be loaded (deleted or damaged since the league checked it at
        start). Failing the session would not help: a restarted learner gets the same reset. Training goes on
        with the weights held; the league repeats the reset in every reply until a learner applies it (once the
        file is back). Logged as an error once per checkpoint, not at every report."""
        if self._unloadable_reset != path:
            self._unloadable_reset = path
            log.error("%s: the league reset the player to %s, which cannot be loaded (%s); training goes on with "
                      "the weights held, and the reset applies once the checkpoint is readable again",
                      self.job.player_id, path, err)

    def apply_reset(self, path: str, version: int) -> CheckpointRef | None:
        """Continue from the league's reset checkpoint (``""``: the seeded fresh initialisation) with a fresh
        optimizer and empty buffers, numbered at least ``version`` and above everything published; publish it."""
        weights = self.publisher.load_reset(path, self.trainer.spec.policy)
        self._unloadable_reset = None
        new_version = self.publisher.next_version(version)
        self._log_pre_reset_dropped()  # (of the reset before, if any: the trainer's floor names it)
        self.pre_reset_dropped = 0
        if held := self.trainer.untrained_samples:
            # Played by the weights the reset replaces, as the chunks acted before it that are dropped: said, as
            # those are (they went with the old trainer without a word).
            log.info("%s: the reset drops %d sample(s) of the replaced weights held for their next batch",
                     self.job.player_id, held)
        self.trainer = build_trainer(
            self.trainer.spec, self.config, self.trainer.progress, seed=self.seed,
            device=self._context.device, weights=weights, version=new_version,
        )
        self.client.ack_reset(self.job.player_id, version)  # training goes on from it: the next report says so
        # Actors play the reset under the league's number (`version`) until this learner publishes it as
        # `new_version`; that number may also be the learner's own last publish of the weights thrown away (the
        # league numbers a reset one past the version it last heard of). Once the reset is published, only its
        # own number is sure to be the reset's games; unpublished (storage failing), the actors' games under
        # the league's number are the only ones to train on, and dropping them left the learner with none.
        self.trainer.lineage_from = version
        ref = self._publish()
        if ref is not None:
            self.trainer.lineage_from = new_version
        log.info("%s was reset by the league to %s: continuing at version %d", self.job.player_id,
                 path or "a fresh initialisation", new_version)
        return ref
