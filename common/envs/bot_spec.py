"""Reference bots by name ("random", "mcts:200"), without importing pyspiel.

The env plays a bot's seat itself (common/envs/openspiel_env.py). The spec is also what the league config
names as a reference-bot player and what a job carries for it, so the coordinator checks a spec at config
load without loading OpenSpiel.
"""

from __future__ import annotations

from dataclasses import dataclass

BOT_KINDS = ("random", "mcts")

REFERENCE_BOT_PREFIX = "bot_"
"""A league's reference bot is the player `bot_<spec>` (`bot_random`, `bot_mcts_25`); active players' ids begin
with their type (`main_player_...`), so never with this."""


MAX_SIMULATIONS = 100_000
"""The most MCTS simulations per move a spec takes: seconds a move on connect four. One move of mcts:100000000
searched for over ten minutes, and no Ctrl-C gets into pyspiel's search."""


@dataclass(frozen=True)
class BotSpec:
    """A reference bot: uniform random, or pyspiel's MCTS with random-rollout evaluation."""

    kind: str
    num_simulations: int = 100
    uct_c: float = 2.0
    rollouts: int = 1
    solve: bool = True
    max_memory_mb: int = 64

    def __post_init__(self) -> None:
        if self.kind not in BOT_KINDS:
            raise ValueError(f"BotSpec.kind must be one of {BOT_KINDS}, got {self.kind!r}")
        if not 1 <= self.num_simulations <= MAX_SIMULATIONS:
            raise ValueError(f"BotSpec.num_simulations must be within [1, {MAX_SIMULATIONS:,}], got "
                             f"{self.num_simulations:,}")
        if self.rollouts < 1:
            raise ValueError(f"BotSpec.rollouts must be >= 1, got {self.rollouts}")

    @property
    def text(self) -> str:
        """The spec as `parse` reads it: "random" or "mcts:<num_simulations>" (other fields at their defaults)."""
        return f"mcts:{self.num_simulations}" if self.kind == "mcts" else self.kind

    @classmethod
    def parse(cls, text: str) -> BotSpec:
        """`"random"`, `"mcts"` or `"mcts:<num_simulations>"` (the form job configs carry)."""
        kind, colon, sims = text.partition(":")
        if kind == "mcts" and colon:  # "mcts:" too: a number left out is a typo, not a wish for the default
            if sims.startswith("-") and sims[1:].isascii() and sims[1:].isdigit():
                raise ValueError(f"bot spec {text!r}: simulations must be within [1, {MAX_SIMULATIONS:,}]")
            if not (sims.isascii() and sims.isdigit()):  # ("²" is a digit to str.isdigit, not to int)
                raise ValueError(f"bot spec {text!r}: simulations must be an integer, as in 'mcts:200'")
            if not 1 <= int(sims) <= MAX_SIMULATIONS:  # (said as the user wrote it, not as the class's field)
                raise ValueError(f"bot spec {text!r}: simulations must be within [1, {MAX_SIMULATIONS:,}]")
            return cls("mcts", num_simulations=int(sims))
        if colon:
            raise ValueError(f"bot spec {text!r}: only mcts takes ':<num_simulations>'")
        if kind not in BOT_KINDS:  # (said as a spec, not as the class's field)
            raise ValueError(f"bot spec {text!r}: unknown bot; one of 'random', 'mcts:<num_simulations>' "
                             f"(as 'mcts:200'; 'mcts' alone: {cls.num_simulations} simulations)")
        return cls(kind)
