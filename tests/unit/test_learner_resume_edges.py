"""A learner's restarts and its player's damaged storage: the league goes on, nothing goes backwards, and
what the learner acknowledged it trains on."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointStore
from common.computation.specs import DiscreteActionSpec, TensorSpec
from common.learner_config import LearnerConfig
from common.policy_config import PolicyConfig
from common.tensor_codec import decode_chunk
from learner_service.chunks import ChunkPreparer
from learner_service.config import LearnerSettings
from learner_service.intake import ChunkQueue
from learner_service.league_client import BindingLost, LearnJob
from learner_service.learner import Learner
from learner_service.learner_testing import synthetic_chunk
from learner_service.publisher import CheckpointPublisher
from learner_service.servicer import Accepted, ChunkRefused, DataPlane, Intake
from learner_service.trainer import ModelSpec, Progress, build_trainer

OBS = {"observation": TensorSpec("observation", (4,))}
ACTIONS = DiscreteActionSpec(2)
POLICY = {"algorithm": "ppo", "model": {"hidden": [16]}, "ppo": {"update_epochs": 1, "num_minibatches": 1}}


def _trainer(weights=None, version=0):
    return build_trainer(ModelSpec(PolicyConfig.from_mapping(POLICY), OBS, ACTIONS),
                         LearnerConfig.from_mapping({"batch_size": 16}), Progress(), seed=3, device="cpu",
                         weights=weights, version=version)


def _train_once(trainer, seq: int) -> None:
    chunk = synthetic_chunk(OBS, 2, player_id="p", batch=2, steps=8, seq=seq, policy_version=0, seed=seq)
    trainer.add(trainer.preparer.prepare(decode_chunk(chunk)))
    assert trainer.train_ready() is not None


def _publisher(root, keep_last: int = 5) -> CheckpointPublisher:
    return CheckpointPublisher(CheckpointStore(root, keep_last=keep_last), "p", "w")


@pytest.mark.parametrize("damage", ["corrupt", "lost", "manifests"])
def test_a_player_whose_every_version_is_damaged_starts_afresh_above_them(tmp_path, damage, caplog):
    """With `keep_last: 1` (or a young player) one damaged file left the learner no start: it exited 2, and
    `league run` stopped the whole league at this and every later restart."""
    trainer = _trainer()
    publisher = _publisher(tmp_path, keep_last=1)
    for version in range(3):
        trainer.task.set_weights(trainer.task.get_weights(), version)
        ref = publisher.publish(trainer)
    publisher.store.wait_for_retention()
    if damage == "corrupt":
        (tmp_path / ref.path).write_bytes(b"garbage")
    elif damage == "lost":
        (tmp_path / ref.path).unlink()
    else:  # the only version's manifest and latest.json (hard links: replaced, not written through)
        for name in (f"{ref.path}.json", "p/latest.json"):
            os.unlink(tmp_path / name)
            (tmp_path / name).write_text("{garbage")
    learner = Learner(LearnerSettings(coordinator="127.0.0.1:1", shared_root=tmp_path, worker_id="w", device="cpu"))
    learner.client.player_progress = lambda player_id: Progress(500, 7)  # the coordinator's view
    job = LearnJob("job-1", "p", ref.path, ref.version, "CartPole-v1", {}, POLICY, {"keep_last": 1}, 30.0, 0.0)
    try:
        session = learner._open_session(job, None, tmp_path)
        assert session.trainer.version == 3 and session.publisher.last.version == 3  # above v2, published
        assert session.trainer.progress.agent_steps == 500  # the counters never go back
    finally:
        learner.close()
    assert "starts afresh at version 3" in caplog.text


def test_no_version_at_all_under_the_shared_root_is_still_refused(tmp_path):
    """The wrong shared root (no version of the player anywhere) must not silently start a fresh player."""
    publisher = _publisher(tmp_path)
    with pytest.raises(FileNotFoundError, match="is it the league's shared root"):
        publisher.choose_start("p/v0000000004.pt", 4, Progress())


def test_a_crash_between_a_versions_manifest_and_latest_json_resumes_its_training_state(tmp_path):
    trainer = _trainer()
    publisher = _publisher(tmp_path)
    for seq in range(2):
        _train_once(trainer, seq)
        publisher.publish(trainer)  # v1, v2
    latest = tmp_path / "p" / "latest.json"  # kill -9 before latest.json moved on to v2
    os.unlink(latest)
    latest.write_bytes((tmp_path / "p" / "v0000000001.pt.json").read_bytes())
    restarted = _publisher(tmp_path)
    start = restarted.choose_start("", 0, Progress())
    assert start.version == 2 and start.published is not None and start.published.version == 2
    assert restarted.last_version == 2  # nothing rewritten; the next publish is v3


def test_a_version_another_learner_published_meanwhile_ends_the_binding(tmp_path):
    """A late publish of the player's previous learner (begun within its lease) beat ours to the number: the
    player is not this learner's any more. It raised a ValueError that failed the whole learner process."""
    old = _trainer()
    _publisher(tmp_path).publish(old)  # v0
    publisher = _publisher(tmp_path)  # our session starts: latest v0
    _publisher(tmp_path).publish(_trainer(version=1))  # the previous learner's publish lands
    trainer = _trainer(weights=old.task.get_weights(), version=0)
    _train_once(trainer, 5)  # v1
    with pytest.raises(BindingLost, match="another learner publishes this player"):
        publisher.try_publish(trainer)


@pytest.mark.parametrize("value", ["Infinity", "1e400", "1e300"])
def test_a_manifest_counter_out_of_range_reads_as_zero(tmp_path, value):
    _publisher(tmp_path).publish(_trainer())
    for name in ("v0000000000.pt.json", "latest.json"):
        path = tmp_path / "p" / name
        body = path.read_text().replace('"agent_steps": 0', f'"agent_steps": {value}')
        os.unlink(path)
        path.write_text(body)
    start = _publisher(tmp_path).choose_start("", 0, Progress(12, 0))
    assert start.progress.agent_steps == 12


def test_chunks_a_session_dropped_untrained_are_new_again_when_resent():
    """They stayed in the de-duplicator: the resend was answered DUPLICATE (delivered, for the actor) and never
    trained on."""
    policy = PolicyConfig.from_mapping(POLICY)
    task = make_computation_task(policy, OBS, ACTIONS, device="cpu", seed=0)

    def intake() -> Intake:
        preparer = ChunkPreparer(policy, task.input_specs, task.learn_specs, 2, task.state_specs)
        return Intake("p", preparer, ChunkQueue(8, 1 << 30))

    def chunk(seq: int):
        return synthetic_chunk(OBS, 2, player_id="p", seq=seq, worker_id="a1", job_id="job-1", seed=seq)

    plane = DataPlane()
    first = intake()
    plane.open(first)
    assert [plane.accept(chunk(s)).status for s in range(3)] == [Accepted.NEW] * 3
    plane.close()
    plane.forget(first.queue.drain())  # what LearnSession.run does with the chunks it drops
    plane.open(intake())
    assert [plane.accept(chunk(s)).status for s in range(4)] == [Accepted.NEW] * 4
    assert plane.accept(chunk(3)).status is Accepted.DUPLICATE


def test_a_copy_of_a_chunk_still_waiting_for_room_is_told_to_retry_not_that_it_arrived():
    """Answered DUPLICATE while the first copy waited on a full queue, the copy counted as delivered; the first
    copy's stream was then cancelled (ABANDONED, its seq released) and the chunk was in no queue."""
    policy = PolicyConfig.from_mapping(POLICY)
    task = make_computation_task(policy, OBS, ACTIONS, device="cpu", seed=0)
    preparer = ChunkPreparer(policy, task.input_specs, task.learn_specs, 2, task.state_specs)
    intake = Intake("p", preparer, ChunkQueue(1, 1 << 30))
    plane = DataPlane()
    plane.open(intake)

    def chunk(seq: int):
        return synthetic_chunk(OBS, 2, player_id="p", seq=seq, worker_id="a1", job_id="job-1", seed=seq)

    assert plane.accept(chunk(0)).status is Accepted.NEW  # the queue is full now
    cancelled = threading.Event()
    first: list = []
    waiting = threading.Thread(target=lambda: first.append(plane.accept(chunk(1), cancelled.is_set)))
    waiting.start()
    try:
        deadline = time.monotonic() + 10
        while not plane._receiving and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(ChunkRefused) as refused:  # the resend on another stream
            plane.accept(chunk(1))
        assert refused.value.code is grpc.StatusCode.UNAVAILABLE and "another stream" in str(refused.value)
    finally:
        cancelled.set()
        plane.wake()
        waiting.join(10)
    assert first[0].status is Accepted.ABANDONED
    assert intake.queue.get() is not None  # seq 0 trained on; room again
    assert plane.accept(chunk(1)).status is Accepted.NEW  # the actor's retry: not lost


@pytest.mark.parametrize("unreadable", ["every manifest", "the newest manifest"])
def test_manifests_that_cannot_be_read_now_fail_the_start_instead_of_losing_the_training(tmp_path, monkeypatch,
                                                                                        unreadable, caplog):
    """A manifest that cannot be read now (an NFS I/O error, no permission) was skipped as a damaged version: with
    none readable the learner started the player afresh above them all ("its training so far is lost"), with
    the newest unreadable it resumed from the one before; either way the intact versions were superseded and
    then retired. The same error on a weights file always failed the session (retried): so does this one, and
    not as a setup error (which would stop `league run`)."""
    import errno

    from common import checkpoint_store
    from common.checkpoint_store import UnreadableCheckpointError
    from learner_service.learner import JobSetupError

    trainer = _trainer()
    publisher = _publisher(tmp_path)
    for version in range(3):
        trainer.task.set_weights(trainer.task.get_weights(), version)
        ref = publisher.publish(trainer)
    publisher.store.wait_for_retention()
    real_open = checkpoint_store._open_regular

    def eio(path):
        name = os.path.basename(path)
        if name.endswith(".json") and (unreadable == "every manifest" or name.startswith(ref.path[2:])):
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real_open(path)

    monkeypatch.setattr(checkpoint_store, "_open_regular", eio)
    with pytest.raises(UnreadableCheckpointError, match="Input/output error"):
        _publisher(tmp_path).choose_start(ref.path, ref.version, Progress())
    assert "starts afresh" not in caplog.text and "resuming from" not in caplog.text
    learner = Learner(LearnerSettings(coordinator="127.0.0.1:1", shared_root=tmp_path, worker_id="w", device="cpu"))
    learner.client.player_progress = lambda player_id: Progress(500, 7)
    job = LearnJob("job-1", "p", ref.path, ref.version, "CartPole-v1", {}, POLICY, {}, 30.0, 0.0)
    try:
        with pytest.raises(UnreadableCheckpointError) as raised:
            learner._open_session(job, None, tmp_path)
        assert not isinstance(raised.value, JobSetupError)
    finally:
        learner.close()
    assert sorted(os.listdir(tmp_path / "p")).count(os.path.basename(ref.path)) == 1  # nothing published over it
    assert not (tmp_path / "p" / "v0000000003.pt").exists()


def test_the_start_says_below_which_version_chunks_are_not_its_weights_games(tmp_path):
    """The trainer drops chunks acted below `lineage_from` (games of weights a reset threw away). A start from
    the player's own weights takes none as foreign: when the league's checkpoint is damaged, learner and actors
    fall back to the same older own version, and a floor at the league's number dropped every chunk they sent,
    for good when the learner's first publish failed (a review)."""
    trainer = _trainer()
    publisher = _publisher(tmp_path)
    for seq in range(3):
        _train_once(trainer, seq)
        ref = publisher.publish(trainer)  # v1..v3
    (tmp_path / ref.path).write_bytes(b"garbage")  # the league names v3: damaged
    start = _publisher(tmp_path).choose_start(ref.path, ref.version, Progress())
    assert start.source.endswith("v0000000002.pt") and start.version == 4 and start.lineage_from == 0
    # The league's reset of the player to a fresh start under its own number, or to a pretrained checkpoint.
    (tmp_path / "fresh").mkdir()
    assert _publisher(tmp_path / "fresh").choose_start("", 7, Progress()).lineage_from == 7
    pretrained = CheckpointStore(tmp_path).publish("sl", _trainer().task.get_weights(), 1).path
    reset = _publisher(tmp_path).choose_start(pretrained, 9, Progress())
    assert reset.source == pretrained and reset.lineage_from == 9
    assert _publisher(tmp_path).choose_start("", 0, Progress()).lineage_from == 0  # resuming its own v2


def test_a_learner_starting_on_the_leagues_reset_says_so_in_its_first_report(tmp_path):
    """A reset pending since the player's last learner (the league names it in the job): the new learner starts
    from it, but its first report did not say so, so the league answered with the same reset and the learner
    started over (a review)."""
    learner = Learner(LearnerSettings(coordinator="127.0.0.1:1", shared_root=tmp_path, worker_id="w", device="cpu"))
    learner.client.player_progress = lambda player_id: Progress(500, 7)
    job = LearnJob("job-1", "p", "", 5, "CartPole-v1", {}, POLICY, {}, 30.0, 0.0)  # reset to fresh, as v5
    try:
        session = learner._open_session(job, None, tmp_path)
        assert session.trainer.version == 5 and session.trainer.lineage_from == 5
        assert learner.client._resets_handed_out == {"p": 5}  # the next UpdatePlayer acknowledges it
        own = LearnJob("job-2", "p", session.publisher.last.path, 5, "CartPole-v1", {}, POLICY, {}, 30.0, 0.0)
        learner.client._resets_handed_out.clear()
        learner._kept = None
        assert learner._open_session(own, None, tmp_path).trainer.lineage_from == 0  # its own weights: no reset
        assert learner.client._resets_handed_out == {}
    finally:
        learner.close()



def _adam_steps(trainer) -> set[int]:
    return {int(s["step"]) for s in trainer.task.algorithm.optimizer.state_dict()["state"].values()}


def test_resuming_an_older_version_when_newer_ones_are_damaged_resumes_its_optimizer_too(tmp_path):
    """Only the store's latest version had its training state resumed: with v3 damaged, v2's weights went on with
    a fresh Adam (and DQN a fresh target network) under v2's restored update count."""
    trainer = _trainer()
    publisher = _publisher(tmp_path)
    refs = []
    for seq in range(3):
        _train_once(trainer, seq)
        refs.append(publisher.publish(trainer))  # v1, v2, v3
    (tmp_path / refs[-1].path).write_bytes(b"garbage")
    learner = Learner(LearnerSettings(coordinator="127.0.0.1:1", shared_root=tmp_path, worker_id="w", device="cpu"))
    learner.client.player_progress = lambda player_id: Progress()
    job = LearnJob("job-1", "p", refs[-1].path, refs[-1].version, "CartPole-v1", {}, POLICY, {}, 30.0, 0.0)
    try:
        session = learner._open_session(job, None, tmp_path)
        assert session.trainer.version == 4  # v2's weights, numbered above the damaged v3
        assert _adam_steps(session.trainer) == {2}  # v2's optimizer, two updates in
        assert session.trainer.algorithm_updates == 2
    finally:
        learner.close()


def test_a_kept_trainer_never_reports_below_the_steps_the_league_counted_meanwhile(tmp_path):
    """A learner's lease on p lapsed (it kept its trainer); another learner held p, received samples without an
    update and reported their steps with the same version at its release. Given p back, the kept trainer
    reported fewer steps than the league's, was refused (steps never go back), kept again, handed the same
    binding back, and never trained."""
    from learner_service.learner import _Kept

    trainer = _trainer()
    publisher = _publisher(tmp_path)
    _train_once(trainer, 0)
    ref = publisher.publish(trainer)
    kept_steps = trainer.progress.agent_steps
    learner = Learner(LearnerSettings(coordinator="127.0.0.1:1", shared_root=tmp_path, worker_id="w", device="cpu"))
    learner._kept = _Kept("p", trainer, ref.version)
    learner.client.player_progress = lambda player_id: Progress(kept_steps + 48, 9)  # the league's count now
    job = LearnJob("job-2", "p", ref.path, ref.version, "CartPole-v1", {}, POLICY, {"batch_size": 16}, 30.0, 0.0)
    try:
        session = learner._open_session(job, None, tmp_path)
        assert session.trainer is trainer  # kept: its optimizer and untrained samples go on
        assert (trainer.progress.agent_steps, trainer.progress.train_iteration) == (kept_steps + 48, 9)
    finally:
        learner.close()
