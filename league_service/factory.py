"""`create_league`: the league manager the config's league_type asks for."""

from __future__ import annotations

from collections.abc import Callable

from league_service.base_league_manager import BaseLeagueManager, LaunchJobFn, SaveCheckpointFn
from league_service.config import Config
from league_service.one_vs_one_league import OneVsOneLeague
from league_service.solo_league import SoloLeague

LEAGUE_CLASSES: dict[str, type[BaseLeagueManager]] = {
    OneVsOneLeague.league_type: OneVsOneLeague,
    SoloLeague.league_type: SoloLeague,
}


def create_league(
    cfg: Config,
    save_checkpoint_fn: SaveCheckpointFn,
    launch_job_fn: LaunchJobFn,
    on_change: Callable[[], None] | None = None,
    rng_seed: int | None = None,
    launch_thread: bool = True,
) -> BaseLeagueManager:
    try:
        cls = LEAGUE_CLASSES[cfg.league.league_type]
    except KeyError:
        raise ValueError(f"league.league_type: unknown {cfg.league.league_type!r}") from None
    return cls(cfg, save_checkpoint_fn, launch_job_fn, on_change=on_change, rng_seed=rng_seed,
               launch_thread=launch_thread)
