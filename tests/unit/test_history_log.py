"""league run's status history grows at a bounded rate however large each record gets."""

import itertools
import json

from league_cli.history import HistoryLog


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_small_records_are_all_written(tmp_path):
    path = tmp_path / "h.jsonl"
    with HistoryLog(path, bytes_per_s=10_000) as log:
        for t in range(5):
            assert log.offer({"t": t}, now=2.0 * t)
    assert [r["t"] for r in _lines(path)] == [0, 1, 2, 3, 4]


def test_large_records_are_spaced_so_the_file_grows_at_the_limit_and_the_last_is_kept(tmp_path):
    path = tmp_path / "h.jsonl"
    big = "x" * 9_990  # ~10 kB a record at 1 kB/s: one record per ~10 s of 2 s polls
    with HistoryLog(path, bytes_per_s=1_000) as log:
        written = [log.offer({"t": t, "pad": big}, now=2.0 * t) for t in range(31)]
    assert written[:6] == [True, False, False, False, False, False]
    records = _lines(path)
    assert [r["t"] for r in records] == [0, 6, 12, 18, 24, 30]  # every ~10 s, and the final record
    assert path.stat().st_size <= 1_000 * 60 + 2 * 10_010  # the rate over the 60 s, plus the first and last


def test_the_held_back_newest_record_is_written_at_close_and_a_resumed_run_appends(tmp_path):
    path = tmp_path / "h.jsonl"
    log = HistoryLog(path, bytes_per_s=1.0)
    log.offer({"t": 0}, now=0.0)
    assert not log.offer({"t": 1}, now=1.0)
    log.close()
    log.close()  # idempotent
    with HistoryLog(path, bytes_per_s=1.0) as again:
        again.offer({"t": 2}, now=0.0)
    assert [r["t"] for r in _lines(path)] == [0, 1, 2]


def test_a_torn_last_record_is_cut_off_before_a_resumed_run_appends(tmp_path):
    """A run killed mid-write left half a record; appending after it used to make that line a corrupt one in
    the middle, which `league plot` (and the end-of-run plots) refuse for good."""
    from league_cli.plot import read_history

    path = tmp_path / "h.jsonl"
    record = {"players": [], "payoff": []}
    path.write_text(json.dumps({**record, "t": 0}) + "\n" + json.dumps({**record, "t": 1})[:9])
    with HistoryLog(path) as log:
        log.offer({**record, "t": 2}, now=0.0)
    assert [r["t"] for r in read_history(path)] == [0, 2]
    with HistoryLog(path) as log:  # a whole last line is kept
        log.offer({**record, "t": 3}, now=0.0)
    assert [r["t"] for r in read_history(path)] == [0, 2, 3]
    path.write_text('{"torn')
    HistoryLog(path).close()
    assert path.read_text() == ""


def test_a_full_disk_costs_records_not_the_run_and_leaves_no_torn_line(tmp_path, monkeypatch):
    """A reviewer filled the run directory's disk: `league run` died on the history's ENOSPC (and again in its
    close), before its summary, plots and the coordinator's restart. Now a failed write is dropped (its part
    cut off again), `error` says so, and the newest record is tried again."""
    import errno
    import os

    import league_cli.history as history

    path = tmp_path / "h.jsonl"
    real_write = os.write
    full = [False]

    def write(fd, data):
        if full[0]:  # as a disk that fills up mid-line: part of it lands, then ENOSPC
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(history.os, "write", write)
    with HistoryLog(path, bytes_per_s=1e9) as log:
        assert log.offer({"t": 0}, now=0.0) and log.error is None
        full[0] = True
        assert not log.offer({"t": 1}, now=1.0)
        assert "a status record was not written: No space left on device" in log.error
        assert not log.offer({"t": 2}, now=2.0)
        assert [r["t"] for r in _lines(path)] == [0]  # no torn line
        full[0] = False
        assert log.offer({"t": 3}, now=3.0) and log.error is None
        full[0] = True
        assert not log.offer({"t": 4}, now=4.0)
    # close() tried the newest record once more, failed, and did not raise
    assert [r["t"] for r in _lines(path)] == [0, 3]


def test_the_newest_record_is_read_from_the_end_of_the_file(tmp_path):
    """`league eval --run-dir` parsed every line of the history to find the last one: minutes at a day's history
    (~1.3 GB). Records larger than the blocks read from the end (MBs, late in a run) and a torn tail are fine."""
    from league_cli.history import newest_record

    path = tmp_path / "h.jsonl"
    big = "x" * (3 << 20)  # each record spans several of the 1 MiB blocks
    path.write_text("".join(json.dumps({"t": t, "pad": big}) + "\n" for t in range(3)) + '{"t": 3, "pa')
    assert newest_record(path)["t"] == 2
    path.write_text(json.dumps({"t": 0}) + "\n\n")
    assert newest_record(path) == {"t": 0}
    path.write_text('{"torn')
    assert newest_record(path) is None
    path.write_text("")
    assert newest_record(path) is None


def test_plots_read_at_most_so_many_records_evenly_spaced_ending_at_the_newest(tmp_path):
    """A day's history read whole as records took gigabytes (4.5 bytes of memory per byte of file, measured):
    the plots read at most PLOT_MAX_RECORDS of them, and the lines left out are not even parsed."""
    from league_cli.plot import iter_history

    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps({"t": t, "players": [], "payoff": []}) + "\n" for t in range(50))
                    + '{"t": 50, "pla')
    assert [r["t"] for r in iter_history(path)] == list(range(50))
    thinned = [r["t"] for r in iter_history(path, max_records=10)]
    assert len(thinned) == 10 and thinned[0] == 0 and thinned[-1] == 49
    assert all(0 < b - a <= 6 for a, b in itertools.pairwise(thinned))
    assert [r["t"] for r in iter_history(path, max_records=100)] == list(range(50))


def test_thinned_plots_still_find_where_a_resumed_run_began(tmp_path):
    """RunClock sees a resumed run only where `elapsed_s` drops between two records it is given: thinned to
    1,000 records, a 60 s run followed by a day's resume lost the first run's seconds (86,398 s at the newest
    record, not 86,456). Each run's last record and the next one's first are kept."""
    from league_cli.plot import RunClock, iter_history

    path = tmp_path / "h.jsonl"
    runs = [range(0, 60, 2), range(0, 10_000, 2)]
    path.write_text("".join(json.dumps({"players": [], "payoff": [], "elapsed_s": float(t)}) + "\n"
                            for run in runs for t in run))

    def newest_time(records) -> float:
        clock = RunClock()
        return [clock.time(r) for r in records][-1]

    assert newest_time(iter_history(path, max_records=100)) == newest_time(iter_history(path)) == 58 + 9998
    assert len(list(iter_history(path, max_records=100))) <= 100


def test_a_history_resumed_many_times_is_still_read_within_the_limit(tmp_path):
    """Each resume added its two records beyond the limit: 200 resumes made 1,330 records of 1,000 (a review).
    The newest resumes are kept, within half the records."""
    from league_cli.plot import iter_history

    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps({"players": [], "payoff": [], "run": run, "elapsed_s": float(t)}) + "\n"
                            for run in range(200) for t in range(0, 46, 2)))
    read = list(iter_history(path, max_records=100))
    assert len(read) <= 100 and read[-1]["run"] == 199 and read[-1]["elapsed_s"] == 44.0
    firsts = {r["run"] for r in read if r["elapsed_s"] == 0.0}
    assert set(range(175, 200)) <= firsts  # the newest 25 resumes, each with the record before it


def test_a_history_that_cannot_be_opened_costs_its_records_not_the_run(tmp_path):
    """`status_history.jsonl` a directory (or not writable): `league run` ended in an IsADirectoryError
    traceback right after its processes started. Now it is like a failed write: said, and tried again."""
    path = tmp_path / "h.jsonl"
    path.mkdir()
    log = HistoryLog(path, bytes_per_s=10_000)
    assert log.error is not None and "status records cannot be written" in log.error
    assert not log.offer({"t": 0}, now=0.0)
    path.rmdir()  # fixed while the run goes on
    assert log.offer({"t": 1}, now=1.0) and log.error is None
    log.close()
    log.close()
    assert [r["t"] for r in _lines(path)] == [1]


def test_a_record_offered_as_a_callable_is_built_only_when_it_is_written(tmp_path):
    """A league with thousands of historical players took over a second of CPU a poll to build and encode a
    record the log then held back (a review): `league run`'s supervisor loop spent a core on it."""
    path = tmp_path / "h.jsonl"
    built = []

    def record(t):
        def build():
            built.append(t)
            return {"t": t}
        return build

    with HistoryLog(path, bytes_per_s=1.0) as log:
        assert log.offer(record(0), now=0.0)
        assert not log.offer(record(1), now=1.0) and not log.offer(record(2), now=2.0)
        assert built == [0]
    assert built == [0, 2] and [r["t"] for r in _lines(path)] == [0, 2]  # the newest, at close
