"""The framework itself: specs conversion, ComputationTask's numpy boundary, weights, configs, the registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest
import torch
from torch import nn

from common.algorithms import PolicyConfig, make_computation_task
from common.computation import (
    Algorithm,
    ComputationTask,
    DiscreteActionSpec,
    ForwardKwargs,
    LearnOutput,
    Model,
    TensorSpec,
    WeightsMismatchError,
    describe_device,
    resolve_device,
    specs_from_gym,
)
from common.typed_config import from_mapping


class RegressionModel(Model):
    """A linear map from a sensor vector to a continuous action (FLARE's SimpleModelDeterministic)."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.dims = dims
        self.net = nn.Linear(dims, dims)

    def get_input_specs(self):
        return [TensorSpec("sensor", (self.dims,)), TensorSpec("scale", (), optional=True)]

    def get_state_specs(self):
        return [TensorSpec("counter", (), "int64")]

    def get_action_specs(self):
        return [TensorSpec("action", (self.dims,))]


class RegressionAlgorithm(Algorithm):
    """Learns action == sensor; predict echoes the dtype/device it saw as artifacts."""

    def __init__(self, model: RegressionModel) -> None:
        super().__init__(model)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.seen: dict[str, torch.Tensor] = {}

    def get_artifact_specs(self):
        return [TensorSpec("norm", ())]

    def get_learn_specs(self):
        return [TensorSpec("sensor", (self.model.dims,))]

    def predict(self, inputs, states, kwargs):
        self.seen = dict(inputs)
        action = self.model.net(inputs["sensor"])
        if "scale" in inputs:
            action = action * inputs["scale"][:, None]
        return {"action": action, "norm": action.norm(dim=-1)}, {"counter": states["counter"] + 1}

    def learn(self, batch):
        loss = ((self.model.net(batch["sensor"]) - batch["sensor"]) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return LearnOutput({"loss": loss.item()})


@pytest.fixture
def task():
    torch.manual_seed(0)
    return ComputationTask(RegressionAlgorithm(RegressionModel(3)), device="cpu")


def test_tensor_spec_validation():
    with pytest.raises(ValueError, match="name"):
        TensorSpec("bad name", ())
    with pytest.raises(ValueError, match="dtype"):
        TensorSpec("x", (), "complex64")
    with pytest.raises(ValueError, match="shape"):
        TensorSpec("x", (-1,))
    spec = TensorSpec("x", (2, 3))
    assert spec.check(np.zeros((5, 2, 3), np.float64)).dtype == np.float32  # same-kind cast
    assert spec.check(np.zeros((5, 2, 3), np.uint8)).dtype == np.float32
    with pytest.raises(ValueError, match="x: shape"):
        spec.check(np.zeros((5, 3, 2)))
    with pytest.raises(ValueError, match="leading"):
        spec.check(np.zeros((4, 5, 2, 3)), leading_dims=1)
    with pytest.raises(ValueError, match="cannot be cast"):
        TensorSpec("m", (2,), "bool").check(np.zeros((1, 2), np.int8))
    with pytest.raises(ValueError, match="cannot be cast"):
        TensorSpec("a", (), "int64").check(np.zeros(3, np.float32))


def test_predict_converts_by_specs_and_returns_numpy(task):
    sensor = np.ones((4, 3), dtype=np.float64)
    prediction = task.predict({"sensor": sensor}, task.initial_states(4))
    seen = task.algorithm.seen
    assert seen["sensor"].dtype == torch.float32 and seen["sensor"].shape == (4, 3)
    assert "scale" not in seen  # optional input left out
    assert isinstance(prediction.actions["action"], np.ndarray)
    assert prediction.actions["action"].shape == (4, 3) and prediction.actions["action"].dtype == np.float32
    assert prediction.artifacts["norm"].shape == (4,)
    np.testing.assert_array_equal(prediction.states["counter"], np.ones(4))
    assert prediction.batch_size == 4
    scaled = task.predict({"sensor": sensor, "scale": np.zeros(4)}, task.initial_states(4))
    np.testing.assert_array_equal(scaled.actions["action"], np.zeros((4, 3)))


def test_read_only_inputs_are_accepted(task):
    sensor = np.ones((2, 3), np.float32)
    sensor.flags.writeable = False
    assert task.predict({"sensor": sensor}, task.initial_states(2)).actions["action"].shape == (2, 3)


@pytest.mark.parametrize(
    "inputs, match",
    [
        ({}, "missing 'sensor'"),
        ({"sensor": np.ones((2, 4))}, "sensor: shape"),
        ({"sensor": np.ones(3)}, "sensor: shape"),
        ({"sensor": np.ones((2, 3)), "typo": np.ones(2)}, "unknown key"),
        ({"sensor": np.ones((2, 3)), "scale": np.ones(3)}, "batch sizes differ"),
        ({"sensor": np.ones((2, 2, 3))}, "leading"),
    ],
)
def test_predict_rejects_inputs_that_break_the_specs(task, inputs, match):
    with pytest.raises(ValueError, match=match):
        task.predict(inputs, task.initial_states(2))


def test_learn_bumps_version_and_reduces_loss(task):
    rng = np.random.default_rng(0)
    batch = {"sensor": rng.normal(size=(64, 3)).astype(np.float32)}
    first = task.learn(batch)
    for _ in range(50):
        last = task.learn(batch)
    assert last.stats["loss"] < first.stats["loss"] / 10
    assert (first.version, last.version, task.version) == (1, 51, 51)
    with pytest.raises(ValueError, match="unknown key"):
        task.learn({"sensor": batch["sensor"], "reward": np.zeros(64)})


def test_weights_round_trip_between_tasks(task):
    other = ComputationTask(RegressionAlgorithm(RegressionModel(3)), device="cpu")
    weights = task.get_weights()
    assert all(isinstance(v, np.ndarray) for v in weights.values())
    weights["net.bias"][:] = 7.0  # a copy: the task is not affected
    assert not np.allclose(task.get_weights()["net.bias"], 7.0)
    other.set_weights(weights, version=42)
    assert other.version == 42
    np.testing.assert_array_equal(other.get_weights()["net.bias"], np.full(3, 7.0, np.float32))
    # One type for names, shapes and dtypes: league eval adds what to do about any of them.
    with pytest.raises(WeightsMismatchError, match="missing"):
        other.set_weights({"net.weight": weights["net.weight"]}, 1)
    with pytest.raises(WeightsMismatchError, match="shape"):
        other.set_weights({**weights, "net.bias": np.zeros(4, np.float32)}, 1)
    with pytest.raises(WeightsMismatchError, match="dtype"):
        other.set_weights({**weights, "net.bias": np.zeros(3, np.float64)}, 1)


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda")
    # A GPU index past the machine's is refused here, not at the first job (`cuda:0` where none exists too).
    with pytest.raises(ValueError, match="CUDA"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")
    assert describe_device(torch.device("cpu")) == "cpu"


def test_forward_kwargs_are_typed():
    assert ForwardKwargs.from_mapping({"eps": 0.25}).eps == 0.25
    assert ForwardKwargs.from_mapping(None) == ForwardKwargs()
    with pytest.raises(ValueError, match="unknown"):
        ForwardKwargs.from_mapping({"epsilon": 0.1})
    with pytest.raises(ValueError, match="eps"):
        ForwardKwargs.from_mapping({"eps": 1.5})


@dataclass(frozen=True)
class Inner:
    width: int = 1


@dataclass(frozen=True)
class Outer:
    sizes: tuple[int, ...] = ()
    layers: tuple[tuple[int, int], ...] = ()
    rate: float = 0.1
    flag: bool = False
    mode: Literal["a", "b"] = "a"
    limit: float | None = None
    inner: Inner = Inner()


def test_typed_config_parses_struct_style_numbers_and_names_bad_fields():
    parsed = from_mapping(Outer, {"sizes": [64.0, 32], "layers": [[1, 2.0]], "rate": 1, "inner": {"width": 3.0}})
    assert parsed == Outer(sizes=(64, 32), layers=((1, 2),), rate=1.0, inner=Inner(3))
    assert from_mapping(Outer, {"limit": None}).limit is None
    for bad, match in [
        ({"sizes": [64.5]}, r"cfg.sizes\[0\]"),
        ({"rate": "fast"}, "cfg.rate"),
        ({"flag": 1}, "cfg.flag"),
        ({"mode": "c"}, "cfg.mode"),
        ({"inner": {"widht": 2}}, "cfg.inner: unknown"),
        ({"layers": [[1, 2, 3]]}, "cfg.layers"),
        ({"typo": 1}, "unknown field"),
    ]:
        with pytest.raises(ValueError, match=match):
            from_mapping(Outer, bad, "cfg")


def test_policy_config_and_registry():
    config = PolicyConfig.from_mapping({"algorithm": "dqn", "model": {"hidden": [32.0]}, "dqn": {"n_step": 5.0}})
    assert config.model.hidden == (32,) and config.dqn.n_step == 5
    with pytest.raises(ValueError, match="policy.algorithm"):
        PolicyConfig.from_mapping({"algorithm": "a2c"})
    with pytest.raises(ValueError, match="policy.ppo: ppo.clip_coef must be > 0"):
        PolicyConfig.from_mapping({"ppo": {"clip_coef": -1}})
    with pytest.raises(ValueError, match="policy.ppo: unknown"):
        PolicyConfig.from_mapping({"ppo": {"clip": 0.1}})


@pytest.mark.parametrize("algorithm", ["ppo", "dqn"])
def test_registry_builds_identical_tasks_for_actor_and_learner(algorithm):
    obs = TensorSpec("observation", (4,))
    actor = make_computation_task({"algorithm": algorithm}, obs, 2, device="cpu", seed=3)
    learner = make_computation_task({"algorithm": algorithm}, obs, DiscreteActionSpec(2), device="cpu", seed=3)
    for key, value in actor.get_weights().items():
        np.testing.assert_array_equal(value, learner.get_weights()[key])
    rng_state = torch.random.get_rng_state()
    make_computation_task({"algorithm": algorithm}, obs, 2, device="cpu", seed=4)
    assert torch.equal(rng_state, torch.random.get_rng_state())  # seeding left the global RNG alone
    actor.set_weights(learner.get_weights(), 5)
    assert actor.version == 5


def test_acting_builds_no_optimizer():
    """Actors only act: building a torch optimizer imports torch._dynamo, about a second of CPU at every actor
    start. A fresh interpreter (one for both algorithms: each start costs seconds of torch import) shows it is
    never imported; learning then builds the optimizer on first use."""
    import subprocess
    import sys

    script = """
import sys
import numpy as np
from common.algorithms import make_computation_task
from common.computation import TensorSpec
tasks = {}
for algorithm in ("ppo", "dqn"):
    task = make_computation_task({"algorithm": algorithm}, TensorSpec("observation", (4,)), 2, device="cpu", seed=0)
    task.set_weights(task.get_weights(), 1)
    task.predict({"observation": np.zeros((3, 4), np.float32)})
    assert "torch._dynamo" not in sys.modules, f"acting ({algorithm}) imported torch._dynamo"
    tasks[algorithm] = task
for algorithm, task in tasks.items():
    state = task.get_training_state()
    assert "optimizer" in state and "torch._dynamo" in sys.modules, algorithm
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_standard_models_for_images_and_board_games():
    import gymnasium as gym

    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    obs, actions = specs_from_gym(image, gym.spaces.Discrete(6))
    task = make_computation_task({"model": {"obs_scale": 1 / 255, "shared_torso": True, "hidden": [512]}}, obs,
                                 actions, device="cpu", seed=0)
    prediction = task.predict({"observation": np.zeros((2, 4, 84, 84), np.uint8)})
    assert prediction.actions["action"].shape == (2,)

    board = gym.spaces.Dict(
        {"observation": gym.spaces.Box(0, 1, (3, 6, 7), np.float32), "action_mask": gym.spaces.MultiBinary(7)}
    )
    obs, actions = specs_from_gym(board, gym.spaces.Discrete(7))
    obs["action_mask"] = TensorSpec("action_mask", (7,), "bool")
    task = make_computation_task({"model": {"conv": [[16, 3, 1]], "hidden": [32]}}, obs, actions, device="cpu")
    with pytest.raises(ValueError, match="missing 'action_mask'"):
        task.predict({"observation": np.zeros((1, 3, 6, 7), np.float32)})
    with pytest.raises(ValueError, match="standard models read only"):
        make_computation_task({}, {**obs, "extra": TensorSpec("extra", ())}, actions, device="cpu")


def test_adam_is_fused_and_a_state_saved_by_the_unfused_one_resumes_fused():
    """Learners step a fused Adam (one kernel for every parameter; a sixth of a minibatch step on small MLPs). A
    training state saved before (param groups saying `fused: None`) still resumes, into the fused optimizer, and
    the next update is the one the unfused optimizer makes, to float rounding."""
    obs, config = TensorSpec("observation", (5,)), {"algorithm": "ppo", "model": {"hidden": [16]}}
    rng = np.random.default_rng(3)
    mask = np.ones((4, 8, 6), bool)
    batch = {
        "observation": rng.normal(size=(4, 8, 5)).astype(np.float32), "action_mask": mask,
        "next_observation": rng.normal(size=(4, 5)).astype(np.float32), "next_action_mask": mask[:, -1],
        "action": rng.integers(0, 6, (4, 8)), "reward": rng.normal(size=(4, 8)).astype(np.float32),
        "terminated": np.zeros((4, 8), bool), "truncated": np.zeros((4, 8), bool),
        "behaviour_logp": np.full((4, 8), np.log(1 / 6), np.float32),
    }
    old = make_computation_task(config, obs, 6, device="cpu", seed=0)
    unfused = torch.optim.Adam(old.algorithm.model.parameters(), lr=old.algorithm.config.learning_rate,
                               eps=old.algorithm.config.adam_eps)
    old.algorithm.optimizer = unfused  # as a learner before fused Adam built it
    old.learn(batch)
    state = old.get_training_state()
    assert state["optimizer"]["param_groups"][0]["fused"] is None
    resumed = make_computation_task(config, obs, 6, device="cpu", seed=9)
    resumed.set_weights(old.get_weights(), old.version)
    resumed.set_training_state(state)
    assert resumed.algorithm.optimizer.param_groups[0]["fused"] is True
    old.learn(batch)
    resumed.learn(batch)
    for name, value in old.get_weights().items():
        np.testing.assert_allclose(resumed.get_weights()[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_adam_is_not_fused_over_a_non_contiguous_parameter():
    """torch 2.13's fused CPU Adam writes a non-contiguous parameter's memory as if it were contiguous (a review's
    reproduction): such a parameter gets the unfused optimizer, whose step is right."""
    from common.computation.algorithm import make_adam

    base = torch.zeros(3, 2)
    strided = nn.Parameter(base.t())  # a view: (2, 3) with strides (1, 2)
    assert not strided.is_contiguous()
    optimizer = make_adam([strided], lr=1e-3, eps=1e-8)
    assert optimizer.param_groups[0]["fused"] is None
    strided.grad = torch.ones_like(strided)
    optimizer.step()
    np.testing.assert_allclose(strided.detach().numpy(), np.full((2, 3), -1e-3), rtol=1e-4)
    assert make_adam([nn.Parameter(torch.zeros(2, 3))], lr=1e-3, eps=1e-8).param_groups[0]["fused"] is True
