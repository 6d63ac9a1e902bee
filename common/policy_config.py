"""The ``policy`` section of a league config as typed dataclasses, free of torch.

Actors and learners build their ComputationTask from it (common/algorithms/registry.py); the coordinator and
`league run` parse it at startup so a typo fails there, naming the key, instead of in a learner's log. Hence
no torch here: the coordinator does not import it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from common.typed_config import from_mapping

ALGORITHM_NAMES = ("ppo", "dqn")
"""The algorithms `common.algorithms.registry` builds."""
RECURRENT_ALGORITHMS = ("ppo",)
"""The algorithms that train recurrent (``model.recurrent``) models."""


MAX_LAYER_WIDTH = 8192
"""The widest layer `policy.model` may name (`hidden` widths, conv channels, `recurrent_size`): one dense layer of
8192 x 8192 is 67M weights (256 MiB of float32, three times that with Adam's moments and the gradient); RL
networks are 64 to a few thousand wide. `hidden: [100000000]` allocated gigabytes in every actor and learner."""
MAX_LAYERS = 64
"""The most layers of `model.hidden`, and of `model.conv`: plain stacks (no residual connections) much deeper
than this do not train."""
MAX_KERNEL = 32
"""The largest conv kernel and stride (the Nature DQN stack's largest kernel is 8); a kernel's weights grow with
its square."""
MAX_MODEL_WEIGHTS = 2**27
"""The most weights the layers `policy.model` sizes on both sides may hold together (dense layer after dense
layer, conv after conv, the recurrent core): 134M, about AlphaStar's whole network (139M), 512 MiB of float32 in
every actor's copy of each player it plays. Layers fed by the env's observations are bounded by their width alone
(the observations' size is known only to workers)."""
MAX_UPDATE_EPOCHS = 100
"""The most passes PPO makes over one batch (published setups use 1 to 32): the learner publishes nothing and
takes in no data meanwhile, and `update_epochs: 1000000000` trained one batch for ever."""
MAX_NUM_MINIBATCHES = 2**20
"""The most minibatches per PPO pass: each is a gradient step, and there is no point in more than the largest
`learner.batch_size` (the league config also checks them against its own `learner.batch_size`)."""
MAX_DQN_BATCH_SIZE = 2**16
"""The most transitions DQN samples per gradient step (DQN-family agents use 32 to 512): each sample is gathered
from the replay and goes through the network and its target network."""
MAX_REPLAY_CAPACITY = 10_000_000
"""The most transitions DQN's replay holds (Ape-X kept 2M): its priority tree and counters are allocated whole
when the learner starts, its storage (observations twice: each transition's and the next one's) at the first
transition, so a huge capacity failed at allocation or swapped the machine."""
MAX_LEARNING_RATE = 1e30
"""Far above any useful rate (Adam's are 1e-5 to 1e-2), and low enough that Adam's step (the rate over its bias
correction, at least a tenth) fits a float32: at 1e38 the optimizer raised an overflow error that failed the
learner, where a rate that merely diverges has its updates rolled back."""
MAX_N_STEP = 100
"""The longest n-step return (Rainbow uses 3, R2D2 5): each transition's window is summed step by step when the
learner takes a chunk in, so the cost grows with unroll_len x n_step."""
MAX_PRIORITY_ALPHA = 1.0
"""The largest prioritization exponent: prioritized replay's range (Schaul et al.: 0 samples uniformly, 1 in
proportion to |TD error|; published agents use 0.5 to 0.7). Far above it, |TD error|^alpha spans more than
float64 holds: at 60 (0.6 written as a percentage) the importance weights of all but the top-priority rows
rounded to 0, so a CartPole DQN stayed at a return of ~12 with nothing said, and a priority that underflows to 0
is refused by the priority tree, which failed the learner."""

MAX_SCALE = 1e6
"""The largest multiplier `model.obs_scale`, `ppo.reward_scale`, `ppo.value_coef`, `ppo.entropy_coef` and
`dqn.priority_eps` may be (useful ones are 1e-3 to 10): the networks and losses compute in float32, whose largest
number is 3.4e38, and 1e39 passed the float64 check to become infinite in every forward (every collect job failed,
or every update rolled back, the errors naming no key; a review). At 1e305 `priority_eps` overflowed DQN's
priority sums and crash-looped the learner."""
MAX_VALUE_BOUND = 1e30
"""The largest `model.value_bound`: far above any return, and within float32 (at 1e39 it is infinite, and
`bound * tanh(v / bound)` is NaN)."""


def _check_at_most(name: str, value: float, maximum: float) -> None:
    if value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")


def _check_finite(name: str, value: float, *, minimum: float, inclusive: bool, null_ok: bool = False) -> None:
    """`value` must be finite and above `minimum` (or equal to it when `inclusive`)."""
    if math.isfinite(value) and (value >= minimum if inclusive else value > minimum):
        return
    bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    raise ValueError(f"{name} must be {bound} and finite{' (or null)' if null_ok else ''}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """The ``policy.model`` section."""

    hidden: tuple[int, ...] = (64, 64)
    """Widths of the fully connected layers (after the conv stack for images)."""
    activation: Literal["tanh", "relu"] | None = None
    """None: the algorithm's usual choice (tanh for PPO, relu for DQN)."""
    conv: tuple[tuple[int, int, int], ...] = ()
    """(out_channels, kernel, stride) per conv layer for (C, H, W) observations; empty: the Nature DQN stack."""
    conv_padding: Literal["valid", "same"] = "valid"
    """"same" pads each conv layer so its output keeps the input's height and width (odd kernels, stride 1):
    for small boards, where "valid" layers shrink a 6x7 board to 2x3 and the cells near the edges reach
    the dense layers through few features. "valid": no padding (pixels)."""
    obs_scale: float = 1.0
    """Observations are multiplied by this (1/255 for uint8 pixels)."""
    shared_torso: bool = False
    """Actor and critic share one torso (usual for conv nets); separate torsos otherwise (CleanRL's MLP).
    A recurrent model always shares its torso and core: both heads read the one memory."""
    recurrent: Literal["gru", "lstm"] | None = None
    """A recurrent core between the torso and the heads, so the policy can remember past observations
    (PPO only); None: feed-forward."""
    recurrent_size: int = 64
    """Width of the recurrent core's state (with ``recurrent``)."""
    value_bound: float | None = None
    """Actor-critic models: values squashed into (-value_bound, value_bound) by ``value_bound * tanh``, for
    envs whose returns stay within that bound (a game won or lost: 1), in the value head's units: PPO's
    ``reward_scale`` multiplies the returns first (a bound of 1 with a scale of 10 caps targets of 10 at 1).
    An unbounded head can overshoot
    there (values of 1.0-1.2 were seen in won connect-four positions), which gives the winning move a
    negative advantage. On the default connect-four league it did not help (BENCHMARKS.md). None: unbounded."""
    obs_norm: bool = False
    """PPO: standardise each observation entry by a running mean and variance before the torso (SB3's
    VecNormalize, CleanRL's NormalizeObservation), for envs whose observation entries differ in scale by orders
    of magnitude (joint angles beside velocities). The learner updates the statistics from every batch it
    trains on; they are buffers of the model, published with its weights, so an actor normalises with those
    of the version it acts with. Scaled by `obs_scale` first."""
    obs_norm_clip: float = 10.0
    """With `obs_norm`: standardised entries are clipped to ±this (SB3's default)."""
    log_std_init: float = 0.0
    """Actor-critic models of an env with a Box (real-valued) action: the Gaussian policy's initial log standard
    deviation, the same for every action entry (0: a std of 1, CleanRL's; -0.5 to -1 for actions bounded to
    [-1, 1], whose samples a std of 1 clips half the time). Learned from there; unused for discrete actions."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.obs_norm_clip) and self.obs_norm_clip > 0):
            raise ValueError(f"model.obs_norm_clip must be a finite number > 0, got {self.obs_norm_clip!r}")
        if not (math.isfinite(self.log_std_init) and -20.0 <= self.log_std_init <= 2.0):
            raise ValueError(f"model.log_std_init must be a finite number within [-20, 2] (a std of 2e-9 to 7.4), "
                             f"got {self.log_std_init!r}")
        if not (math.isfinite(self.obs_scale) and self.obs_scale > 0):
            raise ValueError(f"model.obs_scale must be a finite number > 0, got {self.obs_scale!r}")
        _check_at_most("model.obs_scale", self.obs_scale, MAX_SCALE)
        if self.value_bound is not None and not (math.isfinite(self.value_bound) and self.value_bound > 0):
            raise ValueError(f"model.value_bound must be a finite number > 0 or null, got {self.value_bound!r}")
        if self.value_bound is not None:
            _check_at_most("model.value_bound", self.value_bound, MAX_VALUE_BOUND)
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"model.hidden: widths must be >= 1, got {self.hidden}")
        if self.recurrent_size < 1:
            raise ValueError(f"model.recurrent_size must be >= 1, got {self.recurrent_size}")
        if any(c < 1 or k < 1 or s < 1 for c, k, s in self.conv):
            raise ValueError(f"model.conv: (channels, kernel, stride) must be >= 1, got {self.conv}")
        self._check_size()
        if self.conv_padding == "same" and (not self.conv or any(k % 2 == 0 or s != 1 for _, k, s in self.conv)):
            raise ValueError("model.conv_padding 'same' needs model.conv given, with odd kernels and stride 1, "
                             f"got {self.conv or '[] (the Nature DQN stack)'}")

    def _check_size(self) -> None:
        """Upper limits: a network too large to allocate failed (or swapped) every actor and learner."""
        for name, layers in (("hidden", self.hidden), ("conv", self.conv)):
            if len(layers) > MAX_LAYERS:
                raise ValueError(f"model.{name}: at most {MAX_LAYERS} layers, got {len(layers)}")
        if any(h > MAX_LAYER_WIDTH for h in self.hidden):
            raise ValueError(f"model.hidden: widths must be within [1, {MAX_LAYER_WIDTH}], got {self.hidden}")
        if any(c > MAX_LAYER_WIDTH for c, _, _ in self.conv):
            raise ValueError(f"model.conv: channels must be within [1, {MAX_LAYER_WIDTH}], got {self.conv}")
        if any(k > MAX_KERNEL or s > MAX_KERNEL for _, k, s in self.conv):
            raise ValueError(f"model.conv: kernels and strides must be within [1, {MAX_KERNEL}], got {self.conv}")
        if self.recurrent_size > MAX_LAYER_WIDTH:
            raise ValueError(f"model.recurrent_size must be within [1, {MAX_LAYER_WIDTH}], got {self.recurrent_size}")
        weights = sum(a * b for a, b in itertools.pairwise(self.hidden))
        weights += sum(a[0] * c * k * k for a, (c, k, _) in itertools.pairwise(self.conv))
        if self.recurrent is not None:  # input-to-hidden (from the last dense layer) and hidden-to-hidden, per gate
            gates = 4 if self.recurrent == "lstm" else 3
            weights += gates * self.recurrent_size * (self.recurrent_size + (self.hidden[-1] if self.hidden else 0))
        if weights > MAX_MODEL_WEIGHTS:
            raise ValueError(f"model: the layers sized here hold {weights:,} weights between them, at most "
                             f"{MAX_MODEL_WEIGHTS:,} (hidden {list(self.hidden)}, conv "
                             f"{[list(c) for c in self.conv]}, recurrent_size {self.recurrent_size})")


@dataclass(frozen=True)
class PPOConfig:
    """The ``policy.ppo`` section."""

    learning_rate: float = 2.5e-4
    """Adam step size."""
    anneal_lr_updates: int = 0
    """Decay the learning rate linearly to zero over this many `learn` calls (0: constant)."""
    adam_eps: float = 1e-5
    gamma: float = 0.99
    """Discount factor."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the value targets are formed: values of order 1 for an env whose
    rewards are large (Pendulum's reach -16 a step, its returns -1,600), which a value head otherwise chases with
    the gradient budget `max_grad_norm` shares with the policy. Reported returns stay the env's own."""
    gae_lambda: float = 0.95
    """λ of GAE (and of V-trace's traces c = λ·min(c̄, ratio))."""
    update_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 4
    """Minibatches per pass (the batch's valid steps are shuffled and split)."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    clip_coef: float = 0.2
    """PPO's ratio clip ε."""
    clip_value_loss: bool = True
    """Clip the value change around the start-of-update values (as PPO2 does)."""
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    """Stop the update's remaining epochs once the approximate KL exceeds this (None: never). The KL is taken
    from the log-probabilities the ratio is clipped against: the start-of-update policy's with `vtrace`, the
    actors' with `none` (as CleanRL's, so data from older policies counts toward it too)."""
    off_policy_correction: Literal["none", "vtrace"] = "vtrace"
    """How stale behaviour data is corrected (see the module docstring)."""
    vtrace_rho_clip: float = 1.0
    """ρ̄: truncation of the importance weights in targets and advantages."""
    vtrace_c_clip: float = 1.0
    """c̄: truncation of the trace coefficients; at most ρ̄ (IMPALA's analysis of V-trace assumes c̄ <= ρ̄: the
    traces then never carry more of a step's correction than its own target takes)."""

    def __post_init__(self) -> None:
        # Written as `not (finite and > 0)`: a NaN passes `x <= 0`.
        for name in ("learning_rate", "adam_eps", "clip_coef", "max_grad_norm", "vtrace_rho_clip", "vtrace_c_clip",
                     "reward_scale"):
            _check_finite(f"ppo.{name}", getattr(self, name), minimum=0.0, inclusive=False)
        _check_at_most("ppo.learning_rate", self.learning_rate, MAX_LEARNING_RATE)
        if self.vtrace_c_clip > self.vtrace_rho_clip:
            raise ValueError(f"ppo.vtrace_c_clip ({self.vtrace_c_clip}) must be at most ppo.vtrace_rho_clip "
                             f"({self.vtrace_rho_clip}): V-trace assumes c_clip <= rho_clip (IMPALA, Remark 1)")
        for name in ("value_coef", "entropy_coef"):
            _check_finite(f"ppo.{name}", getattr(self, name), minimum=0.0, inclusive=True)
        for name in ("reward_scale", "value_coef", "entropy_coef"):
            _check_at_most(f"ppo.{name}", getattr(self, name), MAX_SCALE)
        if self.target_kl is not None:  # None: never stop early (0 would stop after the first minibatch)
            _check_finite("ppo.target_kl", self.target_kl, minimum=0.0, inclusive=False, null_ok=True)
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ppo.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("update_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"ppo.{name} must be >= 1, got {getattr(self, name)}")
        _check_at_most("ppo.update_epochs", self.update_epochs, MAX_UPDATE_EPOCHS)
        _check_at_most("ppo.num_minibatches", self.num_minibatches, MAX_NUM_MINIBATCHES)
        if self.anneal_lr_updates < 0:
            raise ValueError(f"ppo.anneal_lr_updates must be >= 0, got {self.anneal_lr_updates}")


@dataclass(frozen=True)
class DQNConfig:
    """The ``policy.dqn`` section; the replay fields configure the learner's `ExpReplayHelper`."""

    learning_rate: float = 1e-3
    """Adam step size."""
    adam_eps: float = 1e-8
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Rewards summed before bootstrapping. A window ends with its trajectory row (at most the player's
    adder_kwargs.unroll_len steps: rows are cut on their own), so the league config refuses n_step above it."""
    double_q: bool = True
    """Pick the next action with the online network, evaluate it with the target network."""
    target_update_period: int = 100
    """`learn` calls between target-network updates."""
    target_update_tau: float = 1.0
    """1.0 copies the online weights; below 1, Polyak-averages them in with this weight."""
    loss: Literal["huber", "mse"] = "huber"
    max_grad_norm: float = 10.0
    replay_capacity: int = 100_000
    """Transitions kept in the replay buffer."""
    batch_size: int = 64
    """Transitions per `learn` call."""
    learning_starts: int = 1000
    """Transitions to collect before the first update."""
    prioritized: bool = True
    """Sample by priority (|TD error|^α) instead of uniformly."""
    priority_alpha: float = 0.6
    priority_beta: float = 0.4
    """Importance-weight exponent at the start (1 corrects the sampling bias fully)."""
    priority_beta_anneal_updates: int = 0
    """Updates over which the exponent rises linearly from `priority_beta` to 1, as in Schaul et al.'s
    prioritized replay (DI-engine's ``IS_weight_anneal_train_iter``): the bias matters most near convergence.
    0: it stays at `priority_beta`."""
    priority_eps: float = 1e-6

    def priority_beta_at(self, updates: int) -> float:
        """The importance-weight exponent after `updates` updates."""
        if self.priority_beta_anneal_updates <= 0:
            return self.priority_beta
        done = min(1.0, max(0, updates) / self.priority_beta_anneal_updates)
        return self.priority_beta + (1.0 - self.priority_beta) * done

    def __post_init__(self) -> None:
        for name in ("learning_rate", "adam_eps", "max_grad_norm", "target_update_tau", "priority_eps"):
            _check_finite(f"dqn.{name}", getattr(self, name), minimum=0.0, inclusive=False)
        _check_at_most("dqn.learning_rate", self.learning_rate, MAX_LEARNING_RATE)
        _check_at_most("dqn.priority_eps", self.priority_eps, MAX_SCALE)
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"dqn.gamma must be in [0, 1], got {self.gamma}")
        if self.target_update_tau > 1.0:
            raise ValueError(f"dqn.target_update_tau must be <= 1, got {self.target_update_tau}")
        for name in ("n_step", "target_update_period", "replay_capacity", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"dqn.{name} must be >= 1, got {getattr(self, name)}")
        for name, maximum in (("n_step", MAX_N_STEP), ("replay_capacity", MAX_REPLAY_CAPACITY),
                              ("batch_size", MAX_DQN_BATCH_SIZE)):
            _check_at_most(f"dqn.{name}", getattr(self, name), maximum)
        if self.priority_beta_anneal_updates < 0:
            raise ValueError(f"dqn.priority_beta_anneal_updates must be >= 0, got {self.priority_beta_anneal_updates}")
        if not 0 <= self.priority_alpha <= MAX_PRIORITY_ALPHA:  # NaN included
            raise ValueError(f"dqn.priority_alpha must be within [0, {MAX_PRIORITY_ALPHA:g}] (0: uniform sampling, "
                             f"1: in proportion to |TD error|), got {self.priority_alpha}")
        if self.learning_starts < 0 or not 0 <= self.priority_alpha < math.inf or not 0 <= self.priority_beta <= 1:
            raise ValueError("dqn: need learning_starts >= 0, a finite priority_alpha >= 0, 0 <= priority_beta <= 1")
        if self.learning_starts > self.replay_capacity:  # the replay never holds that many: no update, ever
            raise ValueError(f"dqn.learning_starts must be at most dqn.replay_capacity ({self.replay_capacity}), "
                             f"got {self.learning_starts}")


@dataclass(frozen=True)
class PolicyConfig:
    """``{"algorithm": "ppo" | "dqn", "model": {...}}`` and the algorithm's own section, ``"ppo": {...}`` or
    ``"dqn": {...}`` (the other one's is refused)."""

    algorithm: str = "ppo"
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHM_NAMES:
            raise ValueError(f"policy.algorithm: {self.algorithm!r} is not one of {sorted(ALGORITHM_NAMES)}")
        if self.model.recurrent is not None and self.algorithm not in RECURRENT_ALGORITHMS:
            raise ValueError(f"policy.model.recurrent: {self.model.recurrent!r} needs algorithm "
                             f"{' or '.join(RECURRENT_ALGORITHMS)}; {self.algorithm} trains feed-forward models only "
                             f"(remove model.recurrent)")
        if self.model.obs_norm and self.algorithm == "dqn":
            raise ValueError("policy.model.obs_norm: PPO only (its learner updates the statistics from the batches "
                             "it trains on once each; DQN's replay samples transitions again and again)")
        if self.model.value_bound is not None and self.algorithm == "dqn":
            raise ValueError("policy.model.value_bound: dqn's model has no state-value head; it bounds only "
                             "actor-critic values (remove model.value_bound)")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | PolicyConfig | None) -> PolicyConfig:
        if isinstance(mapping, Mapping):
            _refuse_other_algorithms(mapping)
        return from_mapping(cls, mapping, "policy")


def _refuse_other_algorithms(mapping: Mapping[str, Any]) -> None:
    """A section for an algorithm the policy does not train (`ppo:` with `algorithm: dqn`) was parsed, checked
    and never read: its settings silently did nothing. Checked on the mapping: the parsed config holds every
    algorithm's section whether given or not. The embedded default's `ppo:` does not reach here beside another
    algorithm: `config_from_dict` drops the default policy for a file that names another one."""
    algorithm = mapping.get("algorithm", PolicyConfig.algorithm)
    if algorithm not in ALGORITHM_NAMES:
        return  # __post_init__ names it
    for other in ALGORITHM_NAMES:
        if other != algorithm and other in mapping:
            raise ValueError(f"policy.{other}: set, but policy.algorithm is {algorithm!r} "
                             f"(its settings are policy.{algorithm})")


PLAY_MODEL_KEYS = ("activation", "obs_scale", "value_bound", "obs_norm_clip")
"""The `policy.model` settings that change what a network computes but none of its weights. A league may change
them between runs (README); a version keeps computing what it was trained to, since its checkpoint's metadata
records them (`play_metadata`, under "model.<name>") and readers build its network with them (`as_published`)."""


def play_metadata(policy: PolicyConfig) -> dict[str, Any]:
    """The checkpoint metadata recording `policy`'s `PLAY_MODEL_KEYS` (a null activation as the model resolves it)."""
    model = policy.model
    values = {
        "activation": model.activation or ("relu" if policy.algorithm == "dqn" else "tanh"),
        "obs_scale": model.obs_scale,
        "value_bound": model.value_bound,
        "obs_norm_clip": model.obs_norm_clip,
    }
    return {f"model.{name}": values[name] for name in PLAY_MODEL_KEYS}


def as_published(policy_config: Mapping[str, Any], metadata: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`policy_config` with the play settings a checkpoint's `metadata` records in place of the config's, and those
    that differ ("activation: tanh -> relu", the config's first); the config as it is, and [], for a checkpoint
    that records none (published before they were recorded) or records what the config would refuse."""
    config = dict(policy_config)
    recorded = {name: metadata[f"model.{name}"] for name in PLAY_MODEL_KEYS if f"model.{name}" in metadata}
    if not recorded:
        return config, []
    current = play_metadata(PolicyConfig.from_mapping(policy_config))
    model = dict(config.get("model") or {})
    changed = []
    for name, value in recorded.items():
        if current[f"model.{name}"] != value:
            changed.append(f"{name}: {current[f'model.{name}']} -> {value}")
            model[name] = value
    if not changed:
        return config, []
    config["model"] = model
    try:
        PolicyConfig.from_mapping(config)
    except (TypeError, ValueError):  # a value no config may have (a hand-edited manifest): the config's, then
        return dict(policy_config), []
    return config, changed


OBS_NORM_SUFFIXES = ("obs_norm.count", "obs_norm.mean", "obs_norm.var")
"""The names (suffixes) of `model.obs_norm`'s running statistics among a network's weights."""


def obs_norm_in_scale(tensors: Mapping[str, Any], metadata: Mapping[str, Any],
                      policy: PolicyConfig) -> tuple[Mapping[str, Any], float | None]:
    """A checkpoint's weights with `obs_norm`'s statistics carried into `policy`'s `obs_scale`, and the factor
    they were carried by (None: nothing to carry: no `obs_norm`, the same scale, nothing recorded, no update yet).

    The statistics are of the observations after `obs_scale` (`Torso`): a learner that went on from a checkpoint
    trained with another `obs_scale` (a league resumed with it changed, which the README allows) standardised
    every entry against a mean and spread in the old units, pinned most of them at ±`obs_norm_clip`, and
    trained on that (a review). With the mean times k and the variance times k² (k = new / old scale), the
    network computes what it did."""
    recorded = metadata.get("model.obs_scale")
    new = policy.model.obs_scale
    if (not policy.model.obs_norm or not isinstance(recorded, int | float) or isinstance(recorded, bool)
            or not (math.isfinite(recorded) and recorded > 0) or recorded == new):
        return tensors, None
    factor = new / recorded
    carried = dict(tensors)
    count_suffix, mean_suffix, var_suffix = OBS_NORM_SUFFIXES
    for name in tensors:
        if not name.endswith(mean_suffix):
            continue
        prefix = name[: -len(mean_suffix)]
        count, var = tensors.get(prefix + count_suffix), tensors.get(prefix + var_suffix)
        if count is None or var is None or not float(count) > 0:  # never updated: the identity, kept as it is
            continue
        carried[name] = tensors[name] * factor
        carried[prefix + var_suffix] = var * (factor * factor)
    return carried, factor


FRESH_INIT_METADATA = "fresh_init"
"""Checkpoint metadata key: true on a learner's publish of its seeded fresh initialisation (untrained). Actors
that play a player the league reset to a fresh initialisation take such a version for the reset's own: it is
built with the learner's seed (`learner.seed`), which the actors do not know."""


def player_seed(player_id: str) -> int:
    """The seed of a player's fresh initialisation: the first 4 bytes of sha256(player_id), little-endian.

    Actors and learners that initialise a player without a checkpoint both use it (``hash()`` is salted per
    process), so a player's version 0 is the same network on both sides.
    """
    return int.from_bytes(hashlib.sha256(player_id.encode()).digest()[:4], "little")
