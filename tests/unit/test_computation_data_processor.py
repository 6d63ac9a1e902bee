"""ComputationDataProcessor: routing under concurrency, batching, error isolation, packing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

from common.computation import (
    Algorithm,
    ComputationDataProcessor,
    ComputationTask,
    LearnOutput,
    Model,
    TensorSpec,
    pack,
    unpack,
)


class EchoModel(Model):
    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(1, 1)

    def get_input_specs(self):
        return [TensorSpec("observation", (2,), "int64")]

    def get_action_specs(self):
        return [TensorSpec("action", (), "int64")]


class EchoAlgorithm(Algorithm):
    """action = 1000 * obs[0] + obs[1]; artifacts echo eps and the batch size of the pass."""

    def __init__(self) -> None:
        super().__init__(EchoModel())
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.calls: list[int] = []

    def get_artifact_specs(self):
        return [TensorSpec("eps", ()), TensorSpec("pass_rows", (), "int64")]

    def get_learn_specs(self):
        return [TensorSpec("observation", (2,), "int64")]

    def predict(self, inputs, states, kwargs):
        self.entered.set()
        if self.gate is not None:
            gate, self.gate = self.gate, None
            gate.wait()
        obs = inputs["observation"]
        rows = obs.shape[0]
        self.calls.append(rows)
        return {
            "action": obs[:, 0] * 1000 + obs[:, 1],
            "eps": torch.full((rows,), kwargs.eps),
            "pass_rows": torch.full((rows,), rows),
        }, states

    def learn(self, batch):
        return LearnOutput({"rows": float(batch["observation"].shape[0])})


@pytest.fixture
def cdp():
    algorithm = EchoAlgorithm()
    processor = ComputationDataProcessor(ComputationTask(algorithm, device="cpu"), max_batch_rows=64)
    try:
        yield processor, algorithm
    finally:
        processor.close()


def obs(caller: int, call: int, rows: int = 1) -> np.ndarray:
    return np.array([[caller, call * 10 + r] for r in range(rows)])


def test_results_go_back_to_their_callers_under_concurrency(cdp):
    processor, _ = cdp
    errors: list[str] = []

    def caller(i: int) -> None:
        for call in range(40):
            rows = 1 + (i + call) % 3
            prediction = processor.predict({"observation": obs(i, call, rows)}, timeout=30)
            expected = [i * 1000 + call * 10 + r for r in range(rows)]
            if prediction.actions["action"].tolist() != expected:
                errors.append(f"caller {i} call {call}: {prediction.actions['action']} != {expected}")

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_queued_requests_share_one_forward_pass(cdp):
    processor, algorithm = cdp
    gate = threading.Event()
    algorithm.gate = gate
    first = processor.submit({"observation": obs(0, 0)})
    assert algorithm.entered.wait(10)
    # The worker is busy with `first`: everything submitted now queues up and is packed together.
    rest = [processor.submit({"observation": obs(i, 1, rows=2)}) for i in range(1, 9)]
    gate.set()
    assert first.result(10).actions["action"].tolist() == [0]
    for i, future in enumerate(rest, start=1):
        prediction = future.result(10)
        assert prediction.actions["action"].tolist() == [i * 1000 + 10, i * 1000 + 11]
        assert prediction.artifacts["pass_rows"].tolist() == [16, 16]
    assert algorithm.calls == [1, 16]
    assert processor.forward_passes == 2


def test_batches_respect_max_rows_and_forward_kwargs(cdp):
    processor, algorithm = cdp
    gate = threading.Event()
    algorithm.gate = gate
    first = processor.submit({"observation": obs(0, 0)})
    assert algorithm.entered.wait(10)
    greedy = [processor.submit({"observation": obs(i, 0, rows=30)}) for i in range(1, 4)]
    explore = [processor.submit({"observation": obs(i, 0)}, forward_kwargs={"eps": 0.5}) for i in range(4, 6)]
    gate.set()
    first.result(10)
    assert [f.result(10).artifacts["eps"].tolist() for f in explore] == [[0.5], [0.5]]
    assert all(f.result(10).artifacts["eps"].max() == 0.0 for f in greedy)
    # 3 x 30 rows do not fit in 64: two of them in one pass, the third in another; eps=0.5 apart.
    assert sorted(algorithm.calls[1:]) == [2, 30, 60]


def test_a_bad_request_fails_alone(cdp):
    processor, algorithm = cdp
    gate = threading.Event()
    algorithm.gate = gate
    first = processor.submit({"observation": obs(0, 0)})
    assert algorithm.entered.wait(10)
    good = processor.submit({"observation": obs(1, 0)})
    bad = processor.submit({"observation": np.zeros((1, 3), np.int64)})
    also_good = processor.submit({"observation": obs(2, 0)})
    gate.set()
    first.result(10)
    assert good.result(10).actions["action"].tolist() == [1000]
    assert also_good.result(10).actions["action"].tolist() == [2000]
    with pytest.raises(ValueError, match="observation: shape"):
        bad.result(10)


def test_close_finishes_queued_work_then_refuses(cdp):
    processor, algorithm = cdp
    gate = threading.Event()
    algorithm.gate = gate
    first = processor.submit({"observation": obs(0, 0)})
    assert algorithm.entered.wait(10)
    queued = processor.submit({"observation": obs(1, 0)})
    closer = threading.Thread(target=processor.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert first.result(0).actions["action"].tolist() == [0]
    assert queued.result(0).actions["action"].tolist() == [1000]
    with pytest.raises(RuntimeError, match="closed"):
        processor.submit({"observation": obs(0, 0)})
    processor.close()  # idempotent


def test_submit_validates_rows():
    processor = ComputationDataProcessor(ComputationTask(EchoAlgorithm(), device="cpu"))
    try:
        with pytest.raises(ValueError, match="leading"):
            processor.submit({"observation": np.zeros((2, 2)), "other": np.zeros(3)})
        with pytest.raises(ValueError, match="empty"):
            processor.submit({})
    finally:
        processor.close()


def test_pack_unpack_and_training_batches(cdp):
    processor, _ = cdp
    parts = [{"observation": obs(i, 0, rows=i + 1), "w": np.full(i + 1, i)} for i in range(3)]
    packed = pack(parts)
    assert packed.sizes == (1, 2, 3)
    assert packed.arrays["observation"].shape == (6, 2)
    for part, back in zip(parts, unpack(packed.arrays, packed.sizes), strict=True):
        np.testing.assert_array_equal(part["observation"], back["observation"])
    with pytest.raises(ValueError, match="keys"):
        pack([{"a": np.zeros(1)}, {"b": np.zeros(1)}])
    with pytest.raises(ValueError, match="leading"):
        pack([{"a": np.zeros(1), "b": np.zeros(2)}])
    result = processor.learn([{"observation": obs(i, 0, rows=2)} for i in range(3)])
    assert result.stats["rows"] == 6.0
