"""The leagues the benchmarks run pass the checks `league run` applies: no test runs the benchmarks themselves,
so a config limit they overstep (bench_system once kept 1,000,000 checkpoint versions, over `MAX_KEEP_LAST`)
would otherwise show only at the next `make bench`."""

from __future__ import annotations

import argparse

import yaml

from bench.bench_system import costly_league_config, solo_league_config
from league_cli.run import _load


def _loads_as_league_run_does(config: dict, tmp_path) -> None:
    path = tmp_path / "league.yaml"
    path.write_text(yaml.safe_dump(config))
    _load(argparse.Namespace(config=path, actors=None, seconds=None, env_steps=None))


def test_bench_system_leagues_load(tmp_path):
    solo = solo_league_config(45.0)
    _loads_as_league_run_does(solo, tmp_path)
    _loads_as_league_run_does(costly_league_config(solo), tmp_path)
