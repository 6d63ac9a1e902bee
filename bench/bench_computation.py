"""ComputationTask overhead: PPO `learn` (and `predict`) through the framework vs plain PyTorch, same run.

The plain loop trains an identically initialised copy of the same model with the same PPO math written
inline, CleanRL style (tensors straight from numpy, GAE loop, shuffled minibatch epochs); the framework path
adds spec checks, numpy->torch conversion, the algorithm's bookkeeping and result conversion. Calls
alternate between the two so that machine-speed swings hit both; medians of per-call rates are reported.
`--device cuda` runs both on the GPU (each timed call ends when its results are on the host), and `--obs
4x84x84` swaps the 8-float observation for an image the Nature conv torso reads, the size where a GPU pays.

    python bench/bench_computation.py [--quick] [--device cpu|cuda] [--obs 8 | 4x84x84]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parent.parent
# First, even when ROOT is on PYTHONPATH: run as `python bench/X.py`, sys.path[0] is bench/, whose common.py
# would otherwise shadow the project's `common` package.
sys.path.insert(0, str(ROOT))

from bench.common import BenchRow, exit_on_sigterm, print_rows  # noqa: E402
from common.algorithms import PPOConfig, make_computation_task  # noqa: E402
from common.algorithms.models import ActorCriticModel, ModelConfig  # noqa: E402
from common.computation import TensorSpec  # noqa: E402
from common.computation.algorithm import make_adam  # noqa: E402
from common.computation.computation_task import resolve_device  # noqa: E402

ACTIONS, ENVS, STEPS = 4, 8, 256  # 2048 samples per learn call, CleanRL's default batch
PPO = {"update_epochs": 4, "num_minibatches": 4, "off_policy_correction": "none"}


def make_batch(seed: int, obs_shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.normal(size=(ENVS, STEPS, *obs_shape)).astype(np.float32),
        "next_observation": rng.normal(size=(ENVS, *obs_shape)).astype(np.float32),
        "action": rng.integers(0, ACTIONS, (ENVS, STEPS)),
        "reward": rng.normal(size=(ENVS, STEPS)).astype(np.float32),
        "terminated": rng.random((ENVS, STEPS)) < 0.01,
        "truncated": np.zeros((ENVS, STEPS), bool),
        "behaviour_logp": np.full((ENVS, STEPS), math.log(1 / ACTIONS), np.float32),
    }


class PlainPPO:
    """The same PPO update written inline against the model, no framework."""

    def __init__(self, model: ActorCriticModel, cfg: PPOConfig, device: torch.device) -> None:
        self.model, self.cfg, self.device = model.to(device), cfg, device
        # The optimizer the framework's PPO steps (fused where torch has the kernel): the row measures the
        # framework's overhead, not a faster optimizer.
        self.optimizer = make_adam(model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
        self.generator = torch.Generator().manual_seed(0)

    def learn(self, b: dict[str, np.ndarray]) -> None:
        cfg, dev = self.cfg, self.device
        obs = torch.from_numpy(b["observation"]).to(dev)
        actions = torch.from_numpy(b["action"]).to(dev)
        rewards = torch.from_numpy(b["reward"]).to(dev)
        dones = torch.from_numpy(b["terminated"] | b["truncated"]).float().to(dev)
        old_logp = torch.from_numpy(b["behaviour_logp"]).to(dev)
        with torch.no_grad():
            _, values = self.model({"observation": obs})
            next_value = self.model.value({"observation": torch.from_numpy(b["next_observation"]).to(dev)})
            advantages = torch.zeros_like(rewards)
            last = torch.zeros(rewards.shape[0], device=dev)
            for t in reversed(range(rewards.shape[1])):
                nxt = next_value if t == rewards.shape[1] - 1 else values[:, t + 1]
                delta = rewards[:, t] + cfg.gamma * nxt * (1 - dones[:, t]) - values[:, t]
                last = delta + cfg.gamma * cfg.gae_lambda * (1 - dones[:, t]) * last
                advantages[:, t] = last
            returns = advantages + values
        b_obs, b_act, b_logp = obs.flatten(0, 1), actions.flatten(), old_logp.flatten()
        b_adv, b_ret, b_val = advantages.flatten(), returns.flatten(), values.flatten()
        n = len(b_act)
        size = n // cfg.num_minibatches
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n, generator=self.generator).to(dev)
            for start in range(0, n, size):
                mb = order[start:start + size]
                logits, new_value = self.model({"observation": b_obs[mb]})
                log_probs = torch.log_softmax(logits, -1)
                new_logp = log_probs.gather(-1, b_act[mb, None]).squeeze(-1)
                entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
                ratio = (new_logp - b_logp[mb]).exp()
                adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                clipped = b_val[mb] + (new_value - b_val[mb]).clamp(-cfg.clip_coef, cfg.clip_coef)
                v_loss = 0.5 * torch.max((new_value - b_ret[mb]) ** 2, (clipped - b_ret[mb]) ** 2).mean()
                loss = pg - cfg.entropy_coef * entropy + cfg.value_coef * v_loss
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
        _synchronize(dev)


def _synchronize(device: torch.device) -> None:
    """A CUDA call returns before its kernels finish: wait for them, or the timer would stop early."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_rate(seconds: list[float], items: int) -> float:
    return items / statistics.median(seconds)


def bench_learn(rounds: int, calls: int, ppo: dict, device: torch.device,
                obs_shape: tuple[int, ...]) -> tuple[float, float]:
    obs = TensorSpec("observation", obs_shape)
    task = make_computation_task({"algorithm": "ppo", "ppo": ppo}, obs, ACTIONS, device=str(device), seed=0)
    torch.manual_seed(0)
    plain = PlainPPO(ActorCriticModel({"observation": obs}, ACTIONS, ModelConfig()), PPOConfig(**ppo), device)
    batches = [make_batch(i, obs_shape) for i in range(calls)]
    task.learn(batches[0])  # warm-up both
    plain.learn(batches[0])
    framework_s, plain_s = [], []
    for _ in range(rounds):
        for batch in batches:  # alternate call by call, so load from other processes hits both alike
            start = time.perf_counter()
            task.learn(batch)
            framework_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            plain.learn(batch)
            plain_s.append(time.perf_counter() - start)
    samples = ENVS * STEPS
    return _median_rate(framework_s, samples), _median_rate(plain_s, samples)


def bench_predict(rounds: int, calls: int, device: torch.device, obs_shape: tuple[int, ...],
                  rows: int = 8) -> tuple[float, float]:
    obs = TensorSpec("observation", obs_shape)
    task = make_computation_task({"algorithm": "ppo"}, obs, ACTIONS, device=str(device), seed=0)
    model = task.algorithm.model
    observation = np.random.default_rng(0).normal(size=(rows, *obs_shape)).astype(np.float32)
    generator = torch.Generator(device=device).manual_seed(0)

    def plain_step() -> tuple[np.ndarray, ...]:
        with torch.inference_mode():
            logits, value = model({"observation": torch.from_numpy(observation).to(device)})
            action = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1)
            logp = torch.log_softmax(logits, -1).gather(-1, action[:, None])
            return action.cpu().numpy(), logp.cpu().numpy(), value.cpu().numpy()

    framework_s, plain_s = [], []
    block = 50
    for _ in range(rounds * calls // block):
        start = time.perf_counter()
        for _ in range(block):
            task.predict({"observation": observation})
        framework_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(block):
            plain_step()
        plain_s.append(time.perf_counter() - start)
    return _median_rate(framework_s, block), _median_rate(plain_s, block)


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (framework and plain loop alike)")
    parser.add_argument("--obs", type=_obs_shape, default=(8,), help="observation shape: 8 (default) or 4x84x84")
    args = parser.parse_args(argv)
    exit_on_sigterm()  # (its temporary files are removed when stopped so, not only at Ctrl-C)
    device = resolve_device(args.device)
    rounds = 3 if args.quick else 8
    calls = 3 if args.quick else 5
    ct, plain = bench_learn(rounds, calls, PPO, device, args.obs)
    ct_vtrace, plain_again = bench_learn(rounds, calls, {**PPO, "off_policy_correction": "vtrace"}, device, args.obs)
    pred, plain_pred = bench_predict(rounds, 200 if args.quick else 1000, device, args.obs)
    where = f"{device.type}, observation {'x'.join(map(str, args.obs))}"
    rows = [
        BenchRow(f"ComputationTask.learn PPO (GAE), 2048-sample batches, 4x4 minibatches ({where})", ct, "samples/s",
                 "plain PyTorch PPO loop, same model", plain, "ratio >= 0.9 (overhead <= 10%)", ct / plain >= 0.9),
        BenchRow("ComputationTask.learn PPO (V-trace correction)", ct_vtrace, "samples/s",
                 "plain PyTorch PPO loop (GAE, no correction)", plain_again, "informational", None),
        BenchRow("ComputationTask.predict, batch 8", pred, "calls/s", "plain torch forward + sample", plain_pred,
                 "informational", None),
    ]
    print_rows("ComputationTask.learn", rows)
    return rows


def _obs_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes joined by x (8, 4x84x84), got {text!r}") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return shape


if __name__ == "__main__":
    main(sys.argv[1:])
