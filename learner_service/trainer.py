"""The training loop's state for one player: its ComputationTask, the data it waits on, and its counters.

Single-threaded by design (the learner's session thread calls it): RPC threads only prepare chunks and put
them in the queue; this class turns them into updates.

- PPO trains on-policy batches: an `OnlineHelper` fills up to ``learner.batch_size`` samples, then everything
  held is one train iteration. Actors send rows of different lengths (a row ends early at a truncation or at
  the job's end), and (B, T) segments only stack at one T: shorter rows are padded at the *front* to the
  batch's longest row (`front_pad`), with padding steps that PPO's targets mark invalid. Where padding would
  be most of a batch (held rows far shorter than a new one, or the other way round), the held rows train
  first as a batch of their own (`PAD_LIMIT`). A recurrent model's
  rows carry ``state_<k>`` per step; the padding repeats the first real step's state, from which the core
  restarts at that step (padding ends like an episode).
- DQN adds n-step transitions to its prioritized replay and, once ``dqn.learning_starts`` transitions are
  held, owes ``replay_ratio / dqn.batch_size`` learn calls per received transition; each call is a train
  iteration whose new priorities go back to the replay.

Versions: the task's version grows by one per learn call, so the version of a published checkpoint is the
number of updates behind it (plus where it started); staleness = task version - the chunk's policy_version.

Training state: every checkpoint a learner publishes carries the task's training state (optimizer moments,
DQN's target network, the update counter, the minibatch generator) in a companion file actors never read;
a learner that resumes the player's latest checkpoint adopts it (`resume_training_state`), so a restart goes
on with the same Adam moments and step counts instead of a fresh optimizer. Replay contents are not saved
(a restarted DQN learner refills its replay up to ``learning_starts`` first).

Trained chunks: the training state also names the chunks (worker_id, job_id, seq) the published weights were
trained on (`Trainer.trained`, the most recent `TRAINED_LEDGER_STREAMS` streams). A learner killed with a
stream open never acknowledged that stream's chunks, so its actor sends them again to the player's next learner;
that learner, resuming the checkpoint, counts the ones already in its weights as duplicates, and trains only
those the killed learner had not published (held short of a batch, or trained after its last publish). A PPO
chunk counts as trained once the batch holding its last sample has trained; a DQN chunk once the replay updates
owed up to it are made (its transitions had their chance to be sampled; the replay itself dies with the learner).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from common.algorithms.dqn import make_replay
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointError, CheckpointRef, CheckpointStore, UnreadableCheckpointError
from common.computation.agent_helpers import ExpReplayHelper, OnlineHelper
from common.computation.computation_task import ComputationTask
from common.computation.specs import ActionSpec, TensorSpec
from common.learner_config import LearnerConfig
from common.policy_config import PolicyConfig
from learner_service.chunks import ChunkPreparer, PreparedChunk
from learner_service.intake import SeqDeduper

log = logging.getLogger(__name__)

TRAINED_STATE_KEY = "learner.trained_chunks"
"""The training state's entry naming the chunks trained into the weights: `SeqDeduper.export` as JSON text (one
string: torch.save pickled the same as nested lists at twice the CPU of the whole publish of a small network)."""
TRAINED_LEDGER_STREAMS = 256
"""Streams (worker_id, job_id) the trained-chunk ledger remembers, the most recently trained: a stream ends with
its job, and an actor runs one job at a time, so this covers the resends of that many actors."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything that decides the network's shape: actors build theirs from the same."""

    policy: PolicyConfig
    obs_specs: Mapping[str, TensorSpec]
    action_spec: ActionSpec


@dataclass
class Progress:
    """Totals since the player was created; they never go down (not even when the player is reset)."""

    agent_steps: int = 0
    train_iteration: int = 0


@dataclass(frozen=True)
class IterationReport:
    train_iteration: int
    version: int
    samples: int
    """Samples the update trained on."""
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StartWeights:
    """The weights a trainer was built with."""

    weights: Mapping[str, np.ndarray] | None
    """None: the seeded fresh initialisation (`build_task` makes it again from the seed)."""


class Trainer:
    """Owns the task and the data buffers of one player (not thread-safe: one caller)."""

    def __init__(
        self, task: ComputationTask, spec: ModelSpec, config: LearnerConfig, progress: Progress, seed: int
    ) -> None:
        self.task = task
        self.spec = spec
        self.config = config
        self.progress = progress
        self.preparer = ChunkPreparer(spec.policy, task.input_specs, task.learn_specs, spec.action_spec,
                                      task.state_specs)
        # Bounded by `train_ready` (it takes everything once batch_size samples are held), not by dropping rows.
        self._online = OnlineHelper(capacity_rows=2**62)
        self._segment_len = 0
        self._held_samples = 0
        self._short_batches: list[tuple[dict[str, np.ndarray], int]] = []
        """Held rows set aside to train before the rest (see `add`), with their sample counts."""
        self._replay: ExpReplayHelper | None = None
        self._owed_updates = 0.0
        self.nonfinite_td_batches = 0
        """Replay batches whose TD errors were not finite (a diverging network): their priorities were kept."""
        self.fresh_at: int | None = None
        """The version of the seeded fresh initialisation this trainer was built with (None: built from weights)."""
        self.lineage_from = 0
        """Chunks acted with a policy version below this were played by weights these do not descend from (the
        ones a league reset threw away): the session drops them. Kept with the trainer across sessions."""
        if spec.policy.algorithm == "dqn":
            self._replay = make_replay(spec.policy.dqn, seed)
        self._average: dict[str, torch.Tensor] | None = None
        """The moving average of the parameters over this trainer's updates (learner.average_decay), or None."""
        self._averaged = 0
        """Updates folded into ``_average``."""
        self._published_average: tuple[dict[str, torch.Tensor] | None, int] = (None, 0)
        """``_average`` and ``_averaged`` as they were when the trainer last published: what a roll-back to the
        published weights goes back to, so the updates it abandons leave the average too."""
        self.unpublished_start: StartWeights | None = None
        """The weights `build_trainer` started this trainer from, until it first publishes: what a roll-back goes
        back to meanwhile. The last published checkpoint may be the weights a league reset threw away (the reset's
        publish failed), and a roll-back to it undid the reset without a word."""
        self.trained = SeqDeduper(max_streams=TRAINED_LEDGER_STREAMS)
        """The chunks whose data the weights were trained on (see the module docstring)."""
        self._published_trained: list[list] = []
        """``trained`` as published with the weights a roll-back goes back to."""
        self._untrained: deque[list] = deque()
        """PPO: ``[(worker_id, job_id, seq), samples not trained yet]`` of the chunks held, in the order they train."""
        self._replay_updates = 0
        """DQN: replay updates made by this trainer."""
        self._unsampled: deque[tuple[tuple[str, str, int], int]] = deque()
        """DQN: ``((worker_id, job_id, seq), replay updates)`` of the chunks in the replay that join `trained` once
        this trainer has made that many updates (see `add`)."""

    @property
    def version(self) -> int:
        return self.task.version

    @property
    def holds_fresh_init(self) -> bool:
        """The weights are still the seeded fresh initialisation (no update since the trainer was built)."""
        return self.fresh_at is not None and self.task.version == self.fresh_at

    @property
    def algorithm_updates(self) -> int:
        """The algorithm's own update counter (learning-rate annealing, target-network period)."""
        return int(getattr(self.task.algorithm, "updates", 0))

    def replace_task(self, task: ComputationTask) -> None:
        """Go on with ``task`` (a fresh network and optimizer of the same model, from `build_task`) and the data
        held so far: a roll-back of a diverged update keeps the rows and the replay, which are the actors'
        transitions and as good as before (a reset of the player, which starts over, builds a new trainer)."""
        if (task.input_specs, task.learn_specs, task.state_specs) != (
                self.task.input_specs, self.task.learn_specs, self.task.state_specs):
            raise ValueError("replace_task: the new task's specs differ from the trainer's")
        self.task = task
        average, self._averaged = self._published_average
        self._average = _clone(average)
        self.trained = SeqDeduper(max_streams=TRAINED_LEDGER_STREAMS)
        self.trained.seed(self._published_trained)

    def update_average(self) -> None:
        """Fold the weights of the update just made (a finite one) into the moving average of the parameters.

        Until ``1 / (1 - decay)`` updates are in, it is their plain mean (weight ``1 / n`` for the n-th); an
        exponential average seeded with the first update would keep that update at ``decay ** (n - 1)`` (0.76
        after 10 updates at 0.97): a player reset or a learner restarted a few updates before the release would
        publish little more than the first update after it."""
        decay = self.config.average_decay
        if decay <= 0:
            return
        self._averaged += 1
        with torch.no_grad():
            parameters = dict(self.task.algorithm.model.named_parameters())
            if self._average is None:
                self._average = {name: p.detach().clone() for name, p in parameters.items()}
            else:
                rate = max(1.0 - decay, 1.0 / self._averaged)
                for name, p in parameters.items():
                    self._average[name].lerp_(p.detach(), rate)

    def adopt_average(self) -> bool:
        """Make the moving average the network's weights, as version + 1 (buffers such as observation statistics
        stay the current ones); False when there is none (learner.average_decay 0, or no update since the trainer
        began or last adopted it), or when it is not finite (logged; the last update's weights stay). Called at
        the player's release: the average is its last checkpoint."""
        average, self._average, self._averaged = self._average, None, 0
        if average is None or self.config.average_decay <= 0:  # (a kept trainer whose new config has no average)
            return False
        with torch.no_grad():
            finite = all(bool(torch.isfinite(value).all()) for value in average.values())
        if not finite:  # finite updates can still average past float32's range; never published
            log.warning("the moving average of the weights is not finite: the last update's weights stay the "
                        "player's (version %d)", self.task.version)
            return False
        weights = self.task.get_weights()
        for name, value in average.items():
            weights[name] = value.to("cpu").numpy().copy()
        self.task.set_weights(weights, self.task.version + 1)
        return True

    def restore_algorithm_updates(self, updates: int) -> None:
        if hasattr(self.task.algorithm, "updates"):
            self.task.algorithm.updates = int(updates)

    def publish(self, store: CheckpointStore, player_id: str, metadata: Mapping[str, object]) -> CheckpointRef:
        """Publish the weights at the trainer's version, with the training state a restart resumes."""
        trained = self.trained.export()
        ref = self.task.publish(store, player_id, metadata, training_state=True,
                                extra_state={TRAINED_STATE_KEY: json.dumps(trained, separators=(",", ":"))})
        self._published_average = (_clone(self._average), self._averaged)
        self._published_trained = trained
        self.unpublished_start = None
        return ref

    def resume_training_state(self, store: CheckpointStore, ref: CheckpointRef) -> bool:
        """Adopt the training state published with ``ref``, the checkpoint this trainer's weights came from.

        False when there is none (published before training states existed) or it cannot be used (logged as an
        error: corrupt, or built for another model); training then goes on with a fresh optimizer.
        """
        try:
            state = store.load_training_state(ref.path, ref.version)
        except UnreadableCheckpointError:
            # No permission or EIO now, not damage: going on with a fresh optimizer would publish over the
            # intact state, and retention then deletes it. Raised, the session fails and is retried (a review).
            raise
        except CheckpointError as err:
            log.error("%s: training state unusable (%s); going on with a fresh optimizer", ref.path, err)
            return False
        if state is None:
            log.info("%s has no training state; going on with a fresh optimizer", ref.path)
            return False
        self._resume_trained(ref, state.pop(TRAINED_STATE_KEY, None))
        try:
            self.task.set_training_state(state)
        except ValueError as err:
            log.error("%s: training state does not fit this model (%s); going on with a fresh optimizer",
                      ref.path, err)
            return False
        return True

    def _resume_trained(self, ref: CheckpointRef, trained: object) -> None:
        """Take the ledger of chunks trained into ``ref``'s weights (a checkpoint of an older learner has none)."""
        if trained is None:
            return
        try:
            if not isinstance(trained, str):
                raise ValueError(f"expected JSON text, got {type(trained).__name__}")
            streams = json.loads(trained)
            if not isinstance(streams, list):
                raise ValueError(f"expected a JSON list, got {type(streams).__name__}")
            self.trained.seed(streams)
        except (ValueError, RecursionError) as err:  # (RecursionError: JSON nested past the parser's depth)
            log.error("%s: its list of trained chunks is unusable (%s): chunks it trained that actors send again "
                      "are trained again", ref.path, err)
            self.trained = SeqDeduper(max_streams=TRAINED_LEDGER_STREAMS)
        self._published_trained = self.trained.export()

    def weights_finite(self) -> bool:
        """False once an update produced NaN or infinite parameters (such weights are never published)."""
        with torch.no_grad():
            return all(bool(torch.isfinite(p).all()) for p in self.task.algorithm.model.parameters())

    @property
    def buffered_samples(self) -> int:
        """Samples received and not yet trained on (PPO) or held in the replay (DQN)."""
        if self._replay is not None:
            return len(self._replay)
        return self._held_samples + sum(samples for _, samples in self._short_batches)

    @property
    def replays(self) -> bool:
        """Whether it trains from a replay buffer (DQN), which a stop loses whole (it is in no checkpoint)."""
        return self._replay is not None

    @property
    def owes_updates(self) -> bool:
        """DQN: replay updates owed for samples received (replay_ratio) not all made yet."""
        return self._replay is not None and self._owed_updates >= 1.0

    @property
    def untrained_samples(self) -> int:
        """Samples received and never trained on (PPO's held rows; a DQN replay's samples have been sampled)."""
        return 0 if self._replay is not None else self.buffered_samples

    def untrained_keys(self) -> list[tuple[str, str, int]]:
        """(worker_id, job_id, seq) of the chunks received and not yet trained into the weights (not in the ledger):
        what a learner dropping this trainer must forget, so that their resends are new data again."""
        return [key for key, _ in (self._unsampled if self._replay is not None else self._untrained)]

    # ---- data -----------------------------------------------------------------------------------------
    def add(self, chunk: PreparedChunk) -> None:
        self.progress.agent_steps += chunk.agent_steps
        key = (chunk.header.worker_id, chunk.header.job_id, chunk.header.seq)
        if self._replay is not None:
            self._add_transitions(chunk.rows)
            # Trained into the weights once the updates owed up to it are made, and at least one update after it
            # entered the replay (before learning_starts none is owed): marked as it entered, a chunk no update
            # had sampled was lost with the replay at a kill, its resend refused as a duplicate (a review).
            owed = max(1, int(self._owed_updates))
            self._unsampled.append((key, self._replay_updates + owed))
            return
        self._untrained.append([key, len(chunk.rows["reward"]) * chunk.steps])  # (the samples `_hold` counts)
        # A chunk of many batches' samples is held a batch's rows at a time, each batch set ready as it fills:
        # taken whole, one 64 MiB chunk of tiny observations (4.4M samples) was one PPO batch of ~8 GB (a review).
        rows = len(chunk.rows["reward"])
        rows_a_batch = max(1, -(-self.config.batch_size // max(chunk.steps, 1)))
        for start in range(0, rows, rows_a_batch):
            piece = chunk.rows if rows <= rows_a_batch else {k: v[start:start + rows_a_batch]
                                                             for k, v in chunk.rows.items()}
            self._hold(piece, chunk.steps, min(rows_a_batch, rows - start) * chunk.steps)
            if start + rows_a_batch < rows and self._held_samples >= self.config.batch_size:
                self._set_held_apart()

    def _hold(self, rows: Mapping[str, np.ndarray], steps: int, samples: int) -> None:
        """Hold (B, `steps`) PPO rows of `samples` samples for the next batch, padded to the held rows' length."""
        held_rows = self._online.rows
        padded = (held_rows + len(rows["reward"])) * max(self._segment_len, steps)
        if held_rows and padded > PAD_LIMIT * max(self._held_samples + samples, self.config.batch_size):
            # Padding what is held and this chunk to one length would be mostly padding (many short rows and a
            # long one): the held rows train as a batch of their own first, so a batch's memory stays a small
            # multiple of its data whatever lengths actors send.
            self._set_held_apart()
            held_rows = 0
        if steps > self._segment_len:
            held = self._online.take(min_rows=1, timeout=0) if held_rows else None
            self._segment_len = steps
            if held is not None:
                self._online.add(front_pad(held, self._segment_len))
        self._online.add(front_pad(rows, self._segment_len))
        self._held_samples += samples

    def _set_held_apart(self) -> None:
        """The rows held so far become a batch of their own (trained before the rest, in order); none are held."""
        self._short_batches.append((self._online.take(min_rows=1, timeout=0), self._held_samples))
        self._held_samples, self._segment_len = 0, 0

    def _add_transitions(self, rows: Mapping[str, np.ndarray]) -> None:
        assert self._replay is not None
        count = len(next(iter(rows.values())))
        for start in range(0, count, self._replay.capacity):
            self._replay.add({k: v[start:start + self._replay.capacity] for k, v in rows.items()})
        dqn = self.spec.policy.dqn
        if len(self._replay) >= max(dqn.learning_starts, 1):
            self._owed_updates += count * self.config.replay_ratio / dqn.batch_size

    # ---- training -------------------------------------------------------------------------------------
    def train_ready(self, rest: bool = False) -> IterationReport | None:
        """One train iteration if enough data is held, else None. ``rest``: samples held short of a batch train
        as a last, smaller batch (a stopping learner: the actors will not send what it accepted again)."""
        if self._replay is not None:
            return self._train_replay()
        if self._short_batches:
            batch, samples = self._short_batches.pop(0)
        else:
            if self._held_samples < self.config.batch_size and not (rest and self._held_samples):
                return None
            batch = self._online.take(min_rows=1, timeout=0)
            if batch is None:
                return None
            samples, self._held_samples = self._held_samples, 0
            self._segment_len = 0  # the next batch pads to its own longest row, not to this one's
        result = self.task.learn(batch)
        self._mark_trained(samples)
        return self._report(result.stats, samples)

    def _mark_trained(self, samples: int) -> None:
        """``samples`` of the held chunks, the oldest first, were trained on: those trained whole join `trained`."""
        while self._untrained and self._untrained[0][1] <= samples:
            key, left = self._untrained.popleft()
            samples -= left
            self.trained.reserve(*key)
        if self._untrained and samples:
            self._untrained[0][1] -= samples

    def _train_replay(self) -> IterationReport | None:
        assert self._replay is not None
        if self._owed_updates < 1.0:
            return None
        self._owed_updates -= 1.0
        dqn = self.spec.policy.dqn
        beta = dqn.priority_beta_at(self.algorithm_updates)
        sample = self._replay.sample(dqn.batch_size, beta=beta)
        batch = dict(sample.batch)
        if self._replay.prioritized:
            batch["weight"] = sample.weights
        result = self.task.learn(batch)
        stats = dict(result.stats, priority_beta=beta) if self._replay.prioritized else result.stats
        if result.priorities is not None:
            if np.isfinite(result.priorities).all():
                self._replay.update_priorities(sample, result.priorities)
            else:  # a diverging network (its outputs overflow; non-finite weights are rolled back by the session)
                self.nonfinite_td_batches += 1
                if self.nonfinite_td_batches % 1000 == 1:
                    log.warning("non-finite TD errors in %d replay batch(es) so far (the network diverges?): their "
                                "priorities were left as they were", self.nonfinite_td_batches)
        self._replay_updates += 1
        while self._unsampled and self._unsampled[0][1] <= self._replay_updates:
            self.trained.reserve(*self._unsampled.popleft()[0])
        return self._report(stats, dqn.batch_size)

    def _report(self, stats: dict[str, float], samples: int) -> IterationReport:
        self.progress.train_iteration += 1
        return IterationReport(self.progress.train_iteration, self.task.version, samples, stats)


def _clone(tensors: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    return None if tensors is None else {name: value.clone() for name, value in tensors.items()}


PAD_LIMIT = 8
"""A PPO batch holds at most this many steps, padding included, per step of data (or of ``batch_size``)."""


def front_pad(rows: Mapping[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """PPO rows (B, T, ...) padded at the front to (B, length, ...), leaving every target of the real steps as it was.

    The padding repeats the row's first step as *truncated* steps with reward 0: a step truncated inside a row
    is invalid for PPO (no target, not in the loss, no trace flows through it), and the real steps still end
    the row, so their bootstrapping from ``next_<input>`` is untouched. ``next_*`` entries have no T axis.
    """
    steps = rows["reward"].shape[1]
    if steps == length:
        return dict(rows)
    if steps > length:
        raise ValueError(f"rows of {steps} steps do not fit {length}")
    pad = length - steps
    out = {}
    for key, value in rows.items():
        if key.startswith("next_"):
            out[key] = value
            continue
        out[key] = np.concatenate([np.repeat(value[:, :1], pad, axis=1), value], axis=1)
    out["reward"][:, :pad] = 0.0
    out["terminated"][:, :pad] = False
    out["truncated"][:, :pad] = True
    return out


def build_trainer(
    spec: ModelSpec,
    config: LearnerConfig,
    progress: Progress,
    *,
    seed: int,
    device: str,
    weights: Mapping[str, np.ndarray] | None,
    version: int,
) -> Trainer:
    """A trainer whose task starts from ``weights`` (None: the seeded fresh initialisation) at ``version``.

    A fresh task every time, so a reset player also gets a fresh optimizer and empty buffers.
    """
    trainer = Trainer(build_task(spec, seed=seed, device=device, weights=weights, version=version), spec, config,
                      progress, seed)
    trainer.fresh_at = version if weights is None else None
    trainer.unpublished_start = StartWeights(weights)
    return trainer


def build_task(
    spec: ModelSpec, *, seed: int, device: str, weights: Mapping[str, np.ndarray] | None, version: int
) -> ComputationTask:
    """A fresh task (network and optimizer) holding ``weights`` (None: the seeded initialisation) at ``version``."""
    task = make_computation_task(spec.policy, dict(spec.obs_specs), spec.action_spec, device=device, seed=seed)
    task.set_weights(task.get_weights() if weights is None else weights, version)
    return task
