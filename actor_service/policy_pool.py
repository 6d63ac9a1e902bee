"""The policies a job's players act with, loaded from the shared checkpoint store.

- The launch player's policy starts from the newest of (the job's checkpoint, the store's latest version),
  and `maybe_reload` swaps in a newer published version every `reload_interval_s` while the job runs. A player
  without any checkpoint yet waits briefly for its learner's first publish (once per player per process), then
  falls back to the deterministic initialisation (`player_seed`) the learner uses too.
- Every other player (historical snapshots, other active players) is a frozen policy from a bounded LRU cache
  keyed by (checkpoint path, version): a league replays the same few opponents over and over.
- Self-play: an opponent with the launch player's id acts with the launch player's policy object.
- A corrupt or tampered checkpoint is never loaded (the store verifies it): it is logged once and remembered;
  the launch player acts with its newest older version that verifies (a reload keeps the version it has), so
  the actor plays on until its learner publishes a good one. An opponent's bad checkpoint fails the job.

One pool serves one model signature (the policy config plus the env's specs); the actor builds a new pool
when a job brings a different one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from actor_service.job import PlayerSlot
from actor_service.stop import StopSignal
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointRef,
    CheckpointStore,
    CorruptCheckpointError,
    UnreadableCheckpointError,
)
from common.computation.computation_task import ComputationTask, WeightsMismatchError
from common.computation.specs import ActionSpec, DiscreteActionSpec, MultiDiscreteActionSpec
from common.envs.base import EnvInfo
from common.envs.policy_view import policy_specs
from common.job_limits import VERSION_FILE
from common.paths import UnsafePathError
from common.policy_config import FRESH_INIT_METADATA, as_published, player_seed

log = logging.getLogger(__name__)

UNREADABLE_RETRY_S = 5.0
"""How long a reload waits before it tries again a version that could not be read (no permission, an I/O error)."""
UNREADABLE_FORGET_S = 60.0
"""How long after its last failed read a version no reload tries any more (a newer one came) is remembered: while
any version of a player is remembered, another one that cannot be read is logged at DEBUG, not WARNING."""
REJECTED_KEPT = 1024
"""How many rejected versions an actor remembers; an older one named again is read (and rejected) once more."""

# How often a player's first checkpoint is looked for while waiting on it. A file on a shared filesystem
# gives no event to wait on, so this is the one place the actor polls.
_FIRST_CHECKPOINT_POLL_S = 0.1


class UnloadableOpponentError(Exception):
    """A historical opponent's checkpoint cannot be loaded (corrupt, tampered or lost). A frozen player has no
    other version to fall back to: the job fails and names the player, and the league sets it aside."""

    def __init__(self, player_id: str, cause: CheckpointError | UnsafePathError) -> None:
        super().__init__(f"historical player {player_id}: {cause}")
        self.player_id = player_id


@dataclass(frozen=True)
class PolicySettings:
    reload_interval_s: float = 0.05
    """How often the launch player's newest published version is looked up during a job (one small JSON read;
    on-policy learners need actors close behind them: a CartPole PPO learner publishes ~30 versions/s, and
    at 0.5 s actors acted 10-30 versions behind)."""
    first_checkpoint_wait_s: float = 5.0
    """How long a launch player without a checkpoint waits for its learner's first publish."""
    opponent_cache_size: int = 8
    """Frozen policies kept (LRU by checkpoint path and version)."""
    device: str = "cpu"
    seed: int | None = None
    """Seeds the acting randomness of the policies built (None: from the OS)."""

    def __post_init__(self) -> None:
        if not self.reload_interval_s > 0:
            raise ValueError(f"reload_interval_s must be > 0, got {self.reload_interval_s}")
        if self.first_checkpoint_wait_s < 0:
            raise ValueError(f"first_checkpoint_wait_s must be >= 0, got {self.first_checkpoint_wait_s}")
        if self.opponent_cache_size < 1:
            raise ValueError(f"opponent_cache_size must be >= 1, got {self.opponent_cache_size}")


class Policy:
    """A player's acting network and which checkpoint version it holds (0 and path "" for a fresh init)."""

    def __init__(self, player_id: str, task: ComputationTask, version: int, path: str) -> None:
        self.player_id = player_id
        self.task = task
        self.version = version
        self.path = path

    def __repr__(self) -> str:
        return f"Policy({self.player_id!r}, version={self.version}, path={self.path!r})"


def model_signature(policy_config: Mapping[str, Any], info: EnvInfo) -> str:
    """What decides a network's shape: a pool only serves jobs with the same signature."""
    inputs, actions = policy_specs(info, str(policy_config.get("algorithm", "ppo")))
    return json.dumps(
        {"policy": policy_config, "inputs": {k: [list(v.shape), v.dtype] for k, v in sorted(inputs.items())},
         "actions": _action_signature(actions)},
        sort_keys=True, default=str,
    )


def _action_signature(actions: ActionSpec) -> Any:
    if isinstance(actions, DiscreteActionSpec):
        return actions.num_actions
    if isinstance(actions, MultiDiscreteActionSpec):
        return {"multi_discrete": list(actions.shape), "nvec": list(actions.nvec)}
    return {"box": list(actions.shape), "low": list(actions.low), "high": list(actions.high)}


class PolicyPool:
    def __init__(
        self,
        store: CheckpointStore,
        policy_config: Mapping[str, Any],
        info: EnvInfo,
        settings: PolicySettings,
        stop: StopSignal,
    ) -> None:
        self.store = store
        self.policy_config = dict(policy_config)
        self.signature = model_signature(policy_config, info)
        self._inputs, self._actions = policy_specs(info, str(self.policy_config.get("algorithm", "ppo")))
        self._settings = settings
        self._stop = stop
        self._acting_seeds = np.random.default_rng(settings.seed)
        self._launch: OrderedDict[str, Policy] = OrderedDict()  # mutable: reloads write into them
        self._frozen: OrderedDict[tuple[str, int] | str, Policy] = OrderedDict()
        self._waited_for: set[str] = set()
        self._last_check: dict[str, float] = {}
        self._rejected: OrderedDict[tuple[str, int], None] = OrderedDict()
        """(path, version) of checkpoints that failed verification: not read again (the newest `REJECTED_KEPT`)."""
        self._unreadable: dict[tuple[str, int], float] = {}
        """Versions that could not be read at some look (not rejected), and when a reload may try each again
        (`UNREADABLE_RETRY_S` later); forgotten `UNREADABLE_FORGET_S` after that."""

    # ---- launch player -----------------------------------------------------------------------------------

    def launch_policy(self, slot: PlayerSlot, cancel: StopSignal | None = None) -> Policy:
        """The launch player's policy at the newest version known (job checkpoint or store); `cancel` (the
        job was revoked) cuts the wait for a first checkpoint short, as the actor's stop signal does."""
        ref = self._newest_ref(slot, wait=slot.player_id not in self._waited_for, cancel=cancel)
        policy = self._launch.get(slot.player_id)
        if _reset_to_fresh(slot, ref):
            # The league reset the player to a fresh initialisation (a mutation) under a version its learner has
            # not published since: the store's versions are the weights the reset threw away.
            if policy is None or policy.path or policy.version != slot.checkpoint_version:
                policy = self._fresh_launch(slot.player_id, slot.checkpoint_version)
        elif policy is None:
            policy = self._fresh_launch(slot.player_id, 0)
            if ref is not None:
                self._load_launch(policy, ref)
        elif ref is not None and (ref.version != policy.version or ref.path != policy.path):
            self._load_launch(policy, ref)
        elif ref is None and policy.path:
            # The store lost every version (a new shared root?): start over like the learner does.
            policy = self._fresh_launch(slot.player_id, 0)
        self._launch.move_to_end(slot.player_id)
        self._last_check[slot.player_id] = time.monotonic()
        return policy

    def _fresh_launch(self, player_id: str, version: int) -> Policy:
        """The launch player's fresh initialisation acting as `version`, held in place of the one held."""
        policy = self._launch[player_id] = self._build(player_id, None, version)
        while len(self._launch) > 4:  # an actor serves a few players in turn
            self._launch.popitem(last=False)
        return policy

    def maybe_reload(self, policy: Policy) -> bool:
        """Load the player's newest published version if one appeared (checked every reload_interval_s)."""
        now = time.monotonic()
        if now - self._last_check.get(policy.player_id, 0.0) < self._settings.reload_interval_s:
            return False
        self._last_check[policy.player_id] = now
        latest = self.store.latest(policy.player_id)
        if latest is None or (latest.path, latest.version) in self._rejected:
            return False
        if now < self._unreadable.get((latest.path, latest.version), -math.inf):
            return False  # (read in full at every 50 ms look, a bad block on a failing share was read 20x a second)
        # The learner's own publish of a fresh initialisation under the number the actor's stands in for (its
        # first version, or a reset's: built with learner.seed where the config sets one, not player_seed).
        learners_init = (latest.version == policy.version and not policy.path
                         and bool(latest.metadata.get(FRESH_INIT_METADATA)))
        if latest.version < policy.version or (latest.version == policy.version and not learners_init):
            return False
        try:
            self._load_into(policy, latest)
        except (CorruptCheckpointError, CheckpointNotFoundError) as err:
            self._reject(latest, err)  # keep acting with the version held
            return False
        log.debug("reloaded %s at version %d", policy.player_id, policy.version)  # routine: once per publish
        return True

    # ---- other players -----------------------------------------------------------------------------------

    def opponent_policy(self, slot: PlayerSlot, launch: Policy) -> Policy:
        """A frozen policy for `slot` (the launch policy itself for self-play)."""
        if slot.player_id == launch.player_id:
            return launch
        if slot.checkpoint_path:
            key: tuple[str, int] | str = (slot.checkpoint_path, slot.checkpoint_version)
            ref: CheckpointRef | None = None
        else:  # no checkpoint in the job: the store may have one already, else the fresh init
            ref = self.store.latest(slot.player_id)
            if _reset_to_fresh(slot, ref):
                ref = None  # reset to a fresh initialisation that its learner has not published yet
            key = (ref.path, ref.version) if ref is not None else f"init:{slot.player_id}:{slot.checkpoint_version}"
        policy = self._frozen.get(key)
        if policy is None:
            try:
                if ref is None and slot.checkpoint_path:
                    ref = self._manifest(slot.checkpoint_path, slot.checkpoint_version, slot.player_id, "player")
                policy = self._build(slot.player_id, ref, slot.checkpoint_version if ref is None else 0)
            except (CheckpointError, UnsafePathError) as err:  # a path out of the root (a symlink) is as unloadable
                if not slot.active:
                    if isinstance(err, UnreadableCheckpointError):
                        # No permission or an I/O error now: a failed job, retried; named as unloadable, the
                        # league set the snapshot aside for good (as a weights file's EACCES never did).
                        raise
                    raise UnloadableOpponentError(slot.player_id, err) from err
                key, policy = self._newest_instead(slot, err)  # cached as what it is
            self._frozen[key] = policy
            while len(self._frozen) > self._settings.opponent_cache_size:
                self._frozen.popitem(last=False)
        self._frozen.move_to_end(key)
        return policy

    def _newest_instead(self, slot: PlayerSlot, err: CheckpointError | UnsafePathError) -> tuple[tuple[str, int], Policy]:
        """An active opponent's version the job named cannot be loaded: most often its learner pruned it
        (`keep_last`) since the job was matched. Its newest version stands in (its cache key and policy), as the
        launch player moves on to newer versions; the job fails with `err` only when that cannot be loaded."""
        latest = self.store.latest(slot.player_id)
        if latest is None or (latest.path, latest.version) == (slot.checkpoint_path, slot.checkpoint_version):
            raise err
        key = (latest.path, latest.version)
        policy = self._frozen.get(key)
        if policy is None:
            try:
                policy = self._build(slot.player_id, latest)
            except CheckpointError as newest_err:
                log.warning("opponent %s: version %d cannot be loaded (%s), nor its newest, version %d (%s)",
                            slot.player_id, slot.checkpoint_version, err, latest.version, newest_err)
                raise err from None
        log.info("opponent %s: version %d is gone (%s); playing its newest, version %d", slot.player_id,
                 slot.checkpoint_version, err, latest.version)
        return key, policy

    @property
    def cached_opponents(self) -> int:
        return len(self._frozen)

    # ---- internals ---------------------------------------------------------------------------------------

    def _newest_ref(self, slot: PlayerSlot, wait: bool, cancel: StopSignal | None) -> CheckpointRef | None:
        latest = self.store.latest(slot.player_id)
        if latest is None and not slot.checkpoint_path and wait:
            self._waited_for.add(slot.player_id)
            deadline = time.monotonic() + self._settings.first_checkpoint_wait_s
            while latest is None and time.monotonic() < deadline:
                if self._stop.wait(_FIRST_CHECKPOINT_POLL_S) or (cancel is not None and cancel.is_set()):
                    break
                latest = self.store.latest(slot.player_id)
            if latest is None:
                log.info("no checkpoint of %s after %.1f s: acting with its fresh initialisation",
                         slot.player_id, self._settings.first_checkpoint_wait_s)
        if slot.checkpoint_path and (latest is None or latest.version <= slot.checkpoint_version):
            try:
                return self._manifest(slot.checkpoint_path, slot.checkpoint_version, slot.player_id, "launch player")
            except CheckpointNotFoundError as err:
                # Most often retention: the learner published `keep_last` versions since `latest` was read (a
                # fast learner does in a fraction of a second), so newer ones are there. Rejected, the version
                # failed a fresh actor's job for want of an older one (a review).
                newer = self.store.latest(slot.player_id)
                if newer is not None and newer.version > slot.checkpoint_version:
                    return newer
                ref = CheckpointRef(slot.checkpoint_path, slot.checkpoint_version, digest="", size=0)
                self._reject(ref, err)
                return ref
            except CorruptCheckpointError as err:
                # The version the job names lost its manifest (deleted from the share, a damaged file) while
                # older ones lie beside it: the job failed at its start, where a damaged weights file falls back
                # to the newest older version that verifies. Rejected here, `_load_launch` walks those.
                ref = CheckpointRef(slot.checkpoint_path, slot.checkpoint_version, digest="", size=0)
                self._reject(ref, err)
                return ref
        return latest

    def _manifest(self, path: str, version: int, player_id: str, what: str) -> CheckpointRef:
        """The checkpoint a job names for a player, as version `version` of that player.

        A checkpoint of the player's own (or a snapshot of one) carries the version the job says; any other
        number means the job and the file disagree, which is refused. A checkpoint from elsewhere on the
        shared root is a pretrained one the league names (`pretrain_checkpoint_path`: the pretrained
        historical player, or the reset of a mutation): the league numbers it in the player's sequence, so
        its own manifest version (whatever it was published with) is not the job's.
        """
        ref = self.store.manifest(path)
        if ref.version == version:
            return ref
        if _owned_by(path, player_id):
            # Refused as a damaged checkpoint is, so the fallbacks apply (an older version of the launch player,
            # an active opponent's newest; a frozen opponent is named unloadable): a plain ValueError failed
            # every job that named it (a review).
            raise CorruptCheckpointError(f"{what} {player_id}: checkpoint {path!r} is version {ref.version}, the "
                                         f"job says {version}")
        return dataclasses.replace(ref, version=version)

    def _build(self, player_id: str, ref: CheckpointRef | None, fresh_version: int = 0) -> Policy:
        """The player's network: loaded from `ref`, else its fresh initialisation acting as `fresh_version`.

        Built with the play settings `ref` was trained with (`as_published`): an opponent is a frozen version,
        and a league resumed with another activation or obs_scale played its snapshots as networks nobody
        trained, under the ratings they earned as themselves (a review). The launch player (`ref` None here)
        acts as its learner trains, with the config's."""
        config = self.policy_config
        if ref is not None:
            config, changed = as_published(config, ref.metadata)
            if changed:
                log.info("%s version %d plays with the settings it was trained with (%s)", player_id, ref.version,
                         "; ".join(changed))
        task = make_computation_task(
            config, self._inputs, self._actions, device=self._settings.device, seed=player_seed(player_id)
        )
        task.algorithm.generator.manual_seed(int(self._acting_seeds.integers(2**62)))
        policy = Policy(player_id, task, fresh_version, "")
        if ref is not None:
            self._load_into(policy, ref)
        return policy

    def _load_launch(self, policy: Policy, ref: CheckpointRef) -> None:
        """Load the launch player's ``ref``, or, when it is corrupt, tampered or its file is lost (a manifest
        whose weights are gone), its newest older version that verifies; raises `CorruptCheckpointError` when
        none does (the job fails, the actor goes on)."""
        just_rejected = False
        if (ref.path, ref.version) not in self._rejected:
            try:
                self._load_into(policy, ref)
                return
            except (CorruptCheckpointError, CheckpointNotFoundError) as err:
                self._reject(ref, err)
                just_rejected = True
        # A version loaded (so verified) before, or the league's reset to a fresh initialisation.
        holds = bool(policy.path or policy.version)
        for older in reversed(self.store.versions(policy.player_id)):
            if older.version >= ref.version or (older.path, older.version) in self._rejected:
                continue
            if holds and older.version <= policy.version:
                break  # nothing newer than what it holds verifies
            try:
                self._load_into(policy, older)
            except (CorruptCheckpointError, CheckpointNotFoundError) as err:
                self._reject(older, err)
                continue
            log.warning("%s: acting with version %d, the newest before %d that verifies", policy.player_id,
                        policy.version, ref.version)
            return
        if holds and policy.version < ref.version:
            # Nothing between the version held and `ref` verifies (or retention pruned every older file): play
            # on with the version held, as a reload during a job does.
            log.log(logging.WARNING if just_rejected else logging.DEBUG,
                    "%s: acting with version %d, which it holds, until a version after %d verifies",
                    policy.player_id, policy.version, ref.version)
            return
        raise CorruptCheckpointError(f"{ref.path} (version {ref.version}) is corrupt, tampered or lost and no older "
                                     f"version of {policy.player_id} verifies")

    def _reject(self, ref: CheckpointRef, err: CheckpointError) -> None:
        """Never read `ref` again, unless it only cannot be read *now* (no permission, an I/O error: it may read
        once the share is fixed), which is skipped this time and tried again at the next look."""
        if isinstance(err, UnreadableCheckpointError):
            now = time.monotonic()
            for old in [old for old, retry in self._unreadable.items() if retry + UNREADABLE_FORGET_S < now]:
                del self._unreadable[old]  # (a version no reload looks at any more: one per publish on a bad share)
            key = (ref.path, ref.version)
            folder = _folder(ref.path)
            # Once per player while its versions keep failing: a reload looks every 50 ms, and a learner writing
            # to a failing share publishes a new version every few seconds (one WARNING each, a review).
            known = any(_folder(path) == folder for path, _ in self._unreadable)
            log.log(logging.DEBUG if known else logging.WARNING,
                    "%s (version %d) cannot be read now (%s); acting with another version until it can",
                    ref.path, ref.version, err)
            self._unreadable[key] = now + UNREADABLE_RETRY_S
            return
        self._rejected[(ref.path, ref.version)] = None
        while len(self._rejected) > REJECTED_KEPT:
            self._rejected.popitem(last=False)
        log.error("%s (version %d) was not loaded and will not be read again: %s", ref.path, ref.version, err)

    def _load_into(self, policy: Policy, ref: CheckpointRef) -> None:
        try:
            self._load_exactly(policy, ref)
        except CheckpointNotFoundError as gone:
            # Retention removed it between lookup and load: the player's newest version is the next best. A fault
            # of that one is said and remembered as its own, and this load fails as `ref`'s, not found: the
            # deleted version was named for the newer one's bad digest, and the newer one, not remembered, was
            # read in full again at the next look (a review).
            newest = self.store.latest(policy.player_id)
            key = None if newest is None else (newest.path, newest.version)
            if (newest is None or key == (ref.path, ref.version) or key in self._rejected
                    or time.monotonic() < self._unreadable.get(key, -math.inf)):
                raise
            try:
                self._load_exactly(policy, newest)
            except (CorruptCheckpointError, CheckpointNotFoundError) as err:
                self._reject(newest, err)
                raise gone from err

    def _load_exactly(self, policy: Policy, ref: CheckpointRef) -> None:
        # A pretrained checkpoint acts as the version the league gave it (`_manifest`); its digest is checked
        # against its own manifest all the same.
        expected = ref.version if _owned_by(ref.path, policy.player_id) else None
        checkpoint = self.store.load(ref.path, expected)
        version = ref.version
        try:
            policy.task.set_weights(checkpoint.tensors, version)
        except WeightsMismatchError as err:
            # It verifies, but is another network's (a learner run with another policy config, a pretrained
            # checkpoint of another model): unusable as a damaged file is, so the same fallbacks apply; it
            # failed every job that named it, and every reload tried it again (a review).
            raise CorruptCheckpointError(f"{checkpoint.ref.path} (version {checkpoint.ref.version}) does not fit "
                                         f"this league's network: {err}") from err
        policy.version = version
        policy.path = checkpoint.ref.path


def _reset_to_fresh(slot: PlayerSlot, newest: CheckpointRef | None) -> bool:
    """Whether the job names the player's fresh initialisation under a version no older than the store's newest:
    the league reset it (a mutation with no pretrained checkpoint) and its learner has not published since the
    reset. A tie is the reset's: the league numbers a reset one past the version it last heard of, which is
    also the number of the learner's next publish of the weights the reset throws away (it learns of the reset
    in the reply to that publish's report, and continues one version later)."""
    if not slot.checkpoint_path and slot.checkpoint_version > 0:
        if newest is None or newest.version < slot.checkpoint_version:
            return True
        # A tie published as a fresh initialisation is the learner's own publish of the reset (a learner that
        # started on the reset's job, or heard of it in the reply to a report of an older version): built with
        # its seed, which is learner.seed where the config sets one, not the actors' player_seed.
        return newest.version == slot.checkpoint_version and not newest.metadata.get(FRESH_INIT_METADATA)
    return False


def _folder(path: str) -> str:
    """A checkpoint's player folder (a pretrained checkpoint's own folder) from its path under the root."""
    return path.partition("/")[0]


def _owned_by(path: str, player_id: str) -> bool:
    """Whether `path` is one of the player's own versions: a version file in its directory, where its learner
    publishes. Another file there (a snapshot's name, `v0000000006_1859.pt`, a league's pretrained start copied
    from another run into a folder of the same player id) is not, and has a version of its own lineage."""
    folder, _, name = path.partition("/")
    return folder == player_id and VERSION_FILE.fullmatch(name) is not None
