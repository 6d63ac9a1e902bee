"""Recurrent policies in common/: config keys, state specs and shapes, predict carrying states, the learner's
unroll reproducing the actor's steps, the trajectory codec with hidden states, and CDP routing of state rows."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from common.algorithms import RecurrentActorCriticModel, RecurrentPPO, make_computation_task
from common.algorithms.ppo import STATE_PREFIX, batch_from_trajectory
from common.algorithms.recurrent_ppo import episode_starts
from common.computation import ComputationDataProcessor, TensorSpec
from common.policy_config import PolicyConfig
from common.tensor_codec import ChunkHeader, decode_chunk, encode_chunk
from common.trajectory import AgentStep, TrajectoryBuilder, hidden_state_key
from league_service.config import ConfigError, config_from_dict

OBS = TensorSpec("observation", (5,))
GRU = {"algorithm": "ppo", "model": {"hidden": [16], "recurrent": "gru", "recurrent_size": 8}}
LSTM = {"algorithm": "ppo", "model": {"hidden": [16], "recurrent": "lstm", "recurrent_size": 8}}


def task_of(config, seed=0):
    return make_computation_task(config, OBS, 3, device="cpu", seed=seed)


def observations(rng, *lead):
    return rng.normal(size=(*lead, 5)).astype(np.float32)


# ---- config ---------------------------------------------------------------------------------------------------
def test_recurrent_keys_build_a_recurrent_ppo_with_state_specs():
    gru, lstm = task_of(GRU), task_of(LSTM)
    assert isinstance(gru.algorithm, RecurrentPPO) and isinstance(gru.algorithm.model, RecurrentActorCriticModel)
    assert gru.state_specs == (TensorSpec("hidden", (8,)),)
    assert lstm.state_specs == (TensorSpec("hidden", (8,)), TensorSpec("cell", (8,)))
    assert {s.name for s in lstm.learn_specs} >= {"state_hidden", "state_cell"}
    feed_forward = task_of({"algorithm": "ppo"})
    assert feed_forward.state_specs == () and not any(s.name.startswith(STATE_PREFIX) for s in feed_forward.learn_specs)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"algorithm": "dqn", "model": {"recurrent": "gru"}}, "policy.model.recurrent: 'gru' needs algorithm ppo"),
        ({"model": {"recurrent": "rnn"}}, "policy.model.recurrent: expected one of ['gru', 'lstm']"),
        ({"model": {"recurrent": "gru", "recurrent_size": 0}}, "model.recurrent_size must be >= 1"),
    ],
)
def test_bad_recurrent_configs_fail_at_league_config_load_naming_the_key(policy, message):
    with pytest.raises(ConfigError, match="recurrent") as info:
        config_from_dict({"policy": policy})
    assert message in str(info.value)
    with pytest.raises(ValueError, match="recurrent"):
        PolicyConfig.from_mapping(policy)


# ---- acting ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [GRU, LSTM], ids=["gru", "lstm"])
def test_predict_returns_each_rows_next_state_and_the_state_changes_the_output(config):
    task = task_of(config)
    rng = np.random.default_rng(0)
    obs = observations(rng, 4)
    first = task.predict({"observation": obs}, task.initial_states(4), {"greedy": True})
    assert set(first.states) == {s.name for s in task.state_specs}
    for spec in task.state_specs:
        assert first.states[spec.name].shape == (4, 8) and first.states[spec.name].dtype == np.float32
        assert not np.allclose(first.states[spec.name], 0.0)
    # The same observation seen with a memory of the past gives another value than with a fresh memory.
    again = task.predict({"observation": obs}, first.states, {"greedy": True})
    assert not np.allclose(again.artifacts["value"], first.artifacts["value"])
    # Rows are independent: row 2 alone with its state gives what it got in the batch.
    alone = task.predict({"observation": obs[2:3]}, {k: v[2:3] for k, v in first.states.items()}, {"greedy": True})
    np.testing.assert_allclose(alone.artifacts["value"], again.artifacts["value"][2:3], rtol=1e-5, atol=1e-6)
    for name, value in alone.states.items():
        np.testing.assert_allclose(value, again.states[name][2:3], rtol=1e-5, atol=1e-6)


def test_predict_without_states_names_the_missing_state():
    task = task_of(GRU)
    with pytest.raises(ValueError, match="states: missing 'hidden'"):
        task.predict({"observation": np.zeros((2, 5), np.float32)})
    with pytest.raises(ValueError, match="hidden"):
        task.predict({"observation": np.zeros((2, 5), np.float32)}, {"hidden": np.zeros((2, 7), np.float32)})


# ---- learning: the unroll reproduces the actor's steps ----------------------------------------------------------
def act_segment(task, rng, rows=3, steps=7, episode_len=3):
    """(rows, steps) of acting with the state carried per row and reset after every episode end; episodes end
    at different steps per row, and each row starts mid-way into an episode (a non-zero recorded state)."""
    builder = TrajectoryBuilder(rows, steps)
    states = task.predict({"observation": observations(rng, rows)}, task.initial_states(rows)).states
    offsets = np.arange(rows)
    for t in range(steps):
        obs = observations(rng, rows)
        prediction = task.predict({"observation": obs}, states)
        done = (t + offsets) % episode_len == episode_len - 1
        builder.add(obs, {"agent": AgentStep(prediction.actions["action"], prediction.artifacts, states)},
                    np.zeros(rows), done & (offsets != 1), done & (offsets == 1))
        initial = task.initial_states(rows)
        states = {k: np.where(done[:, None], initial[k], v) for k, v in prediction.states.items()}
    return builder.build(observations(rng, rows))


@pytest.mark.parametrize("config", [GRU, LSTM], ids=["gru", "lstm"])
def test_learn_time_unroll_reproduces_the_behaviour_log_probabilities(config):
    task = task_of(config)
    trajectory = act_segment(task, np.random.default_rng(1))
    batch = batch_from_trajectory(trajectory, state_names=[s.name for s in task.state_specs])
    model = task.algorithm.model
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    with torch.no_grad():
        logits, values, _ = model.unroll(
            {"observation": t["observation"]},
            {s.name: t[STATE_PREFIX + s.name] for s in task.state_specs},
            episode_starts(t["terminated"], t["truncated"]),
        )
    logp = torch.log_softmax(logits, -1).gather(-1, t["action"][..., None]).squeeze(-1)
    np.testing.assert_allclose(logp.numpy(), batch["behaviour_logp"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values.numpy(), trajectory.artifacts()["value"], rtol=1e-4, atol=1e-5)


def test_recurrent_learn_trains_on_whole_rows_and_reports_on_policy_data():
    task = task_of({**GRU, "ppo": {"num_minibatches": 2, "update_epochs": 2}})
    batch = batch_from_trajectory(act_segment(task, np.random.default_rng(2), rows=4), state_names=["hidden"])
    before = task.get_weights()
    result = task.learn(batch)
    assert task.version == 1
    assert result.stats["behaviour_ratio"] == pytest.approx(1.0, abs=1e-4)  # the unroll matched the actor
    assert 0 < result.stats["samples"] <= 4 * 7
    assert any(not np.array_equal(before[k], v) for k, v in task.get_weights().items())
    missing = {k: v for k, v in batch.items() if k != "state_hidden"}
    with pytest.raises(ValueError, match="missing 'state_hidden'"):
        task.learn(missing)



def test_recurrent_bootstrap_uses_the_state_each_row_ends_in_and_values_learn_the_targets():
    """The bootstrap value is V(next observation) with the state the actor carries on with, not the row's first
    recorded state; and the value head is trained towards the targets (its loss is not zero from the start)."""
    task = task_of({**GRU, "ppo": {"num_minibatches": 1, "update_epochs": 1}})
    rng = np.random.default_rng(3)
    rows, steps = 3, 5
    builder = TrajectoryBuilder(rows, steps)
    states = task.predict({"observation": observations(rng, rows)}, task.initial_states(rows)).states
    for _ in range(steps):  # no episode ends: every row carries its state to the next observation
        obs = observations(rng, rows)
        prediction = task.predict({"observation": obs}, states)
        builder.add(obs, {"agent": AgentStep(prediction.actions["action"], prediction.artifacts, states)},
                    np.ones(rows), np.zeros(rows, bool), np.zeros(rows, bool))
        states = prediction.states
    next_obs = observations(rng, rows)
    expected = task.predict({"observation": next_obs}, states).artifacts["value"]
    batch = batch_from_trajectory(builder.build(next_obs), state_names=["hidden"])
    model = task.algorithm.model
    seen = []
    real_value = model.value
    model.value = lambda inputs, states: seen.append(real_value(inputs, states)) or seen[-1]
    try:
        stats = task.learn(batch).stats
    finally:
        del model.value
    (bootstrap,) = seen
    np.testing.assert_allclose(bootstrap.numpy(), expected, rtol=1e-4, atol=1e-5)
    assert stats["value_loss"] > 1e-6


# ---- trajectory codec -----------------------------------------------------------------------------------------
def test_the_trajectory_codec_round_trips_hidden_states():
    task = task_of(LSTM)
    trajectory = act_segment(task, np.random.default_rng(3))
    assert set(trajectory.hidden_state()) == {"hidden", "cell"}
    decoded = decode_chunk(encode_chunk(trajectory, ChunkHeader("job", "p", "w", 0, 3))).trajectory
    for name in ("hidden", "cell"):
        key = hidden_state_key("agent", name)
        assert decoded.tensors[key].shape == (3, 7, 8)
        np.testing.assert_array_equal(decoded.tensors[key], trajectory.tensors[key])
    np.testing.assert_array_equal(decoded.hidden_state()["cell"], trajectory.hidden_state()["cell"])


# ---- CDP: every caller gets its own state rows back -----------------------------------------------------------
def test_cdp_routes_each_callers_state_rows_back_to_it():
    task = task_of(LSTM)
    rng = np.random.default_rng(4)
    callers = []
    for rows in (1, 3, 2, 4, 1, 2):
        obs = observations(rng, rows)
        states = {k: rng.normal(size=(rows, 8)).astype(np.float32) for k in ("hidden", "cell")}
        callers.append((obs, states, task.predict({"observation": obs}, states, {"greedy": True})))
    results: list = [None] * len(callers)
    start = threading.Barrier(len(callers))
    with ComputationDataProcessor(task, gather_window_s=0.05) as cdp:
        def call(i: int) -> None:
            obs, states, _ = callers[i]
            start.wait()
            results[i] = cdp.predict({"observation": obs}, states, {"greedy": True}, timeout=30)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(callers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert cdp.forward_passes < len(callers)  # requests were batched
    for (_, _, alone), batched in zip(callers, results, strict=True):
        np.testing.assert_array_equal(batched.actions["action"], alone.actions["action"])
        for name in ("hidden", "cell"):
            np.testing.assert_allclose(batched.states[name], alone.states[name], rtol=1e-5, atol=1e-6)
