"""`league run`'s console when its reader goes away (`league run | tee` at a Ctrl-C, `| head`)."""

import os

from rich.console import Console

from league_cli.run import stop_on_broken_pipe


def test_a_closed_reader_stops_the_run_and_later_prints_go_nowhere():
    """Rich's default raised SystemExit(1) from the first print after the reader died: from the line saying the
    workers are stopping, it skipped their ordered stop and the summary."""
    read, write = os.pipe()
    os.close(read)
    out = os.fdopen(write, "w")
    console = Console(file=out, force_terminal=False)
    closed = []
    stop_on_broken_pipe(console, lambda: closed.append(True))
    try:
        console.print("league run: stopping the actors, then the learners, then the coordinator")
        assert closed == [True]
        console.print("the summary")  # nothing raised, nothing written
        out.write("buffered")
        out.flush()  # the descriptor now leads nowhere: no BrokenPipeError at exit either
    finally:
        out.close()
