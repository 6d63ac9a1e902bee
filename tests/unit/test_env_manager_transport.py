"""The pieces under SubprocessEnvManager: the message pipe, its doorbells, the shared-memory observation
buffer."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from actor_service.envs.env_manager.doorbell import Doorbells, SpinBudget
from actor_service.envs.env_manager.pipe import MessagePipe
from actor_service.envs.env_manager.shared_memory import RESET_SLOT, STEP_SLOT, ObsBuffer, supports
from common.envs import ArraySpec, DiscreteSpec
from tests.polling import wait_until


@pytest.fixture(params=["one-way pipes", "duplex"])
def pipe_pair(request):
    if request.param == "duplex":
        a, b = multiprocessing.Pipe()
        left, right = MessagePipe(a), MessagePipe(b)
    else:  # what the env manager uses
        near, far = MessagePipe.channel(multiprocessing.get_context("spawn"))
        left, right = MessagePipe(*near), MessagePipe(*far)
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


def test_closed_end_is_eof_and_breaks_the_pipe(pipe_pair):
    left, right = pipe_pair
    left.close()
    with pytest.raises(EOFError):
        right.recv()
    with pytest.raises(BrokenPipeError):
        right.send("to nobody")


def test_both_directions_carry_messages(pipe_pair):
    left, right = pipe_pair
    left.send("ping")
    assert right.recv() == "ping"
    right.send("pong")
    assert left.poll() and left.recv() == "pong"
    assert not left.poll() and not right.poll()


@pytest.fixture
def rung_pair():
    """Two pipe ends whose sends are counted on doorbells in shared memory, as between parent and worker."""
    bells = Doorbells.create(2)
    near, far = MessagePipe.channel(multiprocessing.get_context("spawn"))
    parent, worker = MessagePipe(*near, bells.parent_end(1)), MessagePipe(*far, bells.worker_end(1))
    yield parent, worker
    parent.close()
    worker.close()
    bells.close()
    bells.close()


def test_doorbell_signals_each_message_until_it_is_received(rung_pair):
    parent, worker = rung_pair
    assert not worker.signalled() and SpinBudget(0.001).spin(worker.signalled) is None
    parent.send("a")
    parent.send(("b", 2))
    assert worker.signalled() and SpinBudget(10.0).spin(worker.signalled)
    assert not parent.signalled()  # the counters of the two directions are apart
    assert worker.recv() == "a"
    assert worker.signalled()  # the second one is still to be taken (here already buffered)
    assert worker.recv() == ("b", 2)
    assert not worker.signalled()
    worker.send("reply")
    assert SpinBudget(10.0).spin(parent.signalled) and parent.recv() == "reply"


def test_doorbell_rings_before_a_large_message_is_fully_written(rung_pair):
    """A message larger than the pipe's buffer only goes through while the reader reads: the reader must
    learn of it after the first write, not after the last (that would leave both ends waiting)."""
    parent, worker = rung_pair
    big = np.arange(300_000, dtype=np.int64)
    sender = threading.Thread(target=parent.send, args=(big,))
    sender.start()
    # (Polled, not one spin: a spin gives up at the first preemption, which a busy machine makes likely.)
    wait_until("the doorbell to ring while the message is still being written", worker.signalled, 10.0)
    np.testing.assert_array_equal(worker.recv(), big)
    sender.join()


def test_spin_budget_follows_how_waits_went():
    budget = SpinBudget(100e-6)
    assert SpinBudget(100e-6).spin(lambda: "found") == "found"
    for _ in range(6):  # waits longer than the limit: spin less and less, then not at all
        budget.waited(1.0)
    assert budget.current == 0.0
    budget.waited(10e-6)  # a short wait: spinning pays again
    assert 0 < budget.current < budget.limit
    for _ in range(4):
        budget.waited(10e-6)
    assert budget.current == budget.limit
    assert budget.spin(lambda: None, until=0.0) is None  # `until` passed already


def test_a_new_worker_slot_starts_from_zero():
    bells = Doorbells.create(1)
    try:
        end = bells.parent_end(0)
        end.ring()
        assert bells.worker_end(0).peer_sent() == 1
        bells.clear(0)
        assert bells.worker_end(0).peer_sent() == 0 and bells.parent_end(0).peer_sent() == 0
    finally:
        bells.close()
    with pytest.raises(ValueError, match="closed"):
        bells.clear(0)


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
