"""What every benchmark returns, and the machine line printed with it.

A benchmark compares against a baseline measured in the same run and reports the ratio; the goal is a
sentence, not an assertion (speed goals are met in benchmarks, never as timed tests).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO


@dataclass(frozen=True)
class BenchRow:
    metric: str
    value: float
    unit: str
    baseline_name: str
    baseline_value: float
    goal: str
    met: bool | None = None  # None when the goal is not a plain threshold on this row

    @property
    def ratio(self) -> float:
        return self.value / self.baseline_value if self.baseline_value else float("nan")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_line() -> str:
    return f"{os.cpu_count()} cores, {cpu_model()}, {datetime.date.today().isoformat()}"


def print_rows(title: str, rows: list[BenchRow]) -> None:
    print(f"\n## {title}  ({machine_line()})")
    for r in rows:
        flag = "" if r.met is None else ("  [goal met]" if r.met else "  [goal NOT met]")
        print(
            f"  {r.metric}: {r.value:,.1f} {r.unit}  vs {r.baseline_name} {r.baseline_value:,.1f}"
            f"  ratio {r.ratio:.2f}  goal: {r.goal}{flag}"
        )


class Terminated(SystemExit):
    """The SystemExit of a SIGTERM (`exit_on_sigterm`): it ends `run_all` too, which goes on past a benchmark
    that failed or exited for any other reason."""


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit (`Terminated`), so a benchmark stopped that way (not only by Ctrl-C)
    unwinds: its `run_until_done` of a `league run` stops that run and waits for it, and the servers it started
    in sessions of their own (the coordinator benchmarks') are stopped, not left running."""

    def terminated(signum: int, frame: object) -> None:
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, terminated)


def league_bench_args(doc: str | None, argv: list[str] | None, quick_s: float, full_s: float) -> tuple[bool, float]:
    """(`--quick`, the league run's budget) of a benchmark that runs one league (`--seconds` overrides the
    budget); a SIGTERM from here on unwinds it (`exit_on_sigterm`)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float, default=None, help="league run budget")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    return args.quick, args.seconds or (quick_s if args.quick else full_s)


STOP_GRACE_S = 60.0


def run_until_done(
    cmd: Sequence[str], *, timeout: float, stdout: int | IO | None = None, cwd: Path | None = None,
    grace_s: float = STOP_GRACE_S,
) -> None:
    """`subprocess.run(cmd, check=True, timeout=...)` for a `league run`, stopped the way it expects.

    Why not `subprocess.run`: interrupted (Ctrl-C, the SystemExit of `exit_on_sigterm`, the timeout), it kills
    the child outright. A `league run` killed so leaves its children to stop on their own (they follow their
    supervisor), still writing into the run directory while the benchmark removes it, so the temp directory
    could stay behind. Here the child gets SIGTERM, stops every process of its league and is waited for (up to
    `grace_s`, then it is killed) before the exception goes on.
    """
    proc = subprocess.Popen(list(cmd), stdout=stdout, cwd=cwd)
    try:
        code = proc.wait(timeout=timeout)
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if code != 0:
        raise subprocess.CalledProcessError(code, list(cmd))
