"""Wall-clock to a learning goal, judged the same way for every trainer compared.

A trainer (our league, Stable-Baselines3) leaves timestamped policy snapshots behind while it runs; after
the run they are evaluated *offline* in time order, so evaluation costs no training time for anyone. The
time of the first snapshot whose greedy policy averages >= the goal over `confirm` episodes of the env
(CartPole-v1 unless told) is the trainer's time to the goal, counted from the launch of its process (start-up included for both).
A `screen` of fewer episodes first keeps the offline pass short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

Act = Callable[[np.ndarray], np.ndarray]
"""Greedy actions for a batch of observations, (n, *obs) float32 -> (n,) int, or (n, *box) float for a Box
action (clipped to the Box here, as every trainer's env wrapper does)."""

EVAL_SEED = 10_000


@dataclass(frozen=True)
class Snapshot:
    seconds: float            # since the trainer's process was launched
    env_steps: int            # training env steps behind this policy (as far as the trainer knows)
    make_act: Callable[[], Act]


@dataclass(frozen=True)
class Reached:
    seconds: float
    env_steps: int
    mean_return: float
    snapshots_evaluated: int


def greedy_mean_return(act: Act, episodes: int, seed: int = EVAL_SEED, env_id: str = "CartPole-v1") -> float:
    """Mean undiscounted return of `episodes` episodes of `env_id` (seeds seed, seed+1, ...), stepped as one
    batch so a snapshot's evaluation is a few hundred forward passes."""
    envs = [gym.make(env_id) for _ in range(episodes)]
    space = envs[0].action_space
    box = isinstance(space, gym.spaces.Box)
    try:
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
        returns = np.zeros(episodes)
        live = np.ones(episodes, bool)
        while live.any():
            idx = np.flatnonzero(live)
            actions = act(obs[idx])
            for j, i in enumerate(idx):
                action = np.clip(actions[j], space.low, space.high) if box else int(actions[j])
                o, r, terminated, truncated, _ = envs[i].step(action)
                returns[i] += r
                obs[i] = o
                if terminated or truncated:
                    live[i] = False
        return float(returns.mean())
    finally:
        for env in envs:
            env.close()


def first_to_reach(
    snapshots: Sequence[Snapshot], goal: float, screen: int = 10, confirm: int = 100, env_id: str = "CartPole-v1"
) -> Reached | None:
    """The earliest snapshot whose greedy mean over `confirm` episodes is >= `goal`, or None."""
    for n, snap in enumerate(sorted(snapshots, key=lambda s: s.seconds), start=1):
        act = snap.make_act()
        if greedy_mean_return(act, screen, env_id=env_id) < goal:
            continue
        mean = greedy_mean_return(act, confirm, env_id=env_id)
        if mean >= goal:
            return Reached(snap.seconds, snap.env_steps, mean, n)
    return None
