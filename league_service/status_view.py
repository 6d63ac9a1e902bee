"""Render a `LeagueStatus` reply for people (rich tables) or programs (JSON).

Works on the wire message so `league status` needs nothing but the generated code and rich.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Sequence

from google.protobuf import json_format
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from common.proto.league.v1 import league_pb2
from league_service.plain_table import PlainTable
from league_service.status import REFERENCE_BOT_TYPE

_ROLE_NAMES = {league_pb2.WORKER_ROLE_ACTOR: "actor", league_pb2.WORKER_ROLE_LEARNER: "learner"}
_KIND_NAMES = {league_pb2.JOB_KIND_COLLECT: "collect", league_pb2.JOB_KIND_LEARN: "learn", league_pb2.JOB_KIND_EVAL: "eval"}


PIPED_WIDTH = 200
"""Columns of the tables when the output is not a terminal (a pipe, a log file) and $COLUMNS is unset."""
MATRIX_MAX_PLAYERS = 8
"""Up to this many players the win rates are a full home x away matrix; beyond it (a league with historical
players: 46 after the default league's five minutes) a matrix squeezes every column to an ellipsis, so active
players get one row each: their win rate against each active player and against the historical ones."""
HISTORICAL_ROWS = 30
"""About this many historical players are listed (the newest of each parent); --json has them all."""
WORKER_ROWS = 40
"""At most this many workers are listed (learners first, then workers not alive, then the rest); a cluster of
a thousand actors would otherwise print a thousand rows. --json has them all."""
JOB_ROWS = 40
"""At most this many jobs in flight are listed, the oldest first; --json has them all."""


def status_console() -> Console:
    """A console for the status tables on stdout. Rich lays out a pipe or a file 80 columns wide, which
    squeezed the active-player table's steps, iteration and rating columns to nothing in `league status |
    less` and in the summary `league run` leaves in its log; a terminal keeps its own width."""
    # No emoji codes either: ":ok:" in a worker's id or an error message is text, not a picture.
    if sys.stdout.isatty() or _positive(os.environ.get("COLUMNS", "")):  # (COLUMNS=0 printed nothing at all)
        return Console(emoji=False)
    return Console(width=PIPED_WIDTH, emoji=False)


def _positive(text: str) -> bool:
    return text.strip().isdigit() and int(text) > 0


def status_to_json(status: league_pb2.LeagueStatus, *, compact: bool = False) -> str:
    """The whole status as JSON with the proto's field names (enums by name, zeros included); `compact`: one
    line (JSON Lines, for `league status --watch --json`)."""
    data = json_format.MessageToDict(
        status,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )
    # Keys sorted: protobuf puts fields left at their zero value after the set ones, so a key's place moved with
    # its value (a counter leaving zero reordered the lines of --watch --json; a review).
    if compact:
        return json.dumps(data, separators=(",", ":"), sort_keys=True)
    return json.dumps(data, indent=2, sort_keys=True)


def render_status(status: league_pb2.LeagueStatus, workers: bool = True) -> Group:
    """Header, players, win-rate matrix, jobs in flight and workers, as one printable group. `workers` False
    leaves the workers out: once `league run` stopped them, the coordinator still counts them alive until
    their heartbeats are a lease old."""
    parts = [_header(status), *_players(status)]
    if status.payoff:
        parts.append(_FirstThatFits([lambda: _win_rates(status), lambda: _win_rates_of_active_players(status),
                                     lambda: _win_rates_of_active_players(status, least=False),
                                     lambda: _win_rates_of_active_players(status, least=False, per_opponent=False)]))
    parts.append(_jobs(status))
    if workers:
        parts.append(_workers(status))
    return Group(*parts)


def _header(status: league_pb2.LeagueStatus) -> Text:
    c = status.counters
    text = Text()
    text.append(f"league {status.league_id}", style="bold")
    text.append(f"  ({status.league_type})  up {_duration(status.uptime_s)}\n")
    text.append(
        f"jobs issued {c.jobs_issued}  finished {c.jobs_finished}  expired {c.jobs_expired}  "
        f"failed {c.jobs_failed}  given up {c.jobs_given_up}  |  matches {c.matches}  snapshots {c.snapshots}  mutations {c.mutations}  "
        f"env steps {c.env_steps:,}"
    )
    return text


def _players(status: league_pb2.LeagueStatus) -> list[Table]:
    """Active players (training progress) and historical players (frozen snapshots), one table each."""
    active = sorted((p for p in status.players if p.active), key=lambda p: p.player_id)
    historical = [p for p in status.players if not p.active]
    solo = status.league_type == "solo"
    # A solo player has no opponents, so no ratings; a battle league keeps no returns (its payoff counts wins).
    columns = ["type", "steps", "iter", "checkpoint", *(["mean return", "episodes"] if solo else ["elo", "trueskill"]),
               "slots", "learner"]
    rows = [[p.player_id, p.player_type, f"{p.agent_steps:,}", str(p.train_iteration), _checkpoint(p),
             *([f"{p.mean_return:.2f}" if p.episodes else "-", str(p.episodes)] if solo else _ratings(p)),
             f"{p.slots_used}/{p.slots_limit}", p.learner_worker_id or "-"] for p in active]
    tables: list[RenderableType] = [_fitted("active players", active, columns, rows,
                                            ["checkpoint", "trueskill", "learner", "type", "slots", "iter",
                                             "episodes"])]
    failing = [p for p in active if p.failed_attempts_in_a_row or p.jobs_given_up]
    if failing:
        table = PlainTable(title="failing jobs (LEASES.md: failing jobs)", title_justify="left")
        for name in ("player", "failed in a row", "given up", "held for", "last error"):
            table.add_column(name, no_wrap=True, overflow="ellipsis",
                             **({"max_width": 60} if name == "last error" else {}))
        for p in failing:
            held = p.jobs_held_until - status.now
            table.add_row(p.player_id, str(p.failed_attempts_in_a_row), str(p.jobs_given_up),
                          _duration(held) if held > 0 else "-",
                          p.last_job_error.strip().splitlines()[-1] if p.last_job_error.strip() else "-")
        tables.append(table)
    if historical:
        shown = _newest_per_parent(historical, HISTORICAL_ROWS)
        title = f"historical players ({len(historical)}" + (
            f"; the newest {len(shown)}, all with --json)" if len(shown) < len(historical) else ")")
        # (solo: no ratings, as for its active players; a snapshot's were the starting values for good)
        rows = [[p.player_id, "(reference bot)" if p.player_type == REFERENCE_BOT_TYPE else p.parent_id or "-",
                 f"{p.agent_steps:,}", _checkpoint(p), *([] if solo else _ratings(p))] for p in shown]
        tables.append(_fitted(title, shown, ["parent", "steps", "checkpoint", *([] if solo else ["elo", "trueskill"])],
                              rows, ["checkpoint", "trueskill", "parent"] if not solo else ["checkpoint", "parent"]))
    set_aside = [p for p in historical if p.set_aside]
    if set_aside:
        table = PlainTable(title="set aside from matchmaking: their checkpoints cannot be loaded", title_justify="left")
        for name in ("player", "checkpoint", "why"):
            table.add_column(name, no_wrap=True, overflow="ellipsis", **({"max_width": 60} if name == "why" else {}))
        for p in set_aside:  # the reason is one line (the exception the actor raised), often naming the file
            table.add_row(p.player_id, p.checkpoint_path, p.set_aside.rpartition(f"{p.checkpoint_path}: ")[2])
        tables.append(table)
    return tables


def _newest_per_parent(players: list[league_pb2.PlayerStatus], rows: int) -> list[league_pb2.PlayerStatus]:
    """Snapshots grouped by parent in the order they were taken; past `rows`, each parent's newest share.
    Reference bots come first, each a group of its own: there are few, and they are the fixed yardsticks."""
    by_parent: dict[str, list[league_pb2.PlayerStatus]] = {}
    key = lambda p: (p.player_type != REFERENCE_BOT_TYPE, p.parent_id, p.agent_steps, p.player_id)  # noqa: E731
    for p in sorted(players, key=key):
        by_parent.setdefault(p.player_id if p.player_type == REFERENCE_BOT_TYPE else p.parent_id, []).append(p)
    if len(players) <= rows:
        return [p for group in by_parent.values() for p in group]
    each = max(1, rows // len(by_parent))
    return [p for group in by_parent.values() for p in group[-each:]]


_NUMERIC = frozenset({"steps", "iter", "elo", "slots", "mean return", "episodes"})


def _fitted(title: str, players: list[league_pb2.PlayerStatus], columns: list[str], rows: list[list[str]],
            drop_order: list[str]) -> _FirstThatFits:
    """The players' table with every column if it fits the width it is printed at; else without the columns
    of `drop_order`, one at a time in that order, and a caption naming what was left out."""
    def build(dropped: tuple[str, ...], fold_ids: bool = False) -> Callable[[], Table]:
        def table() -> Table:
            kept = [i for i, name in enumerate(columns) if name not in dropped]
            t = _table(title, players, [columns[i] for i in kept], fold_ids)
            if dropped:
                t.caption = f"left out at this width: {', '.join(dropped)} (a wider terminal or --json has them)"
                t.caption_justify = "left"
            for row in rows:
                t.add_row(row[0], *(row[1 + i] for i in kept))
            return t
        return table

    drop_order = [name for name in drop_order if name in columns]
    # Last, ids too long for the width even alone with the steps (ids run to 256 characters): folded onto more
    # lines. Kept whole on one line, rich cut the table at the terminal's edge: a step count of 123,456,789 read
    # "123", the other columns were gone, and 150-character ids left nothing to tell the players apart (a review).
    return _FirstThatFits([*(build(tuple(drop_order[:n])) for n in range(len(drop_order) + 1)),
                           build(tuple(drop_order), fold_ids=True)])


def _table(title: str, players: list[league_pb2.PlayerStatus], columns: list[str], fold_ids: bool = False) -> Table:
    table = PlainTable(title=title, title_justify="left")
    # Ids are what people search for: never cut short; the other columns give way instead (and where even that
    # does not fit, `fold_ids`: an id folds onto more lines, whole).
    longest = max((len(p.player_id) for p in players), default=6)
    if fold_ids:
        table.add_column("player", overflow="fold", min_width=min(longest, FOLDED_ID_WIDTH))
    else:
        table.add_column("player", no_wrap=True, min_width=longest)
    for name in columns:
        numeric = name in _NUMERIC
        # A checkpoint is shown whole or not at all (_fitted leaves the column out where it does not fit): cut at
        # 36 characters, a solo player's read "solo_active_player_default_0/v00000…" even 200 columns wide,
        # its version gone.
        width = {} if name == "checkpoint" else {"min_width": max(4, len(name))}
        table.add_column(name, justify="right" if numeric else "left", overflow="ellipsis", no_wrap=True, **width)
    return table


_UNBOUNDED = 100_000
FOLDED_ID_WIDTH = 24
"""The player column's width where ids are folded onto more lines to fit the terminal."""


class _FirstThatFits:
    """The first of `tables` (functions building them, widest first) whose natural width fits the width it is
    rendered at; the last if none does. Rich fits a table wider than the terminal by cutting every column short,
    numbers included (a step count of 28,880 read "28,8…" at 100 columns)."""

    def __init__(self, tables: Sequence[Callable[[], RenderableType]]) -> None:
        self._tables = tables

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        unbounded = options.update(max_width=_UNBOUNDED)  # a measure is clamped to the width it is given
        for build in self._tables:
            table = build()
            if Measurement.get(console, unbounded, table).maximum <= options.max_width:
                break
        yield table

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._tables[-1]())


def _checkpoint(p: league_pb2.PlayerStatus) -> str:
    return f"{p.checkpoint_path}@{p.checkpoint_version}" if p.checkpoint_path else "-"


def _ratings(p: league_pb2.PlayerStatus) -> tuple[str, str]:
    return f"{p.elo:.0f}", f"{p.trueskill_mu:.1f}±{p.trueskill_sigma:.1f}"


DEFAULT_RATE_NOTE = ("*: fewer recent games than league.payoff.min_win_rate_games: the default rate, as PFSP takes "
                     "the pair")


def _rate_cell(e: league_pb2.PayoffEntry) -> str:
    """A pair's win rate and games played; starred while the rate is the default (PFSP's view of a pair with too
    few recent games), which read as a measured 50% before."""
    return f"{e.win_rate:.0%}{'*' if e.win_rate_is_default else ''} ({e.games_played:,})"


def _note_defaults(table: Table, cells: Sequence[league_pb2.PayoffEntry]) -> None:
    if any(e.win_rate_is_default for e in cells):
        table.caption = f"{table.caption}; {DEFAULT_RATE_NOTE}" if table.caption else DEFAULT_RATE_NOTE
        table.caption_justify = "left"


def _win_rates(status: league_pb2.LeagueStatus) -> Table:
    """Rows are home players, columns away players; a cell is the home win rate (over the decayed counts, as
    PFSP sees it) and the games the two have played."""
    if len({e.home for e in status.payoff} | {e.away for e in status.payoff}) > MATRIX_MAX_PLAYERS:
        return _win_rates_of_active_players(status)
    homes = sorted({e.home for e in status.payoff})
    aways = sorted({e.away for e in status.payoff})
    cells = {(e.home, e.away): e for e in status.payoff}
    table = PlainTable(title="win rate, recent games weighing most (games played)", title_justify="left")
    table.add_column("home \\ away")
    for away in aways:
        table.add_column(away, justify="right")
    for home in homes:
        row = [home]
        for away in aways:
            e = cells.get((home, away))
            row.append(_rate_cell(e) if e is not None and e.games > 0 else "-")
        table.add_row(*row)
    _note_defaults(table, [e for e in status.payoff if e.games > 0])
    return table


def _win_rates_of_active_players(status: league_pb2.LeagueStatus, least: bool = True,
                                 per_opponent: bool = True) -> Table:
    """One row per active player: its win rate against each active player (`per_opponent`; else against all of
    them, games-weighted), against all historical players (games-weighted) and (`least`) against the historical
    player it beats least."""
    active = sorted(p.player_id for p in status.players if p.active)
    historical = {p.player_id for p in status.players if not p.active}
    cells = {(e.home, e.away): e for e in status.payoff if e.games > 0}
    table = PlainTable(title=f"win rate (games played) of the active players; the whole matrix of {len(status.players)} players: "
                  "--json or league plot", title_justify="left")
    if per_opponent:
        table.add_column("player", no_wrap=True, min_width=max(map(len, active), default=6))
    else:
        table.add_column("player", overflow="fold", min_width=min(max(map(len, active), default=6), FOLDED_ID_WIDTH))
    opponents = [a for a in active if any((home, a) in cells for home in active)]
    if per_opponent:
        for away in opponents:  # narrow: a rate and its count wrap onto two lines, a long id folds; nothing is cut
            table.add_column(away, justify="right", overflow="fold")
    else:
        # A column per active opponent left every cell empty with 20 of them at 80 columns, and nothing said so
        # (a review): their games taken together instead.
        table.add_column(f"vs {len(active)} active", justify="right", overflow="fold")
    table.add_column(f"vs {len(historical)} historical", justify="right", overflow="fold")
    left_out = [*([] if least else ["the historical player each beats least"]),
                *([] if per_opponent else ["the rate against each active player"])]
    if least:
        table.add_column("historical it beats least", no_wrap=True, overflow="ellipsis", max_width=60)
    if left_out:
        table.caption = f"left out at this width: {' and '.join(left_out)} (--json has them)"
        table.caption_justify = "left"
    shown: list[league_pb2.PayoffEntry] = []
    for home in active:
        row = [home]
        if per_opponent:
            for away in opponents:
                e = cells.get((home, away))
                row.append(_rate_cell(e) if e is not None else "-")
                shown += [e] if e is not None else []
        else:
            row.append(_pooled_rate([e for (h, a), e in cells.items() if h == home and a in opponents]))
        past = [e for (h, a), e in cells.items() if h == home and a in historical]
        row.append(_pooled_rate(past))
        if least:  # among the pairs with a rate of their own: a default 50% is no measure of the weakest
            worst = min((e for e in past if not e.win_rate_is_default), key=lambda e: (e.win_rate, -e.games),
                        default=None)
            row.append(f"{worst.away} {_rate_cell(worst)}" if worst is not None else "-")
        table.add_row(*row)
    _note_defaults(table, shown)
    return table


def _pooled_rate(entries: Sequence[league_pb2.PayoffEntry]) -> str:
    """The games-weighted win rate (draws half) over `entries` (over the decayed counts, as PFSP weighs the
    games: not the rates, where a default would count as played) and the games played."""
    if not entries:
        return "-"
    games = sum(e.games for e in entries)
    scored = sum(e.wins + 0.5 * e.draws for e in entries)
    return f"{min(max(scored / games, 0.0), 1.0):.0%} ({sum(e.games_played for e in entries):,})"


def _jobs(status: league_pb2.LeagueStatus) -> _FirstThatFits:
    """Jobs in flight, the oldest first. Too wide for the terminal (80 columns, a solo league's ids), rich cut the
    table off at its edge: "lease left" and "age" vanished with no word; now the columns of `drop` give way, one
    at a time, and the caption names them."""
    columns = ("job", "kind", "launch player", "players", "worker", "lease left", "age")
    drop = ("players", "launch player", "kind")
    jobs = sorted(status.jobs, key=lambda j: j.issued_at)
    rows = [(j.job_id, _KIND_NAMES.get(j.kind, "?"), j.launch_player, " vs ".join(j.players), j.worker_id,
             _duration(j.lease_deadline - status.now), _duration(status.now - j.issued_at)) for j in jobs[:JOB_ROWS]]

    def build(dropped: tuple[str, ...]) -> Callable[[], Table]:
        def table() -> Table:
            kept = [i for i, name in enumerate(columns) if name not in dropped]
            t = PlainTable(title=f"jobs in flight ({len(status.jobs)})", title_justify="left", caption_justify="left")
            for i in kept:
                name = columns[i]
                width = {"max_width": 36} if name == "players" else {"min_width": max(4, min(len(name), 8))}
                t.add_column(name, no_wrap=True, overflow="ellipsis", **width)
            captions = []
            if len(jobs) > JOB_ROWS:
                captions.append(f"the {JOB_ROWS} oldest; {len(jobs) - JOB_ROWS} more in `league status --json`")
            if dropped:
                captions.append(f"left out at this width: {', '.join(dropped)} (a wider terminal or --json has them)")
            if captions:
                t.caption = "; ".join(captions)
            for row in rows:
                t.add_row(*(row[i] for i in kept))
            return t
        return table

    return _FirstThatFits([build(drop[:n]) for n in range(len(drop) + 1)])


def _workers(status: league_pb2.LeagueStatus) -> Table:
    alive = sum(w.alive for w in status.workers)
    table = PlainTable(title=f"workers ({len(status.workers)}, {alive} alive)", title_justify="left")
    for name in ("worker", "role", "host", "endpoint", "last heartbeat", "jobs", "alive"):
        table.add_column(name)
    learner = league_pb2.WORKER_ROLE_LEARNER
    workers = sorted(status.workers, key=lambda w: (w.role != learner, w.alive, w.role, w.worker_id))
    if len(workers) > WORKER_ROWS:
        table.caption = (f"{WORKER_ROWS} shown (learners, then workers not alive); {len(workers) - WORKER_ROWS} "
                         f"more in `league status --json`")
    for w in workers[:WORKER_ROWS]:
        table.add_row(
            w.worker_id,
            _ROLE_NAMES.get(w.role, "?"),
            w.hostname or "-",
            w.data_endpoint or "-",
            f"{_duration(status.now - w.last_heartbeat)} ago",
            str(len(w.job_ids)),
            "yes" if w.alive else "no",
            style=None if w.alive else "dim",
        )
    return table


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
