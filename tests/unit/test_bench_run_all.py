"""bench/run_all.py: a benchmark that raises is reported in the file and in the exit status."""

from __future__ import annotations

from bench import run_all


def test_a_broken_benchmark_fails_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(run_all, "BENCHMARKS", (("bench.no_such_benchmark", "Broken"),))
    out = tmp_path / "latest.md"
    assert run_all.main(["--out", str(out)]) == 1
    assert "Did not run:" in out.read_text()


def test_an_only_that_matches_nothing_is_refused_and_writes_nothing(tmp_path):
    import pytest

    out = tmp_path / "latest.md"
    with pytest.raises(SystemExit) as exc:
        run_all.main(["--only", "bench_chekpoint", "--out", str(out)])
    assert exc.value.code == 2
    assert not out.exists()


def test_every_benchmark_takes_the_quick_flag_run_all_passes(tmp_path, monkeypatch):
    """`run_all --quick` passes --quick to each benchmark; two had no such option: argparse's SystemExit went
    past run_all's handler, and the run ended with no file written and the benchmarks after unrun (a review).
    Every benchmark now takes it, and one that exits is reported like one that raises."""
    import argparse
    import importlib

    import pytest

    class Parsed(Exception):
        """Raised once a benchmark's arguments parse, before it runs."""

    def parse_or_fail(self, args=None, namespace=None):
        _, unknown = self.parse_known_args(args, namespace)
        assert not unknown, (self.prog, unknown)
        raise Parsed

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_or_fail)
        for module, _ in run_all.BENCHMARKS:
            with pytest.raises(Parsed):
                importlib.import_module(module).main(["--quick"])
    monkeypatch.setattr(run_all, "BENCHMARKS", (("bench.bench_league_scale", "Exits"), ("bench.bench_league_scale",
                                                                                         "Runs")))
    real_main = importlib.import_module("bench.bench_league_scale").main
    calls = []

    def first_exits(argv):
        calls.append(argv)
        if len(calls) == 1:
            raise SystemExit(2)
        return real_main(["--players", "40", "--calls", "2"])

    monkeypatch.setattr(importlib.import_module("bench.bench_league_scale"), "main", first_exits)
    out = tmp_path / "latest.md"
    assert run_all.main(["--quick", "--out", str(out)]) == 1
    text = out.read_text()
    assert "Did not run:" in text and "SystemExit" in text and "get_job, 40 historical players" in text


def test_the_race_to_the_goal_is_judged_alike_in_both_benchmarks():
    """bench_system (CartPole) counted a league that reached the goal when SB3 never did as not met, where
    bench_pendulum counted it met (a review): one rule now."""
    from bench.bench_system import race_met

    assert race_met(5.0, 6.0) is True and race_met(7.0, 6.0) is False
    assert race_met(5.0, None) is True and race_met(None, 6.0) is False and race_met(None, None) is None


def test_a_sigterm_stops_the_whole_run_not_only_the_benchmark_it_hits(tmp_path, monkeypatch):
    """A SIGTERM unwinds the benchmark under way (the coordinator benchmarks' servers, in sessions of their own,
    were left running by one) and then ends run_all, which goes on past a benchmark that exits for any other
    reason: a SIGTERM's exit must not start the next benchmark."""
    import importlib
    import os
    import signal

    import pytest

    from bench.common import Terminated

    monkeypatch.setattr(run_all, "BENCHMARKS", (("bench.bench_league_scale", "Killed"),
                                                ("bench.bench_league_scale", "Never runs")))
    calls = []
    unwound = []

    def killed(argv):
        calls.append(argv)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            unwound.append(True)

    monkeypatch.setattr(importlib.import_module("bench.bench_league_scale"), "main", killed)
    previous = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "latest.md"
    try:
        with pytest.raises(Terminated) as exc:
            run_all.main(["--quick", "--out", str(out)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exc.value.code == 128 + signal.SIGTERM
    assert len(calls) == 1 and unwound == [True] and not out.exists()
