"""`league plot`: PNGs of the win-rate matrix and the rating curves from a run's status history; for a solo
league (one player, no opponents, so no ratings or win rates) the players' mean episode returns instead.

`league run` records one GetStatus reply per interval as JSON lines (as does `league status --watch N --json`);
everything here reads that file, so a plot can be made after the fact, on any machine, without the coordinator.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import cli_args
from common.durable_files import atomic_write, full_disk_note, out_of_space
from common.exit_codes import FAILURE_EXIT, SETUP_ERROR_EXIT
from league_cli.history import HISTORY_FILE, is_status_record
from league_service.status import REFERENCE_BOT_TYPE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history", type=cli_args.path, required=True,
                        help="status_history.jsonl written by `league run` (or its run directory), or the JSON "
                             "lines of `league status --watch N --json`")
    parser.add_argument("--out", type=cli_args.path, required=True, help="directory for the PNG files")


PLOT_MAX_RECORDS = 1000
"""Records the plots read from a history at most: evenly spaced, the first and the last among them. A day of the
default league leaves ~1.3 GB of history (it grows by at most league_cli.history.HISTORY_BYTES_PER_S); read
whole, as records, its plots took ~4.5 bytes of memory per byte of file (1.2 GB at four hours, measured)."""


def read_history(path: Path) -> list[dict[str, Any]]:
    """Every status record of a history, oldest first (see `iter_history`)."""
    return list(iter_history(path))


def iter_history(path: Path, max_records: int | None = None) -> Iterator[dict[str, Any]]:
    """The status records of a history, oldest first, read line by line. `max_records`: at most that many,
    evenly spaced, the newest always among them (the lines left out are not parsed). A torn last line (a run
    killed mid-write) is skipped; any other line that is not a status record is an error."""
    path = Path(path)
    count, restarts = _count_records(path)
    if count == 0:
        return
    wanted: set[int] | None = None
    if max_records is not None and count > max_records:
        keep = max(2, max_records)
        # The last record of each run and the first of the next: RunClock finds where a resumed run began
        # only from two such records (without them it drew the runs over each other). The newest restarts, in
        # half of the records at most: each added two beyond `max_records` (1,330 records of a run directory
        # resumed 200 times; a review).
        kept = restarts[max(0, len(restarts) - keep // 4):] if keep >= 4 else []
        spaced = max(2, keep - 2 * len(kept))
        step = (count - 1) / (spaced - 1)
        wanted = {round(i * step) for i in range(spaced)}
        wanted.update(i for first in kept for i in (first - 1, first))
    with open(path, "rb") as fh:
        n = 0
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            n += 1
            if n > count:
                break  # the torn last line
            if wanted is not None and n - 1 not in wanted:
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                hint = ""
                if number == 1 and raw.strip() == b"{":  # `league status --json > FILE`: one indented document
                    hint = ("; a `league status --json` snapshot is one document over many lines, and plots read "
                            "one status record a line: a run's status_history.jsonl, or `league status --watch N "
                            "--json`")
                raise ValueError(f"{path}:{number}: not JSON ({err}){hint}") from err
            if not is_status_record(record):
                raise ValueError(f"{path}:{number}: not a status record (`league run` writes them, as does "
                                 f"`league status --watch --json`)")
            yield record


_ELAPSED_AT_END = re.compile(rb'"elapsed_s": (-?[0-9.eE+-]+)\}\s*$')
"""The run's seconds, the last key of a `league run` record (run_monitor.history_record): read without parsing."""


def _count_records(path: Path) -> tuple[int, list[int]]:
    """How many non-empty lines of `path` are records to read (its last one left out when torn), and the index
    of each record that begins a resumed run (its `elapsed_s` below the record before); ValueError for a file
    that is not text."""
    count = 0
    last = b""
    restarts: list[int] = []
    previous = -math.inf
    with open(path, "rb") as fh:
        for raw in fh:
            if raw.strip():
                if (match := _ELAPSED_AT_END.search(raw, max(0, len(raw) - 64))) is not None:
                    try:
                        elapsed = float(match.group(1))
                    except ValueError:
                        elapsed = previous
                    if elapsed < previous:
                        restarts.append(count)
                    previous = elapsed
                count += 1
                last = raw
    if count == 0:
        return 0, []
    try:
        json.loads(last)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a status history (not UTF-8 text: {err.reason})") from err
    except json.JSONDecodeError:
        count -= 1  # a run killed mid-write leaves a torn last line
    return count, [i for i in restarts if i < count]


class RunClock:
    """Each record's time on the runs' clock: `elapsed_s` restarts at 0 when a `league run` resumes the league
    in the same run directory (the history file is appended to), so each run continues from where the one
    before it stopped instead of drawing its curves back over the earlier ones.

    `league status --watch --json` records have no `elapsed_s`: their time is the coordinator's `now` since the
    first record of its start (`started_at`), a new start going on from the last record of the one before by the
    time between them (the coordinator's downtime), or by none when its clock reads earlier: the wall clock is
    read afresh at every start, and counted from the watch's first record, a clock set back while the
    coordinator was down (or its state moved to a host whose clock is behind) drew the later points at negative
    times, back over the earlier ones (a review)."""

    def __init__(self) -> None:
        self._offset = self._previous = 0.0
        self._first_now: float | None = None
        self._last_now = 0.0
        self._started_at: Any = None

    def time(self, rec: dict[str, Any]) -> float:
        """The time of `rec`, the record after the ones this clock was given before."""
        if "elapsed_s" in rec:
            elapsed = float(rec["elapsed_s"])
        elif "now" in rec:
            now, started = float(rec["now"]), rec.get("started_at")
            if self._first_now is None or started != self._started_at:  # the first record, or a new start
                if self._first_now is not None:
                    self._offset += self._previous + max(0.0, now - self._last_now)
                    self._previous = 0.0
                self._first_now, self._started_at = now, started
            self._last_now = now
            elapsed = now - self._first_now
        else:
            elapsed = 0.0
        if elapsed < self._previous:  # a new run began
            self._offset += self._previous
        self._previous = elapsed
        return self._offset + elapsed


def run_seconds(records: list[dict[str, Any]]) -> list[float]:
    """Each record's time on the runs' clock (RunClock)."""
    clock = RunClock()
    return [clock.time(rec) for rec in records]


def _players(record: dict[str, Any]) -> list[dict[str, Any]]:
    return record.get("players", [])


IMAGE_MATRIX_MAX_PLAYERS = 40
"""Up to this many players the win-rate plot is the whole matrix; beyond, the active players' rows only."""
MAX_FIGURE_INCHES = 30.0
MAX_TICK_LABELS = 60


def _decayed_games(row: dict[str, Any]) -> float:
    """The pair's decayed game count, what its win rate rests on: 0 for a pair whose records a reset started
    afresh (its rate is then the default, not an observation; it showed as 0.50 (40) here, a review)."""
    try:
        return float(row.get("games", 1.0))
    except (TypeError, ValueError):
        return 0.0


def _games_played(row: dict[str, Any]) -> float:
    """The games a payoff row's pair played (JSON writes int64 as a string); a history from before the count
    was kept has only the decayed `games`."""
    try:
        return float(row["games_played"]) if "games_played" in row else float(row.get("games", 0))
    except (TypeError, ValueError):
        return 0.0


def _ordered_names(record: dict[str, Any], payoff: list[dict[str, Any]]) -> list[str]:
    """Active players first, then historical ones by parent in the order they were taken (by steps)."""
    players = {p["player_id"]: p for p in _players(record)}
    names = {row["home"] for row in payoff} | {row["away"] for row in payoff}

    def key(name: str) -> tuple[bool, str, int, str]:
        p = players.get(name, {})
        return (not p.get("active", False), p.get("parent_id", ""), _count(p.get("agent_steps")), name)

    return sorted(names, key=key)


SOLO_NOTE = ("a solo league has no opponents, so no ratings or win rates: returns.png shows its players' mean "
             "episode returns instead (no ratings.png, no win_rates.png)")


NO_GAMES_NOTE = ("no game between two different players is in the payoff yet (no game played, or only a player's "
                 "games against itself): no win_rates.png")


def is_solo(newest: dict[str, Any]) -> bool:
    """Whether the history is a solo league's (its newest record says; histories older than the field: no)."""
    return newest.get("league_type") == "solo"


@dataclass(frozen=True)
class ReturnCurve:
    """One player's mean episode return (of its recent episodes, as the coordinator reports it) along the run,
    one point per record in which it had played episodes."""

    seconds: tuple[float, ...]  # the record's time on the runs' clock (run_seconds)
    agent_steps: tuple[int, ...]  # the player's agent steps then
    mean_return: tuple[float, ...]


class HistoryCurves:
    """What the plots draw, gathered one record at a time so that only the newest record is held whole: every
    player's rating curve and return curve on the runs' clock (RunClock)."""

    def __init__(self) -> None:
        self._clock = RunClock()
        self.ratings: dict[str, tuple[array, array, array]] = {}
        """Player id -> (seconds, Elo, TrueSkill mu), one point per record that lists the player."""
        self._returns: dict[str, tuple[array, array, array]] = {}
        self.newest: dict[str, Any] | None = None

    def add(self, rec: dict[str, Any]) -> None:
        t = self._clock.time(rec)
        for p in _players(rec):
            pid = p["player_id"]
            xs, elo, mu = self.ratings.setdefault(pid, (array("d"), array("d"), array("d")))
            xs.append(t)
            elo.append(_number(p.get("elo", 0.0)))
            mu.append(_number(p.get("trueskill_mu", 0.0)))
            # A record from before a player's first episode is left out of its returns: the coordinator reports
            # its mean return as 0.0 then, which is no return.
            if _count(p.get("episodes")) > 0:
                seconds, steps, returns = self._returns.setdefault(pid, (array("d"), array("q"), array("d")))
                seconds.append(t)
                steps.append(_count(p.get("agent_steps")))
                returns.append(_number(p.get("mean_return", 0.0)))
        self.newest = rec

    def return_curves(self) -> dict[str, ReturnCurve]:
        """The return curve of every player that played episodes, by player id."""
        return {pid: ReturnCurve(tuple(t), tuple(steps), tuple(r)) for pid, (t, steps, r) in self._returns.items()}


def _number(value: Any) -> float:
    """A figure of a record as a float; NaN (a gap in the curve) for one that is none."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _count(value: Any) -> int:
    """A count of a record (steps, episodes) as an int (0 for none); TypeError, which `plot_main` says is a
    malformed record, for one that is no count or beyond int64 (an `array("q")` holds it): 1e400 reads as
    infinity, whose int() raised OverflowError, a traceback (a review)."""
    try:
        count = int(value or 0)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{value!r} is not a count") from None
    if not -(2**63) <= count < 2**63:
        raise TypeError(f"{value!r} is beyond any count")
    return count


def return_curves(records: list[dict[str, Any]]) -> dict[str, ReturnCurve]:
    """The return curve of every player that played episodes in `records` (HistoryCurves)."""
    curves = HistoryCurves()
    for rec in records:
        curves.add(rec)
    return curves.return_curves()


def _point_marker(points: int) -> dict[str, Any]:
    """A marker for a curve of one point, which a line alone does not draw (a history of one record, a snapshot
    only in the last one: an empty plot)."""
    return {"marker": "o", "markersize": 4} if points == 1 else {}


def _plot_returns(plt: Any, history: HistoryCurves, out_dir: Path) -> Path:
    """returns.png: each player's mean episode return against the run's time and against its agent steps."""
    assert history.newest is not None
    curves = history.return_curves()
    last_players = {p["player_id"]: p for p in _players(history.newest)}
    fig, (ax_time, ax_steps) = plt.subplots(1, 2, figsize=(12, 4.5))
    for pid, curve in curves.items():
        active = last_players.get(pid, {}).get("active", False)
        style = dict(linewidth=2.0) if active else dict(linewidth=0.8, alpha=0.6)
        style.update(_point_marker(len(curve.seconds)))
        ax_time.plot(curve.seconds, curve.mean_return, label=pid if active else None, **style)
        ax_steps.plot(curve.agent_steps, curve.mean_return, label=pid if active else None, **style)
    ax_time.set(title="mean episode return (recent episodes)", xlabel="seconds of league run", ylabel="return")
    ax_steps.set(title="mean episode return (recent episodes)", xlabel="agent steps of the player", ylabel="return")
    if curves:
        ax_time.legend(fontsize="small")
    else:
        for ax in (ax_time, ax_steps):
            ax.text(0.5, 0.5, "no episodes recorded yet", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    path = out_dir / "returns.png"
    _save(plt, fig, path)
    return path


def _save(plt: Any, fig: Any, path: Path) -> None:
    """The figure as a PNG at `path`, written whole or not at all (`atomic_write`), and closed. Saved in place, a
    write that failed (a full disk) left an empty or torn PNG where the plot of an earlier run or call was, and
    the error named no file."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=100, format="png")
    finally:
        plt.close(fig)
    try:
        atomic_write(path, buffer.getbuffer())
    except OSError as err:
        raise OSError(err.errno, f"cannot write {path}: {err.strerror or err}") from err


def rating_line(player: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Legend label and line style of a player's rating curve: active players bold and named, reference bots
    (the fixed yardsticks the ratings are read against) dashed and named, snapshots thin and unnamed."""
    if player.get("active", False):
        return player["player_id"], {"linewidth": 2.0}
    if player.get("player_type") == REFERENCE_BOT_TYPE:
        return player["player_id"], {"linewidth": 1.2, "linestyle": "--"}
    return None, {"linewidth": 0.8, "alpha": 0.6}


def write_plots(history_path: Path, out_dir: Path, notes: list[str] | None = None) -> list[Path]:
    """Write the plots of the history into `out_dir`; returns their paths. `notes`: where to add what the
    reader should know about plots not drawn (a solo league's ratings and win rates: SOLO_NOTE)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = HistoryCurves()
    for rec in iter_history(Path(history_path), PLOT_MAX_RECORDS):
        history.add(rec)
    newest = history.newest
    if newest is None:
        raise ValueError(f"{history_path}: no status records")
    out_dir.mkdir(parents=True, exist_ok=True)
    if is_solo(newest):  # ratings would be flat lines at their start values, win rates an empty matrix
        if notes is not None:
            notes.append(SOLO_NOTE)
        return [_plot_returns(plt, history, out_dir)]
    written: list[Path] = []

    # Rating curves: Elo of every player over time (historical players appear when they are created).
    fig, (ax_elo, ax_mu) = plt.subplots(1, 2, figsize=(12, 4.5))
    last_players = {p["player_id"]: p for p in _players(newest)}
    for pid, (xs, elo, mu) in history.ratings.items():
        label, style = rating_line(last_players.get(pid, {"player_id": pid}))
        style = {**style, **_point_marker(len(xs))}
        ax_elo.plot(xs, elo, label=label, **style)
        ax_mu.plot(xs, mu, label=label, **style)
    ax_elo.set(title="Elo", xlabel="seconds of league run")
    ax_mu.set(title="TrueSkill mu", xlabel="seconds of league run")
    if ax_elo.get_legend_handles_labels()[1]:  # (an empty legend is a matplotlib warning on stderr)
        ax_elo.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / "ratings.png"
    _save(plt, fig, path)
    written.append(path)

    # Win-rate matrix at the end of the run, with game counts.
    payoff = newest.get("payoff", [])
    if not payoff and notes is not None:
        notes.append(NO_GAMES_NOTE)
    if payoff:
        names = _ordered_names(newest, payoff)
        index = {n: i for i, n in enumerate(names)}
        # A league with many historical players (hundreds an hour): a full matrix would be a figure of
        # hundreds of inches (gigapixels); the active players' rows against everyone tell the story.
        rows = names if len(names) <= IMAGE_MATRIX_MAX_PLAYERS else [
            n for n in names if last_players.get(n, {}).get("active", False)] or names[:IMAGE_MATRIX_MAX_PLAYERS]
        row_index = {n: i for i, n in enumerate(rows)}
        import numpy as np

        rate = np.full((len(rows), len(names)), np.nan)
        games = np.zeros((len(rows), len(names)))
        for row in payoff:
            i, j = row_index.get(row["home"]), index[row["away"]]
            if i is not None and _decayed_games(row) > 0:  # (none: a reset player's pair, as `league status`)
                # A default rate (too few recent games) is no measure: left blank, its games still said.
                rate[i, j] = np.nan if row.get("win_rate_is_default") else _number(row.get("win_rate", np.nan))
                games[i, j] = _games_played(row)
        per_column = 0.6 if rows is names else 0.3  # a strip of a few rows reads fine with narrower cells
        width = min(MAX_FIGURE_INCHES, max(5.0, per_column * len(names) + 2))
        height = min(MAX_FIGURE_INCHES, max(3.0, 0.6 * len(rows) + 2))
        fig, ax = plt.subplots(figsize=(width + 1.5, height))
        im = ax.imshow(rate, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
        step = max(1, len(names) // MAX_TICK_LABELS)  # every name up to ~60, else every step-th
        ax.set_xticks(range(0, len(names), step), names[::step], rotation=60, ha="right", fontsize="x-small")
        ax.set_yticks(range(len(rows)), rows, fontsize="x-small")
        whose = "row" if rows is names else "active player (row)"
        ax.set(title=f"win rate of {whose} against column (games played)", xlabel="opponent", ylabel="player")
        if len(names) <= 20:
            for i in range(len(rows)):
                for j in range(len(names)):
                    if games[i, j]:
                        shown = "-" if np.isnan(rate[i, j]) else f"{rate[i, j]:.2f}"
                        ax.text(j, i, f"{shown}\n({games[i, j]:.0f})", ha="center", va="center",
                                fontsize="xx-small")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        path = out_dir / "win_rates.png"
        _save(plt, fig, path)
        written.append(path)
    return written


def plot_main(args: argparse.Namespace) -> int:
    notes: list[str] = []
    in_run_dir = args.history / HISTORY_FILE
    if args.history.is_dir() and in_run_dir.is_file():  # a run directory: its history
        args.history = in_run_dir
    elif args.history.is_dir():  # (it said "cannot read it: Is a directory"; a review)
        print(f"league plot: --history {args.history} is a directory without a {HISTORY_FILE} (a `league run` "
              "writes one into its run directory once its coordinator is up)", file=sys.stderr)
        return SETUP_ERROR_EXIT
    # Which flag is wrong, said before the plots are read: an OSError from write_plots named neither ("[Errno 17]
    # File exists: 'plots.png'" for an --out that is a file, "[Errno 21] Is a directory" for a --history folder).
    try:
        with open(args.history, "rb"):
            pass
    except OSError as err:
        print(f"league plot: --history {args.history}: cannot read it: {err.strerror or err}", file=sys.stderr)
        return SETUP_ERROR_EXIT
    if args.out.exists() and not args.out.is_dir():
        print(f"league plot: --out {args.out} is not a directory", file=sys.stderr)
        return SETUP_ERROR_EXIT
    # (Nor can it be made under a file: "[Errno 20] Not a directory: 'notes.txt/plots'" named no flag.)
    above = next((p for p in args.out.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        print(f"league plot: --out {args.out}: cannot be made, {above} is a file", file=sys.stderr)
        return SETUP_ERROR_EXIT
    try:
        written = write_plots(args.history, args.out, notes)
    except OSError as err:
        if out_of_space(err):  # (space may come back: a failure, not a usage error)
            # (`_save` names the image: "cannot write <out>/ratings.png: No space left on device")
            print(f"league plot: --out {args.out}: {err.strerror or err}{full_disk_note(args.out.absolute())}",
                  file=sys.stderr)
            return FAILURE_EXIT
        if err.filename is not None and _within(Path(err.filename), args.out):  # ("/proc/x" named no flag)
            print(f"league plot: --out {args.out}: cannot write there: {err.strerror or err}", file=sys.stderr)
        else:
            print(f"league plot: {err}", file=sys.stderr)
        return SETUP_ERROR_EXIT
    except ValueError as err:  # a foreign file
        print(f"league plot: {err}", file=sys.stderr)
        return SETUP_ERROR_EXIT
    except TypeError as err:  # a record of the right shape with values of the wrong types (a null player id)
        print(f"league plot: --history {args.history}: a malformed status record ({err})", file=sys.stderr)
        return SETUP_ERROR_EXIT
    for note in notes:
        print(f"league plot: {note}", file=sys.stderr)
    for p in written:
        print(p)
    return 0


def _within(path: Path, directory: Path) -> bool:
    path, directory = path.absolute(), directory.absolute()
    return path == directory or directory in path.parents
