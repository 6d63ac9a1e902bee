"""league run's view of its processes' logs: new ERROR lines, once each, from this run's lines only."""

from __future__ import annotations

import os
import re
from pathlib import Path

from league_cli import log_errors
from league_cli.log_errors import MAX_LINES_PER_POLL, MAX_MESSAGE_CHARS, LogErrors
from league_cli.processes import ManagedProcess


def _proc(path: Path, name: str = "learner-0", offset: int = 0) -> ManagedProcess:
    return ManagedProcess(name, ["league", "learner"], path, popen=None, log_offset=offset)  # type: ignore[arg-type]


def _line(level: str, message: str, logger: str = "learner_service.publisher") -> str:
    return f"2026-11-28 15:01:20,123+0100 {level} {logger}: {message}\n"


def test_error_lines_of_this_run_are_shown_once_and_nothing_else(tmp_path):
    log = tmp_path / "learner-0.log"
    earlier = _line("ERROR", "from the run before")
    log.write_text(earlier)
    watch = LogErrors()
    proc = _proc(log, offset=len(earlier))
    assert watch.check([proc]) == []
    with log.open("a") as f:
        f.write(_line("INFO", "published v3") + _line("WARNING", "slow publish"))
        f.write(_line("ERROR", "publish failed: [Errno 28] No space left on device"))
        f.write("Traceback (most recent call last):\n  File \"x.py\", line 1\nOSError: [Errno 28]\n")
        f.write(_line("CRITICAL", "giving up", logger="root"))
    assert watch.check([proc]) == [
        "learner-0: ERROR learner_service.publisher: publish failed: [Errno 28] No space left on device",
        "learner-0: CRITICAL root: giving up",
    ]
    assert watch.check([proc]) == []  # once each


def test_a_line_still_being_written_waits_for_its_end(tmp_path):
    log = tmp_path / "actor-0.log"
    line = _line("ERROR", "the env could not be built")
    log.write_text(line[:30])
    watch = LogErrors()
    proc = _proc(log, "actor-0")
    assert watch.check([proc]) == []
    with log.open("a") as f:
        f.write(line[30:])
    assert watch.check([proc]) == ["actor-0: ERROR learner_service.publisher: the env could not be built"]


def test_a_burst_is_cut_to_a_few_lines_and_a_count(tmp_path):
    log = tmp_path / "coordinator.log"
    log.write_text("".join(_line("ERROR", f"write failed {i}") for i in range(10)))
    lines = LogErrors().check([_proc(log, "coordinator")])
    assert len(lines) == MAX_LINES_PER_POLL + 1
    assert lines[-1] == f"coordinator: and {10 - MAX_LINES_PER_POLL} more ERROR line(s) in {log}"


def test_a_long_message_is_shortened(tmp_path):
    log = tmp_path / "learner-0.log"
    log.write_text(_line("ERROR", "x" * 10_000))
    (line,) = LogErrors().check([_proc(log)])
    assert len(line.split(": ", 2)[2]) == MAX_MESSAGE_CHARS and line.endswith("…")


def test_a_restarted_process_is_read_on_from_its_predecessors_last_words(tmp_path):
    log = tmp_path / "learner-0.log"
    watch = LogErrors()
    log.write_text(_line("INFO", "bound"))
    assert watch.check([_proc(log)]) == []
    with log.open("a") as f:
        f.write(_line("ERROR", "the last words"))
        f.write("---- 2026-11-28 15:02:00: learner-0 started again; the lines above are from before ----\n")
    restarted = _proc(log, offset=log.stat().st_size)
    with log.open("a") as f:
        f.write(_line("ERROR", "the new one fails too"))
    assert [line.split(": ")[-1] for line in watch.check([restarted])] == ["the last words", "the new one fails too"]


def test_a_missing_or_truncated_log_is_no_error(tmp_path):
    log = tmp_path / "actor-1.log"
    watch = LogErrors()
    proc = _proc(log, "actor-1")
    assert watch.check([proc]) == []  # not created yet
    log.write_text(_line("INFO", "a long line " * 20))
    assert watch.check([proc]) == []
    log.write_text(_line("ERROR", "after a truncation"))  # shorter than where the watch was
    assert watch.check([proc]) == ["actor-1: ERROR learner_service.publisher: after a truncation"]


def test_a_process_no_longer_listed_is_still_read_to_its_end(tmp_path):
    """`league run` stops its workers and forgets them, then looks for what they logged while stopping: the
    final check named only the coordinator, and a learner's last ERROR (its final checkpoint on a full disk)
    never reached the run's output."""
    log = tmp_path / "learner-0.log"
    log.write_text(_line("INFO", "up"))
    watch = LogErrors()
    assert watch.check([_proc(log)]) == []
    with log.open("a") as f:
        f.write(_line("ERROR", "final checkpoint not written: [Errno 28] No space left on device"))
    assert watch.check([]) == [
        "learner-0: ERROR learner_service.publisher: final checkpoint not written: [Errno 28] No space left on device"
    ]


def test_the_last_check_reads_a_log_to_its_end(tmp_path, monkeypatch):
    """A poll reads a bounded piece of each log; the run's last check (its processes stopped) reads them to their
    end, so an ERROR after more than a piece of other lines still shows."""
    monkeypatch.setattr(log_errors, "MAX_READ_BYTES", 256)
    log = tmp_path / "learner-0.log"
    log.write_text("".join(_line("INFO", f"line {i}") for i in range(40)) + _line("ERROR", "the last word"))
    watch = LogErrors()
    assert watch.check([_proc(log)]) == []  # the first 256 bytes
    assert watch.check([], to_end=True) == ["learner-0: ERROR learner_service.publisher: the last word"]


def test_the_services_log_format_is_the_one_read(tmp_path):
    """The three service CLIs log through cli_args.configure_logging; a line in that format is what is parsed."""
    import logging

    from common.cli_args import LOG_FORMAT, LogFormatter

    record = logging.LogRecord("league.learner", logging.ERROR, __file__, 1, "publish failed: %s", ("disk full",),
                               None)
    log = tmp_path / "learner-0.log"
    log.write_text(LogFormatter(LOG_FORMAT).format(record) + "\n")
    assert LogErrors().check([_proc(log)]) == ["learner-0: ERROR league.learner: publish failed: disk full"]


def test_a_service_log_line_says_its_utc_offset(tmp_path):
    """Local time alone: the lines of hosts in different time zones could not be put in order."""
    import subprocess
    import sys

    script = ("import logging; from common.cli_args import configure_logging; configure_logging('INFO'); "
              "logging.getLogger('league.learner').error('publish failed: disk full')")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TZ": "Asia/Kolkata"}, check=True)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\+0530 ERROR league.learner: publish failed: disk full\n",
                        run.stderr), run.stderr
    log = tmp_path / "learner-0.log"
    log.write_text(run.stderr)
    assert LogErrors().check([_proc(log)]) == ["learner-0: ERROR league.learner: publish failed: disk full"]
