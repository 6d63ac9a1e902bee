"""System throughput and learning outcome of a whole local league (issue 6's measured goals).

1. Throughput: `league run configs/solo_cartpole.yaml` (coordinator + learner + actors as processes); env
   steps per second counted by the league over the run's steady part, against the env manager alone stepping
   the same envs (same count, same manager kind) with random actions, in the same run. Goal ≥ 0.7×.
2. Learning: the final checkpoint of that run, played greedily for 100 CartPole episodes. Goal: mean ≥ 475.
3. Wall-clock to that goal against Stable-Baselines3 PPO (rl-baselines3-zoo settings) run as its own process
   in the same benchmark: both trainers keep every policy version with its time since launch, and the
   versions are judged offline by the same code (bench/learning_clock.py), so evaluation costs neither any
   training time. Goal: the league is faster.
4. Throughput again with envs that cost what real simulators do (bench/costly_env.py: CartPole plus 1 ms of
   CPU a step), against one subprocess env manager stepping all the actors' envs: how much of the machine the
   league leaves to environments once they, not the policy, are the work. CartPole alone (item 1) measures
   the opposite regime, where the learner's 20 epochs a batch bound everything.

`python bench/bench_system.py [--quick] [--seconds S]`
"""

from __future__ import annotations

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

from bench.common import BenchRow, league_bench_args, print_rows, run_until_done  # noqa: E402
from bench.learning_clock import first_to_reach  # noqa: E402
from common.learner_config import MAX_KEEP_LAST  # noqa: E402

SOLO = ROOT / "configs" / "solo_cartpole.yaml"
PLAYER = "solo_active_player_default_0"
COSTLY_ENV = "python:bench.costly_env:CostlyCartPole"
COSTLY_WORK_US = 1000.0
SOLO_ACTORS = 1
"""One actor steps exactly the 8 envs the env manager alone steps, and keeps the learner's data freshest: with
2 actors the solo CartPole league reached the goal later (session 9: median 10.3 s against 6.2 s, 5 runs each)."""
COSTLY_ACTORS = 2
"""Envs that cost 1 ms a step need both cores: one env process per actor."""


def env_manager_alone(env_num: int, manager: str, seconds: float, env_name: str = "CartPole-v1",
                      env_kwargs: dict | None = None, num_workers: int | None = None) -> float:
    """Steps/s of the env manager by itself: random actions, no policy, no network."""
    from actor_service.envs import (
        BaseEnvManager,
        EnvManagerConfig,
        SubprocessEnvManager,
        SubprocessEnvManagerConfig,
    )
    from common.envs import env_factories

    fns = env_factories(env_name, env_num, **(env_kwargs or {}))
    if manager == "subprocess":
        workers = {} if num_workers is None else {"num_workers": num_workers}
        mgr = SubprocessEnvManager(fns, SubprocessEnvManagerConfig(**workers))
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


def run_league(config: dict, run_dir: pathlib.Path, seconds: float) -> tuple[list[dict], float]:
    """The run's status history and the wall-clock time it was launched at."""
    path = run_dir.parent / "league.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "league_cli", "run", str(path), "--run-dir", str(run_dir),
           "--seconds", str(seconds), "--quiet"]
    launched = time.time()
    run_until_done(cmd, stdout=subprocess.DEVNULL, timeout=seconds + 180, cwd=ROOT)
    history = [json.loads(line) for line in (run_dir / "status_history.jsonl").read_text().splitlines() if line.strip()]
    return history, launched


def solo_league_config(seconds: float) -> dict:
    """The solo CartPole league the first rows run (configs/solo_cartpole.yaml, one actor, every version kept)."""
    config = yaml.safe_load(SOLO.read_text())
    config["run"] = {"actors": SOLO_ACTORS, "seconds": seconds, "manager": "base", "status_interval_s": 1.0}
    config["learner"]["keep_last"] = MAX_KEEP_LAST  # every version stays on disk for the offline judging
    return config


def costly_league_config(config: dict) -> dict:
    """`config` on the costly env, with COSTLY_ACTORS actors on the subprocess manager."""
    config = json.loads(json.dumps(config))
    config["env"].update(name=COSTLY_ENV, kwargs={"work_us": COSTLY_WORK_US}, env_steps=1024)
    config["run"].update(manager="subprocess", actors=COSTLY_ACTORS)
    return config


def costly_env_throughput(config: dict, seconds: float) -> BenchRow:
    """System against env manager when envs cost what real simulators do (bench/costly_env.py, 1 ms of CPU a
    step): the same solo league and learner, 2 actors with the subprocess manager (one env process each by
    default), against one subprocess env manager stepping all their envs in as many env processes."""
    config = costly_league_config(config)
    actors = COSTLY_ACTORS
    env_num = int(config["env"]["env_num"]) * actors
    alone = env_manager_alone(env_num, "subprocess", 10.0, COSTLY_ENV, {"work_us": COSTLY_WORK_US}, num_workers=actors)
    with tempfile.TemporaryDirectory(prefix="bench-system-costly-") as tmp:
        history, _ = run_league(config, pathlib.Path(tmp) / "run", seconds)
    system = steady_rate(history)
    return BenchRow(f"league run solo, CartPole + {COSTLY_WORK_US / 1000:.0f} ms CPU a step, {actors} actors x "
                    f"{env_num // actors} envs (subprocess manager), env steps/s", system, "steps/s",
                    f"one subprocess env manager alone, {env_num} envs in {actors} processes, random actions",
                    alone, "≥ 0.7× (system vs env manager)", system >= 0.7 * alone)


def league_snapshots(run_dir: pathlib.Path, config: dict, launched: float) -> list:
    """Every published version of the solo player, timed by when its manifest was published."""
    from bench.learning_clock import Snapshot
    from common.checkpoint_store import MANIFEST_SUFFIX, CheckpointStore

    store = CheckpointStore(run_dir / "shared")
    snaps = []
    for ref in store.versions(PLAYER):
        published = (run_dir / "shared" / (ref.path + MANIFEST_SUFFIX)).stat().st_mtime
        snaps.append(Snapshot(published - launched, 0, lambda ref=ref: _greedy_act(store, ref.path, config)))
    return snaps


def _greedy_act(store, path: str, config: dict):
    from common.algorithms.registry import make_computation_task
    from common.computation.algorithm import ForwardKwargs
    from common.envs import make_env
    from common.envs.policy_view import policy_specs

    env = make_env(config["env"]["name"])
    inputs, actions = policy_specs(env.info())
    env.close()
    task = make_computation_task(config["policy"], inputs, actions, device="cpu", seed=0)
    checkpoint = store.load(path)
    task.set_weights(checkpoint.tensors, checkpoint.ref.version)
    greedy = ForwardKwargs(greedy=True)
    (name,) = inputs
    return lambda obs: task.predict({name: obs}, forward_kwargs=greedy).actions["action"]


def run_sb3(steps: int, env: str = "CartPole-v1", goal: float = 475.0) -> dict | None:
    """bench/sb3_reference.py as its own process; None when Stable-Baselines3 is not installed."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return None
    launched = time.time()
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sb3_reference.py"), "--launched", repr(launched),
                          "--steps", str(steps), "--env", env, "--goal", repr(goal)],
                         check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    from common.envs.policy_view import env_action, player_view, policy_specs

    store = CheckpointStore(run_dir / "shared")
    checkpoint = store.load_latest(PLAYER)
    env = make_env(config["env"]["name"])
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
            chosen = task.predict({k: v[None] for k, v in view.items()}, forward_kwargs=greedy).actions["action"][0]
            step = env.step(env_action(actions, chosen, info))
            total += float(step.reward)
            obs, done = step.obs, step.done
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def main(argv: list[str] | None = None) -> list[BenchRow]:
    quick, seconds = league_bench_args(__doc__, argv, quick_s=45.0, full_s=150.0)
    config = solo_league_config(seconds)
    manager = config["run"]["manager"]
    env_num = int(config["env"]["env_num"])
    rows: list[BenchRow] = []
    alone = env_manager_alone(env_num, manager, 5.0 if quick else 10.0)
    with tempfile.TemporaryDirectory(prefix="bench-system-") as tmp:
        run_dir = pathlib.Path(tmp) / "run"
        history, launched = run_league(config, run_dir, seconds)
        system = steady_rate(history)
        actors = config["run"]["actors"]
        rows.append(BenchRow(f"league run solo CartPole, {actors} actor{'s' if actors != 1 else ''} x {env_num} envs "
                             f"({manager} manager), env steps/s", system, "steps/s",
                             f"one {manager} env manager alone, {env_num} envs, random actions", alone,
                             "≥ 0.7× (system vs one env manager)", system >= 0.7 * alone))
        mean = evaluate(run_dir, config, episodes=20 if quick else 100)
        rows.append(BenchRow(f"greedy mean return, {20 if quick else 100} episodes, after {seconds:.0f} s",
                             mean, "return", "goal", 475.0, "≥ 475", mean >= 475))
        league_reached = first_to_reach(league_snapshots(run_dir, config, launched), 475.0)
    sb3 = run_sb3(steps=30_000 if quick else 60_000)
    goal = "faster than SB3 (ratio ≤ 1)"
    if sb3 is None:
        rows.append(BenchRow("seconds from launch to a greedy mean ≥ 475 (100 episodes)",
                             league_reached.seconds if league_reached else float("nan"), "s",
                             "SB3 not installed (pip install -e '.[bench]')", float("nan"), goal, None))
    else:
        sb3_s = sb3["reached_s"] if sb3["reached_s"] is not None else float("nan")
        league_s = league_reached.seconds if league_reached else float("nan")
        rows.append(BenchRow("seconds from launch to a greedy mean ≥ 475 (100 episodes)", league_s, "s",
                             "SB3 PPO, rl-zoo settings, same judging", sb3_s, goal,
                             race_met(league_reached.seconds if league_reached else None, sb3["reached_s"])))
        # (The league's figure first, as in every row: SB3's as the value read its ratio backwards; a review.)
        rows.append(BenchRow("league run env steps/s (context)", system, "steps/s",
                             "SB3 PPO training env steps/s", sb3["steps_per_s"], "(context)", None))
    rows.append(costly_env_throughput(config, 30.0 if quick else 60.0))
    print_rows("System throughput and learning", rows)
    return rows


def race_met(league_s: float | None, sb3_s: float | None) -> bool | None:
    """The race to the goal (None: when neither reached it): met when the league reached it no later than SB3,
    or reached it and SB3 never did."""
    if league_s is None and sb3_s is None:
        return None
    return league_s is not None and (sb3_s is None or league_s <= sb3_s)


if __name__ == "__main__":
    main(sys.argv[1:])
