"""Stable-Baselines3 PPO with the rl-baselines3-zoo tuned settings (CartPole-v1 or Pendulum-v1): the reference
trainer the solo leagues are timed against.

Run as its own process by bench_system and bench_pendulum (so its start-up counts like ours): trains for
`--steps` env steps, keeping a copy of the policy after every update with the seconds since `--launched` (the
parent's wall clock at launch), then evaluates the copies offline with bench.learning_clock and prints one
JSON line.

`python bench/sb3_reference.py --launched UNIX_TIME [--env CartPole-v1|Pendulum-v1] [--steps N] [--goal G]`
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _linear(start: float):
    return lambda progress: progress * start


ZOO = {
    # rl-baselines3-zoo hyperparams/ppo.yml (n_envs, PPO keyword arguments).
    "CartPole-v1": lambda: (8, dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                                    ent_coef=0.0, learning_rate=_linear(0.001), clip_range=_linear(0.2))),
    "Pendulum-v1": lambda: (4, dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                                    learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4)),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launched", type=float, required=True, help="time.time() when the parent launched us")
    parser.add_argument("--steps", type=int, default=100_000, help="training env steps (zoo: 1e5)")
    parser.add_argument("--env", choices=sorted(ZOO), default="CartPole-v1")
    parser.add_argument("--goal", type=float, default=475.0, help="greedy mean return to reach (100 episodes)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sb3-log-") as log_dir:
        # SB3's logger makes a folder even when it logs nothing (it left /tmp/SB3-<date> behind per run).
        os.environ["SB3_LOGDIR"] = log_dir
        return _train_and_judge(args)


def _train_and_judge(args: argparse.Namespace) -> int:
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    from bench.learning_clock import Snapshot, first_to_reach

    class KeepPolicies(BaseCallback):
        """After each rollout+update, a copy of the policy's weights and the time."""

        def __init__(self) -> None:
            super().__init__()
            self.kept: list[tuple[float, int, dict]] = []

        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:  # the previous update has just finished
            self.kept.append((time.time() - args.launched, self.num_timesteps,
                              copy.deepcopy(self.model.policy.state_dict())))

    n_envs, settings = ZOO[args.env]()
    env = make_vec_env(args.env, n_envs=n_envs, seed=0)
    model = PPO("MlpPolicy", env, seed=0, verbose=0, **settings)
    keep = KeepPolicies()
    train_start = time.time() - args.launched
    model.learn(total_timesteps=args.steps, callback=keep)
    train_end = time.time() - args.launched
    keep.kept.append((train_end, model.num_timesteps, copy.deepcopy(model.policy.state_dict())))

    def make_act(state: dict):
        def build():
            model.policy.load_state_dict(state)

            def act(obs: np.ndarray) -> np.ndarray:
                with torch.no_grad():
                    actions, _ = model.predict(obs, deterministic=True)
                return actions
            return act
        return build

    snaps = [Snapshot(t, steps, make_act(state)) for t, steps, state in keep.kept]
    reached = first_to_reach(snaps, args.goal, env_id=args.env)
    print(json.dumps({
        "train_start_s": train_start, "train_end_s": train_end, "env_steps": int(model.num_timesteps),
        "steps_per_s": model.num_timesteps / max(train_end - train_start, 1e-9), "snapshots": len(snaps),
        "reached_s": reached.seconds if reached else None,
        "reached_env_steps": reached.env_steps if reached else None,
        "reached_mean": reached.mean_return if reached else None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
