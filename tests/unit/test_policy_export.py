"""common.algorithms.policy_export: every model kind exports to a file whose module gives the greedy action
the policy plays (the distribution's), with the model's own outputs, at any batch size, and says so in its
policy.json."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.algorithms.models import ActorCriticModel, QNetworkModel
from common.algorithms.policy_export import FORMAT, ExportError, export_policy, load_exported
from common.algorithms.recurrent_models import RecurrentActorCriticModel
from common.computation.specs import BoxActionSpec, MultiDiscreteActionSpec, TensorSpec
from common.policy_config import ModelConfig

BOARD = {"observation": TensorSpec("observation", (3, 6, 7), "float32"),
         "action_mask": TensorSpec("action_mask", (7,), "bool")}
VECTOR = {"observation": TensorSpec("observation", (4,), "float32")}
SOURCE = {"checkpoint": {"path": "p/v0000000003.pt", "version": 3}}


def _rows(rows: int, seed: int, board: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if not board:
        return {"observation": torch.randn(rows, 4, generator=g)}
    mask = torch.rand(rows, 7, generator=g) < 0.5
    mask[:, 3] = True
    return {"observation": (torch.rand(rows, 3, 6, 7, generator=g) < 0.3).float(), "action_mask": mask}


def test_a_board_policy_with_a_mask_exports_its_greedy_legal_move_logits_and_value():
    model = ActorCriticModel(BOARD, 7, ModelConfig(conv=[[8, 3, 1]], hidden=[32]))
    exported = export_policy(model, "ppo", SOURCE)
    policy, meta = load_exported(exported.data)
    assert meta == exported.metadata and meta["format"] == FORMAT and meta["checkpoint"]["version"] == 3
    assert [(i["name"], i["shape"], i["dtype"]) for i in meta["inputs"]] == [
        ("observation", [3, 6, 7], "float32"), ("action_mask", [7], "bool")]
    assert [o["name"] for o in meta["outputs"]] == ["action", "logits", "value"]
    assert meta["action"] == {"kind": "discrete", "num_actions": 7}
    for rows in (1, 9):
        given = _rows(rows, rows, board=True)
        action, logits, value = policy(**given)
        with torch.no_grad():
            want_logits, want_value = model({"observation": given["observation"], "action_mask": given["action_mask"]})
        assert torch.equal(action, torch.argmax(want_logits, -1)) and action.shape == (rows,)
        assert given["action_mask"][torch.arange(rows), action].all()
        assert torch.allclose(logits, want_logits) and torch.allclose(value, want_value, atol=1e-6)


def test_a_box_policy_exports_its_mean_clipped_to_the_box_with_its_running_normalisation():
    spec = BoxActionSpec((2,), (-0.5, -1.0), (0.5, float("inf")))
    model = ActorCriticModel(VECTOR, spec, ModelConfig(hidden=[16], obs_norm=True))
    with torch.no_grad():
        model.policy_head.bias.copy_(torch.tensor([3.0, -0.2]))  # entry 0's mean far past its high bound
        model.actor_torso.update_obs_stats(torch.randn(64, 4) * 5 + 2)
    policy, meta = load_exported(export_policy(model, "ppo", SOURCE).data)
    assert meta["action"] == {"kind": "box", "shape": [2], "low": [-0.5, -1.0], "high": [0.5, None]}
    assert [o["name"] for o in meta["outputs"]] == ["action", "mean_and_log_std", "value"]
    given = _rows(6, 0, board=False)
    action, params, _ = policy(**given)
    with torch.no_grad():
        want, _ = model(given)
    mean = want[:, :2].numpy()
    assert np.allclose(action.numpy(), np.stack([spec.clip(row) for row in mean])) and (action[:, 0] == 0.5).all()
    assert torch.allclose(params, want)


def test_a_multi_discrete_policy_exports_one_choice_per_entry_in_the_actions_shape():
    spec = MultiDiscreteActionSpec((2,), (3, 4))
    model = ActorCriticModel(VECTOR, spec, ModelConfig(hidden=[16]))
    policy, meta = load_exported(export_policy(model, "ppo", SOURCE).data)
    assert meta["action"] == {"kind": "multi_discrete", "shape": [2], "nvec": [3, 4]}
    given = _rows(5, 3, board=False)
    action = policy(**given)[0]
    with torch.no_grad():
        logits, _ = model(given)
    assert torch.equal(action, torch.stack([logits[:, :3].argmax(-1), logits[:, 3:].argmax(-1)], -1))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_a_recurrent_policy_takes_its_state_and_gives_the_next_one(kind):
    model = RecurrentActorCriticModel(BOARD, 7, ModelConfig(conv=[[8, 3, 1]], hidden=[32], recurrent=kind,
                                                            recurrent_size=16))
    policy, meta = load_exported(export_policy(model, "ppo", SOURCE).data)
    names = ["hidden"] if kind == "gru" else ["hidden", "cell"]
    assert meta["recurrent"] == kind and [i["name"] for i in meta["inputs"]][2:] == names
    assert [o["name"] for o in meta["outputs"]] == ["action", "logits", "value", *names]
    state = {name: torch.zeros(2, 16) for name in names}
    want_state = dict(state)
    for step in range(4):  # a few steps carried along: the memory is the model's
        given = _rows(2, step, board=True)
        action, logits, value, *next_state = policy(**given, **state)
        with torch.no_grad():
            want_logits, want_value, want_state = model.step(given, want_state)
        assert torch.equal(action, want_logits.argmax(-1)) and torch.allclose(logits, want_logits, atol=1e-5)
        for name, tensor in zip(names, next_state, strict=True):
            assert torch.allclose(tensor, want_state[name], atol=1e-5)
        state = dict(zip(names, next_state, strict=True))


def test_a_q_network_exports_its_argmax_and_q_values_and_the_model_is_left_as_it_was():
    model = QNetworkModel(VECTOR, 2, ModelConfig(hidden=[16])).train()
    policy, meta = load_exported(export_policy(model, "dqn", SOURCE).data)
    assert model.training  # exported from a copy
    assert meta["algorithm"] == "dqn" and [o["name"] for o in meta["outputs"]] == ["action", "q_values"]
    given = _rows(3, 0, board=False)
    action, q_values = policy(**given)
    with torch.no_grad():
        assert torch.equal(action, model(given).argmax(-1)) and torch.allclose(q_values, model(given))


def test_inputs_of_another_shape_are_refused_by_the_exported_module():
    policy, _ = load_exported(export_policy(ActorCriticModel(VECTOR, 2, ModelConfig(hidden=[8])), "ppo", SOURCE).data)
    with pytest.raises(Exception, match="observation"):
        policy(observation=torch.zeros(2, 5))


def test_a_module_of_another_kind_is_refused():
    with pytest.raises(ExportError, match="cannot be exported"):
        export_policy(torch.nn.Linear(4, 2), "ppo", SOURCE)


def test_a_float64_box_policy_exports_the_action_league_eval_sends_inside_the_box():
    """Clipped in float32, a float64 Box's bound of 0.1 came out as 0.10000000149: outside the Box, and not the
    0.1 that `league eval` sends (`BoxActionSpec.clip`: clipped in float64, then in the env's dtype)."""
    spec = BoxActionSpec((2,), (-0.1, 0.2), (0.1, 1 / 3))
    model = ActorCriticModel(VECTOR, spec, ModelConfig(hidden=[8]))
    with torch.no_grad():
        model.policy_head.bias.copy_(torch.tensor([5.0, -5.0]))  # means past the high bound, then the low
    exported = export_policy(model, "ppo", SOURCE, action_dtype="float64")
    policy, meta = load_exported(exported.data)
    assert meta["outputs"][0] == {"name": "action", "shape": [2], "dtype": "float64"}
    given = _rows(4, 0, board=False)
    action = policy(**given)[0]
    with torch.no_grad():
        mean = model(given)[0][:, :2].numpy()
    want = np.stack([spec.clip(row, np.float64) for row in mean])
    assert action.dtype == torch.float64 and np.array_equal(action.numpy(), want)
    assert (action.numpy() <= np.array(spec.high)).all() and (action.numpy() >= np.array(spec.low)).all()
    with pytest.raises(ExportError, match="action_dtype"):
        export_policy(model, "ppo", SOURCE, action_dtype="int64")
