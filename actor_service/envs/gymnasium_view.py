"""Moved to common.envs.gymnasium_view (learners need env specs too); this re-export goes once the env managers import from there."""

from common.envs.gymnasium_view import *  # noqa: F401,F403
