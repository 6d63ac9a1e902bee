"""`league run`'s own config section and the plot command, without starting processes."""

import json
from pathlib import Path

import pytest
import yaml

from common.config import ConfigError, from_dict
from common.policy_config import PolicyConfig
from common.proto.league.v1 import league_pb2
from league_cli.plot import read_history, run_seconds, write_plots
from league_cli.run import RunConfig, active_player_count
from league_cli.run_watch import MIN_POLL_S, FailingJobsWatch, StepBudget, StepRate
from league_service.config import config_from_dict, load_config
from tests.full_disk import pretend_full_disk

ROOT = Path(__file__).resolve().parents[2]


def test_run_section_is_typed_and_errors_name_the_key():
    assert from_dict(RunConfig, {"actors": 3, "seconds": 10}, "run").actors == 3
    with pytest.raises(ConfigError, match="run.actors"):
        from_dict(RunConfig, {"actors": "many"}, "run")
    with pytest.raises(ConfigError, match="run.bogus"):
        from_dict(RunConfig, {"bogus": 1}, "run")
    with pytest.raises(ConfigError, match="manager: must be 'subprocess' or 'base'"):
        RunConfig(manager="threads")


@pytest.mark.parametrize(
    "section, message",
    [
        ({"actors": 0}, "run.actors: must be within [1, 256], got 0"),
        ({"actors": 100_000}, "run.actors: must be within [1, 256], got 100000"),  # spawned for many minutes
        ({"env_num_per_actor": -1}, "run.env_num_per_actor: must be within [0, 4096]"),
        ({"manager": "threads"}, "run.manager: must be 'subprocess' or 'base'"),
        ({"seconds": 0}, "run.seconds: must be > 0"),
        ({"seconds": 5e7}, "run.seconds: must be > 0 and at most 1e+07"),  # as every duration (README)
        ({"seconds": float("inf")}, "run.seconds: expected a finite float"),
        ({"env_steps": -5}, "run.env_steps: must be >= 0"),
        ({"learner_device": "gpu"}, "run.learner_device: expected auto, cpu, cuda or cuda:N, got 'gpu'"),
        ({"learner_device": "cuda:00"}, "run.learner_device: expected auto, cpu, cuda or cuda:N"),
    ],
)
def test_run_section_values_are_checked_with_the_keys_path(section, message):
    with pytest.raises(ConfigError) as info:
        from_dict(RunConfig, section, "run")
    assert str(info.value).startswith(message)  # once: not "run.run.actors"


def test_a_bad_run_section_in_the_file_is_refused_even_when_a_flag_overrides_it(tmp_path):
    """The file's section is saved in the run directory, and a resume (no flags) failed on it."""
    import argparse

    from league_cli.run import _load

    path = tmp_path / "league.yaml"
    path.write_text(yaml.safe_dump({"run": {"seconds": -10}}))
    with pytest.raises(ConfigError) as info:
        _load(argparse.Namespace(config=path, actors=None, seconds=15.0, env_steps=None))
    assert str(info.value) == f"run.seconds: must be > 0 and at most 1e+07, got -10.0 (in {path})"
    path.write_text(yaml.safe_dump({"run": {"seconds": 10}}))
    assert _load(argparse.Namespace(config=path, actors=None, seconds=15.0, env_steps=None))[1].seconds == 15.0


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"actors": 0}, "--actors (run.actors): must be within [1, 256], got 0"),
        ({"env_steps": -3}, "--env-steps (run.env_steps): must be >= 0, got -3"),
    ],
)
def test_a_bad_flag_is_named_as_typed(flags, message):
    """`league run --actors 0` was refused as `run.actors`, a key the user never wrote."""
    import argparse

    from league_cli.run import _load

    args = argparse.Namespace(config=None, **{"actors": None, "seconds": None, "env_steps": None, **flags})
    with pytest.raises(ConfigError) as info:
        _load(args)
    assert str(info.value) == message


def test_the_refusal_to_resume_another_league_type_says_how_to_resume_it(tmp_path):
    """Its hint was pasted after "resume it with" and read as garbage."""
    from league_cli.run import _saved_league_mismatch
    from league_service.coordinator_testing import run_dir_holding

    run_dir = tmp_path / "run"
    solo = ROOT / "configs" / "solo_cartpole.yaml"
    run_dir_holding(run_dir, solo)
    (run_dir / "config.yaml").write_text(solo.read_text())
    message = _saved_league_mismatch(run_dir, None, load_config(None))
    assert f"says 'one_vs_one': resume it with `league run --run-dir {run_dir}` and no CONFIG (it resumes with its " \
           f"own {run_dir / 'config.yaml'}), or start another league in a new --run-dir" in message, message


def test_the_win_rate_plot_shows_the_games_played():
    from league_cli.plot import _games_played

    assert _games_played({"games": 99.99, "games_played": "1024"}) == 1024  # JSON writes int64 as a string
    assert _games_played({"games": 12.5}) == 12.5  # a history from before the count: the decayed one
    assert _games_played({"games_played": "x"}) == 0


def test_step_rate_starts_from_the_first_poll_not_from_zero():
    """A run resumed in an existing --run-dir starts with the steps its league already counted."""
    rate = StepRate()
    assert rate.update(17_168, 100.0) == 0.0
    assert rate.update(19_168, 102.0) == 1_000.0
    assert rate.update(19_168, 102.0) == 1_000.0  # no time passed: no division by zero


def test_step_rate_is_taken_over_a_window_not_the_gap_between_two_polls():
    """Polls milliseconds apart (the last one before the --seconds budget) showed 0/s, or 55,000/s when a job
    finished in the gap, in a run going at 4,000/s."""
    rate = StepRate(window_s=5.0)
    steps = 0
    for t in range(11):  # 4,000 steps/s, polled every second
        steps = 4_000 * t
        rate.update(steps, float(t))
    # Over the polls since the newest one at least 5 s old (t = 5), not over the last gap.
    assert rate.update(steps, 10.01) == pytest.approx(4_000 * 5 / 5.01, rel=1e-6)  # nothing finished: not 0/s
    assert rate.update(steps + 4_096, 10.02) == pytest.approx((4_000 * 5 + 4_096) / 5.02, rel=1e-6)  # not 400k/s
    assert rate.update(steps + 4_096, 20.0) == 0.0  # nothing for ten seconds


def test_the_step_budget_counts_this_runs_steps_and_polls_sooner_near_its_end():
    budget = StepBudget(30_000)
    # A resumed league: 100k steps counted by earlier runs in the same --run-dir do not spend this run's budget.
    assert not budget.spent(100_000) and budget.steps(100_000) == 0
    assert budget.wait_s(100_000, 5_000.0, 2.0) == 2.0  # 6 s of steps left at 5k/s
    assert budget.wait_s(125_000, 5_000.0, 2.0) == 1.0  # 5k left: poll again when they should be done
    assert budget.wait_s(129_990, 5_000.0, 2.0) == MIN_POLL_S
    assert budget.wait_s(125_000, 0.0, 2.0) == 2.0  # no rate yet
    assert budget.steps(130_000) == 30_000 and budget.spent(130_000)
    unlimited = StepBudget(0)
    assert not unlimited.spent(10**9) and unlimited.wait_s(10**9, 1.0, 2.0) == 2.0


def test_one_learner_per_active_player():
    assert active_player_count(load_config(None)) == 3
    cfg = config_from_dict({"league": {"active_players": {"main_player": 2}, "player_category": ["a", "b"],
                                      "pretrain_checkpoint_path": {"a": "", "b": ""}}})
    assert active_player_count(cfg) == 4


def _record(t, elo_a, elo_b, payoff):
    players = [
        {"player_id": "a", "active": True, "elo": elo_a, "trueskill_mu": 25.0},
        {"player_id": "b_100", "active": False, "elo": elo_b, "trueskill_mu": 24.0},
    ]
    return {"elapsed_s": t, "players": players, "payoff": payoff}


def test_plots_are_written_from_history(tmp_path):
    history = tmp_path / "h.jsonl"
    payoff = [{"home": "a", "away": "b_100", "wins": 3, "draws": 1, "losses": 1, "games": 5, "win_rate": 0.7}]
    lines = [json.dumps(_record(t, 1000 + t, 1000 - t, payoff)) for t in range(5)]
    history.write_text("\n".join(lines) + '\n{"elapsed_s": 9, "play')  # a torn last line is tolerated
    assert len(read_history(history)) == 5
    written = write_plots(history, tmp_path / "plots")
    assert {p.name for p in written} == {"ratings.png", "win_rates.png"}
    assert all(p.stat().st_size > 1000 for p in written)


def test_a_curve_of_one_point_is_drawn_with_a_marker(tmp_path):
    """A line alone draws nothing for one point: a history of one record gave a ratings.png with axes and a
    legend and no data (and a snapshot that shows only in the last record, no point)."""
    import matplotlib.lines

    drawn: list[tuple[int, str]] = []
    real_init = matplotlib.lines.Line2D.__init__

    def record(line, xdata, ydata, *args, **kwargs):
        real_init(line, xdata, ydata, *args, **kwargs)
        drawn.append((len(xdata), str(line.get_marker())))

    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(_record(1, 1000, 1000, [])) + "\n")
    matplotlib.lines.Line2D.__init__ = record
    try:
        write_plots(history, tmp_path / "plots")
    finally:
        matplotlib.lines.Line2D.__init__ = real_init
    curves = [marker for points, marker in drawn if points == 1]
    assert curves and all(marker == "o" for marker in curves), drawn


def test_a_pair_whose_records_a_reset_started_afresh_is_no_observed_rate_in_the_plot():
    """A reset player's pair keeps its games played and has no decayed games: its rate is the default, which the
    plot showed as 0.50 (40) where `league status` shows "-" (a review)."""
    from league_cli.plot import _decayed_games

    assert _decayed_games({"games": 0.0, "games_played": 40}) == 0.0
    assert _decayed_games({"games": 5.0}) == 5.0 and _decayed_games({}) == 1.0  # (older histories: no count)


def test_a_default_rate_is_a_blank_cell_with_its_games(tmp_path, monkeypatch):
    """Fewer recent games than min_win_rate_games: the status's `win_rate_is_default` pair was drawn as a
    measured 0.50; now blank, its games still written."""
    import matplotlib.axes

    texts = []
    real_text = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda ax, x, y, s, **kw: texts.append(s) or real_text(
        ax, x, y, s, **kw))
    history = tmp_path / "h.jsonl"
    payoff = [{"home": "a", "away": "b_100", "losses": 3, "games": 3, "win_rate": 0.5, "games_played": "3",
               "win_rate_is_default": True}]
    history.write_text(json.dumps(_record(1, 1000, 1000, payoff)) + "\n")
    assert "win_rates.png" in {p.name for p in write_plots(history, tmp_path / "plots")}
    assert texts == ["-\n(3)"]


def test_the_ratings_plot_names_the_reference_bots_it_is_read_against():
    """Only the active players had a legend entry: the bots, sold as the ratings' yardsticks, were unnamed lines."""
    from league_cli.plot import rating_line

    assert rating_line({"player_id": "main", "active": True})[0] == "main"
    label, style = rating_line({"player_id": "bot_mcts_25", "active": False, "player_type": "reference_bot"})
    assert label == "bot_mcts_25" and style["linestyle"] == "--"
    assert rating_line({"player_id": "main_1000", "active": False, "player_type": "historical_player"})[0] is None


def _solo_record(t, agent_steps, episodes, mean_return):
    """A solo league's status record as `league run` writes it: ratings stay at their start values."""
    player = {"player_id": "solo_active_player_default_0", "player_type": "solo_active_player", "active": True,
              "elo": 1200.0, "trueskill_mu": 25.0, "trueskill_sigma": 8.333, "agent_steps": agent_steps,
              "episodes": episodes, "mean_return": mean_return}
    return {"league_type": "solo", "elapsed_s": t, "players": [player], "payoff": []}


def test_a_solo_leagues_plot_draws_its_players_mean_returns_instead_of_flat_ratings(tmp_path, capsys):
    """A solo league has no opponents and no ratings: its rating curves were flat lines and its win-rate matrix
    empty. Its plot is the mean episode return over the run; a record from before the first episode (mean
    return reported as 0.0) is no point of the curve."""
    import argparse

    from league_cli.plot import SOLO_NOTE, plot_main, return_curves

    history = tmp_path / "h.jsonl"
    rows = [(0.0, 0, 0, 0.0), (2.0, 4096, 150, 21.5), (4.0, 8192, 180, 48.0), (6.0, 12288, 200, 130.25)]
    history.write_text("".join(json.dumps(_solo_record(*row)) + "\n" for row in rows))
    (curve,) = return_curves(read_history(history)).values()
    assert curve.seconds == (2.0, 4.0, 6.0)
    assert curve.agent_steps == (4096, 8192, 12288)
    assert curve.mean_return == (21.5, 48.0, 130.25)
    notes: list[str] = []
    written = write_plots(history, tmp_path / "plots", notes)
    assert [p.name for p in written] == ["returns.png"] and written[0].stat().st_size > 1000
    assert notes == [SOLO_NOTE] and "win rates" in SOLO_NOTE
    assert plot_main(argparse.Namespace(history=history, out=tmp_path / "cli")) == 0
    out, err = capsys.readouterr()
    assert out.split() == [str(tmp_path / "cli" / "returns.png")]
    assert err.strip() == f"league plot: {SOLO_NOTE}"
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == ["returns.png"]


def test_a_solo_league_without_episodes_yet_still_gets_its_returns_plot(tmp_path):
    from league_cli.plot import return_curves

    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(_solo_record(0.5, 0, 0, 0.0)) + "\n")
    assert return_curves(read_history(history)) == {}
    assert [p.name for p in write_plots(history, tmp_path / "plots")] == ["returns.png"]


def test_corrupt_history_in_the_middle_is_an_error(tmp_path):
    history = tmp_path / "h.jsonl"
    good = json.dumps(_record(0, 1000, 1000, []))
    history.write_text(f'{good}\nnot json\n{good}\n')
    with pytest.raises(ValueError, match=":2: not JSON"):
        read_history(history)


@pytest.mark.parametrize("content, message", [
    ('{"a": 1}\n', r"h.jsonl:1: not a status record"),
    ('[1, 2]\n', r"h.jsonl:1: not a status record"),
    ('{"players": [{"x": 1}]}\n', r"h.jsonl:1: not a status record"),
    ('{"players": [], "payoff": [{"home": "a"}]}\n', r"h.jsonl:1: not a status record"),
    ('{"players": [], "elapsed_s": "abc"}\n', r"h.jsonl:1: not a status record"),  # ("could not convert string")
    ('{"players": [], "now": NaN}\n', r"h.jsonl:1: not a status record"),
    ('{"players": [], "elapsed_s": 1' + "0" * 400 + '}\n', r"h.jsonl:1: not a status record"),  # (OverflowError)
    # A win rate that is no number was "could not convert string to float: 'zz'", naming no file (a review).
    ('{"players": [{"player_id": "a", "active": true}, {"player_id": "b", "active": false}], "payoff": [{"home": '
     '"a", "away": "b", "wins": 1, "draws": 0, "losses": 0, "games": 1, "win_rate": "zz"}]}\n', None),
    # Counts that read as infinity (1e400) raised OverflowError, a traceback (a review).
    ('{"players": [{"player_id": "a", "active": true, "agent_steps": 1e400, "episodes": 1e400}, {"player_id": "b",'
     ' "active": false}], "payoff": [{"home": "a", "away": "b", "wins": 1, "draws": 0, "losses": 0, "games": 1, '
     '"win_rate": 0.5}]}\n', r"malformed status record \(inf is not a count\)"),
    (b"\xd0\x00\xff", r"h.jsonl: not a status history \(not UTF-8"),
    ("", r"h.jsonl: no status records"),
    # Records of the right shape with values of the wrong types: a traceback, exit 1 (a review).
    ('{"players": [{"player_id": "a", "active": false, "agent_steps": [1]}, {"player_id": "b", "active": false}], '
     '"payoff": [{"home": "b", "away": "a", "wins": 1, "draws": 0, "losses": 0, "games": 1, "win_rate": 1.0}]}\n',
     r"malformed status record"),
])
def test_league_plot_refuses_a_file_that_is_not_a_status_history_in_one_line(tmp_path, capsys, content, message):
    import argparse
    import re

    from league_cli.plot import plot_main

    history = tmp_path / "h.jsonl"
    history.write_bytes(content if isinstance(content, bytes) else content.encode())
    if message is None:  # values that are no figure: left out of the drawing, not an error
        assert plot_main(argparse.Namespace(history=history, out=tmp_path / "plots")) == 0
        assert "win_rates.png" in capsys.readouterr().out
        return
    assert plot_main(argparse.Namespace(history=history, out=tmp_path / "plots")) == 2
    err = capsys.readouterr().err
    assert err.startswith("league plot: ") and len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert plot_main(argparse.Namespace(history=tmp_path / "missing.jsonl", out=tmp_path / "plots")) == 2
    assert "No such file" in capsys.readouterr().err


def test_league_plot_names_the_flag_of_a_path_it_cannot_use(tmp_path, capsys):
    """A --history that is a folder and an --out that is a file were "[Errno 21] Is a directory: ..." and
    "[Errno 17] File exists: ...": neither said which flag was wrong."""
    import argparse

    from league_cli.plot import plot_main

    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(_record(0, 1000, 1000, [])) + "\n")
    a_file = tmp_path / "plots.png"
    a_file.write_text("")
    for history_arg, out, message in ((tmp_path, tmp_path / "plots",
                                       f"league plot: --history {tmp_path} is a directory without a "
                                       "status_history.jsonl"),
                                      (tmp_path / "missing.jsonl", tmp_path / "plots", "league plot: --history "),
                                      (history, a_file, f"league plot: --out {a_file} is not a directory"),
                                      (history, a_file / "plots", f"league plot: --out {a_file / 'plots'}: cannot "
                                                                  f"be made, {a_file} is a file")):
        assert plot_main(argparse.Namespace(history=history_arg, out=out)) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "plots").exists()



@pytest.mark.parametrize("errno_name", ["ENOSPC", "EDQUOT"])
def test_league_plot_on_a_full_disk_is_a_failure_naming_the_disk_not_a_usage_error(tmp_path, capsys, monkeypatch,
                                                                                   errno_name):
    """Space may come back, so a full disk (or a spent quota) is exit 1 as `league export`'s is, with the disk
    named; no half-written image is left."""
    import argparse
    import errno
    import os

    from league_cli import plot

    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(_record(0, 1000, 1000, [])) + "\n")
    code = getattr(errno, errno_name)

    def no_space(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(plot, "atomic_write", no_space)
    pretend_full_disk(monkeypatch)
    out = tmp_path / "plots"
    assert plot.plot_main(argparse.Namespace(history=history, out=out)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"league plot: --out {out}: cannot write {out / 'ratings.png'}: {os.strerror(code)}"), err
    assert f"the disk of {out} is full" in err and len(err.strip().splitlines()) == 1, err
    assert not list(out.glob("*.png"))


def test_league_plot_reads_a_run_directory_and_says_what_a_status_snapshot_is(tmp_path, capsys):
    """A CLI review: `--history RUN_DIR` said "Is a directory", a saved `league status --json` (one indented
    document) said only "not JSON", and an --out the system refuses (/proc/x) named no flag."""
    import argparse

    from league_cli.plot import plot_main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = _record(0, 1000, 1000, [])
    (run_dir / "status_history.jsonl").write_text(json.dumps(record) + "\n")
    assert plot_main(argparse.Namespace(history=run_dir, out=tmp_path / "plots")) == 0
    assert (tmp_path / "plots" / "ratings.png").is_file()
    capsys.readouterr()

    snapshot = tmp_path / "status.json"
    snapshot.write_text(json.dumps(record, indent=2))
    assert plot_main(argparse.Namespace(history=snapshot, out=tmp_path / "plots")) == 2
    err = capsys.readouterr().err
    assert "one document over many lines" in err and "--watch N --json" in err, err

    assert plot_main(argparse.Namespace(history=run_dir, out=Path("/proc/no-such-dir"))) == 2
    assert capsys.readouterr().err.startswith("league plot: --out /proc/no-such-dir: cannot write there")

def test_plot_time_continues_across_resumed_runs():
    """A second `league run` in the same run dir appends to the history with elapsed_s from 0 again."""
    elapsed = [0.0, 2.0, 4.0, 0.1, 2.1, 0.0, 1.0]
    assert run_seconds([{"elapsed_s": e} for e in elapsed]) == pytest.approx([0.0, 2.0, 4.0, 4.1, 6.1, 6.1, 7.1])
    assert run_seconds([]) == []


def test_a_status_watch_history_is_plotted_on_the_coordinators_clock(tmp_path):
    """`league status --watch N --json` lines have no `elapsed_s` (only `league run` adds it): every point was at
    x=0. Their time is `now` since the first line's, across a coordinator restart (which resets `uptime_s`)."""
    from league_service.status_view import status_to_json

    lines = []
    for uptime, now in [(9.5, 1000.0), (11.5, 1002.0), (13.5, 1004.0), (0.5, 1006.0), (2.5, 1008.0)]:
        status = league_pb2.LeagueStatus(league_id="l", league_type="one_vs_one", started_at=now - uptime,
                                         uptime_s=uptime, now=now)
        status.players.add(player_id="a", active=True, elo=1200.0 + now - 1000.0)
        lines.append(status_to_json(status, compact=True))
    history = tmp_path / "watch.jsonl"
    history.write_text("\n".join(lines) + "\n")
    records = read_history(history)
    assert "elapsed_s" not in records[0]
    assert run_seconds(records) == pytest.approx([0.0, 2.0, 4.0, 6.0, 8.0])
    assert [p.name for p in write_plots(history, tmp_path / "plots")] == ["ratings.png"]  # no games: no matrix


def test_a_watch_across_a_restart_with_the_clock_set_back_goes_on_from_where_it_was():
    """The coordinator reads the wall clock afresh at its start: set back an hour while it was down, the points
    after the restart were drawn at negative times, back over the earlier ones (a review)."""
    def record(now, started_at):
        return {"now": now, "started_at": started_at}

    t = 1.7e9
    before = [record(t + i * 10, t - 5) for i in range(3)]
    back = [record(t - 3600 + i * 10, t - 3601) for i in range(3)]
    assert run_seconds(before + back) == pytest.approx([0.0, 10.0, 20.0, 20.0, 30.0, 40.0])
    later = [record(t + 100 + i * 10, t + 95) for i in range(2)]  # a restart 80 s after the last record
    assert run_seconds(before + later) == pytest.approx([0.0, 10.0, 20.0, 100.0, 110.0])


def _status(finished: int, given_up: int, error: str = "") -> league_pb2.LeagueStatus:
    status = league_pb2.LeagueStatus()
    status.counters.jobs_finished = finished
    status.counters.jobs_given_up = given_up
    status.players.add(player_id="p", active=True, jobs_given_up=given_up, last_job_error=error)
    return status


def test_a_run_whose_collect_jobs_are_given_up_and_none_finishes_is_stopped_with_the_error():
    watch = FailingJobsWatch()
    assert watch.check(_status(0, 0)) is None
    reason = watch.check(_status(0, 1, "Traceback ...\nRuntimeError: seat 1 asks for an action"))
    assert reason is not None and "p: RuntimeError: seat 1 asks for an action" in reason
    # A resumed league whose earlier runs gave jobs up, and a run where jobs also finish, keep going.
    resumed = FailingJobsWatch()
    assert resumed.check(_status(50, 2)) is None and resumed.check(_status(50, 2)) is None
    healthy = FailingJobsWatch()
    assert healthy.check(_status(0, 0)) is None and healthy.check(_status(3, 1, "flaky")) is None


def test_the_win_rate_plot_of_a_league_with_hundreds_of_historical_players_stays_a_normal_image(tmp_path):
    """A full matrix was 0.6 inch per player: ~330 inches square (a gigapixel image) after an hour of the
    default league. Beyond 40 players it shows the active players' rows against everyone, at most 30 inches."""
    from PIL import Image

    active = ["main_player_default_0", "main_exploiter_default_0", "league_exploiter_default_0"]
    players = [{"player_id": a, "active": True, "elo": 1200.0} for a in active]
    players += [{"player_id": f"{a}_{k}", "active": False, "parent_id": a, "agent_steps": k, "elo": 1200.0}
                for a in active for k in range(1, 201)]
    payoff = [{"home": a, "away": p["player_id"], "win_rate": 0.6, "games": 10.0}
              for a in active for p in players if p["player_id"] != a]
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps({"elapsed_s": 1.0, "players": players, "payoff": payoff}) + "\n")
    written = {p.name: p for p in write_plots(history, tmp_path / "plots")}
    with Image.open(written["win_rates.png"]) as image:
        width, height = image.size
    assert width <= 100 * 32 and height <= 100 * 30, image.size


def test_a_resume_may_change_what_shapes_no_weights_but_not_the_env_or_the_networks_shape(tmp_path):
    """`league run` refuses before anything starts a config whose env or network the saved checkpoints do not
    fit; the default written out, an obs scale, a value bound or the env's openspiel: spelling are the same
    league."""
    from league_cli.run import _saved_model_mismatch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "league_state.sqlite").write_bytes(b"")
    saved = yaml.safe_load((ROOT / "configs" / "league_connect_four.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))

    def mismatch(change) -> str | None:
        data = yaml.safe_load(yaml.safe_dump(saved))
        change(data)
        path = tmp_path / "resume.yaml"
        path.write_text(yaml.safe_dump(data))
        return _saved_model_mismatch(run_dir, path, load_config(path))

    assert mismatch(lambda d: None) is None  # the same content at another path
    assert mismatch(lambda d: d["policy"]["model"].update(activation="tanh")) is None  # shapes no weights
    assert mismatch(lambda d: d["policy"]["model"].update(obs_scale=0.5, value_bound=1.0)) is None
    assert mismatch(lambda d: d["policy"]["ppo"].update(learning_rate=0.0003)) is None
    assert mismatch(lambda d: d["env"].update(name="openspiel:connect_four")) is None
    refused = mismatch(lambda d: d["policy"]["model"].update(hidden=[32]))
    assert refused is not None and refused.startswith("policy.model.hidden:") and "do not fit" in refused
    refused = mismatch(lambda d: d["env"].update(name="openspiel:tic_tac_toe"))
    assert refused is not None and refused.startswith("env.name: the league in")
    refused = mismatch(lambda d: d["env"].update(kwargs={"game_params": {"rows": 5}}))  # another game
    assert refused is not None and refused.startswith("env.kwargs.game_params: the league in") and "another game" in refused
    # Which players the league has: refused before the coordinator (which said only "active players [...] are
    # not the configured [...]", with no word of how to resume), with the same advice.
    refused = mismatch(lambda d: d["league"]["active_players"].update(main_player=2))
    assert refused is not None and refused.startswith("league.active_players:") and "league run --run-dir" in refused
    # A player type with a count of 0 adds no player: the same league (the coordinator takes it too).
    assert mismatch(lambda d: d["league"]["active_players"].update(naive_sp_player=0)) is None
    refused = mismatch(lambda d: d["league"]["active_players"].update(naive_sp_player=1))
    assert refused is not None and refused.startswith("league.active_players:")
    refused = mismatch(lambda d: d["league"].update(reference_bots=["random"]))
    assert refused is not None and refused.startswith("league.reference_bots: ['mcts:10', 'mcts:25'] play in")
    assert mismatch(lambda d: d["league"].update(reference_bots=["random", "mcts:10", "mcts:25", "mcts:50"])) is None
    # The same bots spelled otherwise are the same players (bot_mcts_25), as the coordinator takes them: compared
    # as text, `mcts:025` was refused as a bot gone (a review).
    assert mismatch(lambda d: d["league"].update(reference_bots=["random", "mcts:010", "mcts:025"])) is None
    # A league that played no game and has no checkpoint (a first run whose env.name had a typo) is bound to no
    # env or network yet: the fixed config is taken, where the advice was to resume what cannot run.
    from league_service.coordinator import Coordinator, CoordinatorSettings

    (run_dir / "league_state.sqlite").unlink()
    Coordinator(load_config(run_dir / "config.yaml"), CoordinatorSettings(
        shared_root=tmp_path, state_path=run_dir / "league_state.sqlite"), expiry_thread=False).close()
    assert mismatch(lambda d: d["env"].update(name="openspiel:tic_tac_toe")) is None


def test_a_config_error_naming_brackets_is_printed_as_it_is(tmp_path, capsys):
    """rich read the message as markup: a key "[/x]" ended `league run` in a MarkupError traceback, and a key
    "[bold]secret" was named as "secret"."""
    from league_cli.main import build_parser
    from league_cli.run import run_main

    for key in ("[/x]", "[bold]secret"):
        config = tmp_path / "c[old].yaml"
        config.write_text(yaml.safe_dump({"league": {key: 1}}))
        args = build_parser().parse_args(["run", str(config), "--run-dir", str(tmp_path / "r[/x]")])
        assert run_main(args) == 2
        out = capsys.readouterr().out
        assert f"league.{key}: unknown key" in out
        assert str(config) in out
        assert not (tmp_path / "r[/x]").exists()


def test_the_league_run_watch_says_when_env_steps_stand_still_and_when_they_go_on():
    from league_cli.run_watch import StallWatch

    watch = StallWatch(after_s=60.0)
    assert watch.check(100, 0.0) is None
    assert watch.check(100, 59.0) is None
    assert "no env steps and no training for 60 s" in watch.check(100, 60.0)
    assert watch.check(100, 90.0) is None  # once
    assert watch.check(150, 92.0) == "the league makes progress again"
    assert watch.check(200, 200.0) is None


def test_a_job_of_many_env_steps_whose_learner_trains_is_no_stall():
    """Env steps count as collect jobs finish: a job of 200k env steps adds none for minutes while its learner
    trains on what the actor streams. The run said "no env steps for 61 s" of such a league."""
    from league_cli.run_watch import StallWatch

    watch = StallWatch(after_s=60.0)
    for second in range(0, 300, 2):
        assert watch.check(0, float(second), trained_steps=second * 1000) is None
    assert "no training" in watch.check(0, 360.0, trained_steps=298_000)


def test_a_run_dir_left_with_only_a_pending_config_starts_that_config_not_the_embedded_league(tmp_path, capsys):
    """`league run` killed before its coordinator came up leaves config.pending.yaml and no config.yaml: running
    it again in that directory started the embedded connect-four league instead, unsaid."""
    from league_cli.main import build_parser
    from league_cli.run import run_main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.pending.yaml").write_text("league:\n  no_such_key: 1\n")  # refused: nothing starts
    assert run_main(build_parser().parse_args(["run", "--run-dir", str(run_dir)])) == 2
    out = capsys.readouterr().out
    assert "league.no_such_key: unknown key" in out and "config.pending.yaml" in out
    # A state file with no league in it yet (the run was killed as its coordinator created the file) leaves
    # the choice to the pending config; a file that is no league state leaves it to the coordinator's refusal.
    from league_cli import run as run_module

    args = build_parser().parse_args(["run", "--run-dir", str(run_dir)])
    (run_dir / "league_state.sqlite").write_bytes(b"")
    assert run_module._uses_pending_config(args, run_dir)
    (run_dir / "league_state.sqlite").write_bytes(b"not a database, but long enough to be read as one" * 4)
    assert not run_module._uses_pending_config(args, run_dir)


def test_a_pending_config_is_still_started_when_the_state_was_made_in_the_last_instant_of_the_start_up(tmp_path):
    """A reviewer killed `league run` in the ~0.1 s between its coordinator creating the state and the config
    being taken (or pressed Ctrl-C then, which also deleted the pending file): the next run in that directory
    started the embedded league in its place, unsaid. A state that played no game and holds no checkpoint
    leaves the choice to the pending config; one that trained decides itself."""
    from league_cli import run as run_module
    from league_cli.main import build_parser
    from league_service.store import Counters, LeagueStore

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.pending.yaml").write_text("league:\n  league_type: solo\n")
    store = LeagueStore(run_dir / "league_state.sqlite")
    store.initialise("digest")
    with store.transaction() as tx:
        tx.put_league_state({"league_type": "solo", "players": [{"player_id": "p", "checkpoint_path": ""}]})
        tx.put_counters(Counters())
    args = build_parser().parse_args(["run", "--run-dir", str(run_dir)])
    assert run_module._uses_pending_config(args, run_dir)
    with store.transaction() as tx:
        tx.put_counters(Counters(episodes=1, env_steps=9))
    store.close()
    assert not run_module._uses_pending_config(args, run_dir)


def test_an_empty_pending_config_is_refused_not_taken_for_the_embedded_league(tmp_path, capsys):
    """A full disk cut the pending config's write short (it was written in place, now atomically): the empty
    file then read as no config at all, and the next run started the embedded connect-four league."""
    from league_cli.main import build_parser
    from league_cli.run import run_main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.pending.yaml").write_bytes(b"")
    assert run_main(build_parser().parse_args(["run", "--run-dir", str(run_dir)])) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "config.pending.yaml is empty" in out and "league run CONFIG --run-dir" in out
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.pending.yaml"]


def test_a_run_dir_that_holds_other_things_and_no_run_is_refused(tmp_path, capsys):
    """`--run-dir RUN/shared` (a run's checkpoints, by mistake for the run) started a new connect-four league
    inside it, writing its state, logs and a nested shared/ among the checkpoints."""
    from league_cli.main import build_parser
    from league_cli.run import _foreign_entries, run_main

    shared = tmp_path / "run" / "shared"
    (shared / "solo_active_player_default_0").mkdir(parents=True)
    (shared / "tensorboard").mkdir()
    assert run_main(build_parser().parse_args(["run", "--run-dir", str(shared), "--seconds", "5"])) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert (f"--run-dir {shared} holds no league run but other things (solo_active_player_default_0, tensorboard): "
            "not used") in out
    assert sorted(p.name for p in shared.iterdir()) == ["solo_active_player_default_0", "tensorboard"]
    # A new directory, an empty one (hidden files aside), or one holding what a run holds, such as shared/ with a
    # pretrained checkpoint put there before the first run: used.
    assert _foreign_entries(tmp_path / "new") == []
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".nfs0001").write_text("")
    assert _foreign_entries(tmp_path / "empty") == []
    assert _foreign_entries(tmp_path / "run") == []
    # A home directory of a fresh account (`--run-dir ~`) holds hidden folders only: not a run's (a review).
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_text("")
    assert _foreign_entries(home) == [".ssh"]


def test_a_pending_config_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """On a full disk it was a traceback (exit 1), and left an empty file behind."""
    import errno

    from league_cli import run as run_module
    from league_cli.main import build_parser

    def full(path, data, sync_dir=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_module, "atomic_write", full)
    run_dir = tmp_path / "run"
    config = ROOT / "configs" / "solo_cartpole.yaml"
    assert run_module.run_main(build_parser().parse_args(["run", str(config), "--run-dir", str(run_dir)])) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "cannot write config.pending.yaml: [Errno 28] No space left on device" in out, out
    assert not (run_dir / "config.pending.yaml").exists()


def test_a_league_without_games_between_players_says_why_it_has_no_win_rate_plot(tmp_path):
    """win_rates.png was left out without a word (a league that had played no game, or only self-play), and a
    history of no players printed matplotlib's 'No artists with labels' warning."""
    import warnings

    from league_cli.plot import NO_GAMES_NOTE

    history = tmp_path / "h.jsonl"
    history.write_text("\n".join(json.dumps(_record(t, 1200, 1200, [])) for t in range(3)) + "\n"
                       + json.dumps({"elapsed_s": 4, "players": [], "payoff": []}) + "\n")
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = write_plots(history, tmp_path / "plots", notes)
    assert [p.name for p in written] == ["ratings.png"] and notes == [NO_GAMES_NOTE]


def test_league_run_says_when_one_job_outgrows_the_env_step_budget():
    from league_cli.run import job_size_note

    assert job_size_note(0, 10_000) is None  # jobs end by episodes
    assert job_size_note(5_000, 10_000) is None
    assert job_size_note(50_000, 0) is None  # no env-step budget
    assert "up to 50,000 env steps (env.env_steps)" in job_size_note(50_000, 10_000)


def test_a_run_directory_saved_with_the_earlier_default_network_resumes_with_it(tmp_path):
    """Before session 34 the default league's network was unpadded tanh with 64 channels, and a run directory's
    config.yaml writes out its conv stack but neither padding nor activation (they were ModelConfig's defaults).
    Merged over today's default (same-padded relu) it resumes with the network its checkpoints have; today's
    default itself is another network for it, refused naming the conv stack."""
    from league_cli.run import _saved_model_mismatch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "league_state.sqlite").write_bytes(b"")
    saved = yaml.safe_load((ROOT / "configs" / "league_connect_four.yaml").read_text())
    saved["policy"]["model"] = {"conv": [[64, 3, 1], [64, 3, 1]], "hidden": [128], "shared_torso": True}
    own = run_dir / "config.yaml"
    own.write_text(yaml.safe_dump(saved))
    resumed = load_config(own)
    model = PolicyConfig.from_mapping(resumed.policy).model
    assert model.conv == ((64, 3, 1), (64, 3, 1)) and model.conv_padding == "valid" and model.activation is None
    assert _saved_model_mismatch(run_dir, own, resumed) is None
    default = ROOT / "configs" / "league_connect_four.yaml"
    refused = _saved_model_mismatch(run_dir, default, load_config(default))
    assert refused is not None and refused.startswith("policy.model.conv:"), refused


@pytest.mark.parametrize("policy, key", [
    ({"model": {"recurrent_size": 32}}, "recurrent_size"),
    ({"model": {"obs_norm_clip": 5.0}}, "obs_norm_clip"),
    ({"algorithm": "dqn", "model": {"shared_torso": True}}, "shared_torso"),
    ({"model": {"recurrent": "gru", "shared_torso": False}}, "shared_torso"),
])
def test_a_model_key_the_network_does_not_read_is_refused_naming_it(policy, key):
    """`recurrent_size` without `recurrent`, `obs_norm_clip` without `obs_norm`, `shared_torso` for DQN (one torso)
    or an unshared recurrent model (always shared) were parsed, checked and silently did nothing (a review)."""
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"policy": policy})
    assert refused.value.path == f"policy.model.{key}" and "remove it" in str(refused.value)
    config_from_dict({"policy": {"model": {"recurrent": "gru", "recurrent_size": 32, "shared_torso": True}}})
    config_from_dict({"policy": {"model": {"obs_norm": True, "obs_norm_clip": 5.0}}})


def test_a_resume_may_change_a_model_key_its_network_does_not_read():
    """A feed-forward network has no recurrent core (its `recurrent_size` shapes nothing), a recurrent one always
    shares its torso and DQN's Q-network has one torso (their `shared_torso` shapes nothing): `league run` and the
    coordinator refused such a change, saying the checkpoints did not fit, though every weight has the same
    shape. (A config giving such a key is refused since; a league saved before may hold one.)"""
    import dataclasses

    from common.algorithms.registry import make_computation_task
    from common.computation.specs import TensorSpec
    from league_service.league_identity import LeagueIdentity

    def identity(model: dict, algorithm: str = "ppo") -> LeagueIdentity:
        saved = dataclasses.replace(config_from_dict({"policy": {"algorithm": algorithm}}),
                                    policy={"algorithm": algorithm, "model": model})  # (as loaded before)
        return LeagueIdentity.of(saved)

    def shapes(model: dict, algorithm: str = "ppo") -> dict:
        task = make_computation_task({"algorithm": algorithm, "model": model}, TensorSpec("observation", (5,)), 3,
                                     "cpu", 0)
        return {k: v.shape for k, v in task.get_weights().items()}

    feed_forward = {"hidden": [8], "conv": [], "recurrent_size": 32, "shared_torso": False}
    other_size = {**feed_forward, "recurrent_size": 16}
    assert shapes(feed_forward) == shapes(other_size)
    assert identity(feed_forward).first_change(identity(other_size)) is None
    gru = {"hidden": [8], "conv": [], "recurrent": "gru", "recurrent_size": 4, "shared_torso": True}
    unshared = {**gru, "shared_torso": False}
    assert shapes(gru) == shapes(unshared)
    assert identity(gru).first_change(identity(unshared)) is None
    q_network = {"hidden": [8], "conv": [], "shared_torso": False}
    q_shared = {**q_network, "shared_torso": True}
    assert shapes(q_network, "dqn") == shapes(q_shared, "dqn")
    assert identity(q_network, "dqn").first_change(identity(q_shared, "dqn")) is None
    # What a network reads is still compared.
    assert identity(gru).first_change(identity({**gru, "recurrent_size": 8})) == ("policy.model.recurrent_size", 4, 8)
    assert identity(feed_forward).first_change(identity({**feed_forward, "shared_torso": True})) == (
        "policy.model.shared_torso", False, True)
    assert identity({**feed_forward, "shared_torso": True}).first_change(identity(gru))[0] == "policy.model.recurrent"


def test_two_runs_without_a_run_dir_started_in_the_same_second_get_directories_of_their_own(tmp_path, monkeypatch):
    """The default run directory is runs/<the second the run started>: a second `league run` started in the same
    second as another was refused with "run directory runs/... is in use", a directory it had not been given
    (or, had the first released it, took over the first's directory)."""
    import datetime
    import types

    from league_cli import run as run_module
    from league_cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.setattr(run_module, "datetime", types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: now)))
    dirs = []

    def fake_run(args, console, cfg, run_cfg, cfg_dict, run_dir, run_lock, token):
        dirs.append(run_dir)
        return 0

    monkeypatch.setattr(run_module, "_run", fake_run)
    for _ in range(3):
        assert run_module.run_main(build_parser().parse_args(["run"])) == 0
    assert dirs == [Path("runs/20260102-030405"), Path("runs/20260102-030405-2"), Path("runs/20260102-030405-3")]


@pytest.mark.parametrize("name", ["my run", "-x", "it's é 日本", "-a b"])
def test_the_commands_a_run_tells_the_user_to_run_name_its_directory_as_a_shell_takes_it(name):
    """`league run --run-dir "my run"` printed `(league status --run-dir my run)`, and its refusals `league run
    --run-dir my run`: pasted, those named another directory (or, for `-x`, an option)."""
    import shlex

    from league_cli.main import build_parser
    from league_cli.run import run_dir_arg

    run_dir = Path(name) / "sub"
    argv = shlex.split(f"status {run_dir_arg(run_dir)}")
    assert build_parser().parse_args(argv).run_dir == run_dir



def test_the_fuser_command_a_refused_run_gives_names_the_lock_of_a_run_dir_that_begins_with_a_dash(
        tmp_path, monkeypatch, capsys):
    """`league run --run-dir=-x` beside a run in progress there said to run `fuser -v -x/league_run.lock`,
    which fuser takes for its options ("Invalid option x"; it takes no `--` either)."""
    import shlex

    from common.exclusive_lock import ExclusiveLock
    from league_cli import run as run_module
    from league_cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    (tmp_path / "-x").mkdir()
    with ExclusiveLock(tmp_path / "-x" / "league_run.lock", "run directory -x"):
        assert run_module.run_main(build_parser().parse_args(["run", "--run-dir=-x"])) == 2
    said = " ".join(capsys.readouterr().out.split())
    command = shlex.split(said.split("`fuser ", 1)[1].split("`", 1)[0])
    assert command[0] == "-v" and not command[1].startswith("-"), said
    assert (tmp_path / command[1]).resolve() == tmp_path / "-x" / "league_run.lock"


def test_league_plot_prints_what_it_wrote_into_a_directory_whose_name_is_not_utf8(tmp_path, monkeypatch):
    """Where the locale makes stdout strict UTF-8 (en_US.UTF-8), `league plot --out run\\xff/plots` wrote its plots
    and then died of UnicodeEncodeError printing their paths: a traceback."""
    import io
    import os

    from league_cli.main import main

    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(_record(0, 1000, 1000, [])) + "\n")
    out = Path(os.fsdecode(bytes(tmp_path) + b"/run\xff/plots"))
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    monkeypatch.setattr("sys.stdout", stdout)
    assert main(["plot", "--history", str(history), "--out", str(out)]) == 0
    stdout.flush()
    assert b"run\\udcff/plots/ratings.png" in stdout.buffer.getvalue()


def test_a_run_dir_that_is_a_dangling_link_is_refused_saying_so(tmp_path, capsys):
    """`--run-dir LINK` whose target is gone (a moved disk, a removed folder) said "[Errno 17] File exists"."""
    from league_cli.main import build_parser
    from league_cli.run import run_main

    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone")
    config = ROOT / "configs" / "solo_cartpole.yaml"
    assert run_main(build_parser().parse_args(["run", str(config), "--run-dir", str(link)])) == 2
    assert f"--run-dir {link} is a link to {tmp_path / 'gone'}, which does not exist" in capsys.readouterr().out
    assert not (tmp_path / "gone").exists()


def test_a_shared_folder_that_is_a_dangling_link_is_refused_saying_so(tmp_path, capsys):
    """`shared` may be there before the first run (a pretrained checkpoint): a link to a disk not mounted said only
    "[Errno 17] File exists: 'D/shared'" (a review)."""
    from league_cli.main import build_parser
    from league_cli.run import run_main

    run = tmp_path / "run"
    run.mkdir()
    (run / "shared").symlink_to(tmp_path / "checkpoints")
    config = ROOT / "configs" / "solo_cartpole.yaml"
    assert run_main(build_parser().parse_args(["run", str(config), "--run-dir", str(run)])) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert f"--run-dir {run}: {run / 'shared'} is a link to {tmp_path / 'checkpoints'}, which does not exist" in out


def test_a_file_where_the_run_dir_or_its_shared_folder_goes_is_named(tmp_path, capsys):
    """They said "[Errno 17] File exists: 'D/shared'" and "[Errno 20] Not a directory: 'D/shared'" (a review)."""
    from league_cli.main import build_parser
    from league_cli.run import run_main

    config = ROOT / "configs" / "solo_cartpole.yaml"
    a_file = tmp_path / "run_file"
    a_file.touch()
    assert run_main(build_parser().parse_args(["run", str(config), "--run-dir", str(a_file)])) == 2
    assert f"{a_file} is a file, not a directory" in capsys.readouterr().out
    run = tmp_path / "run"
    run.mkdir()
    (run / "shared").touch()
    assert run_main(build_parser().parse_args(["run", str(config), "--run-dir", str(run)])) == 2
    assert f"{run / 'shared'} is a file, not a directory: a run keeps its checkpoints there" in capsys.readouterr().out


@pytest.mark.parametrize("dangling", ["runs/20260102-030405", "runs"])
def test_the_default_run_dir_through_a_dangling_link_is_refused_naming_it_not_the_flag(tmp_path, capsys, monkeypatch,
                                                                                       dangling):
    """Without --run-dir, a runs/<timestamp> (or a `runs`, a disk not mounted) that is a link to nothing was refused
    as "--run-dir runs/... is a link ..." (or "--run-dir runs/...: [Errno 17] File exists: 'runs'"): a flag the
    user had not given, and for `runs` not the link at fault."""
    import datetime
    import types

    from league_cli import run as run_module
    from league_cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.setattr(run_module, "datetime", types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: now)))
    Path(dangling).parent.mkdir(exist_ok=True)
    Path(dangling).symlink_to(tmp_path / "gone")
    assert run_module.run_main(build_parser().parse_args(["run"])) == 2
    out = " ".join(capsys.readouterr().out.split())
    at = "" if dangling != "runs" else ": runs"
    assert f"league run: run directory runs/20260102-030405{at} is a link to {tmp_path / 'gone'}, which does not " \
           "exist" in out, out
    assert "--run-dir" not in out and not (tmp_path / "gone").exists()


@pytest.mark.parametrize("under", ["", "x"])
def test_a_run_dir_through_a_loop_of_links_is_not_called_a_link_to_nothing(tmp_path, capsys, under):
    """A loop of links (loop1 -> loop2 -> loop1) was refused as "loop1 is a link to loop2, which does not exist",
    though loop2 is there: is_symlink() and not exists() holds for a loop too. mkdir's error names the loop."""
    from league_cli.main import build_parser
    from league_cli.run import run_main

    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    run_dir = tmp_path / "loop1" / under if under else tmp_path / "loop1"
    config = ROOT / "configs" / "solo_cartpole.yaml"
    assert run_main(build_parser().parse_args(["run", str(config), "--run-dir", str(run_dir)])) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "which does not exist" not in out and "Too many levels of symbolic links" in out, out


def test_a_plot_that_cannot_be_written_keeps_the_one_before_and_names_its_file(tmp_path):
    """A reviewer ran `league plot` into a full disk: savefig wrote in place, so the plot there before was cut to
    an empty file, and the error said "[Errno 28] No space left on device" without a file. Here the write is
    cut short by RLIMIT_FSIZE (EFBIG; Python ignores SIGXFSZ)."""
    import re
    import resource

    history = tmp_path / "h.jsonl"
    history.write_text("".join(json.dumps(_solo_record(t, 4096 * t, 10 * t, 20.0 + t)) + "\n" for t in range(4)))
    out = tmp_path / "plots"
    (plot,) = write_plots(history, out)
    before = plot.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        with pytest.raises(OSError, match=f"cannot write {re.escape(str(plot))}"):
            write_plots(history, out)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert plot.read_bytes() == before
    assert [p.name for p in out.iterdir()] == ["returns.png"]  # no temporary file left either


def test_a_run_directory_given_as_the_config_says_how_to_resume_it(tmp_path):
    """`league run runs/cart` said only "cannot read the config file: Is a directory"."""
    import argparse

    from league_cli.run import _load

    run_dir = tmp_path / "my run"
    run_dir.mkdir()
    with pytest.raises(ConfigError, match="a directory, not a config file$"):
        _load(argparse.Namespace(config=run_dir, actors=None, seconds=None, env_steps=None))
    (run_dir / "config.yaml").write_text("{}")
    with pytest.raises(ConfigError) as info:
        _load(argparse.Namespace(config=run_dir, actors=None, seconds=None, env_steps=None))
    assert str(info.value).endswith(f"to resume the run in it: league run --run-dir '{run_dir}'")
