"""`league run` tells why a process stopped with the last lines of its log: only that process's lines, though
a resumed run appends to the same file (a reviewer saw errors of two earlier runs above the real one)."""

from __future__ import annotations

import sys

from league_cli.processes import ProcessGroup


def _run(group: ProcessGroup, name: str, text: str):
    proc = group.start(name, [sys.executable, "-c", f"print({text!r})"])
    proc.popen.wait(30)
    group.forget(proc)
    return proc


def test_the_log_tail_holds_only_this_process_and_the_file_marks_where_it_began(tmp_path):
    group = ProcessGroup(tmp_path / "logs")
    first = _run(group, "coordinator", "error of an earlier run")
    assert first.log_tail() == "error of an earlier run"
    second = _run(group, "coordinator", "error of this run")
    assert second.log_tail() == "error of this run"
    lines = (tmp_path / "logs" / "coordinator.log").read_text().splitlines()
    assert lines[0] == "error of an earlier run" and lines[-1] == "error of this run"
    assert "coordinator started again; the lines above are from before" in lines[1]


def test_a_full_disk_costs_the_mark_not_the_restart(tmp_path, monkeypatch):
    """A process that died of a full disk filled its log: the mark before its restart failed with ENOSPC, and
    `league run` died with it (a reviewer's find)."""
    import errno

    import league_cli.processes as processes

    group = ProcessGroup(tmp_path / "logs")
    _run(group, "coordinator", "before the disk filled")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(processes.os, "write", full)
    proc = _run(group, "coordinator", "after")
    assert proc.log_tail() == "after"


def test_the_log_tail_reads_only_the_end_of_a_long_log(tmp_path, monkeypatch):
    import league_cli.processes as processes

    monkeypatch.setattr(processes, "TAIL_READ_BYTES", 100)
    group = ProcessGroup(tmp_path / "logs")
    proc = group.start("actor-0", [sys.executable, "-c", "for i in range(1000): print(f'line {i:04d} ' + 'x' * 20)"])
    proc.popen.wait(30)
    tail = proc.log_tail(lines=100).splitlines()
    assert tail == [f"line {i:04d} " + "x" * 20 for i in range(997, 1000)]  # whole lines only, the last ones


def test_a_process_that_wrote_nothing_says_where_its_earlier_lines_are(tmp_path):
    """A crash loop's last death during imports left "last log lines:" followed by nothing (a review)."""
    group = ProcessGroup(tmp_path)
    proc = group.start("quiet", [sys.executable, "-c", "pass"])
    proc.popen.wait(30)
    assert proc.log_tail() == ""
    assert proc.last_words() == f"(nothing since it last started; earlier lines are in {proc.log_path})"
    group.stop()
