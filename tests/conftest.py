"""Fixtures shared across test folders."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A fresh bearer-token file readable by its owner only, as an operator would create one."""
    path = tmp_path / "secrets" / "league_token"
    path.parent.mkdir()
    path.write_text(secrets.token_hex(16) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """Chaos tests SIGKILL actors with their env workers and resource trackers; the next env manager that
    starts removes their shared-memory blocks, and this does it for the last ones once the session ends."""
    yield
    from actor_service.envs.env_manager.shm_blocks import remove_orphaned_blocks

    remove_orphaned_blocks()
