"""Many simulated workers against one real coordinator process (bench/bench_load.py): no errors but the
deliberate ones, every job accounted for on both sides, the league's invariants hold live and on disk.

The short form (50 workers, 8 s) runs in `make test`; the issue's full load (200 workers, 60 s) is slow. No
timing is asserted: latencies are the benchmark's business.
"""

from __future__ import annotations

import pytest

from bench.bench_load import LoadReport, LoadSettings, run_load


def _assert_clean(report: LoadReport) -> None:
    assert report.unexpected_errors == 0, "unexpected errors:\n" + "\n".join(report.error_samples)
    assert report.deliberate_sent > 0
    assert report.deliberate_as_expected == report.deliberate_sent
    assert report.duplicates_acknowledged == report.settings.duplicating_actors
    assert not report.problems, "accounting / invariants:\n" + "\n".join(report.problems)
    clients, server = report.clients, report.server
    assert clients is not None and server is not None
    assert clients == server
    assert clients.unaccounted == 0 and server.unaccounted == 0
    assert clients.expired == report.settings.expiring_actors
    assert clients.failed == report.settings.failing_actors
    assert clients.in_flight == report.settings.learners  # the learners' learn jobs; actors released theirs
    assert clients.finished > 0 and clients.matches > 0


def test_fifty_workers_for_eight_seconds(tmp_path):
    settings = LoadSettings(actors=47, learners=3, seconds=8.0, lease_timeout_s=4.0, snapshot_steps=2000)
    _assert_clean(run_load(settings, tmp_path / "load"))


@pytest.mark.slow
def test_two_hundred_workers_for_a_minute(tmp_path):
    report = run_load(LoadSettings(actors=197, learners=3, seconds=60.0), tmp_path / "load")
    _assert_clean(report)
    assert report.snapshots > 0
