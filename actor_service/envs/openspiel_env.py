"""Moved to common.envs.openspiel_env (learners need env specs too); this re-export goes once the env managers import from there."""

from common.envs.openspiel_env import *  # noqa: F401,F403
