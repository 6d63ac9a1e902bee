"""The same tasks on CUDA as on the CPU: acting, learning (PPO with V-trace, recurrent PPO, DQN with
prioritized replay) and weights/training state round trips give the CPU's results within float tolerance.
Runs only where CUDA is available; CPU-only machines (CI here) skip it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.algorithms import make_computation_task
from common.computation.computation_task import ComputationTask, describe_device, resolve_device
from common.computation.specs import TensorSpec
from common.envs import make_env
from common.envs.policy_view import policy_specs
from common.policy_config import PolicyConfig
from league_service.config import default_config_dict

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

OBS = {"observation": TensorSpec("observation", (5,)), "action_mask": TensorSpec("action_mask", (6,), "bool")}


def pair(config: dict) -> tuple[ComputationTask, ComputationTask]:
    return (make_computation_task(config, OBS, 6, device="cpu", seed=0),
            make_computation_task(config, OBS, 6, device="cuda", seed=0))


def ppo_batch(rng: np.random.Generator, rows: int = 4, steps: int = 8) -> dict[str, np.ndarray]:
    mask = rng.random((rows, steps, 6)) < 0.7
    mask[..., 0] = True
    return {
        "observation": rng.normal(size=(rows, steps, 5)).astype(np.float32), "action_mask": mask,
        "next_observation": rng.normal(size=(rows, 5)).astype(np.float32), "next_action_mask": mask[:, -1],
        "action": np.zeros((rows, steps), np.int64), "reward": rng.normal(size=(rows, steps)).astype(np.float32),
        "terminated": rng.random((rows, steps)) < 0.1, "truncated": np.zeros((rows, steps), bool),
        "behaviour_logp": np.full((rows, steps), np.log(0.3), np.float32),
    }


def assert_same_weights(cpu: ComputationTask, cuda: ComputationTask, atol: float = 1e-6) -> None:
    """`atol` after training: Adam turns float differences in near-zero gradients into steps of up to ~lr."""
    got, want = cuda.get_weights(), cpu.get_weights()
    assert got.keys() == want.keys()
    for name in want:
        assert isinstance(got[name], np.ndarray)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=atol, err_msg=name)


def test_auto_picks_the_gpu_and_the_log_names_it():
    device = resolve_device("auto")
    assert device.type == "cuda"
    assert describe_device(resolve_device("cuda:0")) == f"cuda:0 ({torch.cuda.get_device_name(0)})"
    assert describe_device(device).startswith("cuda:")


def test_the_default_leagues_conv_network_acts_and_learns_on_cuda_as_on_the_cpu():
    """The embedded league's own network (same-padded 3x3 convolutions over the (5, 6, 7) board, V-trace PPO):
    cuDNN's convolutions sum in another order than the CPU's, within the same tolerances."""
    policy = PolicyConfig.from_mapping(default_config_dict()["policy"])
    env = make_env(default_config_dict()["env"]["name"])
    obs, actions = policy_specs(env.info(), policy.algorithm)
    env.close()
    assert obs["observation"].shape == (5, 6, 7) and actions.num_actions == 7  # what the batch below is made of
    cpu = make_computation_task(policy, obs, actions, device="cpu", seed=0)
    cuda = make_computation_task(policy, obs, actions, device="cuda", seed=0)
    assert_same_weights(cpu, cuda)
    rng = np.random.default_rng(2)
    rows, steps = 4, 16
    mask = rng.random((rows, steps, 7)) < 0.8
    mask[..., 3] = True
    batch = {
        "observation": (rng.random((rows, steps, 5, 6, 7)) < 0.3).astype(np.float32), "action_mask": mask,
        "next_observation": (rng.random((rows, 5, 6, 7)) < 0.3).astype(np.float32), "next_action_mask": mask[:, -1],
        "action": np.full((rows, steps), 3, np.int64), "reward": rng.normal(size=(rows, steps)).astype(np.float32),
        "terminated": rng.random((rows, steps)) < 0.1, "truncated": np.zeros((rows, steps), bool),
        "behaviour_logp": np.full((rows, steps), np.log(0.2), np.float32),
    }
    greedy = {"greedy": True}
    inputs = {"observation": batch["observation"][:, 0], "action_mask": mask[:, 0]}
    np.testing.assert_array_equal(cuda.predict(inputs, forward_kwargs=greedy).actions["action"],
                                  cpu.predict(inputs, forward_kwargs=greedy).actions["action"])
    for _ in range(2):
        out_cpu, out_cuda = cpu.learn(batch), cuda.learn(batch)
        np.testing.assert_allclose(out_cuda.stats["policy_loss"], out_cpu.stats["policy_loss"], rtol=1e-2, atol=1e-4)
    assert_same_weights(cpu, cuda, atol=5e-3)


@pytest.mark.parametrize("model", [{"hidden": [32]}, {"hidden": [32], "recurrent": "gru", "recurrent_size": 16}])
def test_ppo_acts_and_learns_on_cuda_as_on_the_cpu(model):
    cpu, cuda = pair({"algorithm": "ppo", "model": model, "ppo": {"off_policy_correction": "vtrace"}})
    assert cuda.device.startswith("cuda")
    assert_same_weights(cpu, cuda)
    rng = np.random.default_rng(0)
    inputs = {"observation": rng.normal(size=(16, 5)).astype(np.float32), "action_mask": np.ones((16, 6), bool)}
    greedy = {"greedy": True}
    states = cpu.initial_states(16)
    acted_cpu = cpu.predict(inputs, states, forward_kwargs=greedy)
    acted_cuda = cuda.predict(inputs, states, forward_kwargs=greedy)
    np.testing.assert_array_equal(acted_cuda.actions["action"], acted_cpu.actions["action"])
    # cuDNN runs the GRU in TF32 on Ampere and newer GPUs (PyTorch's default torch.backends.cudnn.allow_tf32): a
    # 10-bit mantissa, relative differences up to ~1e-3 (2.4e-4 absolute on an H200). Exact float32 without it.
    for name, state in acted_cpu.states.items():
        np.testing.assert_allclose(acted_cuda.states[name], state, rtol=1e-2, atol=1e-3)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        exact = cuda.predict(inputs, states, forward_kwargs=greedy)
    for name, state in acted_cpu.states.items():
        np.testing.assert_allclose(exact.states[name], state, rtol=1e-4, atol=1e-5)
    if not states:  # (recurrent learning needs recorded states in the batch: the CPU tests cover its logic)
        batch = ppo_batch(rng)
        for _ in range(2):
            out_cpu, out_cuda = cpu.learn(batch), cuda.learn(batch)
            np.testing.assert_allclose(out_cuda.stats["policy_loss"], out_cpu.stats["policy_loss"], rtol=1e-2,
                                       atol=1e-4)
        assert_same_weights(cpu, cuda, atol=5e-3)


def test_dqn_with_priorities_and_a_training_state_round_trip_on_cuda():
    config = {"algorithm": "dqn", "model": {"hidden": [16]}, "dqn": {"target_update_period": 2}}
    cpu, cuda = pair(config)
    rng = np.random.default_rng(1)
    n = 32
    batch = {
        "observation": rng.normal(size=(n, 5)).astype(np.float32), "action_mask": np.ones((n, 6), bool),
        "next_observation": rng.normal(size=(n, 5)).astype(np.float32), "next_action_mask": np.ones((n, 6), bool),
        "action": rng.integers(0, 6, n), "return": rng.normal(size=n).astype(np.float32),
        "discount": np.full(n, 0.9, np.float32), "weight": np.ones(n, np.float32),
    }
    for _ in range(3):
        out_cpu, out_cuda = cpu.learn(batch), cuda.learn(batch)
        assert isinstance(out_cuda.priorities, np.ndarray)
        np.testing.assert_allclose(out_cuda.priorities, out_cpu.priorities, rtol=1e-2, atol=1e-3)
    assert_same_weights(cpu, cuda, atol=5e-3)
    # Weights and training state move between devices (a CUDA learner's checkpoint loads in a CPU actor).
    actor = make_computation_task(config, OBS, 6, device="cpu", seed=5)
    actor.set_weights(cuda.get_weights(), 3)
    assert_same_weights(actor, cuda)  # the same numbers, moved
    state = cuda.get_training_state()
    resumed = make_computation_task(config, OBS, 6, device="cuda", seed=9)
    resumed.set_weights(cuda.get_weights(), 3)
    resumed.set_training_state(state)
    np.testing.assert_allclose(resumed.learn(batch).priorities, cuda.learn(batch).priorities, rtol=1e-3, atol=1e-4)
