"""What a league's checkpoints and payoff are bound to, so that a state is never resumed with a config of another.

A league's historical players are checkpoints of one network shape trained on one env; its payoff and ratings
are games of that env. A coordinator started on such a state with a config of another env or network served
it with one warning line: the connect-four payoff then matched tic-tac-toe jobs, and every learner failed on
checkpoints its network did not fit. `league run` refused it from the run directory's config.yaml; the state
database keeps this identity itself, so `league coordinator --state` refuses it too.

An OpenSpiel game's `game_params` make another game of the same name (hex's board_size, connect four's rows and
columns: other observation and action shapes, and payoff entries of another game), so they are part of it.
Other env kwargs (a gymnasium env's episode limit, say) may change between runs of one league.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from common.envs.registry import OPENSPIEL_PREFIX
from common.policy_config import PolicyConfig
from league_service.config import Config
from league_service.env_fit import openspiel_game, player_envs

WEIGHT_SHAPING_MODEL_KEYS = ("hidden", "conv", "conv_padding", "shared_torso", "recurrent", "recurrent_size",
                             "obs_norm")
"""The `policy.model` settings that decide which weights a network has and their shapes (activation, obs_scale,
value_bound and the algorithm's hyperparameters may change between runs of one league). `obs_norm` adds the
running statistics' buffers."""
ADDED_MODEL_KEY_DEFAULTS = {"obs_norm": False}
"""Weight-shaping keys added after leagues were saved without them: a saved identity that lacks one had the
default (no such weights), not a change."""


def unread_model_keys(algorithm: str, model: dict[str, Any]) -> frozenset[str]:
    """The weight-shaping keys a network of `algorithm` with these `model` settings does not read: a feed-forward
    network has no recurrent core (`recurrent_size` shapes nothing), and only PPO's feed-forward actor-critic has
    a torso of its own for the critic (a recurrent model always shares its torso, DQN's Q-network has one)."""
    unread = set()
    if model.get("recurrent") is None:
        unread.add("recurrent_size")
    if algorithm != "ppo" or model.get("recurrent") is not None:
        unread.add("shared_torso")
    return frozenset(unread)


@dataclass(frozen=True)
class LeagueIdentity:
    env: str
    """The env's name, without OpenSpiel's optional prefix (`openspiel:connect_four` is `connect_four`)."""
    algorithm: str
    model: dict[str, Any]
    """The weight-shaping model settings, as JSON values (lists, not tuples)."""
    game_params: dict[str, Any] | None = None
    """An OpenSpiel league's `game_params` by active player type (as each type's jobs carry them: `{}` for the
    game's defaults); `{}` for any other env. None: not recorded (an identity saved before it was), not compared."""

    @classmethod
    def of(cls, cfg: Config) -> LeagueIdentity:
        """With the policy's defaults filled in, so that a default written out is the same league. A policy
        section that does not parse (a config loaded from a file never has one: its policy is checked at
        load) is taken as written: its workers fail its jobs with the reason, the coordinator serves on."""
        env = cfg.env.name.removeprefix(OPENSPIEL_PREFIX)
        game_params = _game_params(cfg)
        try:
            policy = PolicyConfig.from_mapping(cfg.policy)
        except ValueError:
            model = cfg.policy.get("model")
            model = model if isinstance(model, dict) else {}
            written = {name: model.get(name) for name in WEIGHT_SHAPING_MODEL_KEYS}
            return cls(env, str(cfg.policy.get("algorithm")), json.loads(json.dumps(written, default=str)),
                       game_params)
        model = {name: getattr(policy.model, name) for name in WEIGHT_SHAPING_MODEL_KEYS}
        return cls(env, policy.algorithm, json.loads(json.dumps(model)), game_params)

    def to_json(self) -> str:
        return json.dumps({"env": self.env, "algorithm": self.algorithm, "model": self.model,
                           "game_params": self.game_params}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeagueIdentity:
        """Raises ValueError for a document that is not one."""
        data = json.loads(text)
        if not (isinstance(data, dict) and isinstance(data.get("env"), str) and isinstance(data.get("algorithm"), str)
                and isinstance(data.get("model"), dict) and isinstance(data.get("game_params"), dict | None)):
            raise ValueError(f"not a league identity: {text[:200]!r}")
        return cls(data["env"], data["algorithm"], data["model"], data.get("game_params"))

    @property
    def complete(self) -> bool:
        """Whether every part is recorded (an identity saved before `game_params` were is not)."""
        return self.game_params is not None

    def first_change(self, other: LeagueIdentity) -> tuple[str, Any, Any] | None:
        """(config key, this league's value, `other`'s) of the first setting in which `other` differs, or None."""
        pairs = [("env.name", self.env, other.env), ("policy.algorithm", self.algorithm, other.algorithm)]
        # A key neither network reads is no change (`recurrent_size` of two feed-forward networks): comparing it
        # refused a resume whose checkpoints fit, saying they did not. Where only one network reads it, another
        # key (`recurrent`, `policy.algorithm`) differs too.
        unused = unread_model_keys(self.algorithm, self.model) & unread_model_keys(other.algorithm, other.model)
        pairs += [(f"policy.model.{name}", self.model.get(name, ADDED_MODEL_KEY_DEFAULTS.get(name)),
                   other.model.get(name, ADDED_MODEL_KEY_DEFAULTS.get(name)))
                  for name in WEIGHT_SHAPING_MODEL_KEYS if name not in unused]
        if self.game_params is not None and other.game_params is not None and self.env == other.env:
            pairs += _game_params_pairs(self.game_params, other.game_params)
        for key, mine, theirs in pairs:
            if mine != theirs:
                return key, mine, theirs
        return None


def _game_params_pairs(mine: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, mine, theirs) per player type of both; `env.kwargs.game_params` where every type has the same."""
    types = sorted(mine.keys() & theirs.keys())
    if types and all(mine[t] == mine[types[0]] and theirs[t] == theirs[types[0]] for t in types):
        return [("env.kwargs.game_params", mine[types[0]], theirs[types[0]])]
    return [(f"game_params of {t}'s jobs", mine[t], theirs[t]) for t in types]


def _game_params(cfg: Config) -> dict[str, Any]:
    """Each active player type's `game_params` as its jobs carry them (JSON values), for an OpenSpiel env; the
    game's defaults given explicitly are left out, as not given (`rows: 6` of connect four is the same game)."""
    game = openspiel_game(cfg.env.name)
    if game is None:
        return {}
    defaults = _default_params(game)
    kwargs = cfg.env.kwargs if isinstance(cfg.env.kwargs, dict) else {}
    out = {}
    for player in player_envs(kwargs, cfg.league):
        params = json.loads(json.dumps(player.kwargs.get("game_params") or {}, default=str))
        if isinstance(params, dict):
            params = {k: v for k, v in params.items() if k not in defaults or not _same_value(v, defaults[k])}
        out[player.player_type] = params
    return out


def _default_params(game: str) -> dict[str, Any]:
    """The game's parameters at their defaults (from pyspiel's registry: no game is loaded)."""
    import pyspiel

    for game_type in pyspiel.registered_games():
        if game_type.short_name == game:
            return dict(game_type.parameter_specification)
    return {}


def _same_value(given: Any, default: Any) -> bool:
    """A parameter given as its default (an OpenSpiel float parameter may be written as a whole number)."""
    if isinstance(default, bool) or isinstance(given, bool):
        return given is default
    if isinstance(default, int | float) and isinstance(given, int | float):
        return float(given) == float(default)
    return given == default
