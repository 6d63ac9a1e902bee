"""Wall-clock to a learning goal, judged the same way for every trainer compared.

A trainer (our league, Stable-Baselines3) leaves timestamped policy snapshots behind while it runs; after
the run they are evaluated *offline* in time order, so evaluation costs no training time for anyone. The
time of the first snapshot whose greedy policy averages >= the goal over `confirm` CartPole-v1 episodes is
the trainer's time to the goal, counted from the launch of its process (start-up included for both).
A `screen` of fewer episodes first keeps the offline pass short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

Act = Callable[[np.ndarray], np.ndarray]
"""Greedy actions for a batch of observations, (n, 4) float32 -> (n,) int."""

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


def greedy_mean_return(act: Act, episodes: int, seed: int = EVAL_SEED) -> float:
    """Mean undiscounted return of `episodes` CartPole-v1 episodes (seeds seed, seed+1, ...), stepped as one
    batch so a snapshot's evaluation is a few hundred forward passes."""
    envs = [gym.make("CartPole-v1") for _ in range(episodes)]
    try:
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]).astype(np.float32)
        returns = np.zeros(episodes)
        live = np.ones(episodes, bool)
        while live.any():
            idx = np.flatnonzero(live)
            actions = act(obs[idx])
            for j, i in enumerate(idx):
                o, r, terminated, truncated, _ = envs[i].step(int(actions[j]))
                returns[i] += r
                obs[i] = o
                if terminated or truncated:
                    live[i] = False
        return float(returns.mean())
    finally:
        for env in envs:
            env.close()


def first_to_reach(
    snapshots: Sequence[Snapshot], goal: float, screen: int = 10, confirm: int = 100
) -> Reached | None:
    """The earliest snapshot whose greedy mean over `confirm` episodes is >= `goal`, or None."""
    for n, snap in enumerate(sorted(snapshots, key=lambda s: s.seconds), start=1):
        act = snap.make_act()
        if greedy_mean_return(act, screen) < goal:
            continue
        mean = greedy_mean_return(act, confirm)
        if mean >= goal:
            return Reached(snap.seconds, snap.env_steps, mean, n)
    return None
