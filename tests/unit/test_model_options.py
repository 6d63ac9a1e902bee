"""Model options for board games: `policy.model.value_bound` (actor-critic values stay inside the bound,
feed-forward and recurrent; the weights keep their names, so checkpoints load either way; a model without a
state value refuses it) and `policy.model.conv_padding` ("same" keeps the board's height and width)."""

from __future__ import annotations

import pytest
import torch

from common.algorithms import ActorCriticModel, RecurrentActorCriticModel
from common.algorithms.models import Torso
from common.computation import TensorSpec
from common.policy_config import ModelConfig, PolicyConfig

OBS = {"observation": TensorSpec("observation", (4,), "float32")}


def _huge_value_bias(model: torch.nn.Module) -> None:
    with torch.no_grad():
        model.value_head.bias.fill_(8.0)


@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_values_stay_inside_the_bound(recurrent):
    torch.manual_seed(0)
    cls = ActorCriticModel if recurrent is None else RecurrentActorCriticModel
    bounded = cls(OBS, 3, ModelConfig(hidden=(8,), recurrent=recurrent, value_bound=1.0))
    unbounded = cls(OBS, 3, ModelConfig(hidden=(8,), recurrent=recurrent))
    assert bounded.state_dict().keys() == unbounded.state_dict().keys()  # same checkpoints
    for model in (bounded, unbounded):
        _huge_value_bias(model)
    inputs = {"observation": torch.randn(16, 4)}
    if recurrent is None:
        values = bounded(inputs)[1]
        assert torch.equal(values, bounded.value(inputs))
        raw = unbounded(inputs)[1]
    else:
        states = {spec.name: torch.zeros(16, *spec.shape) for spec in bounded.get_state_specs()}
        values = bounded.step(inputs, states)[1]
        raw = unbounded.step(inputs, states)[1]
    assert values.shape == (16,) and (values.abs() <= 1.0).all() and (values > 0.99).all()
    assert (raw > 4).all()  # what the bound squashes


def test_small_values_pass_almost_unchanged():
    model = ActorCriticModel(OBS, 3, ModelConfig(hidden=(8,), value_bound=2.0))
    with torch.no_grad():
        model.value_head.weight.zero_()
        model.value_head.bias.fill_(0.1)
    value = model.value({"observation": torch.zeros(1, 4)})
    assert value.item() == pytest.approx(2.0 * torch.tanh(torch.tensor(0.05)).item())
    assert value.item() == pytest.approx(0.1, abs=1e-3)


@pytest.mark.parametrize("bound", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bound_must_be_a_positive_finite_number(bound):
    with pytest.raises(ValueError, match="model.value_bound"):
        ModelConfig(value_bound=bound)


def test_dqn_refuses_a_value_bound():
    with pytest.raises(ValueError, match="value_bound: dqn's model has no state-value head"):
        PolicyConfig.from_mapping({"algorithm": "dqn", "model": {"value_bound": 1.0}})


def test_a_section_for_the_other_algorithm_is_refused_in_a_job_too():
    """Workers parse the policy a job carries with the same check as the league config at load."""
    with pytest.raises(ValueError, match=r"^policy\.ppo: set, but policy\.algorithm is 'dqn'"):
        PolicyConfig.from_mapping({"algorithm": "dqn", "ppo": {"learning_rate": 0.1}})
    assert PolicyConfig.from_mapping({"algorithm": "dqn", "dqn": {"batch_size": 32}}).dqn.batch_size == 32
    assert PolicyConfig.from_mapping({"ppo": {"learning_rate": 0.1}}).ppo.learning_rate == 0.1


BOARD = TensorSpec("observation", (5, 6, 7), "float32")


@pytest.mark.parametrize("padding, width", [("valid", 32 * 2 * 3), ("same", 32 * 6 * 7)])
def test_conv_padding_same_keeps_the_board_size(padding, width):
    config = ModelConfig(conv=((16, 3, 1), (32, 3, 1)), conv_padding=padding, hidden=())
    torso = Torso(BOARD, config, "relu")
    assert torso.out_features == width
    assert torso(torch.zeros(2, 5, 6, 7)).shape == (2, width)


@pytest.mark.parametrize("conv", [(), ((16, 4, 1),), ((16, 3, 2),)])
def test_conv_padding_same_needs_odd_kernels_and_stride_one(conv):
    with pytest.raises(ValueError, match="model.conv_padding 'same' needs model.conv given"):
        ModelConfig(conv=conv, conv_padding="same")


def test_a_conv_stack_that_does_not_fit_the_board_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"model.conv: the conv stack \[\[32, 8, 4\].*\(the default\) does not fit"):
        Torso(BOARD, ModelConfig(), "relu")


def test_the_advice_for_a_board_too_small_for_unpadded_3x3_kernels_is_a_stack_that_fits():
    """On tic-tac-toe's (5, 3, 3) observations the conv [[64, 3, 1], [64, 3, 1]] (the default league's before session
    34) does not fit unpadded, and the error advised that very stack; it now names conv_padding: same, with which
    such a stack fits."""
    board = TensorSpec("observation", (5, 3, 3), "float32")
    stack = ((64, 3, 1), (64, 3, 1))
    with pytest.raises(ValueError, match=r"\(5, 3, 3\).*set policy.model.conv_padding: same") as refused:
        Torso(board, ModelConfig(conv=stack), "relu")
    assert "as the default league's" not in str(refused.value)
    assert Torso(board, ModelConfig(conv=stack, conv_padding="same", hidden=()), "relu").out_features == 64 * 9
    with pytest.raises(ValueError, match=r"as \[\[64, 3, 1\], \[64, 3, 1\]\], or the default league's \[\[32, 3, 1\], "
                       r"\[32, 3, 1\]\] with conv_padding: same"):
        Torso(BOARD, ModelConfig(), "relu")  # a connect-four board: that stack fits it
