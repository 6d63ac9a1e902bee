"""The pieces under SubprocessEnvManager: the message pipe and the shared-memory observation buffer."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from actor_service.envs.env_manager.pipe import MessagePipe
from actor_service.envs.env_manager.shared_memory import RESET_SLOT, STEP_SLOT, ObsBuffer, supports
from common.envs import ArraySpec, DiscreteSpec


@pytest.fixture
def pipe_pair():
    a, b = multiprocessing.Pipe()
    left, right = MessagePipe(a), MessagePipe(b)
    yield left, right
    left.close()
    right.close()


def test_messages_arrive_whole_and_in_order(pipe_pair):
    left, right = pipe_pair
    big = np.arange(300_000, dtype=np.int64)  # 2.4 MB: many reads, and the writer blocks meanwhile
    sender = threading.Thread(target=lambda: [left.send(m) for m in ("a", big, ("b", 2))])
    sender.start()
    assert right.recv() == "a"
    np.testing.assert_array_equal(right.recv(), big)
    assert right.recv() == ("b", 2)
    sender.join()


def test_queued_messages_are_buffered(pipe_pair):
    left, right = pipe_pair
    for i in range(3):
        left.send(i)
    assert right.recv() == 0  # one read may take all three
    assert right.poll()
    assert [right.recv(), right.recv()] == [1, 2]
    assert not right.has_message()


def test_closed_end_is_eof(pipe_pair):
    left, right = pipe_pair
    left.close()
    with pytest.raises(EOFError):
        right.recv()


def test_obs_buffer_round_trip_for_dict_and_scalar_leaves():
    spec = {"board": ArraySpec((2, 3), np.float32), "to_play": ArraySpec((), np.int32), "a": DiscreteSpec(4)}
    owner = ObsBuffer.create(spec, env_num=2)
    other = ObsBuffer.attach(owner.layout)
    try:
        obs = {"board": np.ones((2, 3), np.float32), "to_play": np.array(1, np.int32), "a": 3}
        other.write(1, RESET_SLOT, obs)
        back = owner.read(1, RESET_SLOT)
        assert (
            back["board"].tolist() == obs["board"].tolist()
            and int(back["to_play"]) == 1
            and int(back["a"]) == 3
        )
        assert isinstance(back["to_play"], np.ndarray) and back["to_play"].shape == ()
        back["board"][0, 0] = 7  # a copy: the buffer is untouched
        assert owner.read(1, RESET_SLOT)["board"][0, 0] == 1
        assert owner.read(0, STEP_SLOT)["board"].sum() == 0
        with pytest.raises(ValueError, match="shape"):
            other.write(0, STEP_SLOT, {**obs, "board": np.ones((3, 2), np.float32)})
        with pytest.raises(ValueError, match="keys"):
            other.write(0, STEP_SLOT, {"board": obs["board"]})
    finally:
        other.close()
        owner.close()
        owner.close()


def test_only_array_observations_go_to_shared_memory():
    assert supports(ArraySpec((4,), np.float32))
    assert supports({"x": ArraySpec((1,), np.uint8)})
    assert not supports(None)
    assert not supports({})
    with pytest.raises(ValueError, match="shared memory"):
        ObsBuffer.create(None, env_num=1)
