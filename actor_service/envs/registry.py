"""Moved to common.envs.registry (learners need env specs too); this re-export goes once the env managers import from there."""

from common.envs.registry import *  # noqa: F401,F403
