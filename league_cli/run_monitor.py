"""`league run`'s watch over a running league: a status poll every interval, the progress it shows, the
history it records, and the reasons it ends early.

Kept apart from run.py, which starts and stops the processes: this is what happens between the two.
"""

from __future__ import annotations

import functools
import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from league_cli.history import HistoryLog
from league_cli.log_errors import LogErrors
from league_cli.run_watch import FailingJobsWatch, StallWatch, StepBudget, StepRate

if TYPE_CHECKING:
    from league_cli.run import RunConfig, Supervisor

WORKER_EXIT_GRACE_S = 3.0
"""A job that fails in every actor often fails in its learner too (an env that does not exist). The learner's
setup-error exit names the cause more directly than the given-up jobs, but it may land a moment after the
poll that sees them given up: the run waits this long for it before stopping on the failing jobs."""
STATUS_TIMEOUT_S = 5.0
SHOWN_EVENTS = 3
"""The newest events the live view shows; the monitor keeps no more (a status poll that fails adds one at every
poll: a coordinator that did not answer for a day, polled every 2 s, had grown the list by 43,200, ~7 MB)."""


@dataclass(frozen=True)
class EarlyEnd:
    """Why the run ends before its budget: the reason for the summary and the run's exit code."""

    reason: str
    exit_code: int


class RunMonitor:
    """Polls the league's status until the run's budget (seconds, env steps) is spent, `stop` is set, or the
    league's collect jobs keep failing. Shows progress (a live table on a terminal; with `quiet`, a line per
    poll) and what happens to the processes: restarts, the ERROR lines of their logs, a stall.

    `status` is the last status polled, also after `run` raised (a process that keeps dying): the run records
    it as where the league ended when the coordinator no longer answers."""

    def __init__(self, sup: Supervisor, stub: Any, console: Any, run_cfg: RunConfig, history_path: Path,
                 start: float, quiet: bool, log_errors: LogErrors) -> None:
        self.sup = sup
        self.stub = stub
        self.console = console
        self.run_cfg = run_cfg
        self.history_path = history_path
        self.start = start
        self.quiet = quiet
        self.log_errors = log_errors
        self.status: Any = None
        self.events: deque[str] = deque(maxlen=SHOWN_EVENTS)  # the newest few show under the live table
        self._status_error = ""
        self._step_rate = StepRate()
        self._step_budget = StepBudget(run_cfg.env_steps)
        self._failing_jobs = FailingJobsWatch()
        self._stall = StallWatch()
        self._wait_s = run_cfg.status_interval_s  # until the next poll: shorter as the env-step budget nears
        self._budget_spent = False
        self._history_error: str | None = None  # the history's last error said

    def run(self, stop: Any) -> EarlyEnd | None:
        """Watch until the budget is spent or `stop` is set (None), or the run must end early (why)."""
        from rich.live import Live

        with HistoryLog(self.history_path) as history, Live(console=self.console, auto_refresh=False,
                                                           transient=False, redirect_stdout=False) as live:
            while not stop.is_set():
                self._check_processes()
                early = self._poll(history, live, stop)
                if early is not None or self._budget_spent:
                    return early
                elapsed = time.monotonic() - self.start
                if elapsed >= self.run_cfg.seconds:
                    return None
                stop.wait(min(self._wait_s, max(0.0, self.run_cfg.seconds - elapsed)))
        return None

    def _check_processes(self) -> None:
        """Restarts (and failures, which raise) of the processes, and the ERROR lines they logged."""
        new_events = self.sup.check()
        self.events += new_events
        if self.quiet:
            for event in new_events:
                self.console.print(event, markup=False, soft_wrap=True)
        for line in self.log_errors.check(self.sup.group.processes):  # (above the live table, where it stays)
            self.console.print(line, style="red", markup=False, soft_wrap=True)  # (one line: grep finds it)

    def _note(self, note: str) -> None:
        self.events.append(note)
        if self.quiet:
            self.console.print(f"league run: {note}", style="yellow", markup=False, soft_wrap=True)

    def _poll(self, history: HistoryLog, live: Any, stop: Any) -> EarlyEnd | None:
        """One status poll, shown and recorded. A coordinator that does not answer ends nothing (it may be
        restarting): the run goes on and says so."""
        import grpc

        from common.proto.league.v1 import league_pb2

        try:
            status = self.stub.GetStatus(league_pb2.GetStatusRequest(), timeout=STATUS_TIMEOUT_S)
        except grpc.RpcError as err:
            error = f"status: {err.code().name}: {err.details()}"
            self.events.append(error)
            if self.quiet and error != self._status_error:  # once per kind of failure, not at every poll
                self.console.print(f"league run: {error}", style="yellow", markup=False, soft_wrap=True)
            self._status_error = error
            return None
        self._status_error = ""
        self.status = status
        now = time.monotonic()
        rate = self._step_rate.update(status.counters.env_steps, now)
        history.offer(functools.partial(history_record, status, now - self.start), now)
        if history.error != self._history_error:  # once when writes start failing, once when they work again
            self._note(history.error or f"{self.history_path}: status records are written again")
            self._history_error = history.error
        league_steps = status.counters.env_steps
        trained = sum(p.agent_steps for p in status.players if p.active)
        if (note := self._stall.check(league_steps, now, trained)) is not None:
            self._note(note)
        if self.quiet:
            c = status.counters
            # The league's env steps count from its start; an env-step budget counts this run's (a resumed run's
            # line showed the league's total only, so not how much of the budget was left; a review).
            budget = (f" (this run {self._step_budget.steps(league_steps):,}/{self.run_cfg.env_steps:,})"
                      if self.run_cfg.env_steps else "")
            self.console.print(f"[{now - self.start:6.0f}s] env steps {c.env_steps:,}{budget} ({rate:,.0f}/s) "
                               f"matches {c.matches:,} snapshots {c.snapshots}", markup=False, soft_wrap=True)
        else:
            live.update(progress_table(status, now - self.start, self.run_cfg, self._step_budget.steps(league_steps),
                                       rate, self.events), refresh=True)
        if self._step_budget.spent(league_steps):
            self._budget_spent = True
            return None
        failing = self._failing_jobs.check(status)
        if failing is not None:
            self.events += self.sup.wait_for_setup_errors(WORKER_EXIT_GRACE_S, stop)
            self.console.print(f"league run: {failing}", style="red", markup=False, soft_wrap=True)
            return EarlyEnd("collect jobs keep failing", 1)
        self._wait_s = self._step_budget.wait_s(league_steps, rate, self.run_cfg.status_interval_s)
        return None


def history_record(status: Any, elapsed_s: float) -> dict[str, Any]:
    """A status history line: the GetStatus reply as `league status --json` prints it, and the run's seconds."""
    from league_service.status_view import status_to_json

    record = json.loads(status_to_json(status))
    record["elapsed_s"] = elapsed_s
    return record


def progress_table(status: Any, elapsed: float, run_cfg: RunConfig, run_steps: int, steps_per_s: float,
                   events: Sequence[str]) -> Any:
    """The live view: counters, the active players, and the newest events."""
    from rich.console import Group
    from rich.text import Text

    from league_service.plain_table import PlainTable

    c = status.counters
    budget = f"{elapsed:,.0f}/{run_cfg.seconds:,.0f} s"
    if run_cfg.env_steps:
        budget += f", {run_steps:,}/{run_cfg.env_steps:,} env steps"
    header = Text(
        f"league run · {budget} · env steps {c.env_steps:,} ({steps_per_s:,.0f}/s) · matches {c.matches:,} · "
        f"jobs {c.jobs_finished:,} done, {c.jobs_expired:,} expired · snapshots {c.snapshots} · "
        f"mutations {c.mutations}"
    )
    table = PlainTable(expand=False)
    solo = status.league_type == "solo"  # no opponents, no ratings; a battle league keeps no returns
    for col in ("player", "type", "steps", "iter", "ckpt v", *(("return",) if solo else ("elo", "mu±sigma"))):
        table.add_column(col, justify="left" if col in ("player", "type") else "right")
    for p in status.players:
        if not p.active:
            continue
        table.add_row(p.player_id, p.player_type, f"{p.agent_steps:,}", f"{p.train_iteration:,}",
                      str(p.checkpoint_version),
                      *((f"{p.mean_return:.1f}" if p.episodes else "-",) if solo
                        else (f"{p.elo:.0f}", f"{p.trueskill_mu:.1f}±{p.trueskill_sigma:.1f}")))
    historical = sum(1 for p in status.players if not p.active)
    parts = [header, table, Text(f"historical players: {historical}")]
    parts += [Text(e, style="yellow") for e in list(events)[-SHOWN_EVENTS:]]
    return Group(*parts)
