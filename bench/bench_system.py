"""System throughput and learning outcome of a whole local league (issue 6's measured goals).

1. Throughput: `league run configs/solo_cartpole.yaml` (coordinator + learner + actors as processes); env
   steps per second counted by the league over the run's steady part, against the env manager alone stepping
   the same envs (same count, same manager kind) with random actions, in the same run. Goal ≥ 0.7×.
2. Learning: the final checkpoint of that run, played greedily for 100 CartPole episodes. Goal: mean ≥ 475;
   also reported: seconds until the league's recent-episode mean return first reached 475.

`python bench/bench_system.py [--quick] [--seconds S]`
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BenchRow, print_rows  # noqa: E402

SOLO = ROOT / "configs" / "solo_cartpole.yaml"


def env_manager_alone(env_num: int, manager: str, seconds: float) -> float:
    """Steps/s of the env manager by itself: random actions, no policy, no network."""
    from actor_service.envs import (
        BaseEnvManager,
        EnvManagerConfig,
        SubprocessEnvManager,
        SubprocessEnvManagerConfig,
    )
    from common.envs import env_factories

    fns = env_factories("CartPole-v1", env_num)
    if manager == "subprocess":
        mgr = SubprocessEnvManager(fns, SubprocessEnvManagerConfig())
    else:
        mgr = BaseEnvManager(fns, EnvManagerConfig())
    rng = np.random.default_rng(0)
    steps = 0
    with mgr:
        mgr.launch()
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            ready = mgr.ready_env
            steps += len(mgr.step({i: int(rng.integers(2)) for i in ready}))
        elapsed = time.perf_counter() - start
    return steps / elapsed


def run_league(config: dict, run_dir: pathlib.Path, seconds: float) -> list[dict]:
    path = run_dir.parent / "league.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "league_cli", "run", str(path), "--run-dir", str(run_dir),
           "--seconds", str(seconds), "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=seconds + 180)
    return [json.loads(line) for line in (run_dir / "status_history.jsonl").read_text().splitlines() if line.strip()]


def steady_rate(history: list[dict]) -> float:
    """Env steps/s between the first and the last record that counted steps (start-up excluded)."""
    counted = [(r["elapsed_s"], r["counters"].get("env_steps", 0)) for r in history if r["counters"].get("env_steps")]
    if len(counted) < 2:
        return 0.0
    (t0, s0), (t1, s1) = counted[0], counted[-1]
    return (s1 - s0) / max(t1 - t0, 1e-9)


def evaluate(run_dir: pathlib.Path, config: dict, episodes: int) -> float:
    from common.algorithms.registry import make_computation_task
    from common.checkpoint_store import CheckpointStore
    from common.computation.algorithm import ForwardKwargs
    from common.envs import make_env
    from common.envs.policy_view import player_view, policy_specs

    store = CheckpointStore(run_dir / "shared")
    player = "solo_active_player_default_0"
    checkpoint = store.load_latest(player)
    env = make_env("CartPole-v1")
    info = env.info()
    inputs, actions = policy_specs(info)
    task = make_computation_task(config["policy"], inputs, actions, device="cpu", seed=0)
    task.set_weights(checkpoint.tensors, checkpoint.ref.version)
    greedy = ForwardKwargs(greedy=True)
    returns = []
    for episode in range(episodes):
        env.seed(10_000 + episode)
        obs = env.reset()
        total, done = 0.0, False
        while not done:
            view = player_view(obs, 0, info)
            action = int(task.predict({k: v[None] for k, v in view.items()}, forward_kwargs=greedy).actions["action"][0])
            step = env.step(action)
            total += float(step.reward)
            obs, done = step.obs, step.done
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float, default=None, help="league run budget")
    args = parser.parse_args(argv)
    seconds = args.seconds or (45.0 if args.quick else 150.0)
    config = yaml.safe_load(SOLO.read_text())
    manager = "base"
    config["run"] = {"actors": 2, "seconds": seconds, "manager": manager, "status_interval_s": 1.0}
    env_num = int(config["env"]["env_num"])
    rows: list[BenchRow] = []
    alone = env_manager_alone(env_num, manager, 5.0 if args.quick else 10.0)
    with tempfile.TemporaryDirectory(prefix="bench-system-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        history = run_league(config, run_dir, seconds)
        system = steady_rate(history)
        rows.append(BenchRow(f"league run solo CartPole, {config['run']['actors']} actors x {env_num} envs "
                             f"({manager} manager), env steps/s", system, "steps/s",
                             f"one {manager} env manager alone, {env_num} envs, random actions", alone,
                             "≥ 0.7× (system vs one env manager)", system >= 0.7 * alone))
        reached = [r["elapsed_s"] for r in history
                   if any(p.get("active") and p.get("episodes", 0) >= 20 and p.get("mean_return", 0) >= 475
                          for p in r["players"])]
        mean = evaluate(run_dir, config, episodes=20 if args.quick else 100)
        rows.append(BenchRow(f"greedy mean return, {20 if args.quick else 100} episodes, after {seconds:.0f} s",
                             mean, "return", "goal", 475.0, "≥ 475", mean >= 475))
        rows.append(BenchRow("seconds until the league's recent mean return ≥ 475", reached[0] if reached else float("nan"),
                             "s", "run budget", seconds, "reach 475 (SB3 PPO zoo settings: 3-10 s here, "
                             "FIELD_NOTES; not rerun in this benchmark)", bool(reached)))
    print_rows("System throughput and learning", rows)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
