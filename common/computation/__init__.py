"""The FLARE-style computation framework: Model, Algorithm, ComputationTask, ComputationDataProcessor, helpers.

Actors use it to act (`ComputationTask.predict`, batched across threads by `ComputationDataProcessor`),
learners to train (`ComputationTask.learn` on data from `OnlineHelper` / `ExpReplayHelper`).
"""

from common.computation.agent_helpers import ExpReplayHelper, OnlineHelper, ReplaySample
from common.computation.algorithm import Algorithm, ForwardKwargs, LearnOutput
from common.computation.computation_task import ComputationTask, LearnResult, Prediction, resolve_device
from common.computation.data_processor import ComputationDataProcessor, PackedBatch, pack, unpack
from common.computation.model import Model
from common.computation.specs import (
    ACTION_MASK,
    DiscreteActionSpec,
    TensorSpec,
    observation_specs,
    specs_from_gym,
)

__all__ = [
    "ACTION_MASK",
    "Algorithm",
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
    "observation_specs",
    "pack",
    "resolve_device",
    "specs_from_gym",
    "unpack",
]
