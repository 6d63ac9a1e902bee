"""`league run`'s monitor keeps only the events its live view shows, however many status polls fail."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import grpc

from league_cli.run_monitor import SHOWN_EVENTS, RunMonitor


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect to all addresses"


class _DownStub:
    def GetStatus(self, *args, **kwargs):  # noqa: N802 (the gRPC method's name)
        raise _Unavailable()


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text, **kwargs) -> None:
        self.lines.append(str(text))


def test_failed_status_polls_keep_the_events_bounded() -> None:
    console = _Console()
    monitor = RunMonitor(sup=None, stub=_DownStub(), console=console,
                         run_cfg=SimpleNamespace(env_steps=0, status_interval_s=2.0, seconds=1e9),
                         history_path=Path("/dev/null"), start=time.monotonic(), quiet=True, log_errors=None)
    for _ in range(1_000):  # each failed poll used to append one event: the list grew for as long as they failed
        assert monitor._poll(history=None, live=None, stop=None) is None
    assert len(monitor.events) == SHOWN_EVENTS
    assert list(monitor.events)[-1] == "status: UNAVAILABLE: failed to connect to all addresses"
    assert len(console.lines) == 1  # (said once per kind of failure, as before)


def test_the_live_view_shows_the_newest_events() -> None:
    from rich.console import Console

    from league_cli.run_monitor import progress_table

    monitor = RunMonitor(sup=None, stub=_DownStub(), console=_Console(),
                         run_cfg=SimpleNamespace(env_steps=0, status_interval_s=2.0, seconds=60.0),
                         history_path=Path("/dev/null"), start=time.monotonic(), quiet=True, log_errors=None)
    monitor.events += [f"event {i}" for i in range(10)]
    counters = SimpleNamespace(env_steps=0, matches=0, jobs_finished=0, jobs_expired=0, snapshots=0, mutations=0)
    status = SimpleNamespace(counters=counters, league_type="one_vs_one", players=[])
    console = Console(width=200, record=True)
    console.print(progress_table(status, 1.0, monitor.run_cfg, 0, 0.0, monitor.events))
    text = console.export_text()
    assert [f"event {i}" in text for i in range(10)] == [False] * 7 + [True] * 3


def test_a_quiet_line_shows_this_runs_steps_against_an_env_step_budget(tmp_path) -> None:
    """A resumed run's line showed the league's env steps since its start only, not how much of this run's
    budget was left (a review)."""
    from common.proto.league.v1 import league_pb2
    from league_cli.history import HistoryLog

    class _Stub:
        def __init__(self) -> None:
            self.steps = iter([1_000, 1_500])

        def GetStatus(self, *args, **kwargs):  # noqa: N802 (the gRPC method's name)
            return league_pb2.LeagueStatus(counters=league_pb2.Counters(env_steps=next(self.steps)))

    console = _Console()
    monitor = RunMonitor(sup=None, stub=_Stub(), console=console,
                         run_cfg=SimpleNamespace(env_steps=2_000, status_interval_s=2.0, seconds=1e9),
                         history_path=tmp_path / "history.jsonl", start=time.monotonic(), quiet=True, log_errors=None)
    with HistoryLog(tmp_path / "history.jsonl") as history:
        for _ in range(2):
            monitor._poll(history=history, live=None, stop=None)
    assert "env steps 1,000 (this run 0/2,000)" in console.lines[0]
    assert "env steps 1,500 (this run 500/2,000)" in console.lines[1]
