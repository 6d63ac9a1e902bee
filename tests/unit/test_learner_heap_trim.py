"""The learner's heap trim (glibc malloc_trim): at most once per interval, after train iterations. A reviewer's
default connect-four learner peaked at ~900 MB RSS within 150 iterations while the memory in use stayed under
150 MB (freed buffers of changing shapes left as holes in the heap)."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from learner_service.heap_trim import HeapTrimmer, malloc_trim
from tests.manual_clock import ManualClock
from tests.unit.test_learner_release import _Client, _dqn_session


def test_trims_at_most_once_per_interval_counted_from_the_last_trim():
    clock, trims = ManualClock(100.0), []
    trimmer = HeapTrimmer(5.0, clock=clock, trim=lambda: trims.append(clock.now) or 1)
    assert not trimmer.maybe_trim()  # the interval counts from when the trimmer was built
    for step in (2.0, 2.0, 1.0, 0.5, 3.0, 1.5, 0.1, 10.0, 0.0):
        clock.now += step
        trimmer.maybe_trim()
    assert trims == [105.0, 110.0, 120.1]
    assert trimmer.trims == 3


def test_without_malloc_trim_the_trimmer_does_nothing(monkeypatch):
    monkeypatch.setattr("learner_service.heap_trim.malloc_trim", lambda: None)
    clock = ManualClock(100.0)
    trimmer = HeapTrimmer(1.0, clock=clock)
    clock.now += 60.0
    assert not trimmer.maybe_trim() and trimmer.trims == 0


def test_the_session_trims_after_train_iterations_once_the_interval_passed(tmp_path):
    session, trainer, _ = _dqn_session(tmp_path, _Client())
    at_iteration: list[int] = []
    # Each train iteration "takes" 2 s: with a 5 s interval the trims come after iterations 3, 6, 9, ...
    session.heap_trimmer = HeapTrimmer(5.0, clock=lambda: 2.0 * trainer.progress.train_iteration,
                                       trim=lambda: at_iteration.append(trainer.progress.train_iteration) or 1)
    session.release()
    iterations = trainer.progress.train_iteration
    assert iterations >= 6
    assert at_iteration == list(range(3, iterations + 1, 3))


@pytest.mark.skipif(not sys.platform.startswith("linux") or "musl" in (ctypes.util.find_library("c") or ""),
                    reason="glibc only")
def test_glibc_malloc_trim_is_found_and_returns():
    trim = malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)
