"""`league eval --run-dir RUN`: how a player's strength grew over a finished (or running) `league run`.

A league freezes its players into historical players as they train, so the snapshots of one player, in
the order of their agent steps, are checkpoints taken along the run. Playing each of them against a
ladder of reference bots (random, then MCTS with more and more simulations) shows whether the player got
stronger, and which bot strength it had passed at each point. Nothing here needs the coordinator: the
last line of the run's status history names the players and their checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_LADDER = ("random", "mcts:10", "mcts:25", "mcts:50", "mcts:100")


@dataclass(frozen=True)
class LineagePoint:
    """One checkpoint of the evaluated player: a frozen snapshot or the active player's latest version."""

    player_id: str
    agent_steps: int
    checkpoint_path: str
    checkpoint_version: int
    active: bool


@dataclass
class PointResult:
    point: LineagePoint
    # opponent -> result dict (EvalResult.to_dict())
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def strongest_beaten(self) -> str:
        """The strongest opponent this checkpoint scores more than half against ("-": none): random below every
        MCTS bot, MCTS bots by their simulations, whatever order `--opponent` listed them in (the last one
        beaten in that order was taken once: `mcts:5,random` said random for a player beating both)."""
        # By score (a draw half a win, as the league's payoff counts it): by win rate alone, a tic-tac-toe player
        # that never lost to an opponent (3 wins, 7 draws) beat nothing (a review).
        beaten = [opponent for opponent, r in self.results.items() if r.get("score", r["win_rate"]) > 0.5]
        return max(beaten, key=bot_strength) if beaten else "-"


def bot_strength(opponent: str) -> tuple[int, int]:
    """A reference bot's place in the ladder: random first, then MCTS by simulations (pyspiel's MCTS gets
    stronger with them); an opponent that is no bot spec sorts first."""
    from common.envs.bot_spec import BotSpec

    try:
        spec = BotSpec.parse(opponent)
    except ValueError:
        return (-1, 0)
    return (1, spec.num_simulations) if spec.kind == "mcts" else (0, 0)


def last_status(history_path: Path) -> dict[str, Any]:
    """The newest record of a run's status_history.jsonl (a torn last line, from a live run, is skipped)."""
    from league_cli.history import is_status_record, newest_record

    if not history_path.is_file():
        raise ValueError(f"{history_path}: no status history (is this a `league run` directory?)")
    record = newest_record(history_path)
    if record is None:
        raise ValueError(f"{history_path}: no complete status record yet")
    if not is_status_record(record):  # (another program's JSON: `.get` of a list was a traceback; a review)
        raise ValueError(f"{history_path}: its newest line is not a status record (`league run` writes them, as "
                         "does `league status --watch --json`)")
    return record


def choose_player(status: dict[str, Any], player_id: str | None) -> str:
    """`player_id` if given (it must be an active player), else the league's first main player."""
    active = [p for p in status.get("players", []) if p.get("active")]
    if not active:
        raise ValueError("the run's status lists no active player")
    if player_id is not None:
        if player_id not in {p["player_id"] for p in active}:
            raise ValueError(f"--player {player_id!r} is not an active player of the run "
                             f"(active: {', '.join(p['player_id'] for p in active)})")
        return player_id
    main = [p for p in active if p.get("player_type") == "main_player"]
    return (main or active)[0]["player_id"]


def _count(player: dict[str, Any], key: str) -> int:
    """A player's count in a status record; a value that is none (1e400 reads as infinity, "x") is refused as a
    malformed record, naming the player and the key (int() of infinity raised OverflowError, a traceback)."""
    value = player.get(key, 0)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"a malformed status record: player {player.get('player_id')!r} has {key} {value!r}, "
                         "not a count") from None


def lineage(status: dict[str, Any], player_id: str, points: int) -> list[LineagePoint]:
    """Snapshots of `player_id` by agent steps, thinned to `points` evenly spaced ones ending at its latest
    ([] when the status names none: a run stopped before its first checkpoint was in a status record).
    Snapshots the league set aside (their checkpoints cannot be loaded) are left out."""
    if points < 1:
        raise ValueError(f"--points must be >= 1, got {points}")
    found = []
    for p in status.get("players", []):
        mine = p["player_id"] == player_id if p.get("active") else p.get("parent_id") == player_id
        if mine and p.get("checkpoint_path") and not p.get("set_aside"):
            found.append(LineagePoint(p["player_id"], _count(p, "agent_steps"), p["checkpoint_path"],
                                      _count(p, "checkpoint_version"), bool(p.get("active"))))
    # The active player's latest checkpoint comes after every snapshot taken from it, unless a snapshot
    # froze that very version (then the snapshot stands for it).
    snapshot_versions = {pt.checkpoint_version for pt in found if not pt.active}
    found = [pt for pt in found if not (pt.active and pt.checkpoint_version in snapshot_versions)]
    found.sort(key=lambda pt: (pt.active, pt.agent_steps, pt.checkpoint_version))
    if len(found) <= points:
        return found
    if points == 1:
        return [found[-1]]
    step = (len(found) - 1) / (points - 1)
    return [found[round(i * step)] for i in range(points)]


def with_latest_published(line: Sequence[LineagePoint], player_id: str, version: int, path: str,
                          agent_steps: int | None, points: int) -> list[LineagePoint]:
    """`line` (of at most `points`) ending at the player's newest published checkpoint (`version` at `path`)
    when that is newer than its last point: a learner goes on publishing after the run's last status record,
    and keeps only its newest versions, so the version in the status may be gone by now. An active last point
    moves to it; after a snapshot that froze the status's version (which then stands for the active point),
    it is added, in that snapshot's place if the line is full (it was left out: a reviewer's run ended at the
    snapshot's v17 with v18 published)."""
    out = list(line)
    if out and version <= out[-1].checkpoint_version:
        return out
    last_steps = out[-1].agent_steps if out else 0
    steps = last_steps if agent_steps is None else max(last_steps, agent_steps)
    newest = LineagePoint(player_id, steps, path, version, True)
    if out and (out[-1].active or len(out) >= points):
        out[-1] = newest
    else:
        out.append(newest)
    return out


def evaluate_lineage(
    line: Sequence[LineagePoint],
    ladder: Sequence[str],
    play: Callable[[LineagePoint, str], dict[str, Any]],
    on_result: Callable[[PointResult, str], None] | None = None,
) -> list[PointResult]:
    """`play(point, opponent)` for every point and rung; `on_result` after each (progress)."""
    out = []
    for point in line:
        result = PointResult(point)
        for opponent in ladder:
            result.results[opponent] = play(point, opponent)
            if on_result is not None:
                on_result(result, opponent)
        out.append(result)
    return out


def progression_to_dict(player_id: str, results: Sequence[PointResult], games: int) -> dict[str, Any]:
    return {
        "player_id": player_id,
        "games": games,
        "points": [
            {"checkpoint": r.point.checkpoint_path, "version": r.point.checkpoint_version,
             "agent_steps": r.point.agent_steps, "snapshot": r.point.player_id if not r.point.active else None,
             "strongest_beaten": r.strongest_beaten(),
             "win_rate": {opp: res["win_rate"] for opp, res in r.results.items()},
             # What `strongest_beaten` goes by (draws half): with the win rates alone a reader could not tell
             # why a 30% opponent was named beaten (a review).
             "score": {opp: res.get("score", res["win_rate"]) for opp, res in r.results.items()}}
            for r in results
        ],
    }
