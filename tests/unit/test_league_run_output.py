"""`league run`'s console when its reader goes away (`league run | tee` at a Ctrl-C, `| head`), its terminal does
(EIO), or its disk fills; and a command started without standard descriptors."""

import errno
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from common.closed_output import GuardedOutput
from league_cli.run import stop_on_closed_output

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_reader_stops_the_run_and_later_prints_go_nowhere():
    """Rich's default raised SystemExit(1) from the first print after the reader died: from the line saying the
    workers are stopping, it skipped their ordered stop and the summary."""
    read, write = os.pipe()
    os.close(read)
    out = os.fdopen(write, "w")
    console = Console(file=out, force_terminal=False)
    closed = []
    stop_on_closed_output(console, lambda: closed.append(True))
    try:
        console.print("league run: stopping the actors, then the learners, then the coordinator")
        assert closed == [True]
        console.print("the summary")  # nothing raised, nothing written
        out.write("buffered")
        out.flush()  # the descriptor now leads nowhere: no BrokenPipeError at exit either
    finally:
        out.close()


class _Failing:
    """A stream whose writes raise `error` while it is set."""

    def __init__(self) -> None:
        self.error: OSError | None = None
        self.written: list[str] = []

    def write(self, text: str) -> int:
        if self.error is not None:
            raise self.error
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_a_terminal_gone_stops_the_run_and_a_full_disk_loses_lines_not_the_run():
    """EIO (a terminal hung up under `league run &`) and ENOSPC (`> out.log` on a full disk) escaped the print at the
    stop: a traceback, exit 1, and every process got the parent-death signal at once (a review). A terminal gone is
    a closed output, said to the run even when it failed before the run listened; a full disk drops lines only."""
    stream = _Failing()
    guarded = GuardedOutput(stream)
    console = Console(file=guarded, force_terminal=False)
    stream.error = OSError(errno.ENOSPC, "No space left on device")
    console.print("lost")
    stream.error = None
    console.print("kept")
    assert not guarded.gone and "".join(stream.written) == "kept\n"
    stream.error = OSError(errno.EIO, "Input/output error")
    console.print("to a terminal gone")
    assert guarded.gone and not guarded.isatty()
    closed = []
    guarded.on_closed(lambda: closed.append(True))  # set after the failure: called at once
    stream.error = None
    console.print("nowhere")
    assert closed == [True] and "".join(stream.written) == "kept\n"


def test_a_command_started_without_standard_descriptors_gets_them_on_dev_null():
    """`league run <&-`: the run lock took fd 0, every process it started had its stdin put there, and none of
    them held the lock (a second run was let into the directory); with `>&-` the first print raised, as
    sys.stdout was None (a review)."""
    probe = ("import os, sys; from league_cli.main import _standard_streams_open; _standard_streams_open(); "
             "fd = os.open(os.devnull, os.O_RDONLY); "
             "print(fd, sys.stdin is not None, sys.stdout is not None, file=sys.stderr)")
    for closed in ((0,), (1,), (0, 1)):
        code = (f"import os, subprocess, sys\n"
                f"for fd in {closed}: os.close(fd)\n"
                f"sys.exit(subprocess.call([sys.executable, '-c', {probe!r}], close_fds=False))")
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stderr.split() == ["3", "True", "True"], (closed, done.stderr)


def test_a_character_the_output_cannot_encode_costs_that_character_not_the_run():
    """UnicodeEncodeError is a ValueError, as a write to a closed file is: it must not be taken for a closed
    output (the run would stop)."""
    import io

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    guarded = GuardedOutput(stream)
    guarded.write("league run: runs/x \u00b7 2 learner(s)\n")
    guarded.flush()
    assert not guarded.gone and raw.getvalue() == b"league run: runs/x ? 2 learner(s)\n"
