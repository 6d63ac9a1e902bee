"""The FLARE-style computation framework: Model, Algorithm, ComputationTask, ComputationDataProcessor, helpers.

Actors use it to act (`ComputationTask.predict`, batched across threads by `ComputationDataProcessor`),
learners to train (`ComputationTask.learn` on data from `OnlineHelper` / `ExpReplayHelper`).

Coming from FLARE: the names and the split of responsibilities are FLARE's (a Model defines the networks and
their specs, an Algorithm owns the model and its optimiser, a ComputationTask turns numpy in and out, with
weights got and set by name), the calls are not:
- specs are `TensorSpec` objects, not (name, {shape}) tuples; rewards are scalars per step (shape ()), not [1];
- `predict(inputs, states=None)` returns a `Prediction` (actions, artifacts such as logp and value, next
  states), not a (pred_actions, next_states) tuple; a recurrent model needs its states (`initial_states`);
- `learn(batch)` takes one flat dict per algorithm (`get_learn_specs`: e.g. PPO's (B, T) rows with
  `next_<input>` bootstrap inputs and boolean `terminated` / `truncated`, DQN's n-step `return` and
  `discount`), not FLARE's inputs / next_inputs / next_alive keywords, and returns a `LearnResult`;
- `set_weights(weights, version)` carries the checkpoint version the weights belong to.
"""

from common.computation.agent_helpers import ExpReplayHelper, OnlineHelper, ReplaySample
from common.computation.algorithm import Algorithm, ForwardKwargs, LearnOutput
from common.computation.computation_task import (
    ComputationTask,
    LearnResult,
    Prediction,
    WeightsMismatchError,
    describe_device,
    resolve_device,
)
from common.computation.data_processor import ComputationDataProcessor, PackedBatch, pack, unpack
from common.computation.model import Model
from common.computation.specs import (
    ACTION_MASK,
    ActionSpec,
    BoxActionSpec,
    DiscreteActionSpec,
    TensorSpec,
    observation_specs,
    specs_from_gym,
)

__all__ = [
    "ACTION_MASK",
    "ActionSpec",
    "Algorithm",
    "BoxActionSpec",
    "ComputationDataProcessor",
    "ComputationTask",
    "DiscreteActionSpec",
    "ExpReplayHelper",
    "ForwardKwargs",
    "LearnOutput",
    "LearnResult",
    "Model",
    "OnlineHelper",
    "PackedBatch",
    "Prediction",
    "ReplaySample",
    "TensorSpec",
    "WeightsMismatchError",
    "describe_device",
    "observation_specs",
    "pack",
    "resolve_device",
    "specs_from_gym",
    "unpack",
]
