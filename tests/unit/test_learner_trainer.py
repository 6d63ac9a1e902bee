"""The trainer (PPO batches, DQN replay), where a session starts from, and the TensorBoard scalars."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from common.algorithms.ppo import compute_targets
from common.checkpoint_store import CheckpointNotFoundError, CheckpointStore
from common.computation.specs import DiscreteActionSpec, TensorSpec
from common.learner_config import LearnerConfig
from common.policy_config import PolicyConfig
from common.tensor_codec import ChunkHeader, decode_chunk
from learner_service.chunks import PreparedChunk
from learner_service.learner_testing import rollout_chunks, synthetic_chunk
from learner_service.publisher import CheckpointPublisher
from learner_service.telemetry import EpisodeTracker, Telemetry
from learner_service.trainer import ModelSpec, Progress, build_task, build_trainer, front_pad

OBS = {"observation": TensorSpec("observation", (4,))}
ACTIONS = DiscreteActionSpec(2)


def _trainer(algorithm="ppo", progress=None, weights=None, version=0, **learner):
    sections = {"ppo": {"update_epochs": 1, "num_minibatches": 1},
                "dqn": {"learning_starts": 40, "batch_size": 8, "replay_capacity": 1000}}
    policy = PolicyConfig.from_mapping({"algorithm": algorithm, "model": {"hidden": [16]}, algorithm: sections[algorithm]})
    return build_trainer(ModelSpec(policy, OBS, ACTIONS), LearnerConfig.from_mapping(learner), progress or Progress(),
                         seed=3, device="cpu", weights=weights, version=version)


def _prepared(trainer, *, batch=2, steps=8, seq=0, policy_version=0):
    chunk = synthetic_chunk(OBS, 2, player_id="p", batch=batch, steps=steps, seq=seq, policy_version=policy_version,
                            seed=seq)
    return trainer.preparer.prepare(decode_chunk(chunk))


def test_ppo_trains_once_a_batch_of_samples_is_held():
    trainer = _trainer(batch_size=32)
    trainer.add(_prepared(trainer, seq=0))  # 16 samples
    assert trainer.train_ready() is None and trainer.buffered_samples == 16
    trainer.add(_prepared(trainer, seq=1))
    report = trainer.train_ready()
    assert report is not None and report.train_iteration == 1 and report.version == 1 and report.samples == 32
    assert "policy_loss" in report.stats
    assert trainer.train_ready() is None and trainer.buffered_samples == 0
    assert trainer.progress == Progress(agent_steps=32, train_iteration=1)


def test_ppo_trains_what_is_held_short_of_a_batch_when_asked_for_the_rest():
    trainer = _trainer(batch_size=64)
    trainer.add(_prepared(trainer, seq=0, batch=1, steps=3))  # 3 samples, one row: less than a minibatch each
    assert trainer.train_ready() is None
    report = trainer.train_ready(rest=True)
    assert report is not None and report.samples == 3 and trainer.buffered_samples == 0
    assert trainer.train_ready(rest=True) is None  # nothing held: no empty batch
    assert trainer.weights_finite()


def test_ppo_batches_rows_of_any_length_together():
    trainer = _trainer(batch_size=32)
    trainer.add(_prepared(trainer, steps=4, seq=0, batch=2))  # short rows first: padded later
    trainer.add(_prepared(trainer, steps=8, seq=1, batch=2))
    assert trainer.train_ready() is None and trainer.buffered_samples == 24
    trainer.add(_prepared(trainer, steps=3, seq=2, batch=3))
    report = trainer.train_ready()
    assert report is not None and report.samples == 33 and report.stats["samples"] == 33  # real steps only
    assert trainer.buffered_samples == 0


def test_front_padding_leaves_every_target_of_the_real_steps_unchanged():
    rng = np.random.default_rng(0)
    steps = 5
    rows = {
        "observation": rng.standard_normal((2, steps, 4)).astype(np.float32),
        "next_observation": rng.standard_normal((2, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (2, steps)),
        "reward": rng.standard_normal((2, steps)).astype(np.float32),
        "terminated": np.array([[0, 1, 0, 0, 0], [0, 0, 0, 0, 1]], bool),
        "truncated": np.array([[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], bool),
        "behaviour_logp": np.full((2, steps), -0.7, np.float32),
    }
    padded = front_pad(rows, 8)
    assert padded["observation"].shape == (2, 8, 4) and padded["next_observation"].shape == (2, 4)
    values = torch.tensor(rng.standard_normal((2, steps)), dtype=torch.float32)
    bootstrap = torch.tensor([0.3, -0.2])
    pad_values = torch.cat([torch.full((2, 3), 9.0), values], dim=1)  # garbage values at the padding
    log_ratio = torch.tensor(rng.standard_normal((2, steps)) * 0.1, dtype=torch.float32)
    pad_ratio = torch.cat([torch.full((2, 3), 2.0), log_ratio], dim=1)
    for ratio, ratio_padded in ((None, None), (log_ratio, pad_ratio)):
        real = compute_targets(values, bootstrap, torch.tensor(rows["reward"]), torch.tensor(rows["terminated"]),
                               torch.tensor(rows["truncated"]), 0.9, 0.8, log_ratio=ratio)
        pad = compute_targets(pad_values, bootstrap, torch.tensor(padded["reward"]),
                              torch.tensor(padded["terminated"]), torch.tensor(padded["truncated"]), 0.9, 0.8,
                              log_ratio=ratio_padded)
        assert not pad.valid[:, :3].any()
        assert torch.equal(pad.valid[:, 3:], real.valid)
        torch.testing.assert_close(pad.advantages[:, 3:], real.advantages)
        torch.testing.assert_close(pad.returns[:, 3:], real.returns)


def test_dqn_waits_for_learning_starts_then_trains_by_replay_ratio():
    trainer = _trainer("dqn", replay_ratio=2.0)
    trainer.add(_prepared(trainer, batch=2, steps=16, seq=0))  # ~32 transitions < learning_starts 40
    assert trainer.train_ready() is None
    trainer.add(_prepared(trainer, batch=2, steps=16, seq=1))  # now held >= 40: owes ~32 * 2 / 8 updates
    reports = []
    while (report := trainer.train_ready()) is not None:
        reports.append(report)
    assert 4 <= len(reports) <= 8
    assert [r.train_iteration for r in reports] == list(range(1, len(reports) + 1))
    assert reports[-1].version == len(reports) and "td_abs_mean" in reports[0].stats


def _trained(trainer, seqs):
    """Which of ``seqs`` (worker "actor-test", job "job-test", as `synthetic_chunk` names them) are in the
    trainer's ledger of trained chunks."""
    from learner_service.intake import SeqDeduper

    copy = SeqDeduper()
    copy.seed(trainer.trained.export())
    return {seq for seq in seqs if not copy.reserve("actor-test", "job-test", seq)}


def test_ppo_chunks_join_the_trained_ledger_once_a_batch_has_trained_all_of_them():
    trainer = _trainer(batch_size=24)
    trainer.add(_prepared(trainer, seq=0))  # 16 samples each
    trainer.add(_prepared(trainer, seq=1))
    assert _trained(trainer, range(3)) == set()
    assert trainer.train_ready().samples == 32 and _trained(trainer, range(3)) == {0, 1}
    # 32 samples in 4 rows, more than a batch: held as a batch of 3 rows and 1 row left; trained whole, it counts.
    trainer.add(_prepared(trainer, seq=2, batch=4))
    assert trainer.train_ready().samples == 24 and _trained(trainer, range(3)) == {0, 1}
    assert trainer.train_ready() is None
    assert trainer.train_ready(rest=True).samples == 8 and _trained(trainer, range(3)) == {0, 1, 2}


def test_the_trained_ledger_is_published_resumed_and_rolled_back_with_the_weights(tmp_path):
    store = CheckpointStore(tmp_path)
    trainer = _trainer(batch_size=32)
    for seq in range(2):
        trainer.add(_prepared(trainer, seq=seq))
    trainer.train_ready()
    ref = trainer.publish(store, "p", {})
    trainer.add(_prepared(trainer, seq=2))
    trainer.add(_prepared(trainer, seq=3))
    trainer.train_ready()
    assert _trained(trainer, range(4)) == {0, 1, 2, 3}
    trainer.replace_task(build_task(trainer.spec, seed=3, device="cpu", weights=store.load(ref.path).tensors,
                                    version=trainer.version))  # a roll-back to the published weights
    assert _trained(trainer, range(4)) == {0, 1}  # 2 and 3 are not in these weights any more

    resumed = _trainer(batch_size=32, weights=store.load(ref.path).tensors, version=ref.version)
    assert resumed.resume_training_state(store, ref)
    assert _trained(resumed, range(4)) == {0, 1}
    resumed.add(_prepared(resumed, seq=2))
    resumed.add(_prepared(resumed, seq=3))
    resumed.train_ready()
    resumed.replace_task(build_task(resumed.spec, seed=3, device="cpu", weights=None, version=resumed.version))
    assert _trained(resumed, range(4)) == {0, 1}  # a roll-back before its first publish: the resumed ledger


def test_a_dqn_chunk_joins_the_ledger_once_the_updates_owed_up_to_it_are_made():
    trainer = _trainer("dqn", replay_ratio=1.0)  # learning_starts 40, batch_size 8: 16 samples owe 2 updates
    trainer.add(_prepared(trainer, seq=0))
    trainer.add(_prepared(trainer, seq=1))
    assert trainer.train_ready() is None and _trained(trainer, range(4)) == set()  # replay 32 < 40: none owed
    trainer.add(_prepared(trainer, seq=2))  # 48: owes 2 updates
    assert _trained(trainer, range(4)) == set()  # no update has sampled the replay since they entered it
    trainer.add(_prepared(trainer, seq=3))  # owes 4
    assert trainer.train_ready() is not None and _trained(trainer, range(4)) == {0, 1}
    assert trainer.train_ready() is not None and _trained(trainer, range(4)) == {0, 1, 2}
    trainer.train_ready()
    assert trainer.train_ready() is not None and _trained(trainer, range(4)) == {0, 1, 2, 3}
    assert trainer.train_ready() is None


def test_an_unusable_trained_ledger_is_logged_and_the_optimizer_state_still_resumed(tmp_path, caplog):
    from learner_service.trainer import TRAINED_STATE_KEY

    store = CheckpointStore(tmp_path)
    trainer = _trainer(batch_size=16)
    trainer.add(_prepared(trainer, seq=0))
    trainer.train_ready()
    for bad in ('[["w", "j", -5, [], []]]', "[[", '{"w": 1}', [["w", "j", 1, [], []]], "[" * 100_000):
        caplog.clear()
        state = {**trainer.task.get_training_state(), TRAINED_STATE_KEY: bad}
        ref = store.publish("p", trainer.task.get_weights(), trainer.version, {}, training_state=state)
        resumed = _trainer(batch_size=16, weights=store.load(ref.path).tensors, version=ref.version)
        assert resumed.resume_training_state(store, ref)  # the optimizer's state is good
        assert "list of trained chunks is unusable" in caplog.text and resumed.trained.export() == []
        trainer.add(_prepared(trainer, seq=trainer.version))
        trainer.train_ready()


def test_dqn_importance_weight_exponent_anneals_to_one_over_the_configured_updates():
    policy = PolicyConfig.from_mapping({
        "algorithm": "dqn", "model": {"hidden": [16]},
        "dqn": {"learning_starts": 40, "batch_size": 8, "replay_capacity": 1000, "priority_beta": 0.4,
                "priority_beta_anneal_updates": 4},
    })
    trainer = build_trainer(ModelSpec(policy, OBS, ACTIONS), LearnerConfig.from_mapping({"replay_ratio": 2.0}),
                            Progress(), seed=3, device="cpu", weights=None, version=0)
    trainer.add(_prepared(trainer, batch=2, steps=16, seq=0))
    trainer.add(_prepared(trainer, batch=2, steps=16, seq=1))
    betas = []
    while (report := trainer.train_ready()) is not None:
        betas.append(report.stats["priority_beta"])
    assert len(betas) >= 5
    np.testing.assert_allclose(betas[:5], [0.4, 0.55, 0.7, 0.85, 1.0])
    assert all(b == 1.0 for b in betas[5:])
    # A restarted learner resumes the schedule from the algorithm's update count.
    trainer.restore_algorithm_updates(2)
    trainer.add(_prepared(trainer, batch=2, steps=16, seq=2))
    assert trainer.train_ready().stats["priority_beta"] == pytest.approx(0.7)


def test_one_long_row_does_not_set_the_padding_of_later_batches():
    trainer = _trainer(batch_size=32)
    trainer.add(_prepared(trainer, batch=1, steps=40, seq=0))  # 40 samples: trains alone, at T = 40
    assert trainer.train_ready().samples == 40
    for seq in (1, 2):
        trainer.add(_prepared(trainer, batch=2, steps=8, seq=seq))
    report = trainer.train_ready()
    assert report.samples == 32 and report.stats["valid_fraction"] == 1.0  # rows of 8, not padded to 40


def test_rows_of_very_different_lengths_are_not_padded_into_one_huge_batch():
    trainer = _trainer(batch_size=32)
    trainer.add(_prepared(trainer, batch=20, steps=1, seq=0))  # 20 one-step rows
    trainer.add(_prepared(trainer, batch=1, steps=600, seq=1))  # padding the 20 to 600 steps: 12,600 steps
    assert trainer.buffered_samples == 620
    first, second = trainer.train_ready(), trainer.train_ready()
    assert (first.samples, second.samples) == (20, 600)  # the short rows trained first, as a batch of their own
    assert first.stats["valid_fraction"] == 1.0 and second.stats["valid_fraction"] == 1.0
    assert trainer.train_ready() is None and trainer.buffered_samples == 0
    # Rows of usual, similar lengths still pad into one batch.
    trainer.add(_prepared(trainer, batch=2, steps=3, seq=2))
    trainer.add(_prepared(trainer, batch=4, steps=8, seq=3))
    report = trainer.train_ready()
    assert report.samples == 38 and report.stats["valid_fraction"] == pytest.approx(38 / 48)


def test_a_chunk_of_many_batches_trains_as_batches_of_the_configured_size():
    """A chunk's rows were held whole: one chunk of 4.4M tiny samples (within the 64 MiB message limit) was one
    PPO batch of ~8 GB (a hostile-input review). Its rows now make batches of about batch_size samples."""
    trainer = _trainer(batch_size=32)
    trainer.add(_prepared(trainer, batch=3, steps=4, seq=0))  # 12 samples held
    trainer.add(_prepared(trainer, batch=20, steps=4, seq=1))  # 80 samples: 8 rows make a batch
    assert trainer.buffered_samples == 92 and trainer.progress.agent_steps == 92
    samples = []
    while (report := trainer.train_ready(rest=True)) is not None:
        samples.append(report.samples)
        assert report.stats["valid_fraction"] == 1.0
    assert samples == [44, 32, 16] and trainer.buffered_samples == 0  # the held 12 joined the first 8 rows
    # A chunk of one batch or less is held whole, as before.
    trainer.add(_prepared(trainer, batch=8, steps=4, seq=2))
    assert trainer.train_ready().samples == 32


def test_fresh_initialisation_is_deterministic_and_weights_load_at_a_version():
    a, b = _trainer(), _trainer()
    for name, value in a.task.get_weights().items():
        np.testing.assert_array_equal(value, b.task.get_weights()[name])
    c = _trainer(weights=a.task.get_weights(), version=7)
    assert c.version == 7


def _publisher(tmp_path, player="p"):
    return CheckpointPublisher(CheckpointStore(tmp_path, keep_last=3), player, "w")


def test_start_fresh_at_the_jobs_version_when_nothing_is_published(tmp_path):
    start = _publisher(tmp_path).choose_start("", 0, Progress(5, 2))
    assert start.weights is None and start.version == 0 and start.published is None
    assert start.progress == Progress(5, 2)


def test_start_from_the_newer_of_store_and_job_and_counters_never_go_back(tmp_path):
    publisher = _publisher(tmp_path)
    trainer = _trainer(progress=Progress(agent_steps=500, train_iteration=9))
    publisher.publish(trainer)  # v0 with agent_steps 500
    trainer.task.set_weights(trainer.task.get_weights(), 4)
    ref = publisher.publish(trainer)
    start = _publisher(tmp_path).choose_start("", 2, Progress(100, 3))
    assert start.version == 4 and start.published == ref and start.weights is not None
    assert start.progress == Progress(500, 9)  # the checkpoint knows more than the league
    assert _publisher(tmp_path).choose_start("", 4, Progress(900, 1)).progress == Progress(900, 9)
    # The league reset the player (job names a fresh start above the store): fresh weights at 5, to publish.
    reset = _publisher(tmp_path).choose_start("", 5, Progress())
    assert reset.weights is None and reset.version == 5 and reset.published is None
    assert reset.progress == Progress(500, 9)
    # ... or to another checkpoint (a pretrained one under another directory).
    other = _publisher(tmp_path, "pretrained")
    other_ref = other.publish(_trainer())
    start = _publisher(tmp_path).choose_start(other_ref.path, 6, Progress())
    assert start.version == 6 and start.source == other_ref.path and start.published is None
    assert _publisher(tmp_path).next_version(2) == 5


def test_a_corrupt_latest_version_is_skipped_for_the_one_before(tmp_path):
    publisher = _publisher(tmp_path)
    trainer = _trainer(progress=Progress(10, 1))
    publisher.publish(trainer)
    trainer.task.set_weights(trainer.task.get_weights(), 1)
    ref = publisher.publish(trainer)
    (tmp_path / ref.path).write_bytes(b"garbage")
    fresh = _publisher(tmp_path)
    start = fresh.choose_start("", 0, Progress())
    assert start.version == 0 and start.published is None  # not the store's latest: will be republished
    assert fresh.next_version(start.version) == 2


def test_a_lost_weights_file_of_the_leagues_version_resumes_from_the_one_before(tmp_path):
    """The newest version's weights file gone (its manifest left): the learner exited 2 at setup, and `league run`
    stopped the whole league for good, also when resumed."""
    publisher = _publisher(tmp_path)
    trainer = _trainer(progress=Progress(10, 1))
    publisher.publish(trainer)
    trainer.task.set_weights(trainer.task.get_weights(), 1)
    lost = publisher.publish(trainer)
    (tmp_path / lost.path).unlink()
    start = _publisher(tmp_path).choose_start(lost.path, lost.version, Progress(10, 1))
    assert start.version == 2 and start.weights is not None  # v0's weights, numbered above the lost version
    # Nothing of the player readable at all (another shared root mounted?): refused, naming the root.
    for path in list((tmp_path / "p").iterdir()):
        path.unlink()
    with pytest.raises(CheckpointNotFoundError, match="holds no readable version of p either"):
        _publisher(tmp_path).choose_start(lost.path, lost.version, Progress(10, 1))


def test_a_damaged_manifest_of_any_version_is_skipped_when_resuming(tmp_path):
    """A damaged manifest (even of an old version) used to fail every session of the player at setup."""
    publisher = _publisher(tmp_path)
    trainer = _trainer(progress=Progress(10, 1))
    refs = []
    for version in range(3):
        trainer.task.set_weights(trainer.task.get_weights(), version)
        refs.append(publisher.publish(trainer))
    (tmp_path / (refs[0].path + ".json")).write_text("{not json")
    assert [r.version for r in CheckpointStore(tmp_path).versions("p")] == [1, 2]
    assert _publisher(tmp_path).choose_start("", 0, Progress()).version == 2
    (tmp_path / (refs[2].path + ".json")).write_text("{not json")
    start = _publisher(tmp_path).choose_start("", 0, Progress())
    assert start.version == 1 and start.weights is not None


def _chunk(rewards, dones, seq, job="j", returns=None):
    return PreparedChunk(ChunkHeader(job, "p", "w", seq, 0), {}, rewards.shape[1], rewards.size,
                         np.asarray(rewards, np.float32), np.asarray(dones, bool), returns)


def test_episode_returns_are_summed_across_a_jobs_chunks():
    tracker = EpisodeTracker()
    ones = np.ones((2, 3))
    assert tracker.observe(_chunk(ones, [[0, 0, 0], [0, 1, 0]], seq=0)).tolist() == [2.0]
    assert tracker.observe(_chunk(ones, [[0, 1, 0], [0, 0, 1]], seq=1)).tolist() == [5.0, 4.0]
    # A stream first seen past seq 0 reports only episodes that started while it was watched.
    assert tracker.observe(_chunk(ones, [[1, 0, 1], [0, 0, 0]], seq=5, job="late")).tolist() == [2.0]
    given = np.array([42.0])
    assert tracker.observe(_chunk(ones, [[1, 0, 0], [0, 0, 0]], seq=2, returns=given)) is given


def test_the_episode_tracker_keeps_a_bounded_number_of_rows():
    """It kept the sums of every (worker, job) stream's rows, up to 1,024 streams of any width: chunks of 4M rows
    kept ~35 MB each (a review). Past max_rows the oldest streams are forgotten; a wider chunk is not tracked."""
    tracker = EpisodeTracker(max_rows=10)
    ones = np.ones((4, 2))
    assert tracker.observe(_chunk(ones, [[0, 1]] * 4, seq=0, job="a")).tolist() == [2.0] * 4
    tracker.observe(_chunk(ones, [[0, 0]] * 4, seq=0, job="b"))
    tracker.observe(_chunk(ones, [[0, 0]] * 4, seq=0, job="c"))  # 12 rows: "a" is forgotten
    assert tracker._rows == 8 and ("w", "a") not in tracker._streams
    assert tracker.observe(_chunk(np.ones((11, 1)), [[1]] * 11, seq=0, job="wide")).size == 0
    assert tracker._rows == 8


def test_telemetry_writes_scalars_for_tensorboard(tmp_path):
    trainer = _trainer(batch_size=16)
    telemetry = Telemetry(tmp_path / "tb")
    future = _prepared(trainer, batch=1, steps=8, seq=9, policy_version=10**15)
    telemetry.observe(future, learner_version=3)  # no policy from the future acted: kept out of staleness
    assert telemetry.future_versions == 1
    # One version ahead: actors playing the league's reset to a fresh initialisation, which this learner applies
    # at its next report (a healthy league's transient: no warning).
    telemetry.observe(_prepared(trainer, batch=1, steps=8, seq=10, policy_version=4), learner_version=3)
    assert telemetry.future_versions == 1 and telemetry.reset_ahead == 1
    for seq, version in ((0, 0), (1, 1)):
        chunk = _prepared(trainer, batch=1, steps=8, seq=seq, policy_version=version)
        telemetry.observe(chunk, learner_version=3)
        trainer.add(chunk)
    scalars = telemetry.iteration(trainer.train_ready(), trainer.progress, trainer.buffered_samples)
    telemetry.close()
    assert scalars["staleness/mean"] == 2.5 and scalars["staleness/max"] == 3
    assert scalars["throughput/samples_per_s"] > 0 and "train/policy_loss" in scalars
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_staleness_mean_is_per_sample_not_per_chunk(tmp_path):
    """A 1-step chunk weighed as much as one of thousands: a chunk of 32 fresh samples and one of 8 stale by 3
    read 1.5, where the samples' mean is 0.6 (a review)."""
    trainer = _trainer(batch_size=16)
    telemetry = Telemetry(tmp_path / "tb")
    for seq, (batch, version) in enumerate(((4, 3), (1, 0))):
        chunk = _prepared(trainer, batch=batch, steps=8, seq=seq, policy_version=version)
        telemetry.observe(chunk, learner_version=3)
        trainer.add(chunk)
    scalars = telemetry.iteration(trainer.train_ready(), trainer.progress, trainer.buffered_samples)
    telemetry.close()
    assert scalars["staleness/mean"] == pytest.approx(0.6) and scalars["staleness/max"] == 3


def _read_scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (path,) = log_dir.glob("events.out.tfevents.*")
    events = EventAccumulator(str(path), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_telemetry_writes_the_mean_of_the_iterations_between_writes(tmp_path):
    """A DQN learner iterates ~90 times a second: one write per iteration grew its events ~200 MB an hour."""
    from learner_service.trainer import IterationReport

    now = [0.0]
    telemetry = Telemetry(tmp_path / "tb", clock=lambda: now[0], every_s=5.0)
    for i, (at, loss) in enumerate([(0.0, 9.0), (1.0, 1.0), (2.0, 2.0), (5.0, 3.0), (6.0, 7.0)], start=1):
        now[0] = at
        scalars = telemetry.iteration(IterationReport(i, i, samples=10 * i, stats={"loss": loss}),
                                      Progress(agent_steps=100 * i, train_iteration=i), buffered=i)
    assert scalars["train/loss"] == 2.0 and scalars["learner/version"] == 4  # iterations 2-4, written at 5 s
    assert scalars["throughput/trained_samples"] == 30.0  # per iteration, over the three
    now[0] = 7.0
    telemetry.close()  # the fifth iteration is not lost
    assert telemetry.last["train/loss"] == 7.0
    written = _read_scalars(tmp_path / "tb")
    assert written["train/loss"] == [(100, 9.0), (400, 2.0), (500, 7.0)]  # at the player's agent steps
    assert [v for _, v in written["learner/train_iteration"]] == [1.0, 4.0, 5.0]


def test_a_resumed_learners_curves_hide_the_points_a_crashed_one_wrote_past_its_checkpoint(tmp_path, monkeypatch):
    """The steps past the last checkpoint are trained again after a restart: the curves ran back to them and
    overlapped the old points in a zig-zag ((100, 1), (200, 2), (300, 3), then (250, 3), (350, 4); a review)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    # Both files are named in the same second, and then by a counter of the writers this process made: from the
    # 10th on, "...9" sorted after "...10" and the older file was read last (a flaky test under xdist). A
    # restarted learner is another process, whose files are named in a later second.
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(0))

    from learner_service.trainer import IterationReport

    def write(telemetry, points):
        for version, steps in points:
            telemetry.iteration(IterationReport(version, version, samples=10, stats={}),
                                Progress(agent_steps=steps, train_iteration=version), buffered=0)
        telemetry.close()

    write(Telemetry(tmp_path / "tb", purge_from=0), [(1, 100), (2, 200), (3, 300)])  # crashed after v2's checkpoint
    write(Telemetry(tmp_path / "tb", purge_from=250), [(3, 250), (4, 350)])
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("learner/version")] == [
        (100, 1.0), (200, 2.0), (250, 3.0), (350, 4.0)]


@pytest.mark.parametrize("algorithm", ["ppo", "dqn"])
def test_real_rollouts_train_both_algorithms(algorithm):
    trainer = _trainer(algorithm, batch_size=64, replay_ratio=1.0)
    for chunk in rollout_chunks(trainer.task, player_id="p", env_num=4, unroll_len=16, count=2):
        trainer.add(trainer.preparer.prepare(decode_chunk(chunk)))
    reports = []
    while (report := trainer.train_ready()) is not None:
        reports.append(report)
    assert reports and trainer.version == len(reports)


def _resumed(tmp_path, algorithm, **learner):
    """What the learner does on a restart: choose the start point, build a trainer on it, resume its state."""
    publisher = _publisher(tmp_path)
    start = publisher.choose_start("", 0, Progress())
    trainer = _trainer(algorithm, progress=start.progress, weights=start.weights, version=start.version, **learner)
    trainer.restore_algorithm_updates(start.algorithm_updates)
    assert start.published is not None
    return trainer, trainer.resume_training_state(publisher.store, start.published)


def _assert_same_state(a, b):
    left, right = a.task.get_training_state(), b.task.get_training_state()
    assert left.keys() == right.keys()
    torch.testing.assert_close(left, right, rtol=0, atol=0)


def test_a_restarted_ppo_learner_resumes_its_optimizer_and_updates_exactly(tmp_path):
    trainer = _trainer(batch_size=16)
    for seq in range(2):
        trainer.add(_prepared(trainer, seq=seq))
        assert trainer.train_ready() is not None
    _publisher(tmp_path).publish(trainer)
    adam = trainer.task.algorithm.optimizer.state_dict()["state"]
    assert adam and all(int(s["step"]) == 2 for s in adam.values())  # 2 iterations x 1 epoch x 1 minibatch

    resumed, ok = _resumed(tmp_path, "ppo", batch_size=16)
    assert ok and resumed.version == trainer.version == 2 and resumed.algorithm_updates == 2
    _assert_same_state(trainer, resumed)
    fresh = _trainer(batch_size=16, weights=trainer.task.get_weights(), version=2)  # what a restart did before
    for t in (trainer, resumed, fresh):
        t.add(_prepared(t, seq=2))
        assert t.train_ready() is not None
    after, again, restarted = (t.task.get_weights() for t in (trainer, resumed, fresh))
    for name, value in after.items():
        np.testing.assert_array_equal(again[name], value)  # the same update as if it had never stopped
    assert any(not np.array_equal(restarted[n], v) for n, v in after.items())  # a fresh Adam steps differently


def test_a_restarted_dqn_learner_resumes_optimizer_target_network_and_counter(tmp_path):
    trainer = _trainer("dqn", replay_ratio=1.0)
    for seq in range(6):
        trainer.add(_prepared(trainer, batch=4, seq=seq))
        while trainer.train_ready() is not None:
            pass
    assert trainer.version > 0
    with torch.no_grad():  # a target network that differs from the online one (between target updates)
        for p in trainer.task.algorithm.target.parameters():
            p.add_(0.5)
    _publisher(tmp_path).publish(trainer)
    resumed, ok = _resumed(tmp_path, "dqn")
    assert ok and resumed.algorithm_updates == trainer.algorithm_updates == trainer.version
    _assert_same_state(trainer, resumed)


def test_a_training_state_that_does_not_fit_leaves_a_fresh_optimizer(tmp_path, caplog):
    trainer = _trainer(batch_size=16)
    trainer.add(_prepared(trainer))
    trainer.train_ready()
    ref = _publisher(tmp_path).publish(trainer)
    store = CheckpointStore(tmp_path)
    assert store.load_training_state(ref.path) is not None
    other = build_trainer(  # a wider model: the saved moments have other shapes
        ModelSpec(PolicyConfig.from_mapping({"model": {"hidden": [32]}}), OBS, ACTIONS), LearnerConfig(),
        Progress(), seed=3, device="cpu", weights=None, version=1)
    assert not other.resume_training_state(store, ref)
    assert "does not fit" in caplog.text and not other.task.algorithm.optimizer.state_dict()["state"]
    (tmp_path / (ref.path + ".train")).write_bytes(b"tampered")
    assert not _trainer(batch_size=16).resume_training_state(store, ref)
    assert "training state unusable" in caplog.text


def test_a_training_state_that_cannot_be_read_now_is_not_given_up_for_a_fresh_optimizer(tmp_path, monkeypatch):
    """EIO or no permission on the .train file is the share's state now, not damage: going on with a fresh
    optimizer published over the intact state, and retention deleted it (a review). Raised, the session fails
    and is retried, as for the same error on a manifest."""
    import errno

    import common.checkpoint_store as checkpoint_store
    from common.checkpoint_store import UnreadableCheckpointError

    trainer = _trainer(batch_size=16)
    trainer.add(_prepared(trainer))
    trainer.train_ready()
    ref = _publisher(tmp_path).publish(trainer)
    opened = checkpoint_store._open_regular

    def failing(path):
        if path.name.endswith(".train"):
            raise OSError(errno.EIO, "Input/output error", str(path))
        return opened(path)

    monkeypatch.setattr(checkpoint_store, "_open_regular", failing)
    with pytest.raises(UnreadableCheckpointError, match="Input/output error"):
        _trainer(batch_size=16).resume_training_state(CheckpointStore(tmp_path), ref)


def test_a_publish_withdrawn_at_its_commit_is_a_warning_not_a_storage_failure(tmp_path, caplog):
    """The learner's store asks "does my lease still hold?" at the commit: a learner frozen past its lease while
    it wrote the files publishes nothing over the player's next learner, and is not put on a storage backoff."""
    held = [True]
    publisher = CheckpointPublisher(CheckpointStore(tmp_path, publish_guard=lambda: held[0]), "p", "w")
    trainer = _trainer()
    first = publisher.try_publish(trainer)
    assert first is not None and first.version == 0
    held[0] = False
    trainer.task.set_weights(trainer.task.get_weights(), 1)
    assert publisher.try_publish(trainer) is None
    assert "withdrawn before it became visible" in caplog.text and "another learner's by now" in caplog.text
    assert not publisher.failing and publisher.last == first and publisher.store.latest("p") == first


def test_a_publisher_failing_for_hours_keeps_its_backoff_capped(tmp_path, caplog):
    """The retry delay was RETRY_FIRST_S * 2 ** (failures - 1), capped after the fact: past 1024 failures in a
    row (a shared filesystem full for ~9 hours, one attempt per 30 s) the float overflowed, and the learner died
    of an OverflowError instead of logging the failure and training on."""
    import errno

    from learner_service.publisher import RETRY_MAX_S

    class FullStore(CheckpointStore):
        def publish(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    publisher = CheckpointPublisher(FullStore(tmp_path), "p", "w", clock=lambda: 0.0)
    publisher.failures = 1100  # as ~9 hours of failed attempts left it
    assert publisher.try_publish(_trainer()) is None
    assert publisher.failures == 1101 and 0 < publisher.retry_in() <= RETRY_MAX_S
    assert "No space left on device" in caplog.text


def test_telemetry_under_a_path_that_is_not_utf8_trains_on_without_tensorboard(tmp_path, caplog):
    """A shared root named with bytes that are not UTF-8 (`run\\xff`, as a Latin-1 file system has them): TensorBoard's
    writer raised UnicodeEncodeError and the learner failed at every job, restarted until `league run` gave up."""
    from learner_service.trainer import IterationReport

    log_dir = Path(os.fsdecode(bytes(tmp_path) + b"/run\xff/tensorboard/p"))
    telemetry = Telemetry(log_dir)
    scalars = telemetry.iteration(IterationReport(1, 1, samples=10, stats={"loss": 1.0}),
                                  Progress(agent_steps=100, train_iteration=1), buffered=0)
    telemetry.close()
    assert scalars["train/loss"] == 1.0
    assert "TensorBoard takes only paths that are valid UTF-8" in caplog.text


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # (how pytest shows one)
def test_a_failed_event_write_is_one_error_line_without_a_traceback(tmp_path, monkeypatch, capfd, caplog):
    """A reviewer filled the shared root's disk: beside each ERROR line of the telemetry, TensorBoard's writer
    thread died with its own traceback on stderr ("Exception in thread Thread-3: ... OSError: [Errno 28]"),
    every 30 s while the disk stayed full."""
    import errno
    import logging

    from tensorboard.summary.writer import record_writer

    from learner_service.trainer import IterationReport

    def full_disk(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    now = [0.0]
    monkeypatch.setattr(record_writer.RecordWriter, "write", full_disk)
    with caplog.at_level(logging.ERROR):
        telemetry = Telemetry(tmp_path / "tb", clock=lambda: now[0], every_s=0.0)
        for i in range(1, 4):
            now[0] = float(i)
            telemetry.iteration(IterationReport(i, i, samples=10, stats={"loss": 1.0}),
                                Progress(agent_steps=10 * i, train_iteration=i), buffered=0)
            telemetry.flush()
        telemetry.close()
    assert telemetry.write_failures >= 1
    assert "TensorBoard scalars under" in caplog.text and "No space left on device" in caplog.text
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err


def test_failed_event_writers_leave_no_empty_event_files(tmp_path, monkeypatch):
    """A full disk: every retry (every REOPEN_AFTER_S) opened a new event file and left it empty behind the failed
    writer, thousands a day per learner."""
    import errno

    from tensorboard.compat.tensorflow_stub.io import gfile

    from learner_service.telemetry import REOPEN_AFTER_S
    from learner_service.trainer import IterationReport

    def full_disk(self, filename, content, mode):  # the file is made; nothing fits in it
        open(filename, mode).close()
        raise OSError(errno.ENOSPC, "No space left on device")

    now = [0.0]
    monkeypatch.setattr(gfile.LocalFileSystem, "_write", full_disk)
    telemetry = Telemetry(tmp_path / "tb", clock=lambda: now[0], every_s=0.0)
    for i in range(1, 6):
        now[0] = i * (REOPEN_AFTER_S + 1)
        telemetry.iteration(IterationReport(i, i, samples=10, stats={"loss": 1.0}),
                            Progress(agent_steps=10 * i, train_iteration=i), buffered=0)
        telemetry.flush()
    telemetry.close()
    assert telemetry.write_failures >= 3
    assert [p.name for p in (tmp_path / "tb").iterdir() if p.stat().st_size == 0] == []


def test_the_moving_average_of_the_weights_is_adopted_as_one_more_version():
    """learner.average_decay: the trainer averages the parameters over its updates; adopting the average makes it
    the network's weights at version + 1 (buffers stay the current ones), and starts a new average after."""
    decay = 0.5
    trainer = _trainer(batch_size=16, average_decay=decay)
    expected = None
    for seq in range(3):
        trainer.add(_prepared(trainer, seq=seq))
        assert trainer.train_ready() is not None
        trainer.update_average()
        weights = {k: v.detach().clone() for k, v in trainer.task.algorithm.model.named_parameters()}
        expected = weights if expected is None else {k: decay * expected[k] + (1 - decay) * weights[k] for k in weights}
    version, last = trainer.version, trainer.task.get_weights()
    assert trainer.adopt_average() and trainer.version == version + 1
    adopted = trainer.task.get_weights()
    for name, value in expected.items():
        np.testing.assert_allclose(adopted[name], value.numpy(), rtol=1e-6, atol=1e-7)
        assert not np.array_equal(adopted[name], last[name])  # three different updates were averaged
    buffers = dict(trainer.task.algorithm.model.named_buffers())
    assert all(np.array_equal(adopted[name], last[name]) for name in buffers)
    assert not trainer.adopt_average()  # nothing averaged since


def _update_and_average(trainer, seq):
    trainer.add(_prepared(trainer, seq=seq))
    assert trainer.train_ready() is not None
    trainer.update_average()
    return {k: v.detach().clone() for k, v in trainer.task.algorithm.model.named_parameters()}


def _assert_adopted(trainer, expected):
    assert trainer.adopt_average()
    adopted = trainer.task.get_weights()
    for name, value in expected.items():
        np.testing.assert_allclose(adopted[name], value.numpy(), rtol=1e-5, atol=1e-6)


def test_the_average_of_fewer_updates_than_its_window_is_their_plain_mean():
    """A review found the first update kept decay ** (n - 1) of the average (0.76 after 10 updates at 0.97): a
    player reset a few updates before the release published little more than its first update after the reset."""
    trainer = _trainer(batch_size=16, average_decay=0.97)
    updates = [_update_and_average(trainer, seq) for seq in range(6)]
    _assert_adopted(trainer, {k: sum(u[k] for u in updates) / len(updates) for k in updates[0]})


def test_past_its_window_the_average_decays_exponentially():
    decay = 0.75  # a window of 4 updates: a plain mean up to the 4th, then avg += 0.25 * (weights - avg)
    trainer = _trainer(batch_size=16, average_decay=decay)
    updates = [_update_and_average(trainer, seq) for seq in range(7)]
    expected = {k: sum(u[k] for u in updates[:4]) / 4 for k in updates[0]}
    for u in updates[4:]:
        expected = {k: decay * expected[k] + (1 - decay) * u[k] for k in expected}
    _assert_adopted(trainer, expected)


def test_a_roll_back_to_the_published_weights_takes_the_average_back_with_them(tmp_path):
    """Updates a roll-back abandons (they led to the non-finite one) leave the average too: it goes back to what
    it was when the weights rolled back to were published."""
    trainer = _trainer(batch_size=16, average_decay=0.9)
    kept = [_update_and_average(trainer, seq) for seq in range(2)]
    store = CheckpointStore(tmp_path)
    ref = trainer.publish(store, "p", {})
    for seq in range(2, 5):
        _update_and_average(trainer, seq)  # abandoned by the roll-back below
    trainer.replace_task(build_task(trainer.spec, seed=3, device="cpu", weights=store.load(ref.path).tensors,
                                    version=trainer.version))
    kept.append(_update_and_average(trainer, 5))
    _assert_adopted(trainer, {k: sum(u[k] for u in kept) / len(kept) for k in kept[0]})


def test_an_average_that_is_not_finite_is_never_adopted(caplog):
    trainer = _trainer(batch_size=16, average_decay=0.5)
    _update_and_average(trainer, 0)
    with torch.no_grad():  # finite weights whose average overflows float32
        for p in trainer.task.algorithm.model.parameters():
            p.fill_(3e38)
    trainer.update_average()
    with torch.no_grad():
        for p in trainer.task.algorithm.model.parameters():
            p.fill_(-3e38)
    trainer.update_average()
    version = trainer.version
    assert not trainer.adopt_average() and trainer.version == version
    assert trainer.weights_finite() and "the moving average of the weights is not finite" in caplog.text
    assert not trainer.adopt_average()  # and it is gone


def test_no_average_is_kept_or_adopted_without_a_decay():
    trainer = _trainer(batch_size=16)
    trainer.add(_prepared(trainer, seq=0))
    assert trainer.train_ready() is not None
    trainer.update_average()
    assert not trainer.adopt_average() and trainer.version == 1


@pytest.mark.parametrize("algorithm", ["ppo", "dqn"])
def test_untrained_keys_name_the_chunks_received_and_not_yet_in_the_ledger(algorithm):
    """What a learner dropping a kept trainer forgets in its duplicate table, so that their resends are new data
    again (answered as duplicates, chunks of a stream never acknowledged were never trained anywhere)."""
    trainer = _trainer(algorithm, batch_size=32) if algorithm == "ppo" else _trainer(algorithm)
    for seq in range(2):
        trainer.add(_prepared(trainer, seq=seq))  # 16 samples each: PPO holds them short of its batch of 32
    header = _prepared(trainer, seq=0).header
    assert trainer.untrained_keys() == [(header.worker_id, header.job_id, 0), (header.worker_id, header.job_id, 1)]
    if algorithm == "ppo":
        trainer.add(_prepared(trainer, seq=2))
        assert trainer.train_ready() is not None  # what it held trained into the weights: in the ledger now
        assert trainer.untrained_keys() == []
