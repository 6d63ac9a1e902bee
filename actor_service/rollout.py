"""Playing one job's episodes: batched acting across envs, seats, episode results, the launch player's rows.

Each loop: take the envs waiting for an action, ask each env whose turn it is, group the envs by the policy
that acts there and run **one forward per policy** over its group, step the env manager with all actions,
then account rewards, episode ends and finished trajectory rows. The launch player's (players[0]) decisions
become trajectories; in self-play (another seat is the launch player itself, acting with the same policy
object and forward kwargs) that seat's decisions are recorded too: they are on-policy data of the same
player, and recording them doubles what a self-play game teaches its learner.

Seats: with as many players as the env has seats, player i sits at seat (i + r) % seats, where
r = (env_id + episode_index + the job's seed) % seats, so the launch player's seat alternates per episode (and
differs across envs), and a job of an odd number of episodes gives its extra one to a seat its seed chooses
(without the seed, always to seat 0: the first mover's, in every one-env job). Reference-bot players (no
policy: the env plays their seats, given to it at reset) keep their seats for the job,
r = (env_id + the job's seed) % seats, so the seats still differ across envs and jobs. A single player
in a multi-seat env (the other seats played by the env's reference bots) plays whichever seat it is asked to
act in.

Recurrent policies: every (env, job player) pair carries its own state between that player's decisions (rows of
one batched forward each bring their own state), self-play seats and opponents included; it starts afresh at
every episode (the env manager auto-resets an env whose episode ended, `_observe` sees the end) and is recorded
with each decision, so the learner can re-run the core from it.

Episodes: with `episode_num` > 0 the job reports exactly the first `episode_num` episodes *started* and ends
once they are all finished. An env that finishes while the others play the last counted episodes keeps playing
"surplus" episodes meanwhile: their transitions are sent (the learner can use them; the job's end cuts them),
their results are not reported — reporting the first episodes *finished* would favour short games in the
payoff, and parking the env would leave it idle. A job given `env_steps` too ends at whichever bound it reaches
first: a cap for envs whose episodes may run long, which reports the counted episodes that ended within it (the
ones it cut, the longer, are not). An episode that runs on and on without one is warned of (`_warn_long_episode`):
an env that never ends its episodes holds such a job for ever. With `episode_num` 0 the job ends once `env_steps`
env steps were taken; the episodes then under way go on in the actor's next job when it is one of the same shape
(`EnvCarry`: a solo league's are), and are reported where they end. Cut at every job's end instead, a job
reported the episodes that ended within its steps, short ones favoured: a solo CartPole player's mean return
read 207 where its episodes averaged 275 (a review's test). An episode cut short by an env failure is not
reported and its replacement takes its place; a failure that may strike at any step strikes long episodes more
often, so an env failing often tilts the results toward short episodes too (each job's report counts them).
A job cut short by a stop has finished the counted episodes that were short and not the long ones: its
`episodes` are no fair sample, and the actor reports them only if the job reached its bound (`reached_bound`).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from actor_service.envs.env_manager.base import BaseEnvManager
from actor_service.envs.env_manager.failure import EnvManagerInterrupted
from actor_service.job import JobError
from actor_service.policy_pool import Policy
from actor_service.stop import StopSignal
from actor_service.trajectory_sender import MAX_CHUNK_BYTES, TrajectorySink
from actor_service.transitions import NO_STATE, Decision, Row, SeatTrajectory
from common.algorithms.distributions import check_uniform_exploration
from common.computation.algorithm import ForwardKwargs
from common.computation.specs import ACTION_MASK, BoxActionSpec
from common.envs.base import EnvInfo, Outcome, TimeStep
from common.envs.policy_view import UnsupportedEnvError, env_action, player_view, policy_specs, to_play
from common.job_limits import MAX_EPISODES_PER_JOB
from common.trajectory import Trajectory

log = logging.getLogger(__name__)

LONG_EPISODE_STEPS = 100_000
"""Steps of one episode past which a job of `episode_num` warns that its env may never end it."""

_DEFAULT_KWARGS = ForwardKwargs()

State = Mapping[str, np.ndarray]
"""One player's recurrent state in one env: the model's state entries, without a batch dimension."""


class RolloutEnd(enum.Enum):
    COMPLETED = "completed"  # played every episode (or step) the job asked for
    STOPPED = "stopped"  # the actor is shutting down; the episodes finished so far favour short ones
    REVOKED = "revoked"  # the lease was taken back; nothing is to be reported


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode, per job player (job order: the launch player first)."""

    length: int
    player_ids: tuple[str, ...]
    outcomes: tuple[Outcome | None, ...]
    """None for solo matches (one player): no winner."""
    returns: tuple[float, ...]


@dataclass(frozen=True)
class RolloutResult:
    end: RolloutEnd
    episodes: tuple[EpisodeRecord, ...]
    env_steps: int
    agent_steps: int
    failed_episodes: int
    rows_written: int


@dataclass(frozen=True)
class EnvCarry:
    """One env's episode under way at the end of a step-budget job, for the next job of the same shape to play
    on (`Rollout(carry=...)`), so that an episode is reported whole wherever it ends."""

    episode_index: int
    seat_of: tuple[int | None, ...]
    returns: np.ndarray
    length: int
    states: Mapping[int, State]


@dataclass(frozen=True)
class RolloutTarget:
    """What to play: the job's bounds and players."""

    player_ids: tuple[str, ...]
    episode_num: int
    env_steps: int
    forward_kwargs: ForwardKwargs
    unroll_len: int

    def __post_init__(self) -> None:
        if not self.player_ids:
            raise JobError("players", "names no player")
        if self.episode_num < 0 or self.env_steps < 0 or (self.episode_num == 0 and self.env_steps == 0):
            raise JobError("episode_num", f"need episode_num > 0 or env_steps > 0, got {self.episode_num}, "
                           f"{self.env_steps}")


class Seating:
    """Which seat each job player takes in an episode.

    Seats differ from env to env and `offset` (from the job's seed) shifts them from job to job, so that a
    one-env job does not always seat its players alike. A job with reference-bot players (the env plays their
    seats itself, given at reset: `seat_bots`) keeps each env's seats for the whole job, since the env keeps its
    bots from reset to reset; otherwise they rotate with every episode."""

    def __init__(self, num_players: int, num_seats: int, bots: frozenset[int] = frozenset(), offset: int = 0) -> None:
        if num_players != num_seats and (num_players != 1 or bots):
            hint = ""
            if num_players == 2:  # a battle league's match on an env that is not a two-player game
                hint = (": a battle league (league.league_type: one_vs_one) seats two players per match, so its "
                        "env.name (and env.kwargs.game_params) must give a two-player game")
                if num_seats == 1:
                    hint += "; a single-player env trains in a solo league (league.league_type: solo)"
            raise JobError("players", f"{num_players} players cannot fill an env with {num_seats} seat(s){hint}")
        if 0 in bots:
            raise JobError("players[0]", "the launch player is a reference bot; it must be a player with a policy")
        self.num_players = num_players
        self.num_seats = num_seats
        self.bots = bots
        self._offset = offset

    def seats(self, env_id: int, episode_index: int) -> list[int | None]:
        """Seat of each player; None: taken at the player's first turn (a lone player among bots)."""
        if self.num_players == 1:
            return [0] if self.num_seats == 1 else [None]
        rotation = (env_id + self._offset + (0 if self.bots else episode_index)) % self.num_seats
        return [(i + rotation) % self.num_seats for i in range(self.num_players)]


def seat_bots(player_bots: Sequence[str], env_num: int, offset: int) -> list[dict[int, str]]:
    """Each env's reference bots (seat -> bot spec) for a job whose player j is played by the bot
    `player_bots[j]` ("": by a policy), seated as the job's `Seating` (built with the same `offset`) seats them.
    The env manager gives them to the envs at reset (OpenSpielEnv.reset(bots=...))."""
    bots = frozenset(j for j, bot in enumerate(player_bots) if bot)
    seating = Seating(len(player_bots), len(player_bots), bots, offset)
    return [{seating.seats(env_id, 0)[j]: player_bots[j] for j in sorted(bots)} for env_id in range(env_num)]


class _EnvSlot:
    """The rollout's bookkeeping for one env."""

    def __init__(self, env_id: int, seating: Seating, trajectories: dict[int, SeatTrajectory]) -> None:
        self.env_id = env_id
        self.counted = True  # the current episode's result is reported (False: a surplus episode)
        self.episode_index = 0
        self.trajectories = trajectories  # job player index -> its trajectory (recorded players only)
        self._seating = seating
        self.seat_of: list[int | None] = []
        self.returns = np.zeros(seating.num_seats, np.float64)
        self.length = 0
        self.states: dict[int, State] = {}
        """Recurrent policies: job player index -> the state it continues from (absent: its initial state)."""
        self.start_episode()

    def resume(self, kept: EnvCarry) -> None:
        """Play on the episode a previous job left under way in this env."""
        self.episode_index = kept.episode_index
        self.seat_of = list(kept.seat_of)
        self.returns[:] = kept.returns
        self.length = kept.length
        self.states = dict(kept.states)

    def start_episode(self) -> None:
        self.seat_of = self._seating.seats(self.env_id, self.episode_index)
        self.returns[:] = 0.0
        self.length = 0
        self.states.clear()  # every player's memory starts afresh with the episode

    def player_at(self, seat: int) -> int:
        if self.seat_of == [None]:
            self.seat_of = [seat]
        if seat in self.seat_of:
            return self.seat_of.index(seat)
        raise RuntimeError(f"env {self.env_id}: seat {seat} asks for an action, but the job's player(s) sit at "
                           f"{self.seat_of} (a lone player in a multi-seat game plays one seat per episode: give the other "
                           "seats to reference bots, e.g. env.kwargs.bots: {1: random}, or train in a battle league)")


@dataclass
class _Group:
    """The envs one policy acts in this step."""

    policy: Policy
    kwargs: ForwardKwargs
    env_ids: list[int]
    players: list[int]
    views: list[dict[str, np.ndarray]]


class Rollout:
    def __init__(
        self,
        manager: BaseEnvManager,
        info: EnvInfo,
        target: RolloutTarget,
        policies: Sequence[Policy | None],
        *,
        stop: StopSignal,
        revoked: StopSignal | None = None,
        sink: TrajectorySink | None = None,
        reload: Callable[[], Any] | None = None,
        chunk_rows: int | None = None,
        seat_offset: int = 0,
        carry: Sequence[EnvCarry] | None = None,
    ) -> None:
        """`policies[i]` acts for `target.player_ids[i]`; None: a reference bot the env plays itself, at the
        seats `seat_bots(..., seat_offset)` gave the envs; `sink` None: no trajectories (eval); `reload` is
        called once per loop (the launch policy's reload check). `carry`: the previous rollout's `carry_out()`
        when `manager` was not reset since (a step-budget job of the same players, env and policy)."""
        if len(policies) != len(target.player_ids):
            raise ValueError(f"{len(policies)} policies for {len(target.player_ids)} players")
        self._manager = manager
        self._info = info
        self._action_spec = policy_specs(info)[1]  # what the env receives: an index, or a clipped Box array
        if isinstance(self._action_spec, BoxActionSpec):
            try:  # a config problem, said before the job plays (as a crash from the first step, with a traceback)
                check_uniform_exploration(self._action_spec, target.forward_kwargs.eps)
            except ValueError as err:
                raise UnsupportedEnvError(f"env {info.name!r}: {err}") from None
        self._target = target
        self._policies = list(policies)
        self._stop = stop
        self._revoked = revoked or StopSignal()
        self._sink = sink
        self._reload = reload
        bots = frozenset(i for i, policy in enumerate(self._policies) if policy is None)
        self._seating = Seating(len(policies), info.num_players, bots, seat_offset)
        # The launch player and its self-play twins: the players whose decisions are trained on.
        self._recorded = frozenset(
            i for i, (pid, policy) in enumerate(zip(target.player_ids, self._policies, strict=True))
            if i == 0 or (pid == target.player_ids[0] and policy is self._policies[0])
        )
        env_num = manager.env_num
        self._chunk_rows = chunk_rows or env_num
        self._slots = [
            _EnvSlot(env_id, self._seating,
                     {i: SeatTrajectory(target.unroll_len) for i in self._recorded} if sink is not None else {})
            for env_id in range(env_num)
        ]
        if carry is not None:
            if target.episode_num > 0 or bots or len(carry) != env_num:
                raise ValueError(f"carry: {len(carry)} envs' episodes for a job of {env_num} envs (step budget "
                                 f"{target.env_steps}, episode_num {target.episode_num}, bots {sorted(bots)})")
            for slot, kept in zip(self._slots, carry, strict=True):
                slot.resume(kept)
        self._to_start = 0  # counted episodes not yet started
        if target.episode_num > 0:
            for slot in self._slots[target.episode_num:]:
                slot.counted = False
            self._to_start = max(0, target.episode_num - env_num)
        self._rows: dict[int, list[Row]] = {}
        # Initial states of the recurrent policies (by id: self-play shares one policy object).
        self._initial_states: dict[int, State] = {
            id(p): {k: v[0] for k, v in p.task.initial_states(1).items()}
            for p in self._policies if p is not None and p.task.state_specs
        }
        # An episode this long is warned of where nothing else bounds the job (then ten times as long, ...).
        self._warn_at_length = LONG_EPISODE_STEPS if target.episode_num > 0 and not target.env_steps else math.inf
        self.episodes: list[EpisodeRecord] = []
        self.env_steps = 0
        self.agent_steps = 0
        self.failed_episodes = 0
        self.rows_written = 0

    def run(self) -> RolloutResult:
        """Play until the job's bound, a stop, or a revocation; the manager must be launched (or reset)."""
        end = RolloutEnd.COMPLETED
        while not self._finished():
            if self._revoked.is_set():
                end = RolloutEnd.REVOKED
                break
            if self._stop.is_set():
                end = RolloutEnd.STOPPED
                break
            if self._reload is not None:
                self._reload()
            actions = self._act(self._manager.next_obs)
            try:
                timesteps = self._manager.step(actions)
            except EnvManagerInterrupted:
                if not self._stop.is_set():
                    raise
                # The actor stopped while envs were stepping (a slow or hung env): those steps are dropped,
                # like a stop's other unfinished transitions (`cut` below); what finished before stands.
                end = RolloutEnd.STOPPED
                break
            self._observe(timesteps)
            self._write_rows(final=False)
        if end is not RolloutEnd.REVOKED and self._sink is not None:
            # Each player's last decision in an episode going on ends at its next view if the env waits on
            # that player (its transition is whole: its reward and the replies are in), else it is dropped.
            waiting = self._manager.next_obs if end is RolloutEnd.COMPLETED else {}
            for slot in self._slots:
                obs = waiting.get(slot.env_id)
                seat = to_play(obs, self._info) if obs is not None else None
                for player, trajectory in slot.trajectories.items():
                    if seat is not None and slot.seat_of[player] == seat:
                        view = _kept_view(obs, seat, self._info)
                        self._check_finite_view(view, slot.env_id)  # (never acted on: not checked at `_act`)
                        self._collect(trajectory.close_open(view))
                    else:
                        self._collect(trajectory.cut())
            self._write_rows(final=True)
        return RolloutResult(end, tuple(self.episodes), self.env_steps, self.agent_steps, self.failed_episodes,
                             self.rows_written)

    def carry_out(self) -> tuple[EnvCarry, ...]:
        """Each env's episode under way, for the next job to play on (`carry`); after `run`."""
        return tuple(EnvCarry(slot.episode_index, tuple(slot.seat_of), slot.returns.copy(), slot.length,
                              dict(slot.states)) for slot in self._slots)

    @property
    def reached_bound(self) -> bool:
        """The job's bound was reached: `episodes` are the ones its target names (no stop or error cut them)."""
        return self._finished()

    # ---- one step ----------------------------------------------------------------------------------------

    def _finished(self) -> bool:
        if self._target.episode_num > 0:
            capped = 0 < self._target.env_steps <= self.env_steps
            return capped or len(self.episodes) >= self._target.episode_num
        # An env-step budget ends early at the episodes one FinishJob can report: before a step whose endings (one
        # an env at most) could pass them. Ended at them, the episodes a step ended beyond were dropped, neither
        # reported nor carried to the next job, though their steps were trained on (a review).
        return (self.env_steps >= self._target.env_steps
                or len(self.episodes) > max(MAX_EPISODES_PER_JOB - len(self._slots), 0))

    def _act(self, ready: Mapping[int, Any]) -> dict[int, Any]:
        groups: dict[int, _Group] = {}
        launch_policy = self._policies[0]
        for env_id, obs in ready.items():
            slot = self._slots[env_id]
            seat = to_play(obs, self._info)
            if seat < 0:
                raise RuntimeError(f"env {env_id} asks for an action after its game ended (to_play {seat})")
            player = slot.player_at(seat)
            policy = self._policies[player]
            if policy is None:
                raise RuntimeError(f"env {env_id}: seat {seat} is a reference bot's, yet the env asks for its action "
                                   f"(an env that plays bots, such as OpenSpiel's, takes them at reset)")
            group = groups.get(id(policy))
            if group is None:
                kwargs = self._target.forward_kwargs if policy is launch_policy else _DEFAULT_KWARGS
                group = groups[id(policy)] = _Group(policy, kwargs, [], [], [])
            group.env_ids.append(env_id)
            group.players.append(player)
            group.views.append(player_view(obs, seat, self._info))
        actions: dict[int, Any] = {}
        for group in groups.values():
            inputs = {k: np.stack([view[k] for view in group.views]) for k in group.views[0]}
            self._check_finite(inputs, group.env_ids)
            acted_with = self._states_of(group)
            states = {k: np.stack([row[k] for row in acted_with]) for k in acted_with[0]} if acted_with else None
            try:
                prediction = group.policy.task.predict(inputs, states, forward_kwargs=group.kwargs)
            except ValueError:
                self._check_legal(inputs, group.env_ids)  # (the policy's own check, its refusal told of the env)
                raise
            chosen = prediction.actions["action"]
            for i, (env_id, player) in enumerate(zip(group.env_ids, group.players, strict=True)):
                actions[env_id] = env_action(self._action_spec, chosen[i], self._info)
                if acted_with:
                    self._slots[env_id].states[player] = {k: v[i] for k, v in prediction.states.items()}
                if player not in self._recorded:
                    continue
                self.agent_steps += 1
                trajectory = self._slots[env_id].trajectories.get(player)
                if trajectory is not None:
                    artifacts = {k: v[i] for k, v in prediction.artifacts.items()}
                    hidden_state = acted_with[i] if acted_with else NO_STATE
                    # The row of the batch acted on, not the env's own array: an env that reuses its observation
                    # buffer (the serial manager hands it on) rewrote the trajectory's earlier steps (a review).
                    observed = {k: v[i] for k, v in inputs.items()}
                    decision = Decision(observed, chosen[i], artifacts, group.policy.version, hidden_state)
                    self._collect(trajectory.decide(decision))
        return actions

    def _check_finite(self, inputs: Mapping[str, np.ndarray], env_ids: list[int]) -> None:
        """An env bug, as a non-finite reward is (`_observe`): the job fails naming the env and the step. The
        learner refused the chunk ("/observations: holds NaN or infinite values"), naming neither. One check
        of the batch, a row's only when it fails."""
        for key, batch in inputs.items():
            if batch.dtype.kind == "f" and not np.isfinite(batch).all():
                row = int(np.flatnonzero(~np.isfinite(batch.reshape(len(env_ids), -1)).all(axis=1))[0])
                env_id = env_ids[row]
                raise RuntimeError(f"env {env_id} ({self._info.name}) gave a non-finite observation {key!r} (step "
                                   f"{self._slots[env_id].length} of its episode)")

    def _check_finite_view(self, view: Mapping[str, np.ndarray], env_id: int) -> None:
        """`_check_finite` of one env's view (an observation no policy acts on: an episode's last)."""
        self._check_finite({key: np.asarray(value)[None] for key, value in view.items()}, [env_id])

    def _check_legal(self, inputs: Mapping[str, np.ndarray], env_ids: list[int]) -> None:
        """An env bug too: a mover with no legal action. The policy refuses the batch ("action_mask: row(s) [3]
        have no legal action"), naming a row of its batch, not the env: looked for once it has refused, so the
        policy's check is the only one on every step."""
        mask = inputs.get(ACTION_MASK)
        if mask is None or mask.dtype != np.bool_:
            return
        legal = mask.reshape(len(env_ids), -1).any(axis=1)
        if not legal.all():
            env_id = env_ids[int(np.flatnonzero(~legal)[0])]
            raise RuntimeError(f"env {env_id} ({self._info.name}) asks for an action with no legal one in its "
                               f"{ACTION_MASK!r} (step {self._slots[env_id].length} of its episode)")

    def _states_of(self, group: _Group) -> list[State]:
        """The state each row of a recurrent policy's group acts with (empty for a feed-forward policy)."""
        initial = self._initial_states.get(id(group.policy))
        if initial is None:
            return []
        return [self._slots[env_id].states.get(player, initial)
                for env_id, player in zip(group.env_ids, group.players, strict=True)]

    def _observe(self, timesteps: Mapping[int, TimeStep]) -> None:
        seats = self._info.num_players
        for env_id, ts in timesteps.items():
            slot = self._slots[env_id]
            self.env_steps += 1
            rewards = np.asarray(ts.reward, np.float64).reshape(-1)
            if rewards.shape != (seats,):
                raise RuntimeError(f"env {env_id}: reward of shape {np.shape(ts.reward)} for {seats} seat(s)")
            if not np.isfinite(rewards).all():
                # An env bug: no learner trains on it, and no result could be reported (FinishJob refuses a
                # non-finite return, and refused the job's other episodes with it). The job fails, saying why.
                raise RuntimeError(f"env {env_id} ({self._info.name}) gave a non-finite reward {rewards.tolist()} "
                                   f"(step {slot.length + 1} of its episode)")
            slot.returns += rewards
            slot.length += 1
            if slot.length >= self._warn_at_length:
                self._warn_long_episode(env_id, slot.length)
            recorded = [(trajectory, slot.seat_of[player]) for player, trajectory in slot.trajectories.items()
                        if slot.seat_of[player] is not None]
            for trajectory, seat in recorded:
                trajectory.add_reward(rewards[seat])
            if not (ts.terminated or ts.truncated):
                continue
            if ts.info.failure is not None:
                log.warning("env %d failed, its episode is dropped and replaced: %s", env_id, ts.info.failure)
                self.failed_episodes += 1
                for trajectory in slot.trajectories.values():
                    self._collect(trajectory.cut())
                slot.start_episode()
                continue
            for trajectory, seat in recorded:
                final = _kept_view(ts.obs, seat, self._info)
                # An episode's last observation is acted on by nobody, so `_act` never checked it: a NaN there
                # reached the learner, which refused the chunk naming neither the env nor the step (a review).
                self._check_finite_view(final, env_id)
                episode_return = float(slot.returns[seat])
                self._collect(trajectory.end_episode(final, ts.terminated, ts.truncated, episode_return))
            # An env-step job reports what one FinishJob can hold (its slots start counted: their first episodes too).
            if slot.counted if self._target.episode_num > 0 else len(self.episodes) < MAX_EPISODES_PER_JOB:
                self.episodes.append(self._record(slot, ts))
            slot.episode_index += 1
            slot.start_episode()
            slot.counted = self._to_start > 0
            if slot.counted:
                self._to_start -= 1

    def _warn_long_episode(self, env_id: int, length: int) -> None:
        """A job of `episode_num` waits for its episodes to end; an env that never ends one (a custom env
        without a termination or time limit) held its job, and the player's launch slot, for ever, in silence:
        its transitions went to the learner, no result ever came."""
        log.warning("env %d (%s) has played %d steps of one episode and not ended it: this job of %d episodes "
                    "waits for its episodes to end, and an env that never ends one holds the job for ever (a "
                    "time limit in the env, or env.env_steps, which also ends each job after that many env steps, "
                    "bounds it)", env_id, self._info.name, length, self._target.episode_num)
        self._warn_at_length = length * 10

    def _record(self, slot: _EnvSlot, ts: TimeStep) -> EpisodeRecord:
        ids = self._target.player_ids
        seats = slot.seat_of
        returns = tuple(float(slot.returns[s]) if s is not None else 0.0 for s in seats)
        outcomes: tuple[Outcome | None, ...] = (None,) * len(ids)
        if len(ids) > 1:
            by_seat = ts.info.outcome or _outcomes_from_returns(slot.returns)
            outcomes = tuple(by_seat[s] for s in seats)
        length = ts.info.episode.length if ts.info.episode is not None else slot.length
        return EpisodeRecord(int(length), ids, outcomes, returns)

    # ---- rows --------------------------------------------------------------------------------------------

    def _collect(self, rows: list[Row]) -> None:
        for row in rows:
            self._rows.setdefault(row.trajectory.steps, []).append(row)

    def _write_rows(self, final: bool) -> None:
        """Rows of equal length go out together, `chunk_rows` at a time (all of them at the end)."""
        for steps in list(self._rows):
            rows = self._rows[steps]
            while rows and (final or len(rows) >= self._chunk_rows):
                take, size = 0, 0
                while take < len(rows) and take < self._chunk_rows:
                    size += rows[take].trajectory.nbytes
                    if take and size > MAX_CHUNK_BYTES:
                        break
                    take += 1
                chunk, rows[:] = rows[:take], rows[take:]
                trajectory = Trajectory.concatenate([r.trajectory for r in chunk])
                self._sink.write(trajectory, min(r.policy_version for r in chunk))
                self.rows_written += len(chunk)
            if not rows:
                del self._rows[steps]


def _kept_view(obs: Any, seat: int, info: EnvInfo) -> dict[str, np.ndarray]:
    """`player_view` copied, for a trajectory to keep: the serial manager hands on an env's own arrays, which an
    env that reuses its observation buffer overwrites at its next reset or step."""
    return {k: np.array(v) for k, v in player_view(obs, seat, info).items()}


def _outcomes_from_returns(returns: np.ndarray) -> tuple[Outcome, ...]:
    """For envs that report no outcome: a win for the unique best return, a draw for a shared best."""
    best = returns.max()
    winners = int((returns == best).sum())
    return tuple((Outcome.WIN if winners == 1 else Outcome.DRAW) if r == best else Outcome.LOSS for r in returns)
