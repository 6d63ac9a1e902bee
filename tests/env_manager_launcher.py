"""Launching SubprocessEnvManagers in tests: each one closed at the end, and none of their worker processes left
behind (the fault tests' shared fixture)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from actor_service.envs import SubprocessEnvManager, SubprocessEnvManagerConfig

Launch = Callable[..., SubprocessEnvManager]


def alive(pids) -> list[int]:
    """Pids that still have an entry in the process table (running, or zombies nobody reaped)."""
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


@contextlib.contextmanager
def launched_managers(lockstep: bool = False) -> Iterator[Launch]:
    """`launch(env_fns, **config)` builds and launches a manager; on leaving, every one is closed and no worker
    process of theirs may be left. `lockstep`: `wait_num` defaults to every env (each step returns them all)."""
    built: list[SubprocessEnvManager] = []
    pids: set[int] = set()

    def launch(env_fns, **config) -> SubprocessEnvManager:
        if lockstep:
            config.setdefault("wait_num", len(env_fns))
        manager = SubprocessEnvManager(env_fns, SubprocessEnvManagerConfig(**config))
        built.append(manager)
        manager.launch()
        pids.update(manager.worker_pids)
        return manager

    try:
        yield launch
    finally:
        for manager in built:
            if not manager.closed:
                pids.update(manager.worker_pids)
            manager.close()
    assert alive(pids) == [], "worker processes left behind"
