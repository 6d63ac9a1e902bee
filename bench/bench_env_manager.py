"""Env manager throughput: steps per second with 8 envs, against gymnasium's vector envs and one bare env.

(a) CartPole-v1 with random actions: the per-step message cost dominates.
(b) An env with 84x84x4 uint8 observations and ~100 us of CPU per step: parallelism and observation
    transport dominate.

Every variant runs in the same process, round after round (variants interleaved); each figure is the best
round, so a burst of load from other processes on the machine disturbs all variants alike.

    python bench/bench_env_manager.py [--quick] [--output FILE.md]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium
import numpy as np
from gymnasium import spaces

ROOT = pathlib.Path(__file__).resolve().parent.parent
# First, even when ROOT is on PYTHONPATH: run as `python bench/X.py`, sys.path[0] is bench/, whose common.py
# would otherwise shadow the project's `common` package.
sys.path.insert(0, str(ROOT))

from actor_service.envs.env_manager import (  # noqa: E402
    BaseEnvManager,
    EnvManagerConfig,
    SubprocessEnvManager,
    SubprocessEnvManagerConfig,
)
from bench.common import BenchRow, exit_on_sigterm, machine_line, print_rows  # noqa: E402
from common.envs.gym_env import GymEnv  # noqa: E402

NUM_ENVS = 8
_ACTIONS = 1 << 16  # random actions drawn up front, reused cyclically


class HeavyObsEnv(gymnasium.Env):
    """84x84x4 uint8 frames and a fixed amount of numpy work per step (`work_size` sines, ~100 us)."""

    metadata: dict = {"render_modes": []}

    def __init__(self, work_size: int, episode_length: int = 500) -> None:
        self.observation_space = spaces.Box(0, 255, (84, 84, 4), np.uint8)
        self.action_space = spaces.Discrete(4)
        self._work = np.linspace(0.0, 1.0, work_size)
        self._episode_length = episode_length
        self._frame = np.zeros((84, 84, 4), np.uint8)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        self._frame[...] = self.np_random.integers(0, 255, dtype=np.uint8)
        return self._frame.copy(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        value = float(np.sin(self._work).sum())  # the env's CPU work
        self._frame[:, :, self._t % 4] = (int(value) + int(action) + self._t) % 256
        return self._frame.copy(), 1.0, False, self._t >= self._episode_length, {}


def calibrate_work_size(target_s: float = 100e-6) -> int:
    """The number of sines that costs `target_s` on this machine (fixed before any variant runs)."""
    size = 10_000
    env = HeavyObsEnv(size)
    env.reset(seed=0)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            env.step(0)
        best = min(best, (time.perf_counter() - start) / 200)
    return max(100, int(size * target_s / best))


@dataclass(frozen=True)
class Workload:
    name: str
    make: Callable[[], gymnasium.Env]  # picklable: vector envs and managers build it in subprocesses
    num_actions: int
    # The SubprocessEnvManager settings for this kind of env (see SubprocessEnvManagerConfig's sizing notes).
    subprocess_config: SubprocessEnvManagerConfig


def _cartpole() -> gymnasium.Env:
    return gymnasium.make("CartPole-v1")


@dataclass(frozen=True)
class _HeavyFactory:
    work_size: int

    def __call__(self) -> gymnasium.Env:
        return HeavyObsEnv(self.work_size)


@dataclass(frozen=True)
class _GymEnvFactory:
    make: Callable[[], gymnasium.Env]

    def __call__(self) -> GymEnv:
        return GymEnv(self.make)


# ---- variants: each returns a runner that, called with a duration, returns steps per second ---------------
Runner = Callable[[float], float]


def _timed(step_batch: Callable[[], int], seconds: float) -> float:
    for _ in range(20):  # warm up
        step_batch()
    steps = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(50):
            steps += step_batch()
        now = time.perf_counter()
        if now >= end:
            return steps / (now - start)


def bare_env(work: Workload, actions: np.ndarray) -> tuple[Runner, Callable[[], None]]:
    env = work.make()
    env.reset(seed=0)
    cursor = [0]

    def step_batch() -> int:
        i = cursor[0]
        _, _, terminated, truncated, _ = env.step(int(actions[i]))
        if terminated or truncated:
            env.reset()
        cursor[0] = (i + 1) & (_ACTIONS - 1)
        return 1

    return (lambda seconds: _timed(step_batch, seconds)), env.close


def vector_env(cls: type, work: Workload, actions: np.ndarray) -> tuple[Runner, Callable[[], None]]:
    env = cls([work.make] * NUM_ENVS)
    env.reset(seed=0)
    batches = actions[: (_ACTIONS // NUM_ENVS) * NUM_ENVS].reshape(-1, NUM_ENVS)
    cursor = [0]
    # Gymnasium's default autoreset (NEXT_STEP): the call after an env's episode ended only resets that env.
    # Such a call is not an env step (the bare loop and our managers count steps, resets folded in).
    resetting = [0]

    def step_batch() -> int:
        i = cursor[0]
        _, _, terminated, truncated, _ = env.step(batches[i])
        cursor[0] = (i + 1) % len(batches)
        stepped = NUM_ENVS - resetting[0]
        resetting[0] = int(np.count_nonzero(terminated | truncated))
        return stepped

    return (lambda seconds: _timed(step_batch, seconds)), env.close


def manager(
    cls: type, work: Workload, actions: np.ndarray, config: EnvManagerConfig | None
) -> tuple[Runner, Callable[[], None]]:
    mgr = cls([_GymEnvFactory(work.make)] * NUM_ENVS, config)
    mgr.seed(0)
    mgr.launch()
    cursor = [0]
    python_actions = actions.tolist()  # an actor's policy hands the manager Python ints

    def step_batch() -> int:
        i = cursor[0]
        ready = mgr.ready_env
        timesteps = mgr.step({env_id: python_actions[(i + k) & (_ACTIONS - 1)] for k, env_id in enumerate(ready)})
        cursor[0] = (i + len(ready)) & (_ACTIONS - 1)
        return len(timesteps)

    return (lambda seconds: _timed(step_batch, seconds)), mgr.close


def measure(work: Workload, seconds: float, rounds: int) -> dict[str, float]:
    """Steps per second of every variant on `work`, best of `rounds` interleaved rounds."""
    actions = np.random.default_rng(0).integers(0, work.num_actions, size=_ACTIONS)
    variants: dict[str, Callable[[], tuple[Runner, Callable[[], None]]]] = {
        "bare env": lambda: bare_env(work, actions),
        "SyncVectorEnv": lambda: vector_env(gymnasium.vector.SyncVectorEnv, work, actions),
        "AsyncVectorEnv": lambda: vector_env(gymnasium.vector.AsyncVectorEnv, work, actions),
        "BaseEnvManager": lambda: manager(BaseEnvManager, work, actions, None),
        "SubprocessEnvManager": lambda: manager(SubprocessEnvManager, work, actions, work.subprocess_config),
    }
    if work.subprocess_config != SubprocessEnvManagerConfig():
        variants["SubprocessEnvManager, default config"] = lambda: manager(
            SubprocessEnvManager, work, actions, SubprocessEnvManagerConfig()
        )
    built: dict[str, tuple[Runner, Callable[[], None]]] = {}
    best = dict.fromkeys(variants, 0.0)
    try:
        for name, build in variants.items():
            built[name] = build()
        for _ in range(rounds):
            for name, (run, _) in built.items():
                best[name] = max(best[name], run(seconds))
                print(f"  {work.name:<12.12} {name:<36} {best[name]:>10,.0f} steps/s (best so far)", flush=True)
    finally:
        for _, close in built.values():
            close()
    return best


def rows_for(work: Workload, sps: dict[str, float], goal_baseline: str, goal_ratio: float) -> list[BenchRow]:
    """The goal rows (SubprocessEnvManager against `goal_baseline`, BaseEnvManager against SyncVectorEnv)
    and context rows (every variant against one bare env)."""

    def row(value: str, baseline: str, goal: str = "(context)", threshold: float | None = None) -> BenchRow:
        return BenchRow(
            metric=f"{work.name}: {value}" + ("" if value == "bare env" else f", {NUM_ENVS} envs"),
            value=sps[value],
            unit="steps/s",
            baseline_name=baseline,
            baseline_value=sps[baseline],
            goal=goal,
            met=None if threshold is None else sps[value] / sps[baseline] >= threshold,
        )

    rows = [
        row("SubprocessEnvManager", goal_baseline, f">= {goal_ratio}x {goal_baseline}", goal_ratio),
        row("BaseEnvManager", "SyncVectorEnv", ">= 0.9x SyncVectorEnv (within 10%)", 0.9),
    ]
    context = [name for name in sps if name != "bare env"]
    if goal_baseline == "bare env":
        context.remove("SubprocessEnvManager")  # already the goal row
    return rows + [row(name, "bare env") for name in context]


NOTES = """\
How to read it: every ratio compares two variants measured in the same run, each taking its best of the
interleaved rounds. On light envs (CartPole) the cost is not the env but moving steps between processes:
each message costs a pipe write and read on each side, and waking a process that sleeps for it costs tens of
microseconds on these virtual machines. So the defaults put all envs in one worker, stepped in two halves
(the worker steps one half while the parent handles the other), and both processes busy-wait on a
shared-memory doorbell instead of sleeping, backing off as soon as another process wants their CPU. There the
worker's CPU is the limit: it spends ~75% of its time in the gymnasium env itself. On heavy envs the cost is
the env itself: one worker per core (`num_workers` set to the CPU count, as the config's docstring says for
heavy envs), each worker's envs in one message; workers busy-wait for their next command and the parent
sleeps. Two bare envs in two processes reach ~2x one on a quiet machine; what the manager loses on top
(profiled: parent ~35-60 us a message of 4 envs, worker ~20 us beyond the envs) falls on the worker whose
CPU the parent shares (it runs the parent's work for both workers) and on the other one, which waits for
its next command meanwhile (the parent's wake-up there goes through a cross-CPU interrupt). Observations
are handed to the caller in place from a pool of shared-memory slots (no copy while the caller lets them
go). Other processes on the machine take cores at random moments and hit the two-core variants hardest (a
one-core baseline still finds a free core): under load the SubprocessEnvManager ratios drop far below their
quiet-machine values.
"""


def _describe(config: SubprocessEnvManagerConfig) -> str:
    """The settings a manager of NUM_ENVS envs resolves `config` to on this machine."""
    mgr = SubprocessEnvManager([_GymEnvFactory(_cartpole)] * NUM_ENVS, config)  # sized, not launched
    return (
        f"num_workers={mgr.num_workers}, num_splits={mgr.num_splits}, wait_num={mgr.wait_num}, "
        f"busy-wait up to {mgr.worker_spin_s * 1e6:g} us in workers, {mgr.parent_spin_s * 1e6:g} us in the parent"
    )


def render_markdown(
    rows: list[BenchRow], command: str, workloads: list[Workload], seconds: float, rounds: int
) -> str:
    lines = [
        "# Env manager benchmark",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_line()}. 8 envs in every variant; {rounds} interleaved round(s) of {seconds:g} s per",
        "variant, best round reported. Shared memory on. SubprocessEnvManager settings (as resolved here):",
        "",
        *[f"- {w.name}: {_describe(w.subprocess_config)}" for w in workloads],
        f"- default config: {_describe(SubprocessEnvManagerConfig())}",
        "",
        "| metric | steps/s | baseline | baseline steps/s | ratio | goal | met |",
        "| --- | ---: | --- | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(
            f"| {r.metric} | {r.value:,.0f} | {r.baseline_name} | {r.baseline_value:,.0f} | {r.ratio:.2f} | "
            f"{r.goal} | {met} |"
        )
    return "\n".join(lines) + "\n\n" + NOTES


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round per variant instead of ten")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per variant and round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--output", type=pathlib.Path, default=None, help="also write a markdown table here")
    parser.add_argument("--workload", choices=("all", "cartpole", "heavy"), default="all",
                        help="measure only (a) CartPole or only (b) the 84x84x4 env")
    args = parser.parse_args(argv)
    exit_on_sigterm()  # (its temporary files are removed when stopped so, not only at Ctrl-C)
    # Many short rounds: on a shared machine each variant is likely to meet a quiet moment in one of them.
    seconds = args.seconds or 0.5
    rounds = args.rounds or (1 if args.quick else 10)

    work_size = calibrate_work_size()
    # Light env: the defaults (on 2 cores: one worker with its 8 envs in two halves, the parent keeping the
    # other core, both busy-waiting for messages instead of sleeping).
    light_config = SubprocessEnvManagerConfig()
    # Heavy env: one worker per core (then one message per worker and step; workers busy-wait for their
    # next command, the parent sleeps), `step` returning as soon as one worker answers.
    heavy_config = SubprocessEnvManagerConfig(num_workers=len(os.sched_getaffinity(0)))
    cartpole = Workload("CartPole", _cartpole, 2, light_config)
    heavy = Workload(f"84x84x4 ({work_size} sines/step)", _HeavyFactory(work_size), 4, heavy_config)
    loads = [f"{os.getloadavg()[0]:.2f} at the start"]
    rows: list[BenchRow] = []
    workloads = []
    if args.workload in ("all", "cartpole"):
        rows += rows_for(cartpole, measure(cartpole, seconds, rounds), "AsyncVectorEnv", 5.0)
        loads.append(f"{os.getloadavg()[0]:.2f} after CartPole")
        workloads.append(cartpole)
    if args.workload in ("all", "heavy"):
        rows += rows_for(heavy, measure(heavy, seconds, rounds), "bare env", 1.6)
        workloads.append(heavy)
    loads.append(f"{os.getloadavg()[0]:.2f} at the end")
    print("load average (1 min, whole machine): " + ", ".join(loads))
    print_rows("Env managers", rows)
    if args.output is not None:
        command = "python bench/bench_env_manager.py " + " ".join(argv if argv is not None else sys.argv[1:])
        args.output.parent.mkdir(parents=True, exist_ok=True)
        text = render_markdown(rows, command.strip(), workloads, seconds, rounds)
        args.output.write_text(text + f"\nLoad average of the machine (1 min) during this run: {', '.join(loads)}.\n")
        print(f"wrote {args.output}")
    return rows


if __name__ == "__main__":
    main()
