"""The league core is pure: importing any of its modules loads no gRPC (checked in a fresh interpreter).

The gRPC side (server, coordinator, store, leases, cli) is checked by its own tests, not here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import league_service

CORE_MODULES = (
    "alphastar_players",
    "base_league_manager",
    "config",
    "factory",
    "league_errors",
    "messages",
    "one_vs_one_league",
    "payoff",
    "pfsp",
    "player_factory",
    "players",
    "ratings",
    "roster",
    "slots",
    "solo_league",
    "status",
    "testing",
)

PROBE = """
import importlib, sys
importlib.import_module({module!r})
loaded = sorted(m for m in sys.modules if m == "grpc" or m.startswith("grpc."))
assert not loaded, f"{module} loaded {{loaded}}"
"""


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_grpc(module):
    name = f"league_service.{module}"
    root = Path(league_service.__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=name)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
