"""A stopping learner's release: final checkpoint, report, FinishJob(RELEASED). A reviewer found that a final
publish withdrawn at its commit (the lease lapsed while the file was written), for a player with nothing
published yet, made `release` raise ("nothing published yet") before FinishJob: the learner died with a
traceback and the player waited for the lease to expire."""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from common.checkpoint_store import CheckpointStore
from common.learner_config import LearnerConfig
from common.proto.league.v1 import league_pb2, league_pb2_grpc
from learner_service.league_client import Interrupted, LeagueClient, LearnJob
from learner_service.publisher import CheckpointPublisher
from learner_service.servicer import DataPlane
from learner_service.session import DIVERGED_WINDOW, LearnSession, SessionContext, SessionEnd
from learner_service.trainer import Progress, build_trainer
from tests.unit.test_learner_trainer import _prepared, _trainer


class _Lease:
    """Held when `release` asks, gone by the time the commit asks."""

    def __init__(self) -> None:
        self.asked = 0

    @property
    def held(self) -> bool:
        self.asked += 1
        return self.asked == 1

    def close(self, wait_s=None) -> None:
        pass


class _Client:
    def __init__(self) -> None:
        self.reports: list[str] = []
        self.finished: list[tuple[str, int]] = []

    def update_player(self, *args, **kwargs):
        self.reports.append(args)

    def finish(self, job_id, status, *args, **kwargs):
        self.finished.append((job_id, status))


def test_a_withdrawn_final_publish_of_a_player_with_nothing_published_still_releases_the_job(tmp_path):
    lease, client = _Lease(), _Client()
    publisher = CheckpointPublisher(CheckpointStore(tmp_path, publish_guard=lambda: lease.held), "p", "w")
    context = SessionContext(client, DataPlane(), tmp_path, "cpu", lambda: True, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, lease, _trainer(), publisher, LearnerConfig(), seed=0)
    session.release()
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]
    assert client.reports == [] and publisher.store.latest("p") is None


class _HeldLease:
    held = True

    def close(self, wait_s=None) -> None:
        pass


def _dqn_session(tmp_path, client):
    trainer = _trainer("dqn", replay_ratio=8.0)
    publisher = CheckpointPublisher(CheckpointStore(tmp_path), "p", "w")
    publisher.try_publish(trainer)
    context = SessionContext(client, DataPlane(), tmp_path, "cpu", lambda: True, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, _HeldLease(), trainer, publisher, LearnerConfig(), seed=0)
    for seq in range(6):  # queued when the stop came: each owes replay updates (16 transitions x 8 / 8)
        assert session.queue.put(_prepared(trainer, batch=2, steps=8, seq=seq))
    return session, trainer, publisher


def test_the_training_of_a_stop_is_bounded_and_the_final_checkpoint_still_published(tmp_path, caplog):
    """A DQN learner owed replay updates for every queued chunk: its stop trained for longer than league run's
    grace and was killed before its final checkpoint (a reviewer lost ~2,000 trained steps so). With no time
    to train, the stop publishes what it has, says what it dropped, and releases."""
    client = _Client()
    session, trainer, publisher = _dqn_session(tmp_path, client)
    with caplog.at_level(logging.INFO, logger="learner_service.session"):
        session.release(train_s=0.0)
    assert trainer.progress.train_iteration == 0 and publisher.last_version == 0
    (said,) = [r for r in caplog.records if "the stop's 0.0 s of training ran out" in r.message]
    assert "96 accepted sample(s) not trained on" in said.message
    # INFO: a DQN learner's replay goes at every stop; it was a WARNING in every clean stop of a DQN league.
    assert said.levelname == "INFO" and "the replay is not kept across a stop" in said.message
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]

    client = _Client()
    (tmp_path / "unbounded").mkdir()
    session, trainer, publisher = _dqn_session(tmp_path / "unbounded", client)
    session.release()  # the default: everything accepted is trained on
    assert trainer.progress.train_iteration > 0 and not trainer.owes_updates
    assert publisher.last_version == trainer.version > 0
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]


def test_the_stops_training_time_counts_from_the_stop_and_no_iteration_starts_that_would_end_past_it(tmp_path):
    """A reviewer's PPO learner (8192 samples x 10 epochs, ~5 s an iteration under load) finished the iteration
    under way at the stop, then began another in release(): past its --stop-timeout, exit 1, the last training
    lost. The time now counts from the stop, and an iteration as long as the last one must fit before its end."""
    client = _Client()
    session, trainer, _ = _dqn_session(tmp_path, client)
    session.end(SessionEnd.STOPPED)
    time.sleep(0.3)  # the iteration under way at the stop took this long
    session.release(train_s=0.2)
    assert trainer.progress.train_iteration == 0
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]

    (tmp_path / "long").mkdir()
    client = _Client()
    session, trainer, _ = _dqn_session(tmp_path / "long", client)
    session._iteration_s = 60.0  # the last iteration took a minute: another would not end within the 5 s
    session.end(SessionEnd.STOPPED)
    session.release(train_s=5.0)
    assert trainer.progress.train_iteration == 0 and client.finished


class _PatienceClient(_Client):
    def update_player(self, *args, patient=True, **kwargs):
        self.reports.append(patient)


def test_a_stop_during_an_iteration_leaves_its_publish_and_report_to_the_release(tmp_path):
    """A stop that landed while an iteration trained: the iteration then published and reported with the
    patient policy (4 tries of 10 s), and against a coordinator that did not answer the learner thread took
    ~48 s to stop, past its 20 s --stop-timeout (exit 1, released from outside the stuck thread). The release
    publishes that iteration and reports it once, briefly."""
    client = _PatienceClient()
    trainer = _trainer(batch_size=16)
    publisher = CheckpointPublisher(CheckpointStore(tmp_path), "p", "w")
    publisher.try_publish(trainer)
    context = SessionContext(client, DataPlane(), tmp_path, "cpu", lambda: False, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, _HeldLease(), trainer, publisher, LearnerConfig(publish_every=1), seed=0)
    train_ready = trainer.train_ready

    def stopped_meanwhile(rest=False):
        report = train_ready(rest)
        session.end(SessionEnd.STOPPED)  # SIGTERM while the iteration ran
        return report

    trainer.train_ready = stopped_meanwhile
    session._consume(_prepared(trainer, seq=0))
    assert trainer.version == 1 and publisher.last_version == 0 and client.reports == []
    trainer.train_ready = train_ready
    session.release()
    assert publisher.last_version == 1 and client.reports == [False]
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]


def test_a_patient_report_tries_no_more_once_its_stop_is_set():
    """The report under way when the stop lands: no further attempt (each may wait out a 10 s deadline)."""
    client = LeagueClient("127.0.0.1:1", "w")
    calls = []

    class _Unavailable(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

    class _Failed:
        """A call the coordinator failed (UNAVAILABLE) just as the stop landed."""

        def add_done_callback(self, callback) -> None:
            callback(self)

        def result(self):
            raise _Unavailable()

    def update(request, timeout):
        calls.append(timeout)
        stop.set()  # the stop lands during the first attempt
        return _Failed()

    stop = threading.Event()
    client._stub = type("Stub", (), {"UpdatePlayer": type("Method", (), {"future": staticmethod(update)})()})()
    try:
        assert client.update_player("p", Progress(), "path", 1, stop=stop) is None
    finally:
        client.close()
    assert len(calls) == 1


class _HungUpdatePlayer(league_pb2_grpc.LeagueServiceServicer):
    """A coordinator that takes the call and does not answer (SIGSTOPped, or a proxy that forwards nothing),
    until `release` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.arrived = threading.Event()
        self.release = threading.Event()

    def UpdatePlayer(self, request, context):  # noqa: N802 (the gRPC method's name)
        self.calls += 1
        self.arrived.set()
        self.release.wait(60)
        return league_pb2.UpdatePlayerResponse()


def test_a_stop_cancels_the_attempt_of_a_patient_report_a_hung_coordinator_holds(caplog):
    """The stop landed during the first attempt of a patient UpdatePlayer: the learner waited that attempt out
    (10 s; its stop took 16.5 s against a coordinator that did not answer, where README promises ~10 s). The
    attempt is cancelled now; the stopping learner's own short report is not cut by the stop."""
    hung = _HungUpdatePlayer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    league_pb2_grpc.add_LeagueServiceServicer_to_server(hung, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = LeagueClient(f"127.0.0.1:{port}", "w")
    stop = threading.Event()
    outcome: list = []
    reporter = threading.Thread(target=lambda: outcome.append(
        client.update_player("p", Progress(), "path", 1, stop=stop)), daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="learner_service.league_client"):
            reporter.start()
            assert hung.arrived.wait(10)
            stop.set()
            reporter.join(2.0)  # the attempt's own deadline is 10 s
            assert not reporter.is_alive(), "the patient report still waits out its attempt after the stop"
        assert outcome == [None] and hung.calls == 1  # no retry after the stop either
        assert "cut short by the end of its session (CANCELLED)" in caplog.text
        hung.release.set()  # the coordinator answers again: the stop's own report is not cancelled
        assert client.update_player("p", Progress(), "path", 1, patient=False, stop=stop) is not None
    finally:
        hung.release.set()
        client.close()
        server.stop(None)


class _HungFuture:
    """A call to a coordinator that does not answer: never done until cancelled."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def add_done_callback(self, callback) -> None:
        pass

    def done(self) -> bool:
        return self.cancelled.is_set()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


class _HungGetStatus:
    def __init__(self) -> None:
        self.futures: list[_HungFuture] = []

    def __call__(self, request, timeout):  # the blocking form: waits out its deadline
        time.sleep(timeout)
        raise TimeoutError("deadline")

    def future(self, request, timeout):
        self.futures.append(_HungFuture())
        return self.futures[-1]


def test_a_stop_while_binding_ends_the_wait_for_the_leagues_progress():
    """`player_progress` (binding) against a coordinator that does not answer took 4 tries of 10 s: a learner
    told to stop then took ~45 s, past its --stop-timeout. `interrupt` ends it, like the other waiting calls."""
    client = LeagueClient("127.0.0.1:1", "w")
    get_status = _HungGetStatus()
    client._stub = type("Stub", (), {"GetStatus": get_status})()
    outcome: list = []

    def bind() -> None:
        try:
            outcome.append(client.player_progress("p"))
        except Exception as err:  # the test looks at what it was
            outcome.append(err)

    thread = threading.Thread(target=bind, daemon=True)
    try:
        thread.start()
        time.sleep(0.2)
        client.interrupt()
        thread.join(2.0)
        assert not thread.is_alive(), "player_progress still waits after interrupt()"
        assert len(outcome) == 1 and isinstance(outcome[0], Interrupted)
        assert len(get_status.futures) == 1 and get_status.futures[0].cancelled.is_set()
    finally:
        client.close()


class _BigStatus(league_pb2_grpc.LeagueServiceServicer):
    """A long league's status: over gRPC's default 4 MB."""

    def GetStatus(self, request, context):
        players = [league_pb2.PlayerStatus(player_id=f"historical_{i:06d}_" + "x" * 60, active=False)
                   for i in range(60_000)]
        players.append(league_pb2.PlayerStatus(player_id="p", active=True, agent_steps=1234, train_iteration=56))
        return league_pb2.LeagueStatus(players=players)


def test_a_learner_binds_a_player_of_a_league_whose_status_is_over_4_mb():
    """The status outgrows 4 MB in a long league (~6,000 historical players); the learner read its player's totals
    from it over a channel of the default limit, so every bind failed RESOURCE_EXHAUSTED and the learner exited 1
    (a review)."""
    from common.job_limits import STATUS_MAX_BYTES

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_send_message_length", STATUS_MAX_BYTES)])
    league_pb2_grpc.add_LeagueServiceServicer_to_server(_BigStatus(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = LeagueClient(f"127.0.0.1:{port}", "w")
    try:
        assert client.player_progress("p") == Progress(1234, 56)
    finally:
        client.close()
        server.stop(None)


def test_a_release_publishes_the_moving_average_of_the_weights_as_the_last_checkpoint(tmp_path, caplog):
    """learner.average_decay > 0: the release publishes the average as one more version (what the run's final
    network is), after the updates of the stop's training were folded into it."""
    client = _Client()
    config = LearnerConfig(batch_size=16, average_decay=0.9)
    trainer = _trainer(batch_size=16, average_decay=0.9)
    publisher = CheckpointPublisher(CheckpointStore(tmp_path), "p", "w")
    publisher.try_publish(trainer)
    context = SessionContext(client, DataPlane(), tmp_path, "cpu", lambda: True, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, _HeldLease(), trainer, publisher, config, seed=0)
    for seq in range(4):
        assert session.queue.put(_prepared(trainer, seq=seq))  # 16 samples each: one update each
    with caplog.at_level(logging.INFO, logger="learner_service.session"):
        session.release()
    assert trainer.progress.train_iteration == 4
    assert publisher.last_version == trainer.version == 5  # four updates, then the average
    assert "its last checkpoint, version 5, is the moving average of its weights" in caplog.text
    final = publisher.store.load(publisher.last.path).tensors
    assert all(np.array_equal(final[k], v) for k, v in trainer.task.get_weights().items())
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]


class _ResetClient(_Client):
    def __init__(self) -> None:
        super().__init__()
        self.acked: list[int] = []

    def ack_reset(self, player_id, version):
        self.acked.append(version)

    def update_player(self, *args, **kwargs):
        self.reports.append(args)
        return SimpleNamespace(mutated=False)  # answered (None: unanswered, and nothing newer is published)


def _reset_session(tmp_path, guard=lambda: True):
    trainer = _trainer(batch_size=16)
    publisher = CheckpointPublisher(CheckpointStore(tmp_path, publish_guard=lambda: guard()), "p", "w")
    publisher.try_publish(trainer)  # v0
    client = _ResetClient()
    context = SessionContext(client, DataPlane(), tmp_path, "cpu", lambda: False, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, _HeldLease(), trainer, publisher, LearnerConfig(batch_size=16, publish_every=1),
                           seed=0)
    return session, publisher, client


def test_chunks_of_the_weights_a_reset_threw_away_are_dropped_and_the_floor_goes_with_the_trainer(tmp_path):
    session, publisher, client = _reset_session(tmp_path)
    trainer = session.trainer
    trainer.add(_prepared(trainer, seq=0))
    trainer.add(_prepared(trainer, seq=1))
    assert trainer.train_ready() is not None  # v1 trained; the league resets the player as v2 (one past v1)
    publisher.try_publish(trainer)
    assert session.apply_reset("", 2) is not None and client.acked == [2]
    assert session.trainer.version == 2 and session.trainer.lineage_from == 2  # (next_version(2) = 2: unpublished)
    steps = session.trainer.progress.agent_steps
    session._consume(_prepared(session.trainer, seq=2, policy_version=1))  # acted by the thrown-away weights
    assert session.trainer.progress.agent_steps == steps and session.pre_reset_dropped == 1
    session._consume(_prepared(session.trainer, seq=3, policy_version=2))  # the reset's own games
    assert session.trainer.progress.agent_steps == steps + 16
    # A later session of this learner that keeps the trainer (its lease was lost, the player came back) keeps
    # the floor: it lives on the trainer, not the session.
    again = LearnSession(session._context, session.job, _HeldLease(), session.trainer, publisher,
                         LearnerConfig(batch_size=16, publish_every=1), seed=0)
    again._consume(_prepared(again.trainer, seq=4, policy_version=1))
    assert again.pre_reset_dropped == 1 and again.trainer.progress.agent_steps == steps + 16


class _LostReplyClient(_ResetClient):
    """Answers the reports with `replies` in turn (None: the reply was lost), then plainly."""

    def __init__(self, replies) -> None:
        super().__init__()
        self.replies = list(replies)

    def update_player(self, player_id, progress, path, version, **kwargs):
        self.reports.append(version)
        return self.replies.pop(0) if self.replies else SimpleNamespace(mutated=False)


def test_nothing_newer_is_published_while_the_last_report_is_unanswered(tmp_path):
    """The league reset the player as v1 and the reply to the report of v1 was lost. The learner published the
    weights the reset throws away on, as v2, which actors of jobs leased after the reset took for the reset
    player's newer weights (their games counted as its own; a review). Now it reports v1 again instead, and the
    reset, heard then, is what v2 holds."""
    reset = SimpleNamespace(mutated=True, reset_checkpoint_path="", reset_checkpoint_version=1)
    session, publisher, _ = _reset_session(tmp_path)
    client = _LostReplyClient([None, reset])
    session._context = SessionContext(client, DataPlane(), tmp_path, "cpu", lambda: False, lambda *a: None)
    for seq in range(3):
        session._consume(_prepared(session.trainer, seq=seq))  # one update each, a publish due after each
    assert client.reports[:2] == [1, 1]  # v1's report lost, then v1 again: no v2 of the old weights
    assert client.acked == [1] and client.reports[2] == 2  # the reset, published as v2
    assert session.trainer.lineage_from == 2 and publisher.store.versions("p")[-1].version >= 2
    fresh = build_trainer(session.trainer.spec, session.config, Progress(), seed=session.seed, device="cpu",
                          weights=publisher.load_reset("", session.trainer.spec.policy), version=2).task.get_weights()  # the reset's weights
    v2 = publisher.store.load("p/v0000000002.pt").tensors
    assert all(np.array_equal(v2[k], fresh[k]) for k in fresh), "v2 holds other weights than the reset's"


def test_a_stop_publishes_nothing_newer_while_the_last_report_is_unanswered(tmp_path, caplog):
    """The stop published its final version regardless: with the answer holding a reset lost, that version of
    the thrown-away weights was the player's newest, played as the reset player's (a review of this session's
    change). It asks again first; unanswered, it publishes nothing; answered, it goes on as before."""
    for replies, published in (([None, None, None], [0, 1]), ([None, None], [0, 1, 2])):
        root = tmp_path / str(len(replies))
        root.mkdir()
        session, publisher, _ = _reset_session(root)
        client = _LostReplyClient(replies)  # v1's answer lost, then v1 again (held back), then the stop's ask
        session._context = SessionContext(client, DataPlane(), root, "cpu", lambda: True, lambda *a: None)
        session._consume(_prepared(session.trainer, seq=0))
        session._consume(_prepared(session.trainer, seq=1))
        with caplog.at_level(logging.WARNING, logger="learner_service.session"):
            session.release()
        assert [r.version for r in publisher.store.versions("p")] == published, client.reports
        assert client.reports[:3] == [1, 1, 1]
    assert "no final checkpoint: the coordinator answered no report of version 1" in caplog.text


def test_a_reset_whose_publish_failed_trains_on_the_games_actors_play_it_under_the_leagues_number(tmp_path):
    """The league numbers a reset one past the version it last heard of (v1 here: the learner's own publish of
    the weights thrown away is v1 too), so the learner continues at v2. Its publish of v2 failed (a lapsed lease,
    a full disk): actors kept playing the reset as v1, and a floor of v2 dropped every chunk, so no iteration ran
    and no publish was tried again: the learner sat idle for the rest of the session (a review)."""
    allow = [True]
    session, publisher, _ = _reset_session(tmp_path, guard=lambda: allow[0])
    trainer = session.trainer
    trainer.add(_prepared(trainer, seq=0))
    trainer.add(_prepared(trainer, seq=1))
    assert trainer.train_ready() is not None and publisher.try_publish(trainer) is not None  # v1
    allow[0] = False
    assert session.apply_reset("", 1) is None  # reset as v1, continued as v2, not published
    assert session.trainer.version == 2 and session.trainer.lineage_from == 1
    allow[0] = True
    session._consume(_prepared(session.trainer, seq=2, policy_version=1))
    session._consume(_prepared(session.trainer, seq=3, policy_version=1))
    assert session.pre_reset_dropped == 0 and session.trainer.progress.train_iteration == 3  # 1 + one a chunk
    assert publisher.last_version == session.trainer.version == 4  # trained, and published again


def test_a_roll_back_before_a_reset_is_published_goes_back_to_the_reset_not_to_the_weights_it_replaced(tmp_path):
    """A reset whose publish failed left the last published checkpoint holding the weights the reset threw away;
    an update that then diverged rolled back to those, and so undid the reset without a word (session 39's note).
    Until a trainer publishes, a roll-back goes back to the weights it was built from."""
    allow = [True]
    session, publisher, _ = _reset_session(tmp_path, guard=lambda: allow[0])
    trainer = session.trainer
    trainer.add(_prepared(trainer, seq=0))
    trainer.add(_prepared(trainer, seq=1))
    assert trainer.train_ready() is not None and publisher.try_publish(trainer) is not None  # v1: trained weights
    thrown_away = trainer.task.get_weights()
    allow[0] = False
    assert session.apply_reset("", 1) is None  # reset to the fresh initialisation, not published
    reset = session.trainer.task.get_weights()
    assert any(not np.array_equal(reset[k], thrown_away[k]) for k in reset)
    session.trainer.add(_prepared(session.trainer, seq=2, policy_version=1))
    session.trainer.add(_prepared(session.trainer, seq=3, policy_version=1))
    report = session.trainer.train_ready()
    assert report is not None
    session._roll_back(report)  # as if that update had made the weights non-finite
    after = session.trainer.task.get_weights()
    assert all(np.array_equal(after[k], reset[k]) for k in reset)
    assert session.trainer.version == report.version and session.rollbacks == 1
    # Once the trainer has published, the published checkpoint is the roll-back point again.
    allow[0] = True
    session.trainer.add(_prepared(session.trainer, seq=4, policy_version=1))
    session.trainer.add(_prepared(session.trainer, seq=5, policy_version=1))
    assert session.trainer.train_ready() is not None
    ref = publisher.try_publish(session.trainer)
    assert ref is not None and session.trainer.unpublished_start is None
    published = session.trainer.task.get_weights()
    session.trainer.add(_prepared(session.trainer, seq=6, policy_version=1))
    session.trainer.add(_prepared(session.trainer, seq=7, policy_version=1))
    session._roll_back(session.trainer.train_ready())
    after = session.trainer.task.get_weights()
    assert all(np.array_equal(after[k], published[k]) for k in published)


def test_a_roll_back_of_a_trainer_whose_first_publish_failed_goes_back_to_its_start(tmp_path):
    """Nothing published yet (the disk was full from the start): a diverged update raised "nothing published
    yet" and took the session down; the trainer's start is its roll-back point."""
    trainer = _trainer(batch_size=16)
    start = trainer.task.get_weights()
    publisher = CheckpointPublisher(CheckpointStore(tmp_path, publish_guard=lambda: False), "p", "w")
    assert publisher.try_publish(trainer) is None
    context = SessionContext(_ResetClient(), DataPlane(), tmp_path, "cpu", lambda: False, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, _HeldLease(), trainer, publisher, LearnerConfig(batch_size=16), seed=3)
    trainer.add(_prepared(trainer, seq=0))
    trainer.add(_prepared(trainer, seq=1))
    session._roll_back(trainer.train_ready())
    after = session.trainer.task.get_weights()
    assert all(np.array_equal(after[k], start[k]) for k in start) and session.trainer.version == 1


def test_updates_that_diverge_while_the_stop_trains_still_release_the_job(tmp_path, caplog):
    """The stop trains on what was accepted; updates that kept diverging there raised UpdatesDiverge out of
    `release`, past its FinishJob(RELEASED): the player waited out its lease (a review)."""
    session, publisher, client = _reset_session(tmp_path)
    session.trainer.weights_finite = lambda: False  # every update diverges
    for seq in range(DIVERGED_WINDOW):
        assert session.queue.put(_prepared(session.trainer, seq=seq))
    session.end(SessionEnd.STOPPED)
    session.release()
    assert client.finished == [("job-1", league_pb2.FINISH_STATUS_RELEASED)]
    assert publisher.last_version == 0 and client.reports == []  # the rolled-back weights are not published
    assert "updates made the weights non-finite" in caplog.text


def test_samples_of_the_replaced_weights_held_for_a_batch_are_said_to_be_dropped_by_a_reset(tmp_path, caplog):
    """They went with the old trainer without a word, while chunks acted before a reset are dropped with one."""
    import logging

    session, _, _ = _reset_session(tmp_path)
    session.trainer.add(_prepared(session.trainer, seq=0, batch=1))  # held short of the 16-sample batch
    held = session.trainer.untrained_samples
    assert held > 0
    with caplog.at_level(logging.INFO, logger="learner_service.session"):
        session.apply_reset("", 1)
    assert f"the reset drops {held} sample(s) of the replaced weights" in caplog.text


def _staleness_bounded_session(tmp_path, max_staleness: int) -> LearnSession:
    """A session of player "p" on a fresh trainer (batches of 16), under `learner.max_staleness`."""
    trainer = _trainer(batch_size=16)
    publisher = CheckpointPublisher(CheckpointStore(tmp_path), "p", "w")
    context = SessionContext(_Client(), DataPlane(), tmp_path, "cpu", lambda: False, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    config = LearnerConfig(batch_size=16, publish_every=1, max_staleness=max_staleness, tensorboard_every_s=0.0)
    return LearnSession(context, job, _HeldLease(), trainer, publisher, config, seed=0)


def test_chunks_older_than_max_staleness_are_dropped_and_counted_and_fresher_ones_trained(tmp_path, caplog):
    """`learner.max_staleness` (Sample Factory's max_policy_lag): with two actors solo CartPole's PPO trained on
    data ~7 versions old and collapsed; a chunk acted more than the bound's versions before the learner's is
    dropped, seen by the telemetry (its episodes' returns stay whole) and counted in staleness/dropped."""
    session = _staleness_bounded_session(tmp_path, 2)
    trainer, context, job, publisher = (session.trainer, session._context, session.job, session.publisher)
    for seq in range(4):  # versions 0 -> 4, each chunk acted by the version then current
        session._consume(_prepared(trainer, seq=seq, policy_version=trainer.version))
    assert trainer.version == 4 and session.stale_dropped == 0
    with caplog.at_level(logging.INFO, logger="learner_service.session"):
        session._consume(_prepared(trainer, seq=4, policy_version=1))  # 3 versions behind: dropped
        session._consume(_prepared(trainer, seq=5, policy_version=1))
        session._consume(_prepared(trainer, seq=6, policy_version=2))  # 2 behind: within the bound, trained
    assert session.stale_dropped == 2 and session.telemetry.stale_dropped == 2
    assert trainer.version == 5 and trainer.progress.agent_steps == 5 * 16  # the dropped chunks' steps not counted
    assert caplog.text.count("dropping chunks acted more than 2 version(s) before the learner's") == 1
    assert session.telemetry.last["staleness/dropped"] == 2 / 3  # the window of the last write: 3 chunks received

    unbounded = LearnSession(context, job, _HeldLease(), trainer, publisher, LearnerConfig(batch_size=16), seed=0)
    unbounded._consume(_prepared(trainer, seq=7, policy_version=0))  # the default: no bound
    assert unbounded.stale_dropped == 0 and trainer.version == 6


def test_under_max_staleness_a_chunk_of_a_version_the_learner_never_reached_is_dropped(tmp_path):
    """Its staleness is unknown (an actor reporting a wrong version, another league's checkpoint): it was trained
    even under `max_staleness: 0` (a review). One version ahead is a reset's (the learner applies it at its next
    report): trained."""
    session = _staleness_bounded_session(tmp_path, 0)
    trainer = session.trainer
    session._consume(_prepared(trainer, seq=0, policy_version=10**15))
    session._consume(_prepared(trainer, seq=1, policy_version=2))
    assert session.stale_dropped == 2 and trainer.version == 0
    session._consume(_prepared(trainer, seq=2, policy_version=1))  # a reset's, one ahead
    assert session.stale_dropped == 2 and trainer.version == 1


def test_max_staleness_is_a_number_of_versions_or_null():
    assert LearnerConfig.from_mapping({"max_staleness": 0}).max_staleness == 0
    assert LearnerConfig.from_mapping({"max_staleness": None}).max_staleness is None
    with pytest.raises(ValueError, match=r"learner.max_staleness must be a number of versions in \[0, 2147483647\] "
                                         r"or null \(no bound\), got -1"):
        LearnerConfig.from_mapping({"max_staleness": -1})


class _RevokedLease:
    """A lease the coordinator took back (a partition longer than the lease timeout)."""

    held = False

    def attach(self, on_lost) -> None:
        on_lost(SessionEnd.REVOKED)

    def close(self, wait_s=None) -> None:
        pass


def test_chunks_queued_when_the_lease_is_revoked_stay_with_the_trainer_the_learner_keeps(tmp_path, caplog):
    """A revoked session dropped its queue: the chunks of streams already answered were never sent again, so up to
    `queue_chunks` acknowledged chunks were lost although the league gives the player back to this learner first
    and the learner keeps the trainer (a review: 8 chunks lost per partition). They go to the trainer."""
    trainer = _trainer(batch_size=1024)  # nothing trains: what the queue holds stays untrained
    publisher = CheckpointPublisher(CheckpointStore(tmp_path), "p", "w")
    context = SessionContext(_Client(), DataPlane(), tmp_path, "cpu", lambda: False, lambda *a: None)
    job = LearnJob("job-1", "p", "", 0, "CartPole-v1", {}, {}, {}, 30.0, 0.0)
    session = LearnSession(context, job, _RevokedLease(), trainer, publisher, LearnerConfig(), seed=0)
    for seq in range(3):
        assert session.queue.put(_prepared(trainer, batch=2, steps=8, seq=seq))  # 16 samples each
    with caplog.at_level(logging.INFO, logger="learner_service.session"):
        assert session.run() is SessionEnd.REVOKED
    assert trainer.untrained_samples == 48 and session.queue.drain() == []
    assert "3 received chunk(s) not trained on yet (session revoked) stay with the trainer" in caplog.text
