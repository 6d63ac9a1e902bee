"""The configs we ship load, and the documented default is the embedded one."""

from pathlib import Path

import pytest

from common.config import from_dict
from league_cli.run import RunConfig
from league_service.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_league_connect_four_is_the_embedded_default():
    embedded = ROOT / "league_service" / "default_config.yaml"
    assert (ROOT / "configs" / "league_connect_four.yaml").read_text() == embedded.read_text(), (
        "configs/league_connect_four.yaml must stay a copy of league_service/default_config.yaml"
    )


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_config_loads(path):
    cfg = load_config(path)
    from_dict(RunConfig, dict(cfg.run), "run")
    from common.policy_config import PolicyConfig

    PolicyConfig.from_mapping(cfg.policy)


def test_default_budget_is_about_five_minutes():
    run = from_dict(RunConfig, dict(load_config(None).run), "run")
    assert run.seconds == 300
