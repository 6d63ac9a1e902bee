"""Moved to common.envs.gym_env (learners need env specs too); this re-export goes once the env managers import from there."""

from common.envs.gym_env import *  # noqa: F401,F403
