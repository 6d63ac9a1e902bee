"""The learner's intake: bounded queue (backpressure), duplicate detection, and the data plane's refusals."""

import threading
import time

import grpc
import numpy as np
import pytest

from common.algorithms.registry import make_computation_task
from common.computation.specs import DiscreteActionSpec, TensorSpec
from common.job_limits import MAX_ID_CHARS
from common.policy_config import PolicyConfig
from common.proto.league.v1 import league_pb2
from common.tensor_codec import ChunkHeader
from learner_service.chunks import ChunkPreparer, PreparedChunk
from learner_service.intake import ChunkQueue, IntakeClosedError, SeqDeduper
from learner_service.learner_testing import synthetic_chunk
from learner_service.servicer import Accepted, ChunkRefused, DataPlane, Intake

OBS = {"observation": TensorSpec("observation", (4,))}


def _prepared(seq: int, nbytes: int = 16) -> PreparedChunk:
    rows = {"x": np.zeros(nbytes, np.uint8)}
    return PreparedChunk(ChunkHeader("j", "p", "w", seq, 0), rows, 1, 1, np.zeros((1, 1), np.float32),
                         np.zeros((1, 1), bool), None)


def _blocked_put(queue: ChunkQueue, chunk: PreparedChunk, **kwargs):
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_try_put(queue, chunk, **kwargs)), daemon=True)
    thread.start()
    return thread, outcome


def _try_put(queue, chunk, **kwargs):
    try:
        return queue.put(chunk, **kwargs)
    except IntakeClosedError as err:
        return err


def test_full_queue_blocks_the_producer_until_the_consumer_takes():
    queue = ChunkQueue(max_chunks=2, max_bytes=1 << 20)
    assert queue.put(_prepared(0)) and queue.put(_prepared(1))
    thread, outcome = _blocked_put(queue, _prepared(2))
    thread.join(0.3)
    assert thread.is_alive() and len(queue) == 2  # waiting for room, nothing dropped
    assert queue.get().header.seq == 0
    thread.join(10)
    assert outcome == [True]
    assert [queue.get().header.seq for _ in range(2)] == [1, 2]


def test_byte_bound_and_an_oversized_chunk_still_fits_alone():
    queue = ChunkQueue(max_chunks=10, max_bytes=100)
    assert queue.put(_prepared(0, nbytes=60))
    thread, outcome = _blocked_put(queue, _prepared(1, nbytes=60))
    thread.join(0.3)
    assert thread.is_alive()
    queue.get()
    thread.join(10)
    assert outcome == [True]
    queue.get()
    assert queue.put(_prepared(2, nbytes=1000))  # alone in the queue: admitted, or it would wait forever


def test_close_wakes_blocked_producers_and_consumers():
    queue = ChunkQueue(max_chunks=1, max_bytes=1 << 20)
    queue.put(_prepared(0))
    thread, outcome = _blocked_put(queue, _prepared(1))
    queue.close()
    thread.join(10)
    assert isinstance(outcome[0], IntakeClosedError)
    assert queue.get() is None
    assert [c.header.seq for c in queue.drain()] == [0]  # accepted before closing: kept for the final training
    assert queue.drain() == []
    with pytest.raises(IntakeClosedError):
        queue.put(_prepared(2))


def test_an_abandoned_put_returns_false_when_woken():
    queue = ChunkQueue(max_chunks=1, max_bytes=1 << 20)
    queue.put(_prepared(0))
    cancelled = threading.Event()
    thread, outcome = _blocked_put(queue, _prepared(1), abandoned=cancelled.is_set)
    cancelled.set()
    queue.wake()
    thread.join(10)
    assert outcome == [False] and len(queue) == 1


def test_deduper_counts_each_seq_once_in_any_order():
    dedup = SeqDeduper()
    assert [dedup.reserve("w", "j", s) for s in (0, 2, 1, 2, 0, 3)] == [True, True, True, False, False, True]
    assert dedup.reserve("w", "other-job", 0) and dedup.reserve("other-worker", "j", 0)
    dedup.release("w", "j", 3)
    assert dedup.reserve("w", "j", 3)  # released: a resend is new again
    dedup.release("w", "j", 1)  # inside the contiguous prefix
    assert dedup.reserve("w", "j", 1) and not dedup.reserve("w", "j", 2)


def test_a_release_below_a_gap_given_up_on_enumerates_nothing():
    """A seq reserved, then a gap of 10^12 given up on (4,097 seqs past it), then the first seq released (its
    chunk failed): the release split the prefix into a set of every seq up to the gap's end, under the
    data plane's lock, until the learner ran out of memory (a hostile-input review). It is a hole now."""
    dedup = SeqDeduper()
    gap = 10**12
    assert dedup.reserve("w", "j", 0)
    for seq in range(gap + 1, gap + 4097):
        assert dedup.reserve("w", "j", seq)
    assert dedup.reserve("w", "j", gap)  # 4,097 held past the gap: seqs 1..gap-1 are given up on
    dedup.release("w", "j", 0)
    assert dedup.reserve("w", "j", 0)  # the released chunk's resend is new
    assert not dedup.reserve("w", "j", 0) and not dedup.reserve("w", "j", 7) and not dedup.reserve("w", "j", gap + 5)
    dedup.release("w", "j", gap + 4096)  # the prefix's last: the prefix shrinks
    dedup.release("w", "j", gap + 4095)
    dedup.release("w", "j", 3)
    assert dedup.reserve("w", "j", gap + 4095) and dedup.reserve("w", "j", gap + 4096) and dedup.reserve("w", "j", 3)
    assert not dedup.reserve("w", "j", gap + 4096)


def test_a_stream_with_nothing_accepted_is_not_remembered():
    """Refused chunks (released seqs) used to leave their (worker id, job id) behind, up to 4,096 of them."""
    dedup = SeqDeduper()
    assert dedup.reserve("w", "j", 5) and dedup.reserve("w", "k", 0)
    dedup.release("w", "j", 5)
    dedup.release("w", "k", 0)
    assert len(dedup) == 0
    assert dedup.reserve("w", "k", 0) and dedup.reserve("w", "k", 1)
    dedup.release("w", "k", 1)
    assert len(dedup) == 1 and not dedup.reserve("w", "k", 0)


def test_deduper_forgets_the_oldest_streams_beyond_its_bound():
    dedup = SeqDeduper(max_streams=2)
    for job in ("a", "b", "c"):
        assert dedup.reserve("w", job, 0)
    assert dedup.reserve("w", "a", 0)  # "a" was forgotten
    assert not dedup.reserve("w", "c", 0)


def _seen(dedup: SeqDeduper, seqs, stream=("w", "j")) -> set[int]:
    """Which of ``seqs`` the deduper has seen (asked on a copy: `reserve` records what it is asked)."""
    copy = SeqDeduper()
    copy.seed(dedup.export())
    return {seq for seq in seqs if not copy.reserve(*stream, seq)}


def test_an_export_seeds_a_deduper_that_sees_the_same_seqs():
    dedup = SeqDeduper()
    for seq in (0, 1, 2, 5, 9):
        dedup.reserve("w", "j", seq)
    dedup.release("w", "j", 1)  # a hole in the prefix
    dedup.reserve("w", "k", 0)
    exported = dedup.export()
    assert exported == [["w", "j", 3, [5, 9], [1]], ["w", "k", 1, [], []]]
    assert _seen(dedup, range(12)) == {0, 2, 5, 9}
    assert dedup.export(max_streams=1) == [["w", "k", 1, [], []]] and dedup.export(max_streams=0) == []


def test_seeding_adds_to_what_a_deduper_has_seen():
    """A learner resuming a checkpoint after a session of its own: the seqs of either count as seen."""
    live, trained = SeqDeduper(), SeqDeduper()
    for seq in (0, 1, 2, 3, 7):
        live.reserve("w", "j", seq)
    live.release("w", "j", 2)  # accepted, then dropped untrained: a resend is new ...
    for seq in (0, 1, 2, 10):
        trained.reserve("w", "j", seq)  # ... unless the checkpoint resumed holds it
    live.seed(trained.export())
    assert _seen(live, range(12)) == {0, 1, 2, 3, 7, 10}
    other = SeqDeduper()
    for seq in range(7):
        other.reserve("w", "j", seq)
    other.release("w", "j", 4)  # seen by neither: still new
    other.release("w", "j", 3)  # seen by live
    live.seed(other.export())
    assert _seen(live, range(12)) == {0, 1, 2, 3, 5, 6, 7, 10}
    assert live.export() == [["w", "j", 8, [10], [4]]]


@pytest.mark.parametrize("entry", [
    "w", ["w", "j", 1, []], ["w", 3, 1, [], []], ["w", "j", -1, [], []], ["w", "j", True, [], []],
    ["w", "j", 1, [2, -3], []], ["w", "j", 1, [], "1"], ["w", "j", 1, list(range(5000)), []],
])
def test_a_malformed_export_is_refused_and_changes_nothing(entry):
    dedup = SeqDeduper()
    dedup.reserve("w", "j", 0)
    with pytest.raises(ValueError):
        dedup.seed([["w", "x", 4, [], []], entry])
    assert dedup.export() == [["w", "j", 1, [], []]]


@pytest.fixture()
def plane():
    policy = PolicyConfig.from_mapping({"algorithm": "ppo", "model": {"hidden": [8]}})
    task = make_computation_task(policy, OBS, 2, device="cpu", seed=0)
    queue = ChunkQueue(max_chunks=1, max_bytes=1 << 20)
    plane = DataPlane()
    plane.open(Intake("p", ChunkPreparer(policy, task.input_specs, task.learn_specs, 2), queue))
    yield plane, queue
    plane.close()


def _chunk(seq: int, player: str = "p") -> league_pb2.TrajectoryChunk:
    return synthetic_chunk(OBS, 2, player_id=player, seq=seq, batch=2, steps=4)


def test_data_plane_refusals_have_their_status_codes(plane):
    plane, _ = plane
    with pytest.raises(ChunkRefused) as refused:
        plane.accept(_chunk(0, player="someone-else"))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and "someone-else" in str(refused.value)
    bad = _chunk(0)
    bad.tensors["/rewards"].data = b"\x00"
    with pytest.raises(ChunkRefused) as refused:
        plane.accept(bad)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "/rewards" in str(refused.value)
    negative = _chunk(0)
    negative.seq = -1
    with pytest.raises(ChunkRefused, match="seq"):
        plane.accept(negative)
    long_id = _chunk(0)
    long_id.job_id = "j" * (MAX_ID_CHARS + 1)
    with pytest.raises(ChunkRefused, match=f"job_id: longer than {MAX_ID_CHARS} characters") as refused:
        plane.accept(long_id)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(plane._deduper) == 0  # refused chunks leave nothing behind
    assert plane.accept(_chunk(0)).status is Accepted.NEW  # the refused seq 0 was not remembered
    assert plane.accept(_chunk(0)).status is Accepted.DUPLICATE
    counts = plane.counts()
    assert (counts.chunks_accepted, counts.chunks_duplicate, counts.samples_accepted) == (1, 1, 8)
    plane.close()
    with pytest.raises(ChunkRefused) as refused:
        plane.accept(_chunk(1))
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE


def test_echoed_ids_are_cut_and_escaped_and_checked_before_the_player(plane, caplog):
    """A 20 MB player id was echoed whole into the status detail (over gRPC's metadata limit: the client saw
    RESOURCE_EXHAUSTED and retried) and a long worker id into the log (a review)."""
    plane, _ = plane
    huge = _chunk(0, player="x" * 20_000_000 + "\x1b[2J")
    with pytest.raises(ChunkRefused) as refused:
        plane.accept(huge)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and len(str(refused.value)) < 300
    assert "(20000004 characters)" in str(refused.value)
    long_worker = _chunk(0, player="someone-else")
    long_worker.worker_id = "w" * 10_000
    with pytest.raises(ChunkRefused, match="worker_id: longer than"):  # before the player: ids are logged
        plane.accept(long_worker)


def test_a_gap_that_never_fills_is_given_up_on_with_bounded_memory():
    """A stream first seen past seq 0 (its learner restarted mid-job) kept every later seq in its out-of-order
    set, and the seq that filled the gap walked it all under the lock (a review)."""
    from learner_service.intake import MAX_OUT_OF_ORDER

    deduper = SeqDeduper()
    for seq in range(1, MAX_OUT_OF_ORDER + 3):
        assert deduper.reserve("w", "j", seq)
    stream = deduper._streams[("w", "j")]
    assert stream.below == MAX_OUT_OF_ORDER + 3 and not stream.above
    assert not deduper.reserve("w", "j", 0)  # given up on: taken for a duplicate
    assert not deduper.reserve("w", "j", 5) and deduper.reserve("w", "j", MAX_OUT_OF_ORDER + 3)
    # Out of order within the bound is remembered exactly, as before.
    deduper.reserve("v", "j", 2)
    assert deduper.reserve("v", "j", 0) and deduper.reserve("v", "j", 1) and not deduper.reserve("v", "j", 2)


def test_streams_waiting_for_room_beyond_the_staging_bound_hold_only_their_message(plane, monkeypatch):
    """Every stream blocked on a full queue held its chunk's learn rows (several times the message: 634 MB for six
    8 MiB DQN chunks against a 1 MiB queue, a review). Only STAGING_CHUNKS streams decode at once; the others wait
    with their message, and leave when cancelled; all get in once the queue drains."""
    from learner_service.servicer import STAGING_CHUNKS

    plane, queue = plane
    plane.accept(_chunk(0))  # the queue is full
    prepared = []
    real = plane._intake.preparer.prepare
    monkeypatch.setattr(plane._intake.preparer, "prepare", lambda decoded: prepared.append(1) or real(decoded))
    outcomes: dict[int, object] = {}
    cancelled = threading.Event()

    def push(seq: int, abandoned=lambda: False) -> None:
        outcomes[seq] = plane.accept(_chunk(seq), abandoned).status

    threads = [threading.Thread(target=push, args=(seq,), daemon=True) for seq in range(1, 5)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(prepared) < STAGING_CHUNKS and time.monotonic() < deadline:
        time.sleep(0.01)
    threads.append(threading.Thread(target=push, args=(5, cancelled.is_set), daemon=True))  # waits at the gate
    threads[-1].start()
    threads[-1].join(0.5)
    assert len(prepared) == STAGING_CHUNKS and not outcomes
    cancelled.set()
    plane.wake()
    threads[-1].join(5)
    assert outcomes == {5: Accepted.ABANDONED}
    taken = [queue.get().header.seq for _ in range(5)]
    for thread in threads:
        thread.join(5)
    assert sorted(taken) == [0, 1, 2, 3, 4] and len(prepared) == 4
    assert all(outcomes[seq] is Accepted.NEW for seq in range(1, 5))


def test_data_plane_blocks_a_stream_on_a_full_queue_and_close_releases_it(plane):
    plane, queue = plane
    plane.accept(_chunk(0))
    outcome: list = []

    def push() -> None:
        try:
            outcome.append(plane.accept(_chunk(1)).status)
        except ChunkRefused as err:
            outcome.append(err.code)

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # backpressure: the stream waits
    assert queue.get().header.seq == 0
    thread.join(10)
    assert outcome == [Accepted.NEW]
    thread = threading.Thread(target=push, daemon=True)  # seq 1 again: a duplicate, never blocks
    thread.start()
    thread.join(10)
    assert outcome[-1] is Accepted.DUPLICATE


def test_forgetting_many_dropped_chunks_leaves_each_resend_new(plane):
    """A session's dropped chunks are released to the deduper (their resends are new data). Released oldest
    first, each made a hole below the stream's prefix, and past MAX_OUT_OF_ORDER holes the oldest counted as seen:
    its resend answered DUPLICATE and never trained on (a review). Newest first, the prefix shrinks instead."""
    from types import SimpleNamespace

    from learner_service.intake import MAX_OUT_OF_ORDER

    plane, _ = plane
    count = MAX_OUT_OF_ORDER + 100
    for seq in range(count):
        assert plane._deduper.reserve("w", "j", seq)
    dropped = [SimpleNamespace(header=SimpleNamespace(worker_id="w", job_id="j", seq=seq)) for seq in range(count)]
    plane.forget(dropped)  # in queue order: oldest first
    assert all(plane._deduper.reserve("w", "j", seq) for seq in range(count))


def test_forgotten_keys_are_new_data_again(plane):
    """A learner dropping a kept trainer forgets the chunks it held untrained by their keys."""
    plane, queue = plane
    assert plane.accept(_chunk(0)).status is Accepted.NEW
    assert plane.accept(_chunk(0)).status is Accepted.DUPLICATE
    assert len(queue.drain()) == 1  # (the queue holds one chunk)
    header = _chunk(0)
    plane.forget_keys([(header.worker_id, header.job_id, 0)])
    assert plane.accept(_chunk(0)).status is Accepted.NEW


def _intake_maker():
    """Intakes of one player for a small PPO policy (each with a queue of its own)."""
    policy = PolicyConfig.from_mapping({"algorithm": "ppo", "model": {"hidden": [8]}})
    task = make_computation_task(policy, OBS, DiscreteActionSpec(2), device="cpu", seed=0)

    def intake() -> Intake:
        preparer = ChunkPreparer(policy, task.input_specs, task.learn_specs, 2, task.state_specs)
        return Intake("p", preparer, ChunkQueue(8, 1 << 30))

    return intake


def test_closing_a_sessions_own_intake_leaves_the_next_sessions_open():
    """A session's end closed whatever intake was current: a late close (the session's loop had ended and the
    learner bound again) closed the next session's intake, whose loop then failed, taking the learner down."""
    intake = _intake_maker()
    plane = DataPlane()
    first, second = intake(), intake()
    plane.open(first)
    plane.open(second)  # the learner bound again before the first session's close came
    plane.close(first)
    assert first.queue.closed and not second.queue.closed
    chunk = synthetic_chunk(OBS, 2, player_id="p", seq=0, worker_id="a1", job_id="job-1", seed=0)
    assert plane.accept(chunk).status is Accepted.NEW  # the second session still takes data
    plane.close()  # (the learner's stop closes whatever is current)
    assert second.queue.closed


