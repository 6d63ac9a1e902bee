"""The learner process: serve PushTrajectories, get bound to a player, train it, publish it, hand it back.

    Learner.start()   LearnerService server on --port (0 = free), health SERVING
    Learner.run()     loop: RegisterWorker -> GetJob(LEARNER) until a learn job -> LearnSession.run()
                      a session ends when its lease is revoked or lost (back to GetJob; the trainer is kept
                      in case the same player comes back) or when the learner stops (final checkpoint,
                      UpdatePlayer, FinishJob(RELEASED))
    Learner.request_stop()   from the SIGTERM handler's thread: stop accepting data, end the session

Threads: the thread calling `run` trains (the session loop); one heartbeat thread per learn job; gRPC's server
threads decode and check pushed chunks and block on the session's bounded queue.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from common.busy_clock import BusyClock, StallWatch
from common.checkpoint_store import CheckpointError, CheckpointRef, UnreadableCheckpointError
from common.envs import EnvInfo, make_env
from common.envs.policy_view import policy_specs
from common.learner_config import LearnerConfig
from common.policy_config import PolicyConfig, obs_norm_in_scale, player_seed
from common.proto.league.v1 import league_pb2
from common.root_marker import ROOT_MARKER_WAIT_S, check_shared_root
from common.rpc import (
    SERVER_FAULT_CODES,
    TRANSIENT_CODES,
    RegistrationError,
    ServerOptions,
    ServerTls,
    ServingServer,
    check_exposure,
    is_loopback,
    join_host_port,
    make_server,
    not_a_coordinator_hint,
)
from common.rpc_services import add_service
from common.timed_store import TimedCheckpointStore
from learner_service.config import MAX_CHUNK_BYTES, LearnerSettings
from learner_service.league_client import (
    LAST_WORD_TIMEOUT_S,
    BindingLost,
    Interrupted,
    LeagueClient,
    LearnJob,
    Registration,
)
from learner_service.publisher import CheckpointPublisher
from learner_service.servicer import RESERVED_SERVER_THREADS, SERVICE, DataPlane, LearnerServicer
from learner_service.session import LearnSession, LeaseKeeper, SessionContext, SessionEnd, UpdatesDiverge
from learner_service.trainer import ModelSpec, Trainer, build_trainer

log = logging.getLogger(__name__)


class JobSetupError(Exception):
    """A learn job the learner cannot train (a bad policy/learner section, an unknown env)."""


class WorkerIdTaken(Exception):
    """Another process registered this learner's worker id after it (the same --worker-id given twice): the
    coordinator refuses this one from now on, so it stops."""


class CoordinatorRefused(Exception):
    """The coordinator refused to register this learner or to give it a job, for a reason a restart does not
    change (no or a wrong token, another role under this worker id, not a coordinator at that address): the
    learner stops with one line and exit 2, as an actor does (a traceback and exit 1 had supervisors restart it
    for ever; a review). Transient codes are retried before this."""

    def __init__(self, address: str, err: grpc.RpcError, hint: str = "") -> None:
        code = err.code()
        super().__init__(f"the coordinator at {address} refused this learner: "
                         f"{code.name if code is not None else code}: {err.details()}"
                         f"{not_a_coordinator_hint(code, address)}{hint}")


def _refusal_hint(err: grpc.RpcError, shared_root: Path) -> str:
    """What a refused UpdatePlayer most likely means: a checkpoint the coordinator does not find under its shared
    root is one this learner published under another (a share mounted on one side only, or another path)."""
    if err.code() is grpc.StatusCode.INVALID_ARGUMENT and "shared root" in (err.details() or ""):
        return (f" (this learner published it under its --shared-root {shared_root}: the coordinator's must be "
                "the same share)")
    return ""


def model_spec(job: LearnJob, env_build_timeout_s: float | None = None) -> ModelSpec:
    """The model of the job's player: policy section + the env's policy view (what actors build too). The env is
    built (to read its spaces) within `env_build_timeout_s`, else JobSetupError names it."""
    try:
        policy = PolicyConfig.from_mapping(job.policy)
        obs_specs, action_spec = policy_specs(_env_info(job, env_build_timeout_s), policy.algorithm)
    except JobSetupError:
        raise
    except Exception as err:  # a bad policy section, an unknown env or env kwargs (gymnasium has its own errors)
        raise JobSetupError(f"job {job.job_id} ({job.player_id}): {type(err).__name__}: {err}") from err
    return ModelSpec(policy, obs_specs, action_spec)


def _env_info(job: LearnJob, timeout_s: float | None) -> EnvInfo:
    """The job's env's `info()`, from an env built and closed in a thread of its own, waited for `timeout_s`: a
    constructor that hangs cannot be interrupted, but the learner need not hang with it (the thread is left to
    the process's exit, which a setup error brings)."""
    outcome: list[EnvInfo | BaseException] = []
    answered = threading.Event()

    def build() -> None:
        try:
            env = make_env(job.env_name, **job.env_kwargs)
        except BaseException as err:  # (handed to the learner thread, which raises it)
            outcome.append(err)
            answered.set()
            return
        try:
            outcome.append(env.info())
        except BaseException as err:
            outcome.append(err)
        finally:
            answered.set()  # not waiting for the close: a close that hangs cost the whole timeout (a review)
            try:
                env.close()
            except Exception:
                log.warning("job %s: closing env %r after reading its spaces raised", job.job_id, job.env_name,
                            exc_info=True)

    threading.Thread(target=build, name=f"env-build-{job.job_id}", daemon=True).start()
    answered.wait(timeout_s)
    if not outcome:
        raise JobSetupError(f"job {job.job_id} ({job.player_id}): building env {job.env_name!r} to read its spaces "
                            f"took over {timeout_s:g} s (its constructor hangs?); the learner's --env-build-timeout "
                            "(league run: run.env_reset_timeout_s) allows more")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def learner_config(job: LearnJob) -> LearnerConfig:
    try:
        return LearnerConfig.from_mapping(job.learner_kwargs)
    except ValueError as err:
        raise JobSetupError(f"job {job.job_id} ({job.player_id}): {err}") from err


@dataclass
class _Kept:
    """A trainer from a session that ended without its player being handed back (revoked, lost)."""

    player_id: str
    trainer: Trainer
    published_version: int


class Learner:
    def __init__(self, settings: LearnerSettings) -> None:
        self.settings = settings
        self.plane = DataPlane()
        self.client = LeagueClient(
            settings.coordinator, settings.worker_id, token=settings.token, tls_ca=settings.tls_ca,
            tls_server_name=settings.tls_server_name, max_backoff_s=settings.max_backoff_s,
        )
        self.server: ServingServer | None = None
        self.servicer: LearnerServicer | None = None
        self.data_endpoint = ""
        self._lock = threading.Lock()
        self._stopping = False
        self._session: LearnSession | None = None
        self._job: LearnJob | None = None  # the learn job being served, from binding to its FinishJob
        self._kept: _Kept | None = None
        self._published_cond = threading.Condition()
        self._published: dict[str, CheckpointRef] = {}
        self._publishing = BusyClock()  # the session's checkpoint publish or read under way (lease keeper)

    @property
    def stopping(self) -> bool:
        with self._lock:
            return self._stopping

    @property
    def session(self) -> LearnSession | None:
        with self._lock:
            return self._session

    def note_published(self, player_id: str, ref: CheckpointRef) -> None:
        """Record the newest published version of the bound player (told to actors in PushSummary)."""
        self.plane.learner_version = ref.version
        with self._published_cond:
            self._published[player_id] = ref
            self._published_cond.notify_all()

    def wait_published(self, player_id: str, min_version: int, timeout_s: float) -> CheckpointRef:
        """Block until this learner published ``min_version`` (or later) of the player; for tests and tools."""
        def reached() -> bool:
            ref = self._published.get(player_id)
            return ref is not None and ref.version >= min_version

        with self._published_cond:
            if not self._published_cond.wait_for(reached, timeout_s):
                latest = self._published.get(player_id)
                raise TimeoutError(f"{player_id}: version {min_version} not published within {timeout_s}s "
                                   f"(latest {latest.version if latest else None})")
            return self._published[player_id]

    def start(self) -> str:
        """Bind and start the LearnerService server; returns the bound address."""
        s = self.settings
        check_exposure(s.host, s.token, insecure=s.insecure)
        options = ServerOptions(host=s.host, port=s.port, token=s.token, max_receive_bytes=MAX_CHUNK_BYTES,
                                tls=ServerTls(s.tls_cert, s.tls_key) if s.tls_cert and s.tls_key else None)
        self.servicer = LearnerServicer(self.plane, max_streams=options.max_workers - RESERVED_SERVER_THREADS,
                                        stream_idle_timeout_s=s.stream_idle_timeout_s)
        self.server = make_server(
            options, lambda server: add_service(server, self.servicer, SERVICE), [SERVICE.full_name],
        )
        if s.advertise:
            self.data_endpoint = s.advertise
        else:
            host = s.host if s.host not in ("0.0.0.0", "::", "[::]", "") else socket.gethostname()
            self.data_endpoint = join_host_port(host, self.server.port)
            if not is_loopback(host):
                log.info("advertising %s to actors (give --advertise to choose)", self.data_endpoint)
        return self.server.address

    def run(self) -> None:
        """Serve learn jobs until `request_stop`. Raises on what cannot be recovered (bad job config, bugs)."""
        if self.server is None:
            raise RuntimeError("Learner.start() first")
        store_root = Path(self.settings.shared_root)
        root_checked = ""

        def check_root(registration: Registration) -> None:
            """Once per root id (a restarted coordinator keeps its root): `RegistrationError` when this learner's
            --shared-root is not the coordinator's (it resumed its player from no checkpoint, or an old one found
            there, and trained until its first publish was refused)."""
            nonlocal root_checked
            if registration.shared_root_id != root_checked:
                check_shared_root(store_root, registration.shared_root_id, self.client.wait_interrupted,
                                  ROOT_MARKER_WAIT_S)
                root_checked = registration.shared_root_id

        while not self.stopping:
            try:
                registration = self.client.register(self.data_endpoint)
                check_root(registration)
                job = self.client.next_learn_job(self.data_endpoint, self.settings.get_job_wait_s)
            except Interrupted:
                break
            except grpc.RpcError as err:
                if err.code() is grpc.StatusCode.ALREADY_EXISTS:
                    raise WorkerIdTaken(err.details()) from None
                raise CoordinatorRefused(self.client.address, err) from err
            if (again := self.client.registration) is not registration:
                # Registered again while it waited for a job (a coordinator that forgot this worker, or a new one
                # at the address): its root is checked as at the first, the job handed back if it is another.
                registration = again
                try:
                    check_root(registration)
                except RegistrationError:
                    self.client.finish(job.job_id, league_pb2.FINISH_STATUS_RELEASED, patient=False)
                    raise
            log.info("bound to %s (learn job %s, checkpoint %r v%d)", job.player_id, job.job_id,
                     job.checkpoint_path, job.checkpoint_version)
            lease = LeaseKeeper(self.client, job, registration, self._stall_watches()).start()
            with self._lock:
                self._job = job
            try:
                self._serve_job(job, lease, store_root)
            finally:
                with self._lock:
                    self._job = None
                lease.close(LAST_WORD_TIMEOUT_S if self.stopping else None)
        if self._kept is not None and (untrained := self._kept.trainer.untrained_samples):
            # (Said where the kept trainer is dropped at a rebind; a stop before any dropped it without a word.)
            log.warning("%s: dropping %d received samples not trained on: the learner stops before the league bound "
                        "the player here again", self._kept.player_id, untrained)
        self.client.leave()  # stopping: its learn job was released (or the leave releases it)

    def _stall_watches(self) -> list[StallWatch]:
        """What the session may be stuck in where nothing breaks it off: the lease keeper lets the lease go past
        these limits, so that the league can bind the player to another learner."""
        if self.settings.publish_timeout_s is None:
            return []
        return [StallWatch("a checkpoint publish or read has taken", self._publishing.busy_s, self.settings.publish_timeout_s)]

    def _serve_job(self, job: LearnJob, lease: LeaseKeeper, store_root: Path) -> None:
        try:
            session = self._open_session(job, lease, store_root)
        except JobSetupError as err:
            self.client.finish(job.job_id, league_pb2.FINISH_STATUS_FAILED, str(err))
            raise
        except BindingLost as err:
            log.warning("%s: %s", job.player_id, err)
            return
        except Interrupted:  # told to stop while it bound: nothing trained, the job goes back (one short try)
            log.info("%s: stopping while binding; releasing learn job %s", job.player_id, job.job_id)
            self.client.finish(job.job_id, league_pb2.FINISH_STATUS_RELEASED, patient=False)
            return
        except grpc.RpcError as err:
            if err.code() in SERVER_FAULT_CODES:
                log.error("%s: the coordinator failed a call while binding (%s: %s); asking again", job.player_id,
                          err.code().name, err.details())
                return
            if err.code() not in TRANSIENT_CODES:
                raise
            log.warning("%s: coordinator unreachable while binding (%s); asking again", job.player_id,
                        err.code().name)
            return
        with self._lock:
            self._session = session
        try:
            end = session.run()
        except UpdatesDiverge as err:  # the league's settings for the player, not a bug: a setup error
            self.client.finish(job.job_id, league_pb2.FINISH_STATUS_FAILED, str(err))
            raise JobSetupError(str(err)) from err
        except grpc.RpcError as err:
            # UpdatePlayer refused for a reason no retry changes (the client retries transient codes and ends the
            # session on binding ones): a token rotated away, a checkpoint the coordinator cannot see. A traceback
            # and exit 1 had supervisors restart the learner for ever (a review); one line and exit 2.
            self.client.finish(job.job_id, league_pb2.FINISH_STATUS_FAILED, f"UpdatePlayer refused: {err.details()}")
            raise CoordinatorRefused(self.client.address, err, _refusal_hint(err, store_root)) from err
        except BaseException as err:
            self.client.finish(job.job_id, league_pb2.FINISH_STATUS_FAILED, f"{type(err).__name__}: {err}")
            raise
        finally:
            with self._lock:
                self._session = None
        if end is SessionEnd.STOPPED:
            session.release(self.settings.stop_train_s)
        else:
            self._kept = _Kept(job.player_id, session.trainer, session.publisher.last_version)
            if untrained := session.trainer.untrained_samples:
                log.info("%s: %d received samples not trained on stay with this learner's trainer: trained if the "
                         "league binds %s here again, dropped if it binds another player", job.player_id,
                         untrained, job.player_id)

    def request_stop(self) -> None:
        """Stop taking data and end the current session (safe from any thread)."""
        with self._lock:
            self._stopping = True
            session = self._session
        self.plane.mark_stopping()
        if session is not None:  # before the plane closes: a session whose queue closes must find itself stopped
            session.end(SessionEnd.STOPPED)
        if self.server is not None:
            self.server.set_serving(False)
        self.client.interrupt()
        self.plane.close()

    def release_stuck_job(self) -> bool | None:
        """For the process shell, when the learner thread did not get back within the stop timeout (a final
        checkpoint stuck on a hung share, say): hand the learn job back from the calling thread, so that the
        league can bind the player to another learner now rather than when the lease expires. One short attempt;
        None without a job. The process must exit right after: the learner thread must not publish again."""
        with self._lock:
            job = self._job
        if job is None:
            return None
        log.warning("learn job %s (%s): releasing it from outside the stuck learner thread; what was trained "
                    "since version %d is lost", job.job_id, job.player_id, self.plane.learner_version)
        return self.client.finish(job.job_id, league_pb2.FINISH_STATUS_RELEASED,
                                  "the learner gave up on its stuck learner thread at stop", patient=False)

    def close(self, grace_s: float = 2.0) -> None:
        """Stop the server (health NOT_SERVING, in-flight streams get ``grace_s``) and the client."""
        self.plane.mark_stopping()
        self.plane.close()
        if self.server is not None:
            self.server.stop(grace_s)
        self.client.close()

    # ---- binding ----------------------------------------------------------------------------------------
    def _open_session(self, job: LearnJob, lease: LeaseKeeper, store_root: Path) -> LearnSession:
        spec = model_spec(job, self.settings.env_build_timeout_s)
        config = learner_config(job)
        try:
            return self._start_session(job, lease, store_root, spec, config)
        except UnreadableCheckpointError:
            raise  # (no permission, EIO: the share's state now, not the league's config) a failure, retried
        except CheckpointError as err:  # e.g. the league names a pretrained checkpoint that is not there
            raise JobSetupError(f"job {job.job_id} ({job.player_id}): {err}") from err

    def _start_session(
        self, job: LearnJob, lease: LeaseKeeper, store_root: Path, spec: ModelSpec, config: LearnerConfig
    ) -> LearnSession:
        seed = config.seed if config.seed is not None else player_seed(job.player_id)
        # Asked again under the commit lock, after the files are written: a learner frozen mid-publish past its
        # lease (SIGSTOP, a paused VM, a slow share) must not publish over the learner that took the player over.
        store = TimedCheckpointStore(store_root, keep_last=config.keep_last, clock=self._publishing,
                                     publish_guard=None if lease is None else (lambda: lease.held))
        publisher = CheckpointPublisher(store, job.player_id, self.settings.worker_id)
        kept, self._kept = self._kept, None
        reuse = (
            kept is not None and kept.player_id == job.player_id and kept.trainer.spec == spec
            and publisher.last_version <= kept.published_version and job.checkpoint_version <= kept.published_version
        )
        if kept is not None and not reuse:
            # Their resends are new data again: answered as duplicates, chunks of a stream never acknowledged
            # were never trained anywhere (a review).
            self.plane.forget_keys(kept.trainer.untrained_keys())
            if untrained := kept.trainer.untrained_samples:
                log.info("%s: dropping %d received samples not trained on: %s", kept.player_id, untrained,
                         f"this learner now trains {job.player_id}" if kept.player_id != job.player_id
                         else "the player's checkpoints moved on without this learner")
        if reuse:
            log.info("%s: continuing with the trainer kept in memory (version %d)", job.player_id, kept.trainer.version)
            trainer = kept.trainer
            trainer.config = config
            # Another learner may have held the player meanwhile and reported steps it received without an update
            # (no new version): the kept counters must not report below the league's, which refuses steps that go
            # back, and the refusal ended this binding to be handed straight back, in a loop that never trained.
            league = self.client.player_progress(job.player_id)
            trainer.progress.agent_steps = max(trainer.progress.agent_steps, league.agent_steps)
            trainer.progress.train_iteration = max(trainer.progress.train_iteration, league.train_iteration)
        else:
            league = self.client.player_progress(job.player_id)
            start = publisher.choose_start(job.checkpoint_path, job.checkpoint_version, league)
            version = start.version if start.published is not None else publisher.next_version(start.version)
            weights = start.weights
            if weights is not None:
                weights, factor = obs_norm_in_scale(weights, start.metadata, spec.policy)
                if factor is not None:
                    log.info("%s: %s was trained with model.obs_scale %s, the config says %s: its observation "
                             "statistics are carried over (times %g)", job.player_id, start.source,
                             start.metadata.get("model.obs_scale"), spec.policy.model.obs_scale, factor)
            try:
                trainer = build_trainer(spec, config, start.progress, seed=seed, device=self.settings.device,
                                        weights=weights, version=version)
            except ValueError as err:  # a model the env's observations do not fit (ModelConfig, Torso)
                raise JobSetupError(f"job {job.job_id} ({job.player_id}): {err}") from err
            trainer.restore_algorithm_updates(start.algorithm_updates)
            if start.resumed is not None:  # the player's own weights: resume their optimizer state too (also
                # those of an older version when newer ones are damaged: a fresh Adam under the restored update
                # count had its learning-rate annealing and its step count disagree)
                trainer.resume_training_state(publisher.store, start.resumed)
                self.plane.seed_seen(trainer.trained.export())
            trainer.lineage_from = start.lineage_from  # (a reset or pretrained checkpoint the league names)
            if start.lineage_from:
                # Started from the checkpoint the league names (a reset of the player pending since its last
                # learner, say): said in the first report, or the league repeated the reset and this learner
                # started over, dropping what it trained meanwhile (all of it, if its first publish had failed).
                self.client.ack_reset(job.player_id, start.lineage_from)
            if start.published is None:
                publisher.try_publish(trainer)  # a full disk is logged; the session retries on a backoff
            log.info("%s: starting from %s at version %d (%d agent steps, %d train iterations)", job.player_id,
                     start.source, trainer.version, start.progress.agent_steps, start.progress.train_iteration)
        context = SessionContext(self.client, self.plane, Path(self.settings.shared_root), self.settings.device,
                                 lambda: self.stopping, self.note_published)
        return LearnSession(context, job, lease, trainer, publisher, config, seed)
