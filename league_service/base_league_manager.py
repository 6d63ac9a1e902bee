"""The league manager: holds the players and their payoff, launches jobs, snapshots and mutates players.

Two threads, as in the seed, but event-driven instead of sleep-polling:
- the launch thread waits until some active player has a free launch slot (a slot frees on finish_job /
  release_job), builds one JobSpec per free slot and hands each to `launch_job_fn`. A caller that frees slots
  itself under its own lock (the coordinator) runs the league without it (`launch_thread=False`) and takes the
  jobs with `take_ready_jobs()` right after: no thread hand-off per finished job;
- the snapshot thread waits until a player was updated, then snapshots every player that is trained enough
  (copying its checkpoint with `save_checkpoint_fn`), mutates it if its type says so, and calls `on_change`.
`close()` sets a stop flag and wakes both, so it returns as soon as they finish what they are doing.

Durable state: `state_dict()` is the whole league; `take_state_changes()` only what changed since it last ran
(league_state.py), so a store writes a few rows per finished job instead of the whole league.

One lock guards players, slots, ratings and counters (the payoff has its own). The injected functions and
`on_change` are always called outside it, so they may call back into the league.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple

import numpy as np

from league_service.config import Config
from league_service.league_errors import (
    LeagueStateError,
    LeagueThreadError,
    NotHistoricalCheckpointError,
    SlotError,
)
from league_service.league_state import LeagueStateChanges, changes_from_state
from league_service.messages import JobResult, JobSpec, PlayerUpdate, UpdateOutcome
from league_service.payoff import BattleSharedPayoff, PayoffCounts, SoloSharedPayoff
from league_service.players import ActivePlayer, CheckpointRef, HistoricalPlayer, Player, PlayerJob
from league_service.ratings import Rating
from league_service.roster import Roster
from league_service.status import LeagueCounters, LeagueStatus, PlayerStatus

log = logging.getLogger(__name__)

SaveCheckpointFn = Callable[[str, str], None]
LaunchJobFn = Callable[[JobSpec], None]

STATE_FORMAT_VERSION = 1


@dataclasses.dataclass
class _Counters:
    matches: int = 0
    snapshots: int = 0
    mutations: int = 0
    jobs_launched: int = 0
    jobs_finished: int = 0
    jobs_released: int = 0


class _PlayerValues(NamedTuple):
    """A player's status values, read under the league's lock (a tuple: cheap to make for thousands of players);
    the `PlayerStatus` is built from them after the lock is let go."""

    player: Player
    active: bool
    agent_steps: int
    train_iteration: int
    checkpoint_path: str
    checkpoint_version: int
    snapshots: int
    mutations: int
    set_aside: str
    rating: Rating
    record: tuple[int, float]  # (episodes, mean return)
    slots_used: int
    slots_limit: int

    def status(self) -> PlayerStatus:
        player, rating = self.player, self.rating
        return PlayerStatus(
            player_id=player.player_id,
            player_type=player.player_type,
            active=self.active,
            category=player.category,
            parent_id=player.parent_id if isinstance(player, HistoricalPlayer) else "",
            agent_steps=self.agent_steps,
            train_iteration=self.train_iteration,
            checkpoint_path=self.checkpoint_path,
            checkpoint_version=self.checkpoint_version,
            elo=rating.elo,
            trueskill_mu=rating.mu,
            trueskill_sigma=rating.sigma,
            slots_used=self.slots_used,
            slots_limit=self.slots_limit,
            snapshots=self.snapshots,
            mutations=self.mutations,
            episodes=self.record[0],
            mean_return=self.record[1],
            set_aside=self.set_aside,
        )


@dataclasses.dataclass(frozen=True)
class LeagueStatusValues:
    """`BaseLeagueManager.status_values()`: a league's status as copied under its lock, not yet built."""

    league_id: str
    league_type: str
    players: list[_PlayerValues]
    payoff: BattleSharedPayoff | SoloSharedPayoff  # builds the rows (win rates per its config)
    counts: PayoffCounts
    counters: LeagueCounters

    def status(self) -> LeagueStatus:
        return LeagueStatus(
            league_id=self.league_id,
            league_type=self.league_type,
            players=tuple(v.status() for v in self.players),
            payoff=tuple(self.payoff.rows_of(self.counts)),
            counters=self.counters,
        )


class BaseLeagueManager(ABC):
    league_type: ClassVar[str]

    def __init__(
        self,
        cfg: Config,
        save_checkpoint_fn: SaveCheckpointFn,
        launch_job_fn: LaunchJobFn,
        on_change: Callable[[], None] | None = None,
        rng_seed: int | None = None,
        launch_thread: bool = True,
    ) -> None:
        if cfg.league.league_type != self.league_type:
            raise ValueError(
                f"league.league_type: {type(self).__name__} runs {self.league_type!r} leagues, "
                f"got {cfg.league.league_type!r} (use create_league)"
            )
        self._cfg = cfg
        self.league_id = uuid.uuid4().hex
        self.save_checkpoint_fn = save_checkpoint_fn
        self.launch_job_fn = launch_job_fn
        self._on_change = on_change
        self._rng = np.random.default_rng(rng_seed)
        self._lock = threading.Lock()
        self._slot_freed = threading.Condition(self._lock)
        self._player_updated = threading.Condition(self._lock)
        # Serialises snapshot rounds (the thread's and any called directly); taken before self._lock.
        self._snapshot_round = threading.Lock()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._failure: BaseException | None = None
        self._failure_reported = False
        # The snapshot thread runs a round whenever these differ; the first round checks every player.
        self._update_seq = 1
        self._checked_seq = 0
        self._counters = _Counters()
        self._roster = Roster.build(cfg.league, self.league_type)
        self._launch_thread = launch_thread
        # For take_state_changes: players changed since it last ran, and whether it must hand out everything.
        self._changed_players: set[str] = set()
        self._all_changed = True

    # -- lookup ----------------------------------------------------------------------------------------------

    @property
    def cfg(self) -> Config:
        return self._cfg

    @property
    def payoff(self) -> BattleSharedPayoff | SoloSharedPayoff:
        return self._roster.payoff

    @property
    def active_players(self) -> tuple[ActivePlayer, ...]:
        with self._lock:
            return tuple(self._roster.active.values())

    @property
    def historical_players(self) -> tuple[HistoricalPlayer, ...]:
        with self._lock:
            return tuple(self._roster.historical.values())

    def get_player(self, player_id: str) -> Player:
        with self._lock:
            return self._roster.get(player_id)

    def checkpoint_of(self, player_id: str) -> CheckpointRef:
        """The checkpoint (path and version, read together under the lock) a job should load for a player."""
        with self._lock:
            player = self._roster.get(player_id)
            return CheckpointRef(player.checkpoint_path, player.checkpoint_version)

    def job_checkpoints(self, player_ids: Iterable[str]) -> list[tuple[str, int, bool, str]]:
        """(checkpoint path, checkpoint version, active, reference bot) of each player, read together under the
        lock as in `checkpoint_of`, in one visit (a job's players)."""
        with self._lock:
            players = [self._roster.get(pid) for pid in player_ids]
            return [(p.checkpoint_path, p.checkpoint_version, p.is_active, p.bot) for p in players]

    @property
    def failure(self) -> BaseException | None:
        """The exception that stopped a league thread, if one did."""
        return self._failure

    # -- life cycle ------------------------------------------------------------------------------------------

    def run(self) -> None:
        """Start the launch and snapshot threads."""
        with self._lock:
            if self._closing:
                raise RuntimeError("the league is closed")
            if self._threads:
                raise RuntimeError("the league is already running (run() was called before)")
            self._threads = [
                threading.Thread(
                    target=self._guarded, args=(self._snapshot,), name="league-snapshot", daemon=True
                ),
            ]
            if self._launch_thread:
                self._threads.append(
                    threading.Thread(
                        target=self._guarded, args=(self._launch_job,), name="league-launch", daemon=True
                    )
                )
            threads = list(self._threads)
        for thread in threads:
            thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop both threads and wait for them. Idempotent. Raises LeagueThreadError (once) if a thread died,
        or if one is still stuck in an injected function after `timeout_s`."""
        with self._lock:
            self._closing = True
            self._slot_freed.notify_all()
            self._player_updated.notify_all()
            threads = list(self._threads)
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:
                thread.join(timeout_s)
        stuck = [t.name for t in threads if t is not current and t.is_alive()]
        if stuck:
            raise LeagueThreadError(
                f"league threads still running after {timeout_s}s: {stuck} "
                "(is launch_job_fn or save_checkpoint_fn blocked?)"
            )
        if self._failure is not None and not self._failure_reported:
            self._failure_reported = True
            raise LeagueThreadError(f"a league thread failed: {self._failure!r}") from self._failure

    def _guarded(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as exc:  # recorded and re-raised by close(); the league stops launching
            log.exception("league thread %s failed", threading.current_thread().name)
            with self._lock:
                self._fail_locked(exc)

    def _fail_locked(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._closing = True
        self._slot_freed.notify_all()
        self._player_updated.notify_all()

    def _launch_job(self) -> None:
        """Launch thread: fill free launch slots whenever there are some."""
        while True:
            with self._lock:
                self._slot_freed.wait_for(lambda: self._closing or self._has_free_slot_locked())
                if self._closing:
                    return
                specs = self._take_free_slots_locked()
            self._launch(specs)

    def _snapshot(self) -> None:
        """Snapshot thread: after each player update, snapshot (and maybe mutate) who is trained enough."""
        while True:
            with self._lock:
                self._player_updated.wait_for(lambda: self._closing or self._update_seq != self._checked_seq)
                if self._closing:
                    return
            self.snapshot_ready_players()

    # -- jobs ------------------------------------------------------------------------------------------------

    def _has_free_slot_locked(self) -> bool:
        return any(s.get_residual_space() > 0 for s in self._roster.slots.values())

    def _take_free_slots_locked(self) -> list[JobSpec]:
        specs: list[JobSpec] = []
        try:
            for player in self._roster.active.values():
                slots = self._roster.slots[player.player_id]
                while slots.get_residual_space() > 0:
                    spec = self._get_job_info(player)
                    if spec.launch_player != player.player_id:
                        raise RuntimeError(
                            f"_get_job_info({player.player_id!r}) launched {spec.launch_player!r}"
                        )
                    slots.acquire_space()
                    specs.append(spec)
        except BaseException:
            self._release_slots_locked(specs)
            raise
        self._counters.jobs_launched += len(specs)
        return specs

    def _release_slots_locked(self, specs: Iterable[JobSpec]) -> None:
        for spec in specs:
            self._roster.slots[spec.launch_player].release_space()

    def _launch(self, specs: list[JobSpec]) -> None:
        for i, spec in enumerate(specs):
            try:
                self.launch_job_fn(spec)
            except BaseException:
                with self._lock:  # the jobs not launched give their slots back
                    self._release_slots_locked(specs[i:])
                    self._counters.jobs_launched -= len(specs) - i
                raise

    def launch_ready_jobs(self) -> list[JobSpec]:
        """One round of the launch thread, synchronously: a job launched per free slot; returns them."""
        with self._lock:
            specs = self._take_free_slots_locked()
        self._launch(specs)
        return specs

    def take_ready_jobs(self) -> list[JobSpec]:
        """A job per free launch slot, slots taken, for a caller that launches them itself (`launch_thread=False`;
        launch_job_fn is not called). A failure stops the league as a failing launch thread does: it is logged,
        kept in `failure` and re-raised; later calls take nothing."""
        with self._lock:
            if self._failure is not None:
                return []
            try:
                return self._take_free_slots_locked()
            except BaseException as exc:
                log.exception("launching jobs failed; the league launches no more")
                self._fail_locked(exc)
                raise

    @abstractmethod
    def _get_job_info(self, player: ActivePlayer) -> JobSpec:
        """The next job of `player` (called under the lock; players[0] must be the player)."""

    def _job_spec(self, player: ActivePlayer, job: PlayerJob) -> JobSpec:
        players = (player.player_id, *(o.player_id for o in job.opponents))
        return JobSpec(
            launch_player=player.player_id,
            players=players,
            env_kwargs=job.env_kwargs,
            forward_kwargs=job.forward_kwargs,
            adder_kwargs=job.adder_kwargs,
            extra=job.extra,
        )

    def generations(self, player_ids: tuple[str, ...]) -> tuple[int, ...]:
        """Each player's reset generation now (`_generations_locked`): a collect job's lease keeps those of the
        weights it is played with."""
        with self._lock:
            return self._generations_locked(player_ids)

    def _generations_locked(self, player_ids: tuple[str, ...]) -> tuple[int, ...]:
        """Each player's reset generation: an active player's mutations so far; 0 for a historical one."""
        return tuple(p.mutations if isinstance(p := self._roster.get(pid), ActivePlayer) else 0 for pid in player_ids)

    def _played_by_replaced_weights(self, result: JobResult) -> bool:
        """A job leased before one of its players was reset (mutated) was played, in part at least, by the weights
        the reset replaced (`result.generations`: the coordinator's lease keeps them from when it was leased): its
        results are no record of the reset player's new weights, whose win rates start afresh
        (`Payoff.forget_results_of`). Counted, a stuck main exploiter's last job's losses were
        its fresh record at once, and it was reset again at the next snapshot. Under the lock."""
        if not result.generations:
            return False
        now = self._generations_locked(result.players)
        if result.generations == now:
            return False
        reset = [pid for pid, then, current in zip(result.players, result.generations, now, strict=True) if then != current]
        log.info("a job of %s leased before a reset of %s finished: its %d result(s) are not counted (played by the "
                 "weights the reset replaced)", result.launch_player, ", ".join(reset), len(result.episodes))
        return True

    def finish_job(self, result: JobResult) -> int:
        """A job ended with results: free the launch player's slot, count its episodes in the payoff and the
        ratings. Validated in full before anything changes. Returns the episodes counted."""
        if not isinstance(result, JobResult):
            raise TypeError(f"result: expected a JobResult, got {type(result).__name__}")
        with self._lock:
            player = self._roster.require_active(result.launch_player, field="launch_player")
            slots = self._roster.slots[player.player_id]
            if slots.used == 0:
                raise SlotError(
                    "launch_player", f"{player.player_id!r} holds no launch slot (finished twice?)"
                )
            counted = self._record_result(result)
            slots.release_space()
            self._counters.jobs_finished += 1
            self._counters.matches += counted
            self._slot_freed.notify_all()
        return counted

    @abstractmethod
    def _record_result(self, result: JobResult) -> int:
        """Validate `result`, then count it in the payoff (and ratings): all or nothing. Under the lock."""

    def release_job(self, launch_player: str) -> None:
        """A job ended without results (failed, lease expired): free its slot."""
        with self._lock:
            player = self._roster.require_active(launch_player, field="launch_player")
            self._roster.slots[player.player_id].release_space()
            self._counters.jobs_released += 1
            self._slot_freed.notify_all()

    def require_settable_aside(self, player_id: str, field: str = "player_id") -> HistoricalPlayer:
        """The historical player with a checkpoint `player_id` names; raises for any other player (an active
        one falls back to its older versions, a reference bot has no checkpoint)."""
        with self._lock:
            return self._settable_aside_locked(player_id, field)

    def _settable_aside_locked(self, player_id: str, field: str) -> HistoricalPlayer:
        player = self._roster.get(player_id, field)
        if not isinstance(player, HistoricalPlayer) or player.bot or not player.checkpoint_path:
            raise NotHistoricalCheckpointError(field, f"{player_id!r} is not a historical player with a checkpoint "
                                                      "(an active player's older versions stand in)")
        return player

    def set_aside(self, player_id: str, reason: str) -> bool:
        """Leave a historical player whose checkpoint cannot be loaded out of matchmaking (for good); False
        when it already was. Raises as `require_settable_aside` for any other player."""
        with self._lock:
            player = self._settable_aside_locked(player_id, "player_id")
            if player.set_aside:
                return False
            player.set_aside_for(reason)
            self._changed_players.add(player_id)
            return True

    # -- training progress, snapshots, mutation --------------------------------------------------------------

    def update_active_player(self, update: PlayerUpdate) -> UpdateOutcome:
        """A learner's progress report. Tells the learner when its player was reset (mutated)."""
        if not isinstance(update, PlayerUpdate):
            raise TypeError(f"update: expected a PlayerUpdate, got {type(update).__name__}")
        with self._lock:
            player = self._roster.require_active(update.player_id)
            outcome = self._update_player(player, update)
            self._changed_players.add(player.player_id)
            self._update_seq += 1
            self._player_updated.notify_all()
        return outcome

    def _update_player(self, player: ActivePlayer, update: PlayerUpdate) -> UpdateOutcome:
        """Apply an update to `player` (under the lock). Override to record more."""
        return player.apply_update(update)

    def snapshot_ready_players(self) -> list[HistoricalPlayer]:
        """One round of the snapshot thread, synchronously; returns the new historical players.

        The checkpoint copies run outside the lock; the snapshots, and any mutation, become part of the league
        only after their copy succeeded, so the league never names a checkpoint that is not there.
        """
        with self._snapshot_round:
            with self._lock:
                self._checked_seq = self._update_seq
                roster = self._roster
                plans = [
                    (p, p.snapshot(), p.checkpoint_path)
                    for p in roster.active.values()
                    if p.is_trained_enough()
                ]
            copied = []
            for plan in plans:
                _, historical, source = plan
                if source:
                    try:
                        self.save_checkpoint_fn(source, historical.checkpoint_path)
                    except FileNotFoundError as err:
                        # The learner retired that version meanwhile (it publishes faster than it keeps: a
                        # fast DQN learner keeps 5 versions for ~0.1 s). Expected, and the next update names a
                        # newer one, so no traceback.
                        log.warning("snapshot of %s skipped, its checkpoint is gone (%s); retried at the "
                                    "player's next update", historical.player_id, err)
                        continue
                    except OSError as err:
                        # A failed copy (disk full, a damaged share) skips this snapshot only: the player stays
                        # trained enough and is tried again at its next update, and the league keeps
                        # launching jobs meanwhile. One line: on a full disk it comes at every update of the
                        # player (every second or so), and a traceback says nothing the error does not.
                        log.error("snapshot of %s failed (%s); retried at its next update", historical.player_id,
                                  err)
                        continue
                    except Exception:  # (not the file system's: a traceback, as for any bug)
                        log.exception("snapshot of %s failed; retried at its next update", historical.player_id)
                        continue
                copied.append(plan)
            plans = copied
            with self._lock:
                for player, historical, _ in plans:
                    roster.add_historical(historical)
                    player.record_snapshot(historical)
                    self._changed_players.update((player.player_id, historical.player_id))
                    self._counters.snapshots += 1
                    if self._mutate_player(player):
                        self._counters.mutations += 1
        if plans and self._on_change is not None:
            self._on_change()
        return [historical for _, historical, _ in plans]

    def _mutate_player(self, player: ActivePlayer) -> bool:
        """After a snapshot: reset `player` to its category's pretrained checkpoint if its type decides so."""
        pretrained = self._cfg.league.pretrain_path(player.category)
        reset_path = player.mutate(pretrained, self._rng)
        if reset_path is None:
            return False
        ref = player.reset_checkpoint(reset_path)
        self.payoff.forget_results_of(player.player_id)  # other weights: their win rates are not known yet
        self._roster.ratings.restart(player.player_id)  # nor their rating
        log.info("mutated %s: reset to %r (version %d)", player.player_id, ref.path, ref.version)
        return True

    # -- status ----------------------------------------------------------------------------------------------

    def sizes(self) -> tuple[LeagueCounters, int, int]:
        """The counters and the number of active and of historical players (reference bots included): what a
        metrics scrape needs, without copying every player's status values and the payoff counts."""
        with self._lock:
            roster = self._roster
            return LeagueCounters(**dataclasses.asdict(self._counters)), len(roster.active), len(roster.historical)

    def status(self) -> LeagueStatus:
        """Every player's view and the payoff rows."""
        return self.status_values().status()

    def status_values(self) -> LeagueStatusValues:
        """The values of `status()`, copied under the league's lock; `.status()` builds the views from them after
        the lock is let go. Copying is what an RPC that reaches the league waits for (6,000 players: ~15 ms in a
        battle league, against 0.1-0.4 s for building the views and 12,000 payoff rows), and a caller holding a lock of its own
        (the coordinator's) copies them under it, so its status is of one moment."""
        with self._lock:
            roster = self._roster
            return LeagueStatusValues(
                league_id=self.league_id,
                league_type=self.league_type,
                players=[self._player_values(p) for p in roster.payoff.players],
                payoff=roster.payoff,
                counts=roster.payoff.counts(),
                counters=LeagueCounters(**dataclasses.asdict(self._counters)),
            )

    def _player_values(self, player: Player) -> _PlayerValues:
        """Hold the lock."""
        active = isinstance(player, ActivePlayer)
        slots = self._roster.slots.get(player.player_id)
        return _PlayerValues(
            player,
            active,
            player.total_agent_step,
            player.train_iteration if active else 0,
            player.checkpoint_path,
            player.checkpoint_version,
            player.snapshots if active else 0,
            player.mutations if active else 0,
            player.set_aside,
            self._roster.ratings.get(player.player_id),
            self._player_record(player),
            slots.used if slots else 0,
            slots.max_val if slots else 0,
        )

    @abstractmethod
    def _player_record(self, player: Player) -> tuple[int, float]:
        """(episodes, mean return) of a player for its status."""

    # -- durable state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this league exactly; JSON-serialisable."""
        with self._lock:
            return {**self._header_locked(), **self._roster.state_dict()}

    def has_unsaved_players(self, player_ids: Iterable[str]) -> bool:
        """Whether any of these players changed since `take_state_changes` last ran: a job naming a snapshot
        the snapshot thread has just added must not be committed without that player."""
        with self._lock:
            return self._all_changed or not self._changed_players.isdisjoint(player_ids)

    def take_state_changes(self) -> LeagueStateChanges:
        """What changed in `state_dict()` since this last ran: the header, the players updated or added, the
        payoff records and ratings that changed. The first call (and the first after `load_state_dict`) hands
        out everything (`complete`)."""
        with self._lock:
            if self._all_changed:
                self._all_changed = False
                self._changed_players.clear()
                self._roster.take_changes(set())  # forget the roster's own changes: all of it goes out now
                return changes_from_state({**self._header_locked(), **self._roster.state_dict()})
            changed, self._changed_players = self._changed_players, set()
            players, records, ratings = self._roster.take_changes(changed)
            return LeagueStateChanges(self._header_locked(), players, records, ratings)

    def _header_locked(self) -> dict[str, Any]:
        """The state besides the roster's collections (small: written whole with every change)."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "league_id": self.league_id,
            "league_type": self.league_type,
            "slots_used": self._roster.slots_used(),
            "counters": dict(vars(self._counters)),
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a league saved by `state_dict` (before run()). Its active players must be the configured
        ones; everything is validated and built apart first, so a bad state changes nothing."""
        with self._lock:
            if self._threads:
                raise RuntimeError("load_state_dict must be called before run()")
        if not isinstance(state, dict):
            raise LeagueStateError("state", f"expected a dict, got {type(state).__name__}")
        if state.get("format_version") != STATE_FORMAT_VERSION:
            raise LeagueStateError(
                "format_version", f"expected {STATE_FORMAT_VERSION}, got {state.get('format_version')!r}"
            )
        if state.get("league_type") != self.league_type:
            raise LeagueStateError(
                "league_type",
                f"the saved league is {state.get('league_type')!r}, the config says {self.league_type!r} (use the "
                "config the league was made with, or a new state)",
            )
        roster = Roster.from_state_dict(self._cfg.league, self.league_type, state)
        counters = self._restore_counters(state.get("counters"))
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = state["rng"]
        except (KeyError, TypeError, ValueError) as exc:
            raise LeagueStateError("rng", f"not a generator state: {exc}") from None
        league_id = state.get("league_id")
        if not isinstance(league_id, str) or not league_id:
            raise LeagueStateError("league_id", f"expected a non-empty str, got {league_id!r}")
        with self._lock:
            self._roster, self._counters, self._rng, self.league_id = roster, counters, rng, league_id
            self._all_changed = True
            self._update_seq += 1

    @staticmethod
    def _restore_counters(saved: Any) -> _Counters:
        names = {f.name for f in dataclasses.fields(_Counters)}
        if not isinstance(saved, dict) or set(saved) != names:
            raise LeagueStateError("counters", f"expected the counters {sorted(names)}")
        for name, value in saved.items():
            if not isinstance(value, int) or value < 0:
                raise LeagueStateError(f"counters.{name}", f"expected an int >= 0, got {value!r}")
        return _Counters(**saved)
