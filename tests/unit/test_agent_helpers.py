"""OnlineHelper and ExpReplayHelper (with its priority tree): contents, waiting, sampling statistics."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from common.computation import ExpReplayHelper, OnlineHelper
from common.computation.priority_tree import PriorityTree


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(start, start + n), "y": np.arange(start, start + n, dtype=np.float32)[:, None] * 2}


# ---- OnlineHelper ------------------------------------------------------------------------------------------
def test_online_helper_takes_everything_once():
    helper = OnlineHelper(capacity_rows=100)
    helper.add(rows(0, 3))
    helper.add(rows(3, 2))
    batch = helper.take()
    np.testing.assert_array_equal(batch["x"], np.arange(5))
    assert batch["y"].shape == (5, 1)
    assert helper.rows == 0
    assert helper.take(timeout=0) is None


def test_online_helper_keeps_the_most_recent_rows():
    helper = OnlineHelper(capacity_rows=5)
    for i in range(4):
        helper.add(rows(i * 2, 2))
    assert helper.rows == 4 and helper.dropped_rows == 4
    np.testing.assert_array_equal(helper.take()["x"], [4, 5, 6, 7])


def test_online_helper_waits_for_enough_rows_and_wakes_on_close():
    helper = OnlineHelper(capacity_rows=100)
    got: list[object] = []
    taker = threading.Thread(target=lambda: got.append(helper.take(min_rows=4, timeout=30)))
    taker.start()
    helper.add(rows(0, 2))
    helper.add(rows(2, 2))
    taker.join(30)
    np.testing.assert_array_equal(got[0]["x"], np.arange(4))

    waiter = threading.Thread(target=lambda: got.append(helper.take(min_rows=1, timeout=30)))
    waiter.start()
    helper.close()
    waiter.join(30)
    assert not waiter.is_alive() and got[1] is None


def test_online_helper_rejects_mismatched_batches():
    helper = OnlineHelper(capacity_rows=10)
    helper.add(rows(0, 2))
    with pytest.raises(ValueError, match="keys"):
        helper.add({"x": np.zeros(2)})
    with pytest.raises(ValueError, match="leading"):
        helper.add({"x": np.zeros(2), "y": np.zeros(3)})


# ---- PriorityTree ------------------------------------------------------------------------------------------
def test_priority_tree_sums_and_finds():
    tree = PriorityTree(5)
    tree.update(np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert tree.total == 15.0 and tree.min == 1.0
    np.testing.assert_array_equal(tree.find(np.array([0.0, 0.99, 1.0, 2.9, 3.0, 14.99])), [0, 0, 1, 1, 2, 4])
    tree.update(np.array([4, 4]), np.array([9.0, 0.5]))  # last wins
    assert tree.total == 10.5 and tree.min == 0.5
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([0.0]))
    with pytest.raises(IndexError):
        tree.update(np.array([5]), np.array([1.0]))


def test_priority_tree_of_one_slot():
    tree = PriorityTree(1)
    tree.update(np.array([0]), np.array([2.0]))
    assert tree.total == 2.0
    assert tree.find(np.array([0.0, 1.999])).tolist() == [0, 0]


# ---- ExpReplayHelper ---------------------------------------------------------------------------------------
def test_replay_ring_buffer_overwrites_the_oldest():
    replay = ExpReplayHelper(capacity=5, prioritized=False, seed=0)
    replay.add(rows(0, 3))
    replay.add(rows(3, 4))
    assert len(replay) == 5 and replay.total_added == 7
    sample = replay.sample(200)
    assert set(sample.batch["x"].tolist()) == {2, 3, 4, 5, 6}
    np.testing.assert_array_equal(sample.batch["y"][:, 0], sample.batch["x"] * 2)
    np.testing.assert_array_equal(sample.weights, np.ones(200))


def test_replay_validates_input():
    replay = ExpReplayHelper(capacity=4, seed=0)
    with pytest.raises(ValueError, match="empty"):
        replay.sample(1)
    replay.add(rows(0, 2))
    with pytest.raises(ValueError, match="keys"):
        replay.add({"x": np.zeros(1)})
    with pytest.raises(ValueError, match="y is"):
        replay.add({"x": np.zeros(1, np.int64), "y": np.zeros((1, 2), np.float32)})
    with pytest.raises(ValueError, match="capacity"):
        replay.add(rows(0, 5))
    with pytest.raises(ValueError, match="priorities"):
        replay.add(rows(0, 2), priorities=np.array([1.0]))


def test_prioritized_sampling_matches_priorities_and_weights():
    alpha, beta = 0.7, 0.5
    replay = ExpReplayHelper(capacity=64, prioritized=True, alpha=alpha, beta=beta, priority_eps=1e-9, seed=1)
    priorities = np.arange(1, 51, dtype=np.float64)
    replay.add(rows(0, 50), priorities=priorities)
    expected = priorities**alpha / np.sum(priorities**alpha)
    np.testing.assert_allclose(replay.probabilities(), expected, rtol=1e-6)

    draws = 4000
    counts = np.zeros(50)
    for _ in range(50):
        sample = replay.sample(draws // 50 * 2)
        np.add.at(counts, sample.batch["x"], 1)
        # Importance weights: (N P(i))^-beta normalised by the largest possible weight (smallest priority).
        p = expected[sample.batch["x"]]
        np.testing.assert_allclose(sample.weights, (50 * p) ** -beta / (50 * expected.min()) ** -beta, rtol=1e-5)
    total = counts.sum()
    # Chi-square goodness of fit: 49 degrees of freedom, 99.9th percentile ~ 85.4 (stratified sampling is
    # tighter than multinomial, so a correct sampler is far below it).
    chi2 = np.sum((counts - total * expected) ** 2 / (total * expected))
    assert chi2 < 85.4, chi2
    assert counts[-1] > counts[0] * 5


def test_priority_updates_change_sampling_and_skip_overwritten_slots():
    replay = ExpReplayHelper(capacity=4, prioritized=True, alpha=1.0, priority_eps=1e-9, seed=0)
    replay.add(rows(0, 4))
    np.testing.assert_allclose(replay.probabilities(), np.full(4, 0.25))
    sample = replay.sample(4)
    replay.update_priorities(sample, np.where(sample.batch["x"] == 2, 97.0, 1.0))
    probabilities = replay.probabilities()
    assert probabilities[2] == pytest.approx(0.97, abs=1e-6)
    # New rows come in at the max priority seen so far.
    stale = replay.sample(4)
    replay.add(rows(10, 1))  # overwrites slot 0
    assert replay.probabilities()[0] == pytest.approx(97 / (97 + 97 + 2), abs=1e-6)
    replay.update_priorities(stale, np.full(4, 1e-3))  # slot 0 was rewritten: its update is ignored
    assert replay.probabilities()[0] > 0.9
    with pytest.raises(ValueError, match="finite"):
        replay.update_priorities(stale, np.full(4, np.nan))


def test_given_priorities_count_as_seen_for_the_rows_added_after_them():
    """`add` gives new rows "the largest priority seen so far", but given priorities did not count: rows added after
    ones of priority 50 came in at 1.0 (a review)."""
    replay = ExpReplayHelper(capacity=4, prioritized=True, alpha=1.0, priority_eps=1e-9, seed=0)
    replay.add(rows(0, 2), priorities=np.array([50.0, 100.0]))
    replay.add(rows(2, 2))
    np.testing.assert_allclose(replay.probabilities(), np.array([50, 100, 100, 100]) / 350, rtol=1e-6)


def test_replay_is_safe_across_threads():
    replay = ExpReplayHelper(capacity=1000, prioritized=True, seed=0)
    replay.add(rows(0, 10))
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(200):
                replay.add(rows(i, 5))
        except BaseException as e:  # reported below
            errors.append(e)

    def learner() -> None:
        try:
            for _ in range(200):
                sample = replay.sample(16)
                np.testing.assert_array_equal(sample.batch["y"][:, 0], sample.batch["x"] * 2)
                replay.update_priorities(sample, np.abs(np.sin(sample.batch["x"])) + 0.1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=learner), threading.Thread(target=learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
