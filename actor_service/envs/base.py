"""Moved to common.envs.base (learners need env specs too); this re-export goes once the env managers import from there."""

from common.envs.base import *  # noqa: F401,F403
