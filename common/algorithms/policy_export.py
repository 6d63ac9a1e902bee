"""A trained policy as one file that runs without this package: `torch.export` of its greedy forward pass.

Why: a checkpoint holds weights whose meaning is this package's model code and config, so a policy trained here
could only be played by `league eval`. The export is a graph of torch operations with the weights in it (the
observation scaling and running normalisation, the legal-action mask, a recurrent core included), loaded with
``torch.export.load(path).module()`` where only torch is installed, and called with keyword arguments::

    policy = torch.export.load("policy.pt2").module()
    action, logits, value = policy(observation=obs, action_mask=mask)  # a batch of rows; names in policy.json

Its ``policy.json`` (an extra file of the archive, read by `load_exported`) names the inputs and outputs with their
per-row shapes and dtypes, the action space and the checkpoint it came from. The action is the greedy one (the
most probable choice, or a Gaussian's mean clipped to the Box in float64 and given in the env's dtype), as `league
eval` plays; the policy's parameters are there for callers that sample. An export is checked before it is handed
out: loaded back and run on random inputs of two batch sizes, it must give the same actions and (to float32
rounding) the same outputs as the model.
"""

from __future__ import annotations

import copy
import io
import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from common.algorithms.distributions import Categorical, DiagGaussian, MultiCategorical
from common.algorithms.models import ActorCriticModel, QNetworkModel
from common.algorithms.recurrent_models import RecurrentActorCriticModel
from common.computation.specs import ACTION_MASK, BoxActionSpec, DiscreteActionSpec, MultiDiscreteActionSpec
from common.trajectory import OBSERVATION

FORMAT = "league-policy-export/1"
METADATA_FILE = "policy.json"
MAX_BATCH = 1 << 20
"""Rows per call the export accepts (the batch dimension is dynamic up to this)."""


class ExportError(ValueError):
    """The model cannot be exported, or its export does not reproduce it."""


@dataclass(frozen=True)
class TensorIO:
    """One input or output of the exported policy: its keyword, per-row shape (the batch dimension comes first
    and is left out) and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ExportedPolicy:
    """The archive's bytes (`torch.export.save`) and what its policy.json says."""

    data: bytes
    metadata: dict[str, Any]


class _GreedyPolicy(nn.Module):
    """The model's one-step forward with the greedy action in front: the module `torch.export` traces. Its
    keyword inputs are the model's (the observation, the legal-action mask where the env gives one, a recurrent
    core's state); its outputs are a tuple in the order of `outputs`."""

    def __init__(self, model: nn.Module, state_names: tuple[str, ...], action_dtype: torch.dtype) -> None:
        super().__init__()
        self.model = model
        self.state_names = state_names
        distribution = getattr(model, "distribution", None)
        self.distribution = distribution
        self.action_dtype = action_dtype
        if isinstance(distribution, DiagGaussian):
            # The env receives the mean clipped to its Box as `BoxActionSpec.clip` gives it: clipped in float64, then
            # in the env's dtype. Clipped in float32, a float64 Box's bound of 0.1 came out as 0.10000000149, outside.
            self.register_buffer("low", torch.tensor(distribution.spec.low, dtype=torch.float64))
            self.register_buffer("high", torch.tensor(distribution.spec.high, dtype=torch.float64))

    def forward(self, observation: torch.Tensor, action_mask: torch.Tensor | None = None,
                hidden: torch.Tensor | None = None, cell: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        inputs = {OBSERVATION: observation}
        if action_mask is not None:
            inputs[ACTION_MASK] = action_mask
        if isinstance(self.model, QNetworkModel):
            q_values = self.model(inputs)
            return torch.argmax(q_values, dim=-1), q_values
        if isinstance(self.model, RecurrentActorCriticModel):
            given = {"hidden": hidden, "cell": cell}
            params, value, next_states = self.model.step(inputs, {k: given[k] for k in self.state_names})
            return (self._action(params), params, value, *(next_states[k] for k in self.state_names))
        params, value = self.model(inputs)
        return self._action(params), params, value

    def _action(self, params: torch.Tensor) -> torch.Tensor:
        assert self.distribution is not None
        action = self.distribution.greedy(params)
        if isinstance(self.distribution, DiagGaussian):
            flat = action.reshape(*action.shape[: action.ndim - len(self.distribution.spec.shape)], -1)
            clipped = torch.minimum(torch.maximum(flat.to(torch.float64), self.low), self.high)
            action = clipped.to(self.action_dtype).reshape(action.shape)
        return action


def export_policy(model: nn.Module, algorithm: str, source: Mapping[str, Any],
                  action_dtype: str = "float32") -> ExportedPolicy:
    """`model` (built for its env's specs, weights loaded) as an export archive; `source` (the checkpoint, env)
    goes into policy.json as it is; `action_dtype` is the env's dtype of a Box action (the action output's; unused
    for the other kinds). ExportError when the model is of no exportable kind or its export does not reproduce
    it."""
    if not isinstance(model, ActorCriticModel | RecurrentActorCriticModel | QNetworkModel):
        raise ExportError(f"a {type(model).__name__} cannot be exported: the export knows the actor-critic, "
                          "recurrent actor-critic and Q-network models")
    model = copy.deepcopy(model).eval()  # the caller's model keeps its mode
    model.requires_grad_(False)  # a policy to play: its outputs need no autograd graph
    dtype = getattr(torch, action_dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ExportError(f"action_dtype: a Box action's dtype is a float one (float32, float64), got {action_dtype!r}")
    inputs = _inputs(model)
    state_names = tuple(s.name for s in model.get_state_specs()) if isinstance(model, RecurrentActorCriticModel) else ()
    wrapper = _GreedyPolicy(model, state_names, dtype).eval()
    outputs = _outputs(model, state_names, action_dtype)
    examples = _random_inputs(inputs, rows=2, seed=0)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    with torch.no_grad(), warnings.catch_warnings():
        # An LSTM's flattened weights are assigned during tracing: torch says so, and the check below covers it.
        warnings.filterwarnings("ignore", message=".*were assigned during export.*")
        try:
            program = torch.export.export(wrapper, (), kwargs=examples,
                                          dynamic_shapes={name: {0: batch} for name in examples})
        except Exception as err:  # torch's own tracing errors have no common base class
            raise ExportError(f"torch.export could not trace the model: {type(err).__name__}: {err}") from err
    metadata = {
        "format": FORMAT,
        "algorithm": algorithm,
        "recurrent": _recurrent_kind(model),
        "inputs": [asdict(i) for i in inputs],
        "outputs": [asdict(o) for o in outputs],
        "action": _action_metadata(model),
        "call": _call_line(inputs, outputs),
        "max_batch": MAX_BATCH,  # rows a call may take (the traced batch dimension's bound)
        "torch": torch.__version__,
        **source,
    }
    text = json.dumps(metadata, indent=1, default=_json_default)
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={METADATA_FILE: text})
    data = buffer.getvalue()
    _check_reproduces(wrapper, data, inputs, outputs)
    return ExportedPolicy(data, json.loads(text))  # as a reader of policy.json gets it (lists, not tuples)


def load_exported(data: bytes) -> tuple[nn.Module, dict[str, Any]]:
    """An export archive's callable module and its policy.json."""
    extra = {METADATA_FILE: ""}
    program = torch.export.load(io.BytesIO(data), extra_files=extra)
    return program.module(), json.loads(extra[METADATA_FILE])


def _inputs(model: nn.Module) -> tuple[TensorIO, ...]:
    """The keyword inputs: the observation, the mask where the env declares one (an optional mask, absent = all
    legal, is left out), then a recurrent core's state."""
    specs = [model.obs_spec]
    if model.mask_spec is not None and not model.mask_spec.optional:
        specs.append(model.mask_spec)
    if isinstance(model, RecurrentActorCriticModel):
        specs.extend(model.get_state_specs())
    return tuple(TensorIO(s.name, tuple(int(d) for d in s.shape), str(s.dtype)) for s in specs)


def _outputs(model: nn.Module, state_names: tuple[str, ...], action_dtype: str) -> tuple[TensorIO, ...]:
    if isinstance(model, QNetworkModel):
        return TensorIO("action", (), "int64"), TensorIO("q_values", (model.num_actions,), "float32")
    distribution = model.distribution
    spec = distribution.spec
    if isinstance(distribution, Categorical):
        action, params = TensorIO("action", (), "int64"), TensorIO("logits", (spec.num_actions,), "float32")
    elif isinstance(distribution, MultiCategorical):
        action = TensorIO("action", tuple(spec.shape), "int64")
        params = TensorIO("logits", (distribution.head_size,), "float32")
    else:
        action = TensorIO("action", tuple(spec.shape), action_dtype)
        params = TensorIO("mean_and_log_std", (2 * distribution.size,), "float32")
    states = tuple(TensorIO(name, (model.core.size,), "float32") for name in state_names)
    return (action, params, TensorIO("value", (), "float32"), *states)


def _recurrent_kind(model: nn.Module) -> str | None:
    return model.core.kind if isinstance(model, RecurrentActorCriticModel) else None


def _action_metadata(model: nn.Module) -> dict[str, Any]:
    spec = getattr(model, "action_spec", None)
    if isinstance(model, QNetworkModel) or isinstance(spec, DiscreteActionSpec):
        n = model.num_actions if isinstance(model, QNetworkModel) else spec.num_actions
        return {"kind": "discrete", "num_actions": int(n)}
    if isinstance(spec, MultiDiscreteActionSpec):
        return {"kind": "multi_discrete", "shape": list(spec.shape), "nvec": [int(n) for n in spec.nvec]}
    assert isinstance(spec, BoxActionSpec)
    # JSON has no infinity: an unbounded side is null.
    return {"kind": "box", "shape": list(spec.shape),
            "low": [x if math.isfinite(x) else None for x in spec.low],
            "high": [x if math.isfinite(x) else None for x in spec.high]}


def _call_line(inputs: tuple[TensorIO, ...], outputs: tuple[TensorIO, ...]) -> str:
    args = ", ".join(f"{i.name}=<{i.dtype} (B, {', '.join(map(str, i.shape))})>".replace(", )", ")") for i in inputs)
    return f"policy({args}) -> ({', '.join(o.name for o in outputs)})"


def _json_default(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _random_inputs(inputs: tuple[TensorIO, ...], rows: int, seed: int) -> dict[str, torch.Tensor]:
    """Inputs of `rows` rows: observations and states from a normal draw (integer observations from 0-255), masks
    with a random legal set that is never empty."""
    generator = torch.Generator().manual_seed(seed)
    drawn = {}
    for spec in inputs:
        shape = (rows, *spec.shape)
        dtype = getattr(torch, spec.dtype)
        if spec.dtype == "bool":
            mask = torch.rand(shape, generator=generator) < 0.6
            mask[..., 0] |= ~mask.any(-1)
            drawn[spec.name] = mask
        elif dtype.is_floating_point:
            drawn[spec.name] = torch.randn(shape, generator=generator).to(dtype)
        else:
            drawn[spec.name] = torch.randint(0, 256, shape, generator=generator).to(dtype)
    return drawn


def _check_reproduces(wrapper: nn.Module, data: bytes, inputs: tuple[TensorIO, ...],
                      outputs: tuple[TensorIO, ...]) -> None:
    loaded, _ = load_exported(data)
    for rows, seed in ((1, 1), (5, 2)):
        given = _random_inputs(inputs, rows, seed)
        with torch.no_grad():
            want, got = wrapper(**given), loaded(**given)
        for spec, w, g in zip(outputs, want, got, strict=True):
            same = torch.equal(w, g) if spec.name == "action" and spec.dtype == "int64" else (
                w.shape == g.shape and torch.allclose(w, g, rtol=1e-4, atol=1e-5))
            if not same:
                raise ExportError(f"the exported policy's {spec.name!r} differs from the model's on {rows} random "
                                  "row(s): the export would not play this policy")
