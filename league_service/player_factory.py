"""Player type name (as in `active_players`) -> class, and construction of active players from the config."""

from __future__ import annotations

from league_service.alphastar_players import LeagueExploiter, MainExploiter, MainPlayer
from league_service.config import PLAYER_TYPES, LeagueConfig
from league_service.players import ActivePlayer, NaiveSpPlayer, SoloActivePlayer

PLAYER_CLASSES: dict[str, type[ActivePlayer]] = {
    cls.player_type: cls
    for cls in (SoloActivePlayer, NaiveSpPlayer, MainPlayer, MainExploiter, LeagueExploiter)
}
if set(PLAYER_CLASSES) != set(PLAYER_TYPES):
    raise ImportError(
        f"player classes {sorted(PLAYER_CLASSES)} do not match the config's {sorted(PLAYER_TYPES)}"
    )


def active_player_id(player_type: str, category: str, index: int) -> str:
    """Deterministic, readable ids: `main_player_default_0`."""
    return f"{player_type}_{category}_{index}"


def create_player(
    league_cfg: LeagueConfig, player_type: str, category: str, index: int, payoff
) -> ActivePlayer:
    try:
        cls = PLAYER_CLASSES[player_type]
    except KeyError:
        raise ValueError(
            f"player_type: unknown {player_type!r} (expected one of: {', '.join(PLAYER_CLASSES)})"
        ) from None
    return cls(
        player_id=active_player_id(player_type, category, index),
        category=category,
        payoff=payoff,
        cfg=league_cfg.player_config(player_type),
        # AlphaStar starts every agent from the supervised one: the category's pretrained checkpoint ("" =
        # a fresh initialisation). Its learner starts from it; actors act with it until the first publish.
        checkpoint_path=league_cfg.pretrain_path(category),
    )
