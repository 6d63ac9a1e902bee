"""The league's invariants, checked from the outside after (and during) every chaos scenario.

Two sources, each checked on its own and against the other where that is sound:
- the coordinator's `GetStatus` (a `LeagueStatus` proto, or the JSON dict `league status --json` and
  `league run`'s status_history.jsonl hold);
- the SQLite state file (`read_ledger`): the ended jobs with the episodes each accepted `FinishJob` counted,
  the jobs in flight, the counters and the league state, all read in one transaction. It is the durable
  record of accepted results even when the finishes were sent by real actor processes the test cannot see.

API (everything raises `InvariantViolation`, an AssertionError listing every broken invariant at once):

    status = assert_invariants(address, state_path=..., earlier=previous_status, accepted=acks)
    check_status(status, earlier=..., since=ledger, accepted=..., payoff_decay=..., shared_root=...)
    check_ledger(read_ledger(state_path), accepted=..., earlier=...)

`earlier` is a status (or ledger) observed before: counters, game counts and steps never go back, and no
historical player (snapshot) disappears. `since` is a ledger read before: nothing durable then is lost (use it
across a coordinator kill, where a status taken before the kill may show changes never committed).
`accepted` maps job id -> episodes counted, as the test's own clients were told by FinishJob replies; pass
`accepted_complete=True` when those clients were the only ones finishing jobs, so the league's match total
must equal their sum exactly.

What is checked, from a status: every job in flight listed once, leased to a registered worker that lists it
(one owner), at most one learner per player; slots_used within [0, slots_limit] (these runs never lower a
limit, which a restart allows while jobs are in flight) and no fewer than the
player's collect jobs in flight, none for snapshots; jobs_issued == finished + expired + failed + in flight;
solo leagues: the players' episodes add up to counters.matches; battle leagues: rated games pair up and never
exceed the matches, payoff rows mirror each other, wins+draws+losses == games, no player has played more payoff
games than rated games (exactly as many in total: games played are never decayed, nor forgotten at a reset),
ratings finite. From the ledger: the stored
match total and counters.episodes equal the episodes of the ended jobs, no job both in flight and ended, only
completed/released jobs count episodes, every accepted job recorded with its count, ended jobs stay ended.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from common.proto.league.v1 import league_pb2
from league_service.store import read_counters, read_league_state

# Payoff counts are decayed floats: compare them with this slack.
_TOL = 1e-6

_MONOTONE_COUNTERS = (
    "jobs_issued", "jobs_finished", "jobs_expired", "jobs_failed", "matches", "snapshots", "mutations", "env_steps",
)


class InvariantViolation(AssertionError):
    """One or more league invariants do not hold; the message lists each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("league invariants violated:\n  - " + "\n  - ".join(self.problems))


def as_status(status: league_pb2.LeagueStatus | Mapping[str, Any]) -> league_pb2.LeagueStatus:
    """A LeagueStatus proto from a proto or from its JSON dict (status_history.jsonl; extra keys ignored)."""
    if isinstance(status, league_pb2.LeagueStatus):
        return status
    if isinstance(status, Mapping):
        return json_format.ParseDict(dict(status), league_pb2.LeagueStatus(), ignore_unknown_fields=True)
    raise TypeError(f"status: expected a LeagueStatus or its JSON dict, got {type(status).__name__}")


# ---- the status --------------------------------------------------------------------------------------------


def check_status(
    status: league_pb2.LeagueStatus | Mapping[str, Any],
    *,
    earlier: league_pb2.LeagueStatus | Mapping[str, Any] | None = None,
    accepted: Mapping[str, int] | None = None,
    accepted_complete: bool = False,
    payoff_decay: float | None = None,
    shared_root: Path | None = None,
    since: Ledger | None = None,
) -> None:
    """Check one GetStatus snapshot (and its relation to an earlier one).

    since: a ledger read before this status was taken (e.g. right after a coordinator was killed): whatever
    was durable then must still be there — match and job counters at least as high, every stored snapshot
    still a player with the same checkpoint.
    payoff_decay: the league's `payoff.decay` (kept for callers: the games played, which the check adds up, are
    never decayed, so they equal the rated episodes whatever it is). shared_root: every snapshot's checkpoint file must
    exist under it (snapshots are frozen copies; they must never vanish).
    """
    s = as_status(status)
    problems: list[str] = []
    problems += _lease_problems(s)
    problems += _slot_problems(s)
    problems += _accounting_problems(s, payoff_decay)
    if accepted is not None:
        total = sum(accepted.values())
        if accepted_complete and s.counters.matches != total:
            problems.append(f"counters.matches {s.counters.matches} != {total}, the sum of accepted results")
        elif s.counters.matches < total:
            problems.append(f"counters.matches {s.counters.matches} < {total} accepted by our clients alone")
    if shared_root is not None:
        for p in s.players:  # active players' older checkpoints are pruned by design; snapshots never
            if not p.active and p.checkpoint_path and not (Path(shared_root) / p.checkpoint_path).is_file():
                problems.append(f"snapshot {p.player_id}: checkpoint {p.checkpoint_path!r} missing under {shared_root}")
    if earlier is not None:
        problems += _progress_problems(as_status(earlier), s)
    if since is not None:
        problems += _durable_problems(since, s)
    if problems:
        raise InvariantViolation(problems)


def _durable_problems(ledger: Ledger, s: league_pb2.LeagueStatus) -> list[str]:
    problems = []
    if s.counters.matches < ledger.matches:
        problems.append(f"counters.matches {s.counters.matches} < {ledger.matches} stored before (lost matches)")
    for name in ("jobs_issued", "jobs_finished", "jobs_expired", "jobs_failed", "env_steps"):
        if name in ledger.counters and getattr(s.counters, name) < ledger.counters[name]:
            problems.append(f"counters.{name} {getattr(s.counters, name)} < {ledger.counters[name]} stored before")
    players = {p.player_id: p for p in s.players}
    for pid, path in ledger.historical.items():
        p = players.get(pid)
        if p is None or p.active or p.checkpoint_path != path:
            problems.append(f"stored snapshot {pid} ({path!r}) is lost or changed")
    return problems


def _lease_problems(s: league_pb2.LeagueStatus) -> list[str]:
    problems = []
    ids = Counter(j.job_id for j in s.jobs)
    problems += [f"job {jid} listed {n} times (two owners?)" for jid, n in ids.items() if n > 1]
    workers = {w.worker_id: w for w in s.workers}
    owned: dict[str, set[str]] = {}
    for job in s.jobs:
        if job.worker_id not in workers:
            problems.append(f"job {job.job_id} is leased to unregistered worker {job.worker_id!r}")
        owned.setdefault(job.worker_id, set()).add(job.job_id)
    for w in s.workers:
        listed = set(w.job_ids)
        if listed != owned.get(w.worker_id, set()):
            problems.append(f"worker {w.worker_id} lists jobs {sorted(listed)}, the leases say "
                            f"{sorted(owned.get(w.worker_id, set()))}")
    claimed = Counter(jid for w in s.workers for jid in w.job_ids)
    problems += [f"job {jid} claimed by {n} workers" for jid, n in claimed.items() if n > 1]
    learn = Counter(j.launch_player for j in s.jobs if j.kind == league_pb2.JOB_KIND_LEARN)
    problems += [f"player {pid} has {n} learners bound" for pid, n in learn.items() if n > 1]
    learner_of = {j.launch_player: j.worker_id for j in s.jobs if j.kind == league_pb2.JOB_KIND_LEARN}
    for p in s.players:
        if p.learner_worker_id and learner_of.get(p.player_id) != p.learner_worker_id:
            problems.append(f"player {p.player_id} names learner {p.learner_worker_id!r}, its learn job "
                            f"{learner_of.get(p.player_id)!r}")
    return problems


def _slot_problems(s: league_pb2.LeagueStatus) -> list[str]:
    problems = []
    collect = Counter(j.launch_player for j in s.jobs if j.kind != league_pb2.JOB_KIND_LEARN)
    players = {p.player_id: p for p in s.players}
    for p in s.players:
        if not 0 <= p.slots_used <= p.slots_limit:
            problems.append(f"player {p.player_id}: slots_used {p.slots_used} outside [0, {p.slots_limit}]")
        if collect[p.player_id] > p.slots_used:
            problems.append(f"player {p.player_id}: {collect[p.player_id]} collect jobs in flight > "
                            f"{p.slots_used} slots used")
        if not p.active and (p.slots_used or collect[p.player_id]):
            problems.append(f"historical player {p.player_id} holds launch slots or jobs")
    for pid in collect:
        if pid not in players:
            problems.append(f"collect job(s) launched by unknown player {pid!r}")
    return problems


def _accounting_problems(s: league_pb2.LeagueStatus, payoff_decay: float | None) -> list[str]:
    problems = []
    c = s.counters
    in_flight = len(s.jobs)
    if c.jobs_issued != c.jobs_finished + c.jobs_expired + c.jobs_failed + in_flight:
        problems.append(f"jobs_issued {c.jobs_issued} != finished {c.jobs_finished} + expired {c.jobs_expired} "
                        f"+ failed {c.jobs_failed} + in flight {in_flight}")
    episodes = sum(p.episodes for p in s.players)
    if s.league_type == "solo":
        if episodes != c.matches:
            problems.append(f"solo: players' episodes {episodes} != counters.matches {c.matches}")
        return problems
    # Battle: each rated (non-self-play) episode gives both players one rated game; self-play is not rated.
    if episodes % 2:
        problems.append(f"players' rated games add up to an odd {episodes}")
    if episodes // 2 > c.matches:
        problems.append(f"rated episodes {episodes // 2} > counters.matches {c.matches}")
    rows = {(e.home, e.away): e for e in s.payoff}
    known = {p.player_id for p in s.players}
    games_of: Counter[str] = Counter()
    pair_games = 0.0
    for (home, away), e in rows.items():
        if home not in known or away not in known:
            problems.append(f"payoff row {home} vs {away} names an unknown player")
        if home == away:
            problems.append(f"payoff records self-play {home}")
        values = (e.wins, e.draws, e.losses, e.games, e.win_rate)
        if not all(math.isfinite(v) and v >= 0 for v in values) or e.win_rate > 1:
            problems.append(f"payoff {home} vs {away}: bad numbers {values}")
        if abs(e.wins + e.draws + e.losses - e.games) > _TOL * max(1.0, e.games):
            problems.append(f"payoff {home} vs {away}: wins+draws+losses != games {e.games}")
        other = rows.get((away, home))
        if other is None:
            problems.append(f"payoff {home} vs {away} has no mirror row")
        elif (abs(other.wins - e.losses) > _TOL * max(1.0, e.games) or abs(other.games - e.games) > _TOL
              * max(1.0, e.games) or abs(other.draws - e.draws) > _TOL * max(1.0, e.games)):
            problems.append(f"payoff {home} vs {away} disagrees with its mirror row")
        # Games played, not the decayed counts: those of a player reset by a mutation start afresh.
        games_of[home] += e.games_played
        if home < away:
            pair_games += e.games_played
    rated = {p.player_id: p.episodes for p in s.players}
    for pid, games in games_of.items():
        if games > rated.get(pid, 0) + _TOL * max(1.0, games):
            problems.append(f"player {pid}: payoff games {games:.3f} > its rated games {rated.get(pid, 0)}")
    if abs(pair_games - episodes / 2) > _TOL * max(1.0, pair_games):
        problems.append(f"payoff games played {pair_games} != rated episodes {episodes / 2}")
    for p in s.players:
        if not all(math.isfinite(v) for v in (p.elo, p.trueskill_mu, p.trueskill_sigma)) or p.trueskill_sigma <= 0:
            problems.append(f"player {p.player_id}: bad ratings elo {p.elo} mu {p.trueskill_mu} "
                            f"sigma {p.trueskill_sigma}")
    return problems


def _progress_problems(before: league_pb2.LeagueStatus, after: league_pb2.LeagueStatus) -> list[str]:
    problems = []
    if before.league_id and after.league_id != before.league_id:
        problems.append(f"league_id changed {before.league_id!r} -> {after.league_id!r}")
    for name in _MONOTONE_COUNTERS:
        old, new = getattr(before.counters, name), getattr(after.counters, name)
        if new < old:
            problems.append(f"counters.{name} went back {old} -> {new}")
    now = {p.player_id: p for p in after.players}
    for p in before.players:
        q = now.get(p.player_id)
        if q is None:
            problems.append(f"player {p.player_id} ({'active' if p.active else 'snapshot'}) disappeared")
            continue
        if q.agent_steps < p.agent_steps:
            problems.append(f"player {p.player_id}: agent_steps went back {p.agent_steps} -> {q.agent_steps}")
        if q.episodes < p.episodes:
            problems.append(f"player {p.player_id}: episodes went back {p.episodes} -> {q.episodes}")
        if not p.active and (q.active or q.checkpoint_path != p.checkpoint_path or q.parent_id != p.parent_id):
            problems.append(f"snapshot {p.player_id} changed: {p.checkpoint_path!r} -> {q.checkpoint_path!r}")
    played = {(e.home, e.away): e.games_played for e in after.payoff}
    for e in before.payoff:
        # (the decayed count may go back: a reset player's records start afresh; the games played never do)
        if played.get((e.home, e.away), 0) < e.games_played:
            problems.append(f"payoff {e.home} vs {e.away}: games played went back {e.games_played} -> "
                            f"{played.get((e.home, e.away), 0)}")
    return problems


# ---- the durable state -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """What the state file records, read in one transaction."""

    # job id -> (status, episodes counted) of every ended job.
    ended: Mapping[str, tuple[str, int]]
    # job id -> worker of every job in flight.
    in_flight: Mapping[str, str]
    # Coordinator counters (store.Counters as stored).
    counters: Mapping[str, int]
    # The league core's state_dict (players, payoff, ratings, slots, counters); None before the first write.
    league_state: Mapping[str, Any] | None

    @property
    def episodes_counted(self) -> int:
        return sum(n for _, n in self.ended.values())

    @property
    def matches(self) -> int:
        return int(self.league_state["counters"]["matches"]) if self.league_state else 0

    @property
    def historical(self) -> dict[str, str]:
        """Snapshot id -> checkpoint path, from the stored league state."""
        if not self.league_state:
            return {}
        return {h["player_id"]: h.get("checkpoint_path", "") for h in _historical_states(self.league_state)}


def read_ledger(state_path: Path) -> Ledger:
    """Read the coordinator's SQLite state (it may be running: WAL readers do not block it)."""
    path = Path(state_path)
    if not path.is_file():
        raise FileNotFoundError(f"state_path: no league state at {path}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        conn.execute("BEGIN")  # one read snapshot for every query below
        ended = {jid: (status, int(n)) for jid, status, n in
                 conn.execute("SELECT job_id, status, episodes_counted FROM ended_jobs")}
        in_flight = dict(conn.execute("SELECT job_id, worker_id FROM jobs"))
        stored_counters = read_counters(conn)
        league_state = read_league_state(conn)  # stored in parts (league_service/league_state.py)
        conn.execute("COMMIT")
    finally:
        conn.close()
    counters = dict(vars(stored_counters)) if stored_counters is not None else {}
    return Ledger(ended=ended, in_flight=in_flight, counters=counters, league_state=league_state)


def check_ledger(
    ledger: Ledger,
    *,
    accepted: Mapping[str, int] | None = None,
    accepted_complete: bool = False,
    earlier: Ledger | None = None,
) -> None:
    """Check the durable books: the stored match total is the sum of the stored accepted results, every
    result a client was told was accepted is there with its count, and nothing ended comes back."""
    problems: list[str] = []
    counted = ledger.episodes_counted
    if ledger.league_state is not None and ledger.matches != counted:
        problems.append(f"stored league matches {ledger.matches} != {counted}, the episodes of the ended jobs")
    if "episodes" in ledger.counters and ledger.counters["episodes"] != counted:
        problems.append(f"stored counters.episodes {ledger.counters['episodes']} != {counted} (ended jobs)")
    both = set(ledger.in_flight) & set(ledger.ended)
    if both:
        problems.append(f"jobs both in flight and ended: {sorted(both)[:5]}")
    for status, n in ledger.ended.values():
        if n and status not in ("completed", "released"):
            problems.append(f"a {status} job counted {n} episodes")
    if accepted is not None:
        for jid, n in accepted.items():
            got = ledger.ended.get(jid)
            if got is None:
                problems.append(f"accepted job {jid} is not recorded as ended (an accepted result was lost)")
            elif got[1] != n:
                problems.append(f"accepted job {jid} counted {n}, recorded {got[1]}")
        if accepted_complete and counted != sum(accepted.values()):
            problems.append(f"recorded episodes {counted} != {sum(accepted.values())} accepted")
    if earlier is not None:
        for jid, end in earlier.ended.items():
            if ledger.ended.get(jid) != end:
                problems.append(f"ended job {jid} {end} became {ledger.ended.get(jid)}")
        if ledger.matches < earlier.matches:
            problems.append(f"stored matches went back {earlier.matches} -> {ledger.matches}")
        for pid, path in earlier.historical.items():
            if ledger.historical.get(pid) != path:
                problems.append(f"stored snapshot {pid} ({path!r}) lost or changed")
    if problems:
        raise InvariantViolation(problems)


def _historical_states(league_state: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The stored snapshots: the league state's players of type historical_player."""
    return [p for p in league_state.get("players", []) if p.get("player_type") == "historical_player"]


# ---- both, against a live coordinator ----------------------------------------------------------------------


def fetch_status(address: str, *, timeout_s: float = 10.0, token: str | None = None) -> league_pb2.LeagueStatus:
    from common.proto.league.v1 import league_pb2_grpc
    from common.rpc import make_channel

    kwargs = {"token": token} if token else {}
    channel = make_channel(address, **kwargs)
    try:
        return league_pb2_grpc.LeagueServiceStub(channel).GetStatus(league_pb2.GetStatusRequest(), timeout=timeout_s)
    finally:
        channel.close()


def assert_invariants(
    address: str | None = None,
    *,
    status: league_pb2.LeagueStatus | Mapping[str, Any] | None = None,
    state_path: Path | None = None,
    earlier: league_pb2.LeagueStatus | Mapping[str, Any] | None = None,
    accepted: Mapping[str, int] | None = None,
    accepted_complete: bool = False,
    payoff_decay: float | None = None,
    shared_root: Path | None = None,
    coordinator_stopped: bool = False,
    token: str | None = None,
) -> league_pb2.LeagueStatus | None:
    """Everything at once: the live status (fetched from `address`, or the `status` given) and, with
    `state_path`, the durable ledger. Returns the status, to pass as `earlier` next time.

    A running coordinator's GetStatus may show changes its group commit has not written yet (no worker has
    been told about those; a kill may take them back), so the status and the ledger are compared only with
    `coordinator_stopped=True`: a status taken when no worker was sending any more, after which the
    coordinator stopped cleanly (SIGTERM). Then the two must agree exactly.
    """
    if status is None and address is not None:
        status = fetch_status(address, token=token)
    s = as_status(status) if status is not None else None
    if s is not None:
        check_status(s, earlier=earlier, accepted=accepted, accepted_complete=accepted_complete,
                     payoff_decay=payoff_decay, shared_root=shared_root)
    if state_path is not None:
        ledger = read_ledger(state_path)
        check_ledger(ledger, accepted=accepted, accepted_complete=accepted_complete)
        if s is not None and coordinator_stopped and ledger.matches != s.counters.matches:
            raise InvariantViolation([f"stored matches {ledger.matches} != status matches {s.counters.matches} "
                                      "(coordinator stopped: they must agree)"])
    return s
