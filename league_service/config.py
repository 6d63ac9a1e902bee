"""The league's configuration schema, and `load_config` for the whole file.

The `league:` section is typed all the way down. The other top-level sections belong to other code: `env` and
`coordinator` are small typed sections, `policy`, `learner`, `actor` and `run` are free dicts passed through
to the workers (their owners validate them). Defaults are the dataclass defaults overlaid with the embedded
`default_config.yaml` (a battle league on OpenSpiel connect four); a user's file is merged over those.
"""

from __future__ import annotations

import importlib.resources
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from common.adder_config import AdderConfig
from common.config import (
    MAX_DURATION_S,
    REPLACE,
    ConfigError,
    deep_merge,
    from_dict,
    load_yaml,
    merge_with_defaults,
    parse_yaml,
    to_dict,
)
from common.envs.bot_spec import REFERENCE_BOT_PREFIX, BotSpec
from common.envs.registry import OPENSPIEL_ALIASES, OPENSPIEL_PREFIX, PYTHON_PREFIX
from common.job_limits import MAX_ENV_NUM, MAX_EPISODES_PER_JOB
from common.paths import MAX_COMPONENT_CHARS, UnsafePathError, check_component, check_relative
from common.policy_config import PolicyConfig
from common.ports import split_host_port
from common.typed_config import NULL_SECTION
from league_service.env_fit import check_battle_env, check_env_seats


def reference_bot_id(text: str) -> str:
    """The player id of the reference bot `text` names: `bot_random`, `bot_mcts_25` ("mcts" is mcts:100).
    Raises ValueError for a spec OpenSpiel's bots do not take."""
    return REFERENCE_BOT_PREFIX + BotSpec.parse(text).text.replace(":", "_")


Weighting = Literal["squared", "variance", "linear", "linear_capped", "uniform"]  # league_service/pfsp.py

# Player type names as they appear in `active_players`, each with its section of the league config.
BATTLE_PLAYER_TYPES: tuple[str, ...] = (
    "naive_sp_player",
    "main_player",
    "main_exploiter",
    "league_exploiter",
)
SOLO_PLAYER_TYPES: tuple[str, ...] = ("solo_active_player",)
PLAYER_TYPES: tuple[str, ...] = SOLO_PLAYER_TYPES + BATTLE_PLAYER_TYPES
# Keys of a player's `job` template that give defaults under the computed job values; the rest go to extra.
JOB_TEMPLATE_SECTIONS: tuple[str, ...] = ("forward_kwargs", "adder_kwargs", "env_kwargs")


MAX_JOBS_PER_PLAYER = 1000
"""The most jobs in flight per player (`max_active_player_job`, `max_job`): the league builds one job spec per
free slot at start, so a huge limit meant unbounded memory; actors take ready jobs in turn, so more slots than
actors buy nothing."""
MAX_ACTIVE_PER_TYPE = 256
"""The most active players of one type per category: each needs a learner of its own, and the league is built
at start (AlphaStar had a dozen in all)."""
MAX_ACTIVE_PLAYERS = 1024
"""The most active players in all (every type, every category)."""
MAX_INT64 = 2**63 - 1
"""JobSpec's episode_num and env_steps are int64 on the wire."""
_LONGEST_STEP_SUFFIX = f"_{MAX_INT64}"
"""What a snapshot appends to a player id (`<id>_<agent steps>`), at its longest."""


def _check_probability(value: float | None, name: str) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise ConfigError(name, f"must be within [0, 1], got {value}")


def _check_at_least(value: int | float, minimum: int | float, name: str) -> None:
    if value < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {value}")


def _check_within(value: int, minimum: int, maximum: int, name: str) -> None:
    _check_at_least(value, minimum, name)
    if value > maximum:
        raise ConfigError(name, f"must be at most {maximum}, got {value}")


@dataclass(frozen=True)
class ExplorationConfig:
    """Epsilon-greedy schedule over the player's agent steps; the job's forward_kwargs get `eps`. The defaults
    are DI-engine's DQN schedule (`DQN_EXPLORATION`), for a section that gives only some of the fields as for
    one that names none (a partial one took end 0.05 over 100k steps instead of 0.1 over 10k; a docs review)."""

    start: float = 0.95
    end: float = 0.1
    decay_len: int = 10_000
    # exp: end + (start - end) * exp(-step / decay_len); linear: reaches `end` at decay_len and stays.
    kind: Literal["exp", "linear"] = "exp"

    def __post_init__(self) -> None:
        _check_probability(self.start, "start")
        _check_probability(self.end, "end")
        _check_at_least(self.decay_len, 1, "decay_len")


@dataclass(frozen=True)
class ActivePlayerConfig:
    """What every trainable player type shares (the seed's per-player section)."""

    # The opponent-choice branches this player type implements; branch_probs keys must be among them.
    BRANCHES: ClassVar[tuple[str, ...]] = ()

    # Agent steps per phase: a snapshot is due after one phase (with the strong-win-rate rule) or two.
    one_phase_step: int = 20_000
    # None: snapshot after every one_phase_step. A number: after one phase only if the min win rate
    # against the player's reference opponents exceeds it, and in any case after two phases.
    strong_win_rate: float | None = None
    branch_probs: dict[str, float] = field(default_factory=dict, metadata=REPLACE)
    # None: the job carries no `eps`.
    exploration: ExplorationConfig | None = None
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    adder_kwargs: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    # The job template: keys forward_kwargs / adder_kwargs / env_kwargs give defaults under the computed
    # values; no other key (a job carries nothing else to its worker).
    job: dict[str, Any] = field(default_factory=dict)
    # Jobs in flight for each player of this type; None: league.max_active_player_job. Actors take ready
    # jobs in turn, so a player's share of the actors (and of the data its learner gets) follows its slots:
    # more for the main player than for the exploiters that serve it.
    max_job: int | None = None

    def __post_init__(self) -> None:
        _check_at_least(self.one_phase_step, 1, "one_phase_step")
        if self.max_job is not None:
            _check_within(self.max_job, 1, MAX_JOBS_PER_PLAYER, "max_job")
        _check_probability(self.strong_win_rate, "strong_win_rate")
        for name, prob in self.branch_probs.items():
            if name not in self.BRANCHES:
                expected = ", ".join(self.BRANCHES) or "none (this player type chooses no opponent)"
                raise ConfigError(f"branch_probs.{name}", f"unknown branch (expected: {expected})")
            if not 0.0 <= prob <= 1.0:
                raise ConfigError(f"branch_probs.{name}", f"must be within [0, 1], got {prob}")
        if self.BRANCHES and not math.isclose(sum(self.branch_probs.values()), 1.0, abs_tol=1e-6):
            raise ConfigError("branch_probs", f"must sum to 1, got {sum(self.branch_probs.values())}")
        for name in JOB_TEMPLATE_SECTIONS:
            if name in self.job and self.job[name] is None:
                raise ConfigError(f"job.{name}", NULL_SECTION)
            if name in self.job and not isinstance(self.job[name], Mapping):
                raise ConfigError(f"job.{name}", f"expected a mapping, got {type(self.job[name]).__name__}")


@dataclass(frozen=True)
class SoloActivePlayerConfig(ActivePlayerConfig):
    """A player that acts alone in its environment (Atari, MuJoCo, CartPole): no opponent."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strong_win_rate is not None:  # its first early snapshot would ask the payoff for win rates
            raise ConfigError("strong_win_rate", "a solo player has no opponents to win against: leave it unset "
                              "(a snapshot then follows every one_phase_step)")


@dataclass(frozen=True)
class NaiveSpPlayerConfig(ActivePlayerConfig):
    """Self-play against itself (sp) or PFSP over the league's historical players (pfsp): its own past
    versions and other players' (another naive_sp_player's, in a league of several), and the reference bots and
    pretrained players when the league has them (as DI-engine's)."""

    BRANCHES: ClassVar[tuple[str, ...]] = ("pfsp", "sp")

    branch_probs: dict[str, float] = field(default_factory=lambda: {"pfsp": 0.5, "sp": 0.5}, metadata=REPLACE)
    pfsp_weighting: Weighting = "squared"


@dataclass(frozen=True)
class MainPlayerConfig(ActivePlayerConfig):
    """AlphaStar's main agent: PFSP over all past players, self-play, and verification of its weaknesses."""

    BRANCHES: ClassVar[tuple[str, ...]] = ("pfsp", "sp", "verification")

    branch_probs: dict[str, float] = field(
        default_factory=lambda: {"pfsp": 0.5, "sp": 0.35, "verification": 0.15}, metadata=REPLACE
    )
    strong_win_rate: float | None = 0.7
    # The pfsp branch's weighting over all past players; AlphaStar's "squared" favours the hardest ones.
    pfsp_weighting: Weighting = "squared"
    # Self-play: a main opponent we beat less often than this is too strong; play its past versions instead.
    sp_min_win_rate: float = 0.3
    # Verification: past exploiters we beat less often than this are replayed (exploitation check) ...
    verification_exploiter_win_rate: float = 0.3
    # ... and past versions of the main opponent we beat less often than this (forgetting check).
    verification_forgetting_win_rate: float = 0.7

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "sp_min_win_rate",
            "verification_exploiter_win_rate",
            "verification_forgetting_win_rate",
        ):
            _check_probability(getattr(self, name), name)


@dataclass(frozen=True)
class MainExploiterConfig(ActivePlayerConfig):
    """AlphaStar's main exploiter: plays the main players to find their weaknesses; restarts from
    pretrained."""

    BRANCHES: ClassVar[tuple[str, ...]] = ("main_players",)

    branch_probs: dict[str, float] = field(default_factory=lambda: {"main_players": 1.0}, metadata=REPLACE)
    strong_win_rate: float | None = 0.7
    # Below this win rate a main player gives no training signal: play its past versions (curriculum).
    min_valid_win_rate: float = 0.1
    # At a snapshot, reset to the pretrained checkpoint when the min win rate against the main players is
    # below this (nothing found to exploit) ...
    reset_win_rate_below: float = 0.2
    # ... or when this many agent steps passed since the last reset. AlphaStar resets at every snapshot:
    # set this to one_phase_step for that.
    reset_after_steps: int = 40_000

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_probability(self.min_valid_win_rate, "min_valid_win_rate")
        _check_probability(self.reset_win_rate_below, "reset_win_rate_below")
        _check_at_least(self.reset_after_steps, 1, "reset_after_steps")


@dataclass(frozen=True)
class LeagueExploiterConfig(ActivePlayerConfig):
    """AlphaStar's league exploiter: PFSP over every past player, sometimes restarts from pretrained."""

    BRANCHES: ClassVar[tuple[str, ...]] = ("pfsp",)

    branch_probs: dict[str, float] = field(default_factory=lambda: {"pfsp": 1.0}, metadata=REPLACE)
    strong_win_rate: float | None = 0.7
    pfsp_weighting: Weighting = "linear_capped"  # AlphaStar's (and DI-engine's) league exploiter
    # Probability of resetting to the pretrained checkpoint at each snapshot.
    mutate_prob: float = 0.25

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_probability(self.mutate_prob, "mutate_prob")


MAX_SOLO_BUFFER_SIZE = 1_000_000
"""The most recent episodes a solo league keeps per player (the default keeps 100). They are held in memory and
saved with the league's state; at 2**63 the buffer could not even be made, and every FinishJob failed."""


def reachable_games(decay: float) -> float:
    """Below this a pair's decayed game count (each game: count * decay + 1) gets in floating point. Its limit is
    1 / (1 - decay), but the sums settle a few units in the last place below it (decay 0.9: 9.999999999999995
    against a limit of 10.000000000000002, so `min_win_rate_games: 10` passed a check against the limit and no
    win rate ever left the default; a review): a relative margin of 1e-9, wider where the limit is so large that
    the settled sums fall further short (about limit * 2**-53 relative)."""
    limit = 1.0 / (1.0 - decay)
    return limit * (1.0 - max(1e-9, 4.0 * limit * 2.0**-53))


@dataclass(frozen=True)
class PayoffConfig:
    # Every record decays by this factor before each new game is added (1.0: no decay).
    decay: float = 0.99
    # Fewer (decayed) games than this between two players: their win rate is `default_win_rate`.
    min_win_rate_games: float = 8.0
    default_win_rate: float = 0.5
    # Solo leagues: the recent episodes kept per player.
    solo_buffer_size: int = 100

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise ConfigError("decay", f"must be within (0, 1], got {self.decay}")
        _check_at_least(self.min_win_rate_games, 0, "min_win_rate_games")
        _check_probability(self.default_win_rate, "default_win_rate")
        _check_within(self.solo_buffer_size, 1, MAX_SOLO_BUFFER_SIZE, "solo_buffer_size")


MAX_ELO_K_FACTOR = 1000.0
"""Chess uses 10-40; with thousands a single game moves a rating by more than the whole spread of a league."""


MAX_RATING_SCALE = 1e9
"""The largest magnitude of a rating setting (Elo's initial rating; TrueSkill's mu, sigma, beta, tau). Far above
any useful value; at 1e154 and up TrueSkill's squared sigmas overflow to inf, the ratings became NaN, and the
coordinator's state store refused to save them (a crash-restart on every finished job)."""

MIN_TRUESKILL_BETA = 1e-6
"""TrueSkill's smallest beta: c^2 = 2 beta^2 + sigma1^2 + sigma2^2 must stay a positive float64 as the sigmas
shrink over many games (at 1e-160 and tau 0 it reached 0, and the next update divided by zero)."""


def _check_rating_scale(value: float, name: str) -> None:
    if abs(value) > MAX_RATING_SCALE:
        raise ConfigError(name, f"must be within ±{MAX_RATING_SCALE:g}, got {value:g}")


@dataclass(frozen=True)
class EloConfig:
    initial: float = 1200.0
    k_factor: float = 16.0

    def __post_init__(self) -> None:
        _check_rating_scale(self.initial, "initial")
        if not 0 < self.k_factor <= MAX_ELO_K_FACTOR:
            raise ConfigError("k_factor", f"must be within (0, {MAX_ELO_K_FACTOR:g}], got {self.k_factor}")


MIN_DRAW_PROBABILITY = 1e-9
"""TrueSkill's smallest draw probability: the draw margin it gives still separates the two ends of a draw's
interval in float64 (at 1e-17 it is 0, and the update of a drawn game divided by zero)."""


@dataclass(frozen=True)
class TrueSkillConfig:
    mu: float = 25.0
    sigma: float = 25.0 / 3
    beta: float = 25.0 / 6
    tau: float = 25.0 / 300
    draw_probability: float = 0.1

    def __post_init__(self) -> None:
        if self.sigma <= 0:
            raise ConfigError("sigma", f"must be > 0, got {self.sigma}")
        _check_at_least(self.beta, MIN_TRUESKILL_BETA, "beta")
        _check_at_least(self.tau, 0, "tau")
        for name in ("mu", "sigma", "beta", "tau"):
            _check_rating_scale(getattr(self, name), name)
        if not MIN_DRAW_PROBABILITY <= self.draw_probability < 1.0:
            raise ConfigError("draw_probability", f"must be within [{MIN_DRAW_PROBABILITY:g}, 1), got "
                              f"{self.draw_probability} (below, the draw margin is too thin for float64 and every "
                              "draw's rating update divides by zero)")


@dataclass(frozen=True)
class LeagueConfig:
    league_type: Literal["one_vs_one", "solo"] = "one_vs_one"
    player_category: tuple[str, ...] = ("default",)
    # {player type: how many per category}; ids are `<type>_<category>_<index>`, e.g. main_player_default_0.
    active_players: dict[str, int] = field(
        default_factory=lambda: {"main_player": 1, "main_exploiter": 1, "league_exploiter": 1},
        metadata=REPLACE,
    )
    # Jobs in flight per active player (the seed's LimitedSpaceContainer).
    max_active_player_job: int = 2
    # Add each category's pretrained checkpoint as a historical player at start.
    use_pretrain_init_historical: bool = False
    # {category: path} the league starts from and mutations reset to; "" means a fresh initialisation.
    pretrain_checkpoint_path: dict[str, str] = field(
        default_factory=lambda: {"default": ""}, metadata=REPLACE
    )
    # Reference bots the env plays itself ("random", "mcts:25"), in the league from the start as fixed
    # historical players (ids bot_random, bot_mcts_25): opponents that take a win left on the board and block
    # one, which the league's own young players rarely do, and anchors for the ratings. PFSP and the payoff
    # treat them as any past player. Battle leagues on OpenSpiel games (common/envs/openspiel_env.py).
    reference_bots: tuple[str, ...] = ()
    solo_active_player: SoloActivePlayerConfig = field(default_factory=SoloActivePlayerConfig)
    naive_sp_player: NaiveSpPlayerConfig = field(default_factory=NaiveSpPlayerConfig)
    main_player: MainPlayerConfig = field(default_factory=MainPlayerConfig)
    main_exploiter: MainExploiterConfig = field(default_factory=MainExploiterConfig)
    league_exploiter: LeagueExploiterConfig = field(default_factory=LeagueExploiterConfig)
    payoff: PayoffConfig = field(default_factory=PayoffConfig)
    elo: EloConfig = field(default_factory=EloConfig)
    trueskill: TrueSkillConfig = field(default_factory=TrueSkillConfig)

    def __post_init__(self) -> None:
        payoff = self.payoff
        # (A battle league's: a solo league keeps no win rates, and `payoff.decay: 0.5` alone in one was refused
        # for this reason, the default min_win_rate_games's; a review.)
        if (self.league_type != "solo" and payoff.decay < 1.0
                and payoff.min_win_rate_games >= reachable_games(payoff.decay)):
            # Decayed game counts stay below 1 / (1 - decay): every win rate would stay the default for ever,
            # and PFSP, snapshots and exploiter resets would never see a result.
            raise ConfigError("payoff.min_win_rate_games",
                              f"must be below 1 / (1 - decay) = {1.0 / (1.0 - payoff.decay):g}, which a pair's "
                              f"decayed games approach but never reach, got {payoff.min_win_rate_games}")
        if not self.player_category:
            raise ConfigError("player_category", "needs at least one category")
        if len(set(self.player_category)) != len(self.player_category):
            raise ConfigError(
                "player_category", f"categories must be unique, got {list(self.player_category)}"
            )
        allowed = SOLO_PLAYER_TYPES if self.league_type == "solo" else BATTLE_PLAYER_TYPES
        for name, count in self.active_players.items():
            if name not in allowed:
                raise ConfigError(
                    f"active_players.{name}",
                    f"not a player type of a {self.league_type} league "
                    f"(expected one of: {', '.join(allowed)})",
                )
            _check_within(count, 0, MAX_ACTIVE_PER_TYPE, f"active_players.{name}")
        if sum(self.active_players.values()) < 1:
            raise ConfigError("active_players", "needs at least one active player")
        total = self.active_player_total
        if total > MAX_ACTIVE_PLAYERS:
            raise ConfigError("active_players", f"{total} active players in all (the counts times "
                              f"{len(self.player_category)} categories); at most {MAX_ACTIVE_PLAYERS}")
        self._check_categories()
        _check_within(self.max_active_player_job, 1, MAX_JOBS_PER_PLAYER, "max_active_player_job")
        for category, path in self.pretrain_checkpoint_path.items():
            if category not in self.player_category:
                raise ConfigError(f"pretrain_checkpoint_path.{category}", "not one of player_category")
            if path:  # handed to actors and learners, who load it from the shared root
                try:
                    check_relative(path)
                except UnsafePathError as err:
                    raise ConfigError(f"pretrain_checkpoint_path.{category}", str(err)) from None
        if self.use_pretrain_init_historical:
            if self.league_type == "solo":
                raise ConfigError("use_pretrain_init_historical", "a solo league has no historical opponents")
            for category in self.player_category:
                if not self.pretrain_checkpoint_path.get(category):
                    raise ConfigError(
                        f"pretrain_checkpoint_path.{category}",
                        "use_pretrain_init_historical needs a pretrained checkpoint for every category",
                    )

        if self.reference_bots:
            if self.league_type == "solo":
                raise ConfigError("reference_bots", "a solo league has no opponents (seat bots with env.kwargs.bots)")
            seen: dict[str, str] = {}
            for i, text in enumerate(self.reference_bots):
                try:
                    bot_id = reference_bot_id(text)
                except ValueError as err:
                    raise ConfigError(f"reference_bots[{i}]", str(err)) from None
                if bot_id in seen:
                    raise ConfigError(f"reference_bots[{i}]", f"{text!r} is the same bot as {seen[bot_id]!r}")
                seen[bot_id] = text

    def _check_categories(self) -> None:
        """Categories become part of player ids, which name checkpoint directories: check them here, with the
        longest id built from each (`<type>_<category>_<index>_<agent steps>` of a snapshot), rather than
        fail at run time as an unsafe player id."""
        around = max(len(f"{name}__{count - 1}{_LONGEST_STEP_SUFFIX}")
                     for name, count in self.active_players.items() if count > 0)
        limit = MAX_COMPONENT_CHARS - around
        for i, category in enumerate(self.player_category):
            if not category:
                raise ConfigError(f"player_category[{i}]", "must not be empty")
            if len(category) > limit:
                raise ConfigError(f"player_category[{i}]", f"must be at most {limit} characters (player ids "
                                  f"<type>_<category>_<index>_<agent steps> must fit in {MAX_COMPONENT_CHARS}), "
                                  f"got {len(category)}")
            try:  # inside an id, as it is used ("-fast" is fine there, not as a name of its own)
                check_component(f"main_player_{category}_0", "category")
            except UnsafePathError:
                raise ConfigError(f"player_category[{i}]", f"{category!r}: only letters, digits, '_', '.' and "
                                  "'-' (it is part of player ids, which name checkpoint directories)") from None
        categories = set(self.player_category)
        for i, category in enumerate(self.player_category):
            numbered = re.fullmatch(r"(.+)_[0-9]+", category)
            if numbered and numbered.group(1) in categories:
                # main_player_<other>_0 snapshotted at step 1 is main_player_<other>_0_1, the id of
                # main_player_<category>_1: the snapshot round failed on the taken id and closed the league.
                other = numbered.group(1)
                raise ConfigError(f"player_category[{i}]", f"{category!r} is category {other!r} followed by '_' "
                                  f"and a number: its players' ids would be those of {other!r}'s snapshots "
                                  f"(<type>_{other}_<index>_<agent steps>); rename it")

    def job_limit(self, player_type: str) -> int:
        """Launch slots of each player of `player_type`: its `max_job`, else max_active_player_job."""
        limit = self.player_config(player_type).max_job
        return self.max_active_player_job if limit is None else limit

    def player_config(self, player_type: str) -> ActivePlayerConfig:
        """The section of one player type, e.g. `main_player`."""
        if player_type not in PLAYER_TYPES:
            raise KeyError(
                f"unknown player type {player_type!r} (expected one of: {', '.join(PLAYER_TYPES)})"
            )
        return getattr(self, player_type)

    def pretrain_path(self, category: str) -> str:
        """The checkpoint the league starts a category from and resets mutated players to ("" = fresh)."""
        return self.pretrain_checkpoint_path.get(category, "")

    @property
    def active_player_total(self) -> int:
        """Active players in all: each type's count in every category (one learner each)."""
        return sum(self.active_players.values()) * len(self.player_category)


@dataclass(frozen=True)
class EnvConfig:
    name: str = "connect_four"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Environments per collect job.
    env_num: int = 1
    # Episodes per collect job (at most MAX_EPISODES_PER_JOB); 0 means until env_steps are spent (a job also
    # ends before a step whose endings, one an env at most, could take it past MAX_EPISODES_PER_JOB episodes:
    # its FinishJob reports each of them).
    episode_num: int = 8
    # Env steps per collect job; 0 means no step budget (episode_num bounds the job). Beside an episode_num, a
    # cap: a job ends at whichever bound it reaches first (actor_service/rollout.py).
    env_steps: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("name", "must not be empty")
        _check_within(self.env_num, 1, MAX_ENV_NUM, "env_num")
        _check_within(self.episode_num, 0, MAX_EPISODES_PER_JOB, "episode_num")
        _check_within(self.env_steps, 0, MAX_INT64, "env_steps")
        if self.episode_num == 0 and self.env_steps == 0:
            raise ConfigError("episode_num", "episode_num and env_steps are both 0: a job would never end")


@dataclass(frozen=True)
class CoordinatorConfig:
    bind_address: str = "127.0.0.1:50051"
    # A job whose worker stays silent this long is taken back and issued again.
    lease_timeout_s: float = 30.0
    heartbeat_interval_s: float = 5.0
    # A collect job is leased at most this many times when its attempts fail (FAILED finish or lease expiry);
    # once a player's consecutive failed attempts reach it, its jobs wait job_retry_backoff_s, then twice that,
    # ... up to max_job_retry_backoff_s before they are handed out again (LEASES.md, "Failing jobs").
    max_job_attempts: int = 3
    job_retry_backoff_s: float = 5.0
    max_job_retry_backoff_s: float = 300.0
    # A worker silent this long and holding no job is dropped from the registry (and the status); it registers
    # again if it comes back. Every actor process that starts is a new worker (actor-<host>-<pid>), so without
    # this the registry and every status reply would grow for as long as the league runs. 0: never.
    forget_workers_after_s: float = 3600.0

    def __post_init__(self) -> None:
        try:
            split_host_port(self.bind_address)
        except ValueError as err:
            raise ConfigError("bind_address", str(err)) from None
        if not 0 < self.lease_timeout_s <= MAX_DURATION_S:
            raise ConfigError("lease_timeout_s", f"must be > 0 and at most {MAX_DURATION_S:g}, got {self.lease_timeout_s}")
        if not 0 < self.heartbeat_interval_s < self.lease_timeout_s:
            raise ConfigError(
                "heartbeat_interval_s",
                f"must be > 0 and below lease_timeout_s ({self.lease_timeout_s}), "
                f"got {self.heartbeat_interval_s}",
            )
        _check_at_least(self.max_job_attempts, 1, "max_job_attempts")
        if not (self.forget_workers_after_s <= MAX_DURATION_S
                and (self.forget_workers_after_s == 0 or self.forget_workers_after_s > self.lease_timeout_s)):
            raise ConfigError("forget_workers_after_s", f"must be 0 (never) or above lease_timeout_s "
                              f"({self.lease_timeout_s}) and at most {MAX_DURATION_S:g}, "
                              f"got {self.forget_workers_after_s}")
        if not (math.isfinite(self.job_retry_backoff_s) and self.job_retry_backoff_s >= 0):
            raise ConfigError("job_retry_backoff_s", f"must be a finite number >= 0, got {self.job_retry_backoff_s}")
        if not self.job_retry_backoff_s <= self.max_job_retry_backoff_s <= MAX_DURATION_S:
            raise ConfigError("max_job_retry_backoff_s", f"must be >= job_retry_backoff_s "
                              f"({self.job_retry_backoff_s}) and at most {MAX_DURATION_S:g}, "
                              f"got {self.max_job_retry_backoff_s}")


@dataclass(frozen=True)
class Config:
    league: LeagueConfig = field(default_factory=LeagueConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    # Algorithm and model of the policies, passed through to actors and learners.
    policy: dict[str, Any] = field(default_factory=dict)
    learner: dict[str, Any] = field(default_factory=dict)
    actor: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)

    def __post_init__(self) -> None:
        self._check_reference_bots()
        check_env_seats(self.env.name, self.env.kwargs, self.league)

    def _check_reference_bots(self) -> None:
        if not self.league.reference_bots:
            return
        name = self.env.name
        if not (name in OPENSPIEL_ALIASES or name.startswith((OPENSPIEL_PREFIX, PYTHON_PREFIX))):
            raise ConfigError("league.reference_bots", f"need an env that plays bots itself (connect_four, "
                              f"openspiel:<game>, or a python: env whose reset takes bots=), not {name!r}")
        seated = _bot_seat_paths({"env": to_dict(self.env), "league": to_dict(self.league)})
        if seated:
            raise ConfigError(seated[0], "cannot be combined with league.reference_bots: the league seats its "
                              "reference bots itself, in the jobs that name them")
        searching = [text for text in self.league.reference_bots if BotSpec.parse(text).kind == "mcts"]
        game = name.removeprefix(OPENSPIEL_PREFIX)
        if searching and name.startswith(OPENSPIEL_PREFIX) and imperfect_information(game):
            # The env refuses such a bot (pyspiel's MCTS searches the true state: it would see the hidden cards),
            # but only in the actors, one failed job after another against it for as long as the league ran.
            raise ConfigError("league.reference_bots", f"{searching} cannot play {game!r}, a game of imperfect "
                              "information: pyspiel's MCTS searches the true state, so it would see the other "
                              "players' hidden information; keep 'random' only (a saved league that has them "
                              "cannot drop them: start a new league)")


def imperfect_information(game: str) -> bool:
    """OpenSpiel's game `game` is one of imperfect information (False for a game it does not know: the env says)."""
    import pyspiel

    for game_type in pyspiel.registered_games():
        if game_type.short_name == game:
            return game_type.information != pyspiel.GameType.Information.PERFECT_INFORMATION
    return False


DEFAULT_CONFIG_RESOURCE = "default_config.yaml"

log = logging.getLogger(__name__)

# Keys an older version had and this one has not. `league run` writes the whole config (every default) into its
# run directory's config.yaml, which resuming the directory reads: a key retired since made an old league's
# directory unresumable ("unknown key") until the file was edited by hand. Such a key is dropped with a warning.
RETIRED_KEYS: dict[tuple[str, str], str] = {
    ("coordinator", "job_queue_size"): "the coordinator keeps no job queue since d008dd6, 2026-11-21",
}


def _without_retired_keys(data: Mapping[str, Any]) -> Mapping[str, Any]:
    out: dict[str, Any] | None = None
    for (section, key), why in RETIRED_KEYS.items():
        part = data.get(section)
        if isinstance(part, Mapping) and key in part:
            out = dict(data) if out is None else out
            out[section] = {k: v for k, v in part.items() if k != key}
            log.warning("%s.%s: no longer used (%s); ignored", section, key, why)
    return data if out is None else out


def default_config_dict() -> dict[str, Any]:
    """The embedded default configuration file as a dict."""
    text = importlib.resources.files("league_service").joinpath(DEFAULT_CONFIG_RESOURCE).read_text("utf-8")
    return parse_yaml(text, source=f"league_service/{DEFAULT_CONFIG_RESOURCE}")


def config_from_dict(data: Mapping[str, Any], *, for_training: bool = True) -> Config:
    """Merge `data` over the embedded defaults and validate it into a `Config`.

    `for_training=False` (`league eval`, which reads only the policy and the env) skips the checks of whether
    the league's jobs would train as meant (`_check_league_trains`): an older run directory's league that
    trained, and whose checkpoints are there, loads for its policy and env although a league configured so is
    refused now.

    When `data` names a policy algorithm other than the default's, the default `policy` and `learner` sections
    are dropped instead of merged: one algorithm's hyperparameters mean nothing to another. Likewise the
    default's reference bots play the default's game in a battle league: a config naming another env or league
    type, or seating env bots of its own (`bots` in env kwargs), starts without them unless it names its own. And
    a config giving its own `policy.model.conv` starts without the default's padding and activation
    (`CONV_COMPANION_KEYS`).
    """
    if not isinstance(data, Mapping):
        raise ConfigError("", f"the configuration must be a mapping, got {type(data).__name__}")
    data = _without_retired_keys(data)
    defaults = default_config_dict()
    if _names_other(data, defaults, "policy", "algorithm"):
        defaults.pop("policy", None)
        defaults.pop("learner", None)
    if (_names_other_env(data, defaults) or _names_other(data, defaults, "league", "league_type")
            or _bot_seat_paths(data)):
        defaults.get("league", {}).pop("reference_bots", None)
    if _sets_own_conv(data) and isinstance(defaults.get("policy"), dict):
        default_model = defaults["policy"].get("model")
        if isinstance(default_model, dict):
            for key in CONV_COMPANION_KEYS:
                default_model.pop(key, None)
    user_league = data.get("league")
    if (isinstance(user_league, Mapping) and "player_category" in user_league
            and "pretrain_checkpoint_path" not in user_league and isinstance(defaults.get("league"), dict)):
        # The default's `{default: ""}` (a fresh start) names the default's category: beside categories of the
        # user's own it was refused as "not one of player_category", a key the file never set. An empty mapping
        # means the same for every category (`pretrain_path` gives "" to a category it does not name).
        defaults["league"]["pretrain_checkpoint_path"] = {}
    merged = merge_with_defaults(Config, defaults, data)
    _default_dqn_exploration(merged)
    cfg = from_dict(Config, merged)
    sections = _check_worker_sections(cfg)
    if for_training:
        _check_league_trains(cfg, sections)
    return cfg


@dataclass(frozen=True)
class _WorkerSections:
    """The worker-side sections as the workers will parse them (`_check_worker_sections`)."""

    policy: PolicyConfig
    adders: dict[str, AdderConfig]  # player type -> its adder_kwargs over its job template's


def _check_league_trains(cfg: Config, sections: _WorkerSections) -> None:
    """Refuse a league whose jobs would not train as its config means, though each value is valid."""
    active = cfg.league.active_players
    if active.get("main_exploiter") and not active.get("main_player"):
        # Its one branch plays the main players (any category's) and active players are fixed at start: with
        # none, every job fell back to playing itself, for as long as the league ran (reference bots too).
        raise ConfigError("league.active_players.main_exploiter", "a main exploiter plays only main players, and "
                          "there is no main_player to exploit: add one (active_players.main_player), or use "
                          "naive_sp_player for self-play")
    if sections.policy.algorithm == "dqn":
        _check_n_step_fits_rows(sections.policy.dqn.n_step, cfg.league, sections.adders)
    for player_type in PLAYER_TYPES:
        _check_job_settings(cfg.league.player_config(player_type), f"league.{player_type}")
    check_battle_env(cfg.env.name, cfg.env.kwargs, cfg.league)


def _check_job_settings(section: ActivePlayerConfig, where: str) -> None:
    """Settings a job would carry otherwise than written (only for training: `league eval` reads an older run's
    config, which these checks are newer than)."""
    if section.exploration is not None and _fixes_eps(section.forward_kwargs, section.job):
        # (The schedule's eps went into every job over the fixed one, without a word.)
        raise ConfigError(f"{where}.exploration", "sets each job's eps on a schedule, and forward_kwargs (or the "
                          "job template's) fixes eps too: give one of them")
    for name in section.job:
        if name not in JOB_TEMPLATE_SECTIONS:  # (a typo such as `forward_kwrags` was accepted, and dropped)
            raise ConfigError(f"{where}.job.{name}", f"a job template holds {', '.join(JOB_TEMPLATE_SECTIONS)}; a "
                              "job carries nothing else to its worker")


DQN_EXPLORATION = ExplorationConfig()
"""The epsilon-greedy schedule of a DQN league's player types that name none (DI-engine's DQN default): DQN acts
greedily on its Q-values, so without one a DQN league never explored (a solo CartPole league stayed at a
return of ~10 in 24k agent steps; with a schedule it reached ~100)."""


def _default_dqn_exploration(merged: dict[str, Any]) -> None:
    """Give each player type of a DQN config `DQN_EXPLORATION` unless it says how it explores: its own
    `exploration` (null: none, on purpose) or an `eps` in its forward_kwargs or its job template's. PPO
    explores by sampling its policy and gets none. Anything malformed is left for the parse to name."""
    policy, league = merged.get("policy"), merged.setdefault("league", {})
    if not isinstance(policy, Mapping) or policy.get("algorithm") != "dqn" or not isinstance(league, dict):
        return
    schedule = to_dict(DQN_EXPLORATION)
    for player_type in PLAYER_TYPES:
        section = league.setdefault(player_type, {})
        if not isinstance(section, dict) or "exploration" in section:
            continue
        if not _fixes_eps(section.get("forward_kwargs"), section.get("job")):
            section["exploration"] = dict(schedule)


def _fixes_eps(forward_kwargs: Any, job: Any) -> bool:
    """Whether a player type fixes `eps` in its forward_kwargs or its job template's (raw or parsed config)."""
    job_forward = job.get("forward_kwargs") if isinstance(job, Mapping) else None
    return any(isinstance(kwargs, Mapping) and "eps" in kwargs for kwargs in (forward_kwargs, job_forward))


def greedy_dqn_player_types(cfg: Config) -> list[str]:
    """The active player types of a DQN league that never explore (`exploration: null`, no `eps`): what a user
    asks for on purpose, or what a run directory saved before DQN leagues got `DQN_EXPLORATION` holds, which a
    resume then keeps greedy; worth a word at start either way."""
    if cfg.policy.get("algorithm") != "dqn":
        return []
    greedy = []
    for player_type, count in cfg.league.active_players.items():
        section = getattr(cfg.league, player_type, None)
        if not count or not isinstance(section, ActivePlayerConfig) or section.exploration is not None:
            continue
        if not _fixes_eps(section.forward_kwargs, section.job):
            greedy.append(player_type)
    return greedy


def greedy_dqn_note(cfg: Config) -> str | None:
    """The start-up warning of `league run` and the coordinator for `greedy_dqn_player_types`, or None."""
    greedy = greedy_dqn_player_types(cfg)
    if not greedy:
        return None
    return (f"DQN player type(s) {', '.join(greedy)} never explore (exploration: null and no eps): their actors act "
            "greedily on the Q-values; set league.<type>.exploration (a run directory saved before DQN leagues got "
            "a default schedule holds null)")


BATTLE_ONLY_LEAGUE_KEYS: tuple[str, ...] = (
    "elo", "trueskill", "payoff.decay", "payoff.min_win_rate_games", "payoff.default_win_rate")
"""What only a battle league uses: ratings of matches, and the payoff's win rates."""


def battle_only_note(cfg: Config) -> str | None:
    """The start-up warning of `league run` and the coordinator for a solo league given other values than the
    defaults for BATTLE_ONLY_LEAGUE_KEYS, or None: taken without a word, they changed nothing (`elo.k_factor:
    999`; a review). A warning, not a refusal: a solo run's config.yaml holds every key, and one an earlier
    version accepted must still resume."""
    if cfg.league.league_type != "solo":
        return None
    defaults = from_dict(LeagueConfig, default_config_dict()["league"], "league")
    changed = []
    for key in BATTLE_ONLY_LEAGUE_KEYS:
        mine: Any = cfg.league
        default: Any = defaults
        for part in key.split("."):
            mine, default = getattr(mine, part), getattr(default, part)
        if mine != default:
            changed.append(f"league.{key}")
    if not changed:
        return None
    return (f"{', '.join(changed)} set, but a solo league rates no matches and keeps no win rates (its players are "
            "judged by their returns): they change nothing")


def _bot_seat_paths(data: Mapping[str, Any]) -> list[str]:
    """Where a config (a whole one, or a user's file before the defaults) gives the env bots of its own:
    `env.kwargs.bots`, and each player type's `env_kwargs.bots` and `job.env_kwargs.bots`."""
    def has_bots(section: Any, *keys: str) -> bool:
        for key in keys:
            section = section.get(key) if isinstance(section, Mapping) else None
        return isinstance(section, Mapping) and "bots" in section

    paths = ["env.kwargs.bots"] if has_bots(data, "env", "kwargs") else []
    for player_type in PLAYER_TYPES:
        for keys in (("env_kwargs",), ("job", "env_kwargs")):
            if has_bots(data.get("league"), player_type, *keys):
                paths.append(".".join(("league", player_type, *keys, "bots")))
    return paths


CONV_COMPANION_KEYS = ("conv_padding", "activation")
"""`policy.model` keys of the default network that go with its conv stack: a config giving a `conv` of its own
takes them from what it says, or else ModelConfig's defaults (unpadded, the algorithm's own activation), never
from the default's. Run directories and states saved before the default network was same-padded relu (session 34)
write out the old stack, [[64, 3, 1], [64, 3, 1]], without these keys: so they resume with the network they
trained, and a user's config that names its conv means the same as before."""


def _sets_own_conv(data: Mapping[str, Any]) -> bool:
    policy = data.get("policy")
    model = policy.get("model") if isinstance(policy, Mapping) else None
    return isinstance(model, Mapping) and "conv" in model


def _names_other(data: Mapping[str, Any], defaults: Mapping[str, Any], section: str, key: str) -> bool:
    """Whether `data` sets `section.key` to something other than the defaults' value."""
    user = data.get(section)
    return isinstance(user, Mapping) and key in user and user[key] != defaults.get(section, {}).get(key)


def _names_other_env(data: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
    """`_names_other` for `env.name`, where `openspiel:connect_four` is the default's `connect_four` (as league
    identities compare them): the prefix alone dropped the default's reference bots, silently (a review)."""
    user, default = data.get("env"), defaults.get("env", {}).get("name")
    if not (isinstance(user, Mapping) and "name" in user):
        return False
    name = user["name"]
    return not (isinstance(name, str) and isinstance(default, str)
                and name.removeprefix(OPENSPIEL_PREFIX) == default.removeprefix(OPENSPIEL_PREFIX))


def _check_worker_sections(cfg: Config) -> _WorkerSections:
    """`policy` and `learner` travel to actors and learners as free dicts; parse them here too, so a typo
    stops the coordinator (or `league run`) at startup, naming the key, instead of every learner later.
    Returns the parsed policy and each player type's parsed `AdderConfig`."""
    from common.learner_config import LearnerConfig

    parsed = []
    for section, parse in (("policy", PolicyConfig.from_mapping), ("learner", LearnerConfig.from_mapping)):
        try:
            parsed.append(parse(getattr(cfg, section)))
        except (TypeError, ValueError) as err:
            message = str(err)
            path, _, rest = message.partition(": ")
            if path.startswith(section) and rest:  # "policy.ppo.x: ..." -> path and message
                raise ConfigError(path, rest) from None
            raise ConfigError(section, message) from None
    policy, learner = parsed
    _refuse_other_algorithms_learner_keys(policy.algorithm, cfg.learner)
    _refuse_unread_model_keys(policy.algorithm, cfg.policy.get("model") or {})
    if policy.algorithm == "ppo" and policy.ppo.num_minibatches > learner.batch_size:
        # A batch of batch_size samples cut into more minibatches than that: minibatches of one sample.
        raise ConfigError("policy.ppo.num_minibatches", f"must be at most learner.batch_size ({learner.batch_size}), "
                          f"got {policy.ppo.num_minibatches}: each minibatch is a share of one batch's samples")
    from common.run_config import RunConfig

    from_dict(RunConfig, cfg.run, "run")  # `league run`'s section: a typo must not pass the coordinator silently
    if cfg.actor:  # kept (empty) so that configs and run directories written with `actor: {}` still load
        key = next(iter(cfg.actor))
        raise ConfigError(f"actor.{key}", "actors read no settings from the league config: give them on the "
                          "actor's command line (`league actor --help`; per job: the player type's adder_kwargs "
                          "and forward_kwargs)")
    return _WorkerSections(policy, _check_job_kwargs(cfg.league))


def _check_n_step_fits_rows(n_step: int, league: LeagueConfig, adders: Mapping[str, AdderConfig]) -> None:
    """An n-step window never spans two trajectory rows (`transitions_from_trajectory` cuts each row on its own)
    and a row holds at most unroll_len transitions: n_step above an active player's unroll_len summed no more
    rewards than n_step = unroll_len would, silently."""
    for player_type, count in league.active_players.items():
        unroll_len = adders[player_type].unroll_len
        if count and n_step > unroll_len:
            section = league.player_config(player_type)
            key = f"league.{player_type}.adder_kwargs.unroll_len"
            if "unroll_len" not in section.adder_kwargs:
                template = section.job.get("adder_kwargs") or {}
                key = f"league.{player_type}.job.adder_kwargs.unroll_len" if "unroll_len" in template else f"{key} (default)"
            raise ConfigError("policy.dqn.n_step", f"must be at most {key} = {unroll_len}, got {n_step}: an n-step "
                              "window ends at the end of the trajectory row the actors send, which holds at most "
                              "unroll_len steps, so a longer n_step sums no more rewards; lower n_step or raise "
                              "unroll_len")


_ONE_ALGORITHMS_LEARNER_KEYS: dict[str, tuple[str, str]] = {
    "batch_size": ("ppo", "a DQN learner samples policy.dqn.batch_size transitions per update"),
    "replay_ratio": ("dqn", "a PPO learner has no replay: it trains on each batch of learner.batch_size "
                              "samples as it comes, policy.ppo.update_epochs times"),
    "max_staleness": ("ppo", "a DQN learner learns off-policy from its replay buffer, whose transitions are of many "
                             "versions by design"),
}
"""`learner` keys only one algorithm's learner reads: {key: (that algorithm, what the other does instead)}."""


def _refuse_other_algorithms_learner_keys(algorithm: str, learner: Mapping[str, Any]) -> None:
    """A `learner` key that only the other algorithm reads (`learner.batch_size` beside `algorithm: dqn`) was
    parsed, checked and never read: a DQN user's `batch_size: 32` silently did nothing (DQN's is
    policy.dqn.batch_size). Checked on the section as given: a file naming dqn starts without the default's
    `learner` section (`config_from_dict`), so the key is there only when the user wrote it."""
    for key, (reader, instead) in _ONE_ALGORITHMS_LEARNER_KEYS.items():
        if key in learner and algorithm != reader:
            raise ConfigError(f"learner.{key}", f"set, but only {reader} reads it and policy.algorithm is "
                              f"{algorithm!r} ({instead}); remove it")


def _refuse_unread_model_keys(algorithm: str, model: Mapping[str, Any]) -> None:
    """A `policy.model` key the network built does not read (`recurrent_size` of a feed-forward network) was parsed,
    checked and silently did nothing: a user tuning it saw no effect and no word. Checked on the section as merged
    with the embedded default's, whose model sets `shared_torso: true` alone (what every recurrent model does)."""
    recurrent = model.get("recurrent")
    unread = []
    if recurrent is None:
        unread += [("recurrent_size", "only a recurrent model reads it (policy.model.recurrent is null)")]
    if not model.get("obs_norm"):
        unread += [("obs_norm_clip", "only observation normalisation reads it (policy.model.obs_norm is off)")]
    if algorithm == "dqn":
        unread += [("shared_torso", "DQN's Q-network has one torso, with no critic to share it")]
    elif recurrent is not None and model.get("shared_torso", True) is False:
        unread += [("shared_torso", f"a recurrent model ({recurrent}) always shares its torso and core: both "
                    "heads read the one memory")]
    for key, why in unread:
        if key in model:
            raise ConfigError(f"policy.model.{key}", f"set, but {why}; remove it")


def _check_job_kwargs(league: LeagueConfig) -> dict[str, AdderConfig]:
    """Each player type's ``adder_kwargs`` and ``forward_kwargs`` (over its job template's) as the actors will
    parse them: a typo or a bad value would otherwise fail every collect job of that player, on every actor.
    Returns each player type's parsed `AdderConfig`."""
    from common.forward_kwargs import ForwardKwargs
    from common.typed_config import from_mapping

    adders: dict[str, AdderConfig] = {}
    for f in fields(league):
        player = getattr(league, f.name)
        if not isinstance(player, ActivePlayerConfig):
            continue
        for section, parsed_as in (("adder_kwargs", AdderConfig), ("forward_kwargs", ForwardKwargs)):
            path = f"league.{f.name}.{section}"
            own, template = getattr(player, section), player.job.get(section)
            try:
                parsed = from_mapping(parsed_as, deep_merge(template, own) if template else own, path)
            except (TypeError, ValueError) as err:
                message = str(err)
                if message.startswith(f"{path}."):  # "<path>.unroll_len: expected an integer, ..."
                    key, _, rest = message.removeprefix(f"{path}.").partition(": ")
                    raise ConfigError(f"{path}.{key}", rest) from None
                raise ConfigError(path, message.removeprefix(f"{path}: ").removeprefix(f"{section}.")) from None
            if isinstance(parsed, AdderConfig):
                adders[f.name] = parsed
    return adders


def load_config(path: str | Path | None, *, for_training: bool = True) -> Config:
    """The configuration in the YAML file at `path` merged over the defaults; None gives the defaults.
    `for_training`: see `config_from_dict`."""
    if path is None:
        return config_from_dict({}, for_training=for_training)
    data = load_yaml(path)  # its errors name the file already
    try:
        return config_from_dict(data, for_training=for_training)
    except ConfigError as exc:
        raise ConfigError(exc.path, f"{exc.message} (in {path})") from None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The whole configuration as plain data (YAML/JSON-ready); `config_from_dict` reads it back equal."""
    return to_dict(cfg)
