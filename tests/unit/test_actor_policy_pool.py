"""PolicyPool against a real checkpoint store: launch player at its newest version, reloads, deterministic fresh
init, frozen opponents in a bounded LRU, self-play sharing the launch policy."""

import numpy as np
import pytest

from actor_service.job import PlayerSlot
from actor_service.policy_pool import PolicyPool, PolicySettings, UnloadableOpponentError
from actor_service.stop import StopSignal
from common.algorithms.registry import make_computation_task
from common.checkpoint_store import CheckpointError, CheckpointStore
from common.envs.base import ArraySpec, DiscreteSpec, EnvInfo
from common.envs.policy_view import policy_specs
from common.policy_config import player_seed

POLICY = {"algorithm": "ppo", "model": {"hidden": [8]}}
INFO = EnvInfo("toy", ArraySpec((4,), np.float32), DiscreteSpec(2))
OBS = {"observation": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}


def weights(seed: int) -> dict[str, np.ndarray]:
    inputs, actions = policy_specs(INFO)
    return make_computation_task(POLICY, inputs, actions, "cpu", seed).get_weights()


def value(policy) -> np.ndarray:
    return policy.task.predict(OBS).artifacts["value"]


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(tmp_path)


def _failing_open(name: str, error: OSError):
    """The store's `_open_regular`, raising `error` for files called `name` (a share refusing one file now)."""
    import common.checkpoint_store as checkpoint_store

    opened = checkpoint_store._open_regular

    def failing(path):
        if path.name == name:
            raise type(error)(error.errno, error.strerror, str(path))
        return opened(path)

    return failing


def pool(store, **settings) -> PolicyPool:
    defaults = dict(first_checkpoint_wait_s=0.0, reload_interval_s=1e-6)  # a publish takes far longer
    return PolicyPool(store, POLICY, INFO, PolicySettings(**{**defaults, **settings}), StopSignal())


def test_fresh_init_is_deterministic_per_player(store):
    a = pool(store).launch_policy(PlayerSlot("p", "", 0, True))
    b = pool(store).launch_policy(PlayerSlot("p", "", 0, True))
    c = pool(store).launch_policy(PlayerSlot("q", "", 0, True))
    assert a.version == 0 and a.path == ""
    np.testing.assert_array_equal(value(a), value(b))
    assert not np.allclose(value(a), value(c))
    # The learner's version 0 (built with player_seed) is the same network.
    inputs, actions = policy_specs(INFO)
    learner = make_computation_task(POLICY, inputs, actions, "cpu", player_seed("p"))
    np.testing.assert_array_equal(learner.predict(OBS).artifacts["value"], value(a))


def test_launch_player_starts_from_the_newest_version_and_reloads(store):
    store.publish("p", weights(1), 1)
    store.publish("p", weights(2), 2)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "p/v0000000001.pt", 1, True))
    assert launch.version == 2  # the store is newer than the job
    store.publish("p", weights(3), 5)
    assert policies.maybe_reload(launch)
    assert launch.version == 5 and launch.path == "p/v0000000005.pt"
    reference = pool(store).opponent_policy(PlayerSlot("x", "p/v0000000005.pt", 5, False), launch)
    np.testing.assert_array_equal(value(launch), value(reference))
    assert not policies.maybe_reload(launch)


def test_launch_player_waits_briefly_for_its_first_checkpoint(store):
    policies = pool(store, first_checkpoint_wait_s=0.05)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    assert launch.version == 0
    store.publish("p", weights(4), 0)
    store.publish("p", weights(5), 1)
    assert policies.launch_policy(PlayerSlot("p", "", 0, True)).version == 1


def test_opponents_are_frozen_and_cached_by_path_and_version(store):
    for version in range(1, 5):
        store.publish("h", weights(10 + version), version)
    store.pin("h/v0000000001.pt")
    policies = pool(store, opponent_cache_size=2)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    first = policies.opponent_policy(PlayerSlot("h", "h/v0000000003.pt", 3, False), launch)
    assert first.version == 3
    assert policies.opponent_policy(PlayerSlot("h", "h/v0000000003.pt", 3, False), launch) is first
    policies.opponent_policy(PlayerSlot("h", "h/v0000000004.pt", 4, False), launch)
    policies.opponent_policy(PlayerSlot("h", "h/v0000000002.pt", 2, False), launch)
    assert policies.cached_opponents == 2
    assert policies.opponent_policy(PlayerSlot("h", "h/v0000000003.pt", 3, False), launch) is not first


def test_self_play_opponent_is_the_launch_policy(store):
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    assert policies.opponent_policy(PlayerSlot("p", "", 0, True), launch) is launch


def test_a_job_version_that_does_not_match_the_manifest_is_refused(store):
    """Refused as a damaged checkpoint is: a frozen opponent is named unloadable (a plain ValueError failed every
    job naming it); an active one's newest version stands in."""
    store.publish("h", weights(1), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    with pytest.raises(UnloadableOpponentError, match="version 1, the job says 7"):
        policies.opponent_policy(PlayerSlot("h", "h/v0000000001.pt", 7, False), launch)
    store.publish("a", weights(2), 1)
    store.publish("a", weights(3), 2)
    stand_in = policies.opponent_policy(PlayerSlot("a", "a/v0000000001.pt", 7, True), launch)
    assert stand_in.version == 2


def other_networks_weights(seed: int) -> dict[str, np.ndarray]:
    inputs, actions = policy_specs(INFO)
    other = {**POLICY, "model": {"hidden": [5]}}
    return make_computation_task(other, inputs, actions, "cpu", seed).get_weights()


def test_a_version_of_another_network_falls_back_like_a_damaged_one(store):
    """A published version that verifies but does not fit the league's network (a learner run with another
    policy config): the launch player played on with nothing (WeightsMismatchError failed every job) and each
    reload tried it again; now it is rejected once and the version before it plays (a review)."""
    store.publish("p", weights(1), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    held = value(launch)
    store.publish("p", other_networks_weights(2), 2)
    assert not policies.maybe_reload(launch) and launch.version == 1
    assert not policies.maybe_reload(launch)  # rejected: not read again
    fresh_pool = pool(store)
    launched = fresh_pool.launch_policy(PlayerSlot("p", "", 0, True))
    assert launched.version == 1
    np.testing.assert_array_equal(value(launched), held)
    with pytest.raises(UnloadableOpponentError, match="does not fit this league's network"):
        fresh_pool.opponent_policy(PlayerSlot("h2", "p/v0000000002.pt", 2, False), launched)


def test_a_pretrained_checkpoint_acts_as_the_version_the_league_gives_it(store):
    """`pretrain_checkpoint_path` names a checkpoint published elsewhere on the share, with a version of its
    own. The league numbers it in the player's sequence (0 for the pretrained historical player; the next
    version for a mutation's reset), which the version check refused: every such job failed."""
    pretrained = store.publish("sl", weights(7), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("me", "", 0, True))
    historical = policies.opponent_policy(PlayerSlot("main_player_default_0_pretrain", pretrained.path, 0, False),
                                          launch)
    assert historical.version == 0
    np.testing.assert_array_equal(value(historical), value(pool(store).launch_policy(PlayerSlot("sl", "", 0, True))))
    store.publish("me", weights(1), 7)  # the player's last version before the league reset it
    mutated = pool(store).launch_policy(PlayerSlot("me", pretrained.path, 8, True))
    assert (mutated.version, mutated.path) == (8, pretrained.path)  # not the older v7, not the file's 1
    np.testing.assert_array_equal(value(mutated), value(historical))


def test_a_pretrained_checkpoint_copied_into_a_folder_of_the_same_player_id_is_not_taken_for_its_own_version(
        store, tmp_path_factory):
    """A new league started from another run's main player: its snapshot file and manifest copied to the same
    place under the new root, `main_player_default_0/v0000000006_1859.pt`, the only path its manifest allows.
    The actors took it for the new main player's own version 6 (its folder) against the job's 0 and refused it,
    then every other player starting from it too: the league's first jobs failed (a review)."""
    import shutil

    old = CheckpointStore(tmp_path_factory.mktemp("old_run"))
    old.publish("me", weights(7), 6)
    snap = old.snapshot("me/v0000000006.pt", "me/v0000000006_1859.pt")
    (store.root.root / "me").mkdir()
    for suffix in ("", ".json"):
        shutil.copy(old.root.root / (snap.path + suffix), store.root.root / (snap.path + suffix))
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("me", snap.path, 0, True))
    assert (launch.version, launch.path) == (0, snap.path)
    other = policies.launch_policy(PlayerSlot("other", snap.path, 0, True))
    assert (other.version, other.path) == (0, snap.path)
    np.testing.assert_array_equal(value(launch), value(other))
    np.testing.assert_array_equal(value(launch), value(pool(old).launch_policy(PlayerSlot("me", "", 0, True))))


def test_a_reset_to_a_fresh_initialisation_is_played_before_its_learner_publishes_it(store, tmp_path_factory):
    """A mutation with no pretrained checkpoint resets the player to ("", its next version). Until its learner
    published that reset, the store's newest version holds the weights the reset threw away: actors played
    them, as the launch player and as an opponent, and the league credited their games to the reset player."""
    store.publish("me", weights(1), 7)  # the player's last version before the league reset it
    fresh = value(pool(CheckpointStore(tmp_path_factory.mktemp("elsewhere"))).launch_policy(PlayerSlot("me", "", 0, True)))
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("me", "", 8, True))
    assert (launch.version, launch.path) == (8, "")
    np.testing.assert_array_equal(value(launch), fresh)
    assert not policies.maybe_reload(launch)  # v7 is older than the reset
    assert policies.launch_policy(PlayerSlot("me", "", 8, True)) is launch and launch.version == 8
    other = policies.launch_policy(PlayerSlot("other", "", 0, True))
    opponent = policies.opponent_policy(PlayerSlot("me", "", 8, True), other)
    assert (opponent.version, opponent.path) == (8, "")
    np.testing.assert_array_equal(value(opponent), fresh)
    # The learner's next publish, of the weights the reset throws away, has the reset's number: the
    # league tells it of the reset in the reply to that publish's report, and it continues at the next.
    store.publish("me", weights(3), 8)
    assert not policies.maybe_reload(launch)
    assert policies.launch_policy(PlayerSlot("me", "", 8, True)) is launch and launch.path == ""
    np.testing.assert_array_equal(value(launch), fresh)
    np.testing.assert_array_equal(value(policies.opponent_policy(PlayerSlot("me", "", 8, True), other)), fresh)
    store.publish("me", weights(2), 9)  # the learner's first version after the reset
    assert policies.maybe_reload(launch) and launch.version == 9
    assert policies.opponent_policy(PlayerSlot("me", "", 8, True), other).version == 9
    assert policies.launch_policy(PlayerSlot("me", "", 8, True)).version == 9


def test_the_learners_own_publish_of_a_reset_under_its_number_is_played_with_the_learners_seed(store):
    """A learner that starts on the reset's job (a restart, a lease taken over), or hears of the reset in the reply
    to a report of an older version, publishes its fresh initialisation under the reset's own number. With
    `learner.seed` set that is not the actors' player_seed initialisation, yet the tie rule played the actors'
    own: a network no learner trained, its games credited to the reset player, its trajectories tagged with a
    version the learner holds other weights under."""
    from common.learner_config import LearnerConfig
    from common.policy_config import PolicyConfig
    from learner_service.publisher import CheckpointPublisher
    from learner_service.trainer import ModelSpec, Progress, build_trainer

    store.publish("me", weights(1), 7)  # before the league reset the player to ("", 8)
    publisher = CheckpointPublisher(store, "me", "learner-1")
    start = publisher.choose_start("", 8, Progress())
    version = publisher.next_version(start.version)
    inputs, actions = policy_specs(INFO)
    trainer = build_trainer(ModelSpec(PolicyConfig.from_mapping(POLICY), inputs, actions),
                            LearnerConfig.from_mapping({"seed": 123}), Progress(), seed=123, device="cpu",
                            weights=start.weights, version=version)
    assert version == 8 and trainer.holds_fresh_init
    publisher.publish(trainer)
    learner = trainer.task.predict(OBS).artifacts["value"]
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("me", "", 8, True))
    assert (launch.version, launch.path) == (8, "me/v0000000008.pt")
    np.testing.assert_array_equal(value(launch), learner)
    other = policies.launch_policy(PlayerSlot("other", "", 0, True))
    np.testing.assert_array_equal(value(policies.opponent_policy(PlayerSlot("me", "", 8, True), other)), learner)
    # Weights set since (trained) are no fresh initialisation: the tie rule holds for them.
    trainer.task.set_weights(weights(4), 9)
    assert not trainer.holds_fresh_init
    assert not publisher.publish(trainer).metadata.get("fresh_init")


def test_a_corrupt_newest_version_with_no_older_file_keeps_the_version_held(tmp_path):
    """The pool plays on with the version it holds when its learner's newest does not verify. A reload during a
    job did, but the next job's launch looked only for an older file on disk: retention (keep_last) had pruned
    it, so every job of the player failed although the actor held a good version."""
    store = CheckpointStore(tmp_path, keep_last=1)
    store.publish("p", weights(1), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    held = value(launch)
    second = store.publish("p", weights(2), 2)
    store.wait_for_retention()
    assert [ref.version for ref in store.versions("p")] == [2]
    with open(store.root.resolve(second.path), "r+b") as weights_file:
        weights_file.seek(500)
        byte = weights_file.read(1)
        weights_file.seek(500)
        weights_file.write(bytes([byte[0] ^ 0xFF]))
    assert not policies.maybe_reload(launch) and launch.version == 1
    for _ in range(2):
        again = policies.launch_policy(PlayerSlot("p", "", 0, True))
        assert again is launch and (launch.version, launch.path) == (1, "p/v0000000001.pt")
        np.testing.assert_array_equal(value(launch), held)
    store.publish("p", weights(3), 3)
    assert policies.launch_policy(PlayerSlot("p", "", 0, True)).version == 3


def test_a_corrupt_newest_version_never_steps_back_below_the_version_held(store, tmp_path_factory):
    """Falling back from a corrupt version stops at the version held: a player reset to a fresh
    initialisation (held as the reset's version) must not go back to the older weights the reset threw away."""
    store.publish("me", weights(1), 7)  # before the league reset it to ("", 8)
    fresh = value(pool(CheckpointStore(tmp_path_factory.mktemp("elsewhere"))).launch_policy(PlayerSlot("me", "", 0, True)))
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("me", "", 8, True))
    ninth = store.publish("me", weights(2), 9)
    store.root.resolve(ninth.path).write_bytes(b"damaged")
    assert policies.launch_policy(PlayerSlot("me", "", 8, True)) is launch
    assert (launch.version, launch.path) == (8, "")
    np.testing.assert_array_equal(value(launch), fresh)


def test_a_historical_opponent_that_cannot_be_loaded_is_named(store):
    """A frozen player has no other version: the job fails naming it (the league sets it aside)."""
    store.publish("h", weights(1), 1)
    store.snapshot("h/v0000000001.pt", "h/v0000000001_100.pt")
    store.snapshot("h/v0000000001.pt", "h/v0000000001_200.pt")
    tampered = store.root.root / "h" / "v0000000001_100.pt"
    tampered.unlink()  # a hard link of the source: a new file, not the source's bytes rewritten
    tampered.write_bytes(b"tampered")
    (store.root.root / "h" / "v0000000001_200.pt").unlink()
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    for frozen, path in (("h_100", "h/v0000000001_100.pt"), ("h_200", "h/v0000000001_200.pt")):
        with pytest.raises(UnloadableOpponentError) as err:
            policies.opponent_policy(PlayerSlot(frozen, path, 1, False), launch)
        assert err.value.player_id == frozen and path in str(err.value)
    # An active opponent's bad file is not the player's last word (newer versions come): not named.
    (store.root.root / "h" / "v0000000001.pt").write_bytes(b"tampered too")  # and no version of it loads
    with pytest.raises(CheckpointError) as err:
        policies.opponent_policy(PlayerSlot("h", "h/v0000000001_100.pt", 1, True), launch)
    assert not isinstance(err.value, UnloadableOpponentError)


def test_an_active_opponents_pruned_version_is_replaced_by_its_newest(store):
    """Its learner keeps `keep_last` versions: the version a job named may be gone by the time it loads."""
    for version in (1, 2, 3):
        store.publish("o", weights(version), version)
    (store.root.root / "o" / "v0000000001.pt").unlink()
    (store.root.root / "o" / "v0000000001.pt.json").unlink()
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    opponent = policies.opponent_policy(PlayerSlot("o", "o/v0000000001.pt", 1, True), launch)
    assert opponent.version == 3
    np.testing.assert_array_equal(value(opponent), value(pool(store).launch_policy(PlayerSlot("o", "", 0, True))))
    with pytest.raises(UnloadableOpponentError):  # a frozen player has no newer version to stand in
        policies.opponent_policy(PlayerSlot("o_snap", "o/v0000000001.pt", 1, False), launch)


def test_a_launch_version_whose_file_is_lost_falls_back_like_a_corrupt_one(store):
    """A manifest whose weights file is gone (lost on the share, a partial restore): the job failed at its start,
    or the running job failed at its reload, while an intact older version lay beside it."""
    store.publish("p", weights(1), 1)
    store.publish("p", weights(2), 2)
    (store.root.root / "p" / "v0000000002.pt").unlink()
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    assert launch.version == 1  # the newest that loads
    store.publish("p", weights(3), 3)
    (store.root.root / "p" / "v0000000003.pt").unlink()
    assert not policies.maybe_reload(launch)  # mid-job: keeps acting with the version held
    assert launch.version == 1


@pytest.mark.parametrize("damage", ["deleted", "manifest not JSON"])
def test_a_launch_version_the_job_names_whose_manifest_is_gone_falls_back_to_the_newest_that_verifies(store, damage):
    """A league resumed after its newest versions were deleted from the share (or their manifest damaged): its
    state, and so each job, still names that version. The job failed at its start (CheckpointNotFoundError,
    CorruptCheckpointError: every collect job of the player, until its learner published again), where a
    damaged weights file falls back to the newest older version that verifies."""
    for version in (1, 2, 3):
        store.publish("p", weights(version), version)
    v3 = store.root.root / "p" / "v0000000003.pt"
    if damage == "deleted":
        for path in (v3, v3.with_name(v3.name + ".json"), v3.with_name(v3.name + ".train")):
            path.unlink(missing_ok=True)
        (store.root.root / "p" / "v0000000002.pt").write_bytes(b"tampered")  # and the one before it is damaged
    else:
        v3.with_name(v3.name + ".json").write_text('{"broken')
    launch = pool(store).launch_policy(PlayerSlot("p", "p/v0000000003.pt", 3, True))
    expected = 1 if damage == "deleted" else 2
    assert launch.version == expected
    reference = pool(store).launch_policy(PlayerSlot("p", f"p/v000000000{expected}.pt", expected, True))
    np.testing.assert_array_equal(value(launch), value(reference))
    # No version of it verifies: the job fails, naming the player.
    (store.root.root / "p" / "v0000000001.pt").write_bytes(b"tampered")
    (store.root.root / "p" / "v0000000002.pt").write_bytes(b"tampered")
    with pytest.raises(CheckpointError, match="no older version of p verifies"):
        pool(store).launch_policy(PlayerSlot("p", "p/v0000000003.pt", 3, True))


def test_a_historical_opponent_whose_path_leaves_the_root_is_named(store, tmp_path_factory):
    """A snapshot directory moved elsewhere and symlinked back resolves outside the shared root: refused, and as
    unloadable as a missing file, so the job names the opponent (the league sets it aside)."""
    store.publish("h", weights(1), 1)
    outside = tmp_path_factory.mktemp("elsewhere") / "h"
    (store.root.root / "h").rename(outside)
    (store.root.root / "h").symlink_to(outside, target_is_directory=True)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    with pytest.raises(UnloadableOpponentError) as err:
        policies.opponent_policy(PlayerSlot("h_1", "h/v0000000001.pt", 1, False), launch)
    assert err.value.player_id == "h_1" and "outside the shared root" in str(err.value)


def test_a_historical_opponent_whose_manifest_cannot_be_read_now_is_not_named_unloadable(store, monkeypatch):
    """A snapshot's manifest the actor may not read (a directory's permissions changed under the share, an I/O
    error) was a "corrupt" checkpoint: the job named the opponent unloadable and the league set it aside for
    good, though the file was intact and read again once the permissions were back. Now the job just fails
    (retried), as it did for the same error on the weights file. (Root reads whatever the mode says: the
    refusal is patched in.)"""
    import errno

    import common.checkpoint_store as checkpoint_store

    store.publish("h", weights(1), 1)
    store.snapshot("h/v0000000001.pt", "h/v0000000001_100.pt")
    no_permission = _failing_open("v0000000001_100.pt.json", PermissionError(errno.EACCES, "Permission denied"))

    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    slot = PlayerSlot("h_100", "h/v0000000001_100.pt", 1, False)
    with monkeypatch.context() as patched:
        patched.setattr(checkpoint_store, "_open_regular", no_permission)
        with pytest.raises(CheckpointError, match="Permission denied") as err:
            policies.opponent_policy(slot, launch)
    assert not isinstance(err.value, UnloadableOpponentError)
    assert policies.opponent_policy(slot, launch).version == 1  # readable again: it plays


def test_a_newer_version_that_cannot_be_read_now_is_loaded_once_it_can(store, monkeypatch):
    """An I/O error or a permission refused on a manifest, for a moment, rejected the version for the life of the
    actor (a review): the player never moved past the version it held, or a job naming that version played an
    older one for good. It is now skipped while it cannot be read, and loaded once it can."""
    import errno

    import common.checkpoint_store as checkpoint_store

    store.publish("p", weights(1), 1)
    store.publish("p", weights(2), 2)
    io_error = _failing_open("v0000000002.pt.json", OSError(errno.EIO, "Input/output error"))

    policies = pool(store)
    with monkeypatch.context() as patched:
        patched.setattr(checkpoint_store, "_open_regular", io_error)
        launch = policies.launch_policy(PlayerSlot("p", "p/v0000000002.pt", 2, True))
        assert launch.version == 1  # the newest it can read now
        assert not policies.maybe_reload(launch)
    assert not policies.maybe_reload(launch)  # not looked at again until UNREADABLE_RETRY_S passed
    monkeypatch.setattr("actor_service.policy_pool.UNREADABLE_RETRY_S", 0.0)
    policies._unreadable.clear()  # (as once the retry time has passed)
    assert policies.maybe_reload(launch) and launch.version == 2
    np.testing.assert_array_equal(value(launch), value(pool(store).launch_policy(PlayerSlot("p", "", 0, True))))


def test_the_learners_first_version_replaces_the_actors_stand_in_under_the_same_number(store):
    """A first checkpoint published after the actor stopped waiting for it: the actor acted with its own fresh
    initialisation as version 0, and the learner's version 0 (built with learner.seed, another network) was never
    loaded, since it was no newer; trajectories were tagged with a version the learner holds other weights under
    (a review). A later publish of the same number that is no fresh initialisation is not taken."""
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    assert (launch.version, launch.path) == (0, "")
    store.publish("p", weights(5), 0, metadata={"fresh_init": True})
    assert policies.maybe_reload(launch) and launch.path == "p/v0000000000.pt"
    np.testing.assert_array_equal(value(launch), value(pool(store).launch_policy(PlayerSlot("p", "", 0, True))))
    assert not policies.maybe_reload(launch)  # held now


def test_a_tie_that_is_no_fresh_initialisation_is_not_taken_for_the_reset(store):
    """The league's reset to a fresh initialisation at version 3 ties with the learner's publish of the weights
    the reset throws away (the same number): the actor keeps playing the reset."""
    store.publish("p", weights(1), 2)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 3, True))
    assert (launch.version, launch.path) == (3, "")
    store.publish("p", weights(2), 3)
    assert not policies.maybe_reload(launch) and launch.path == ""


def test_a_launch_version_retired_between_latest_and_its_manifest_loads_a_newer_one(store, monkeypatch):
    """The job names the store's newest version; before its manifest is read the learner publishes `keep_last`
    more and retention removes it. It was rejected as "corrupt, tampered or lost", and a fresh actor (nothing
    older to fall back to) failed the job while the newer versions lay there (a review)."""
    store = CheckpointStore(store.root.root, keep_last=1)
    store.publish("p", weights(1), 1)
    manifest = store.manifest

    def publish_first(path):
        if path == "p/v0000000001.pt" and store.latest("p").version == 1:
            store.publish("p", weights(2), 2)
        return manifest(path)

    monkeypatch.setattr(store, "manifest", publish_first)
    launch = pool(store).launch_policy(PlayerSlot("p", "p/v0000000001.pt", 1, True))
    assert launch.version == 2 and launch.path == "p/v0000000002.pt"


def test_a_retired_versions_stand_in_that_fails_is_named_and_remembered_as_itself(store, monkeypatch, caplog):
    """A reload read `latest.json` naming v10; retention removed v10 before its load, and the newest, v15, which
    the pool loads instead, does not match its digest. The error blamed v10, and v15, not remembered, was read in
    full again at the next look (a review)."""
    store = CheckpointStore(store.root.root, keep_last=1)
    store.publish("p", weights(5), 5)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "p/v0000000005.pt", 5, True))
    store.publish("p", weights(10), 10)
    stale = store.latest("p")
    store.publish("p", weights(15), 15)  # v10 retired
    newest = store.root.resolve("p/v0000000015.pt")
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))
    latest, load, loaded = store.latest, store.load, []
    stale_once = [stale]
    monkeypatch.setattr(store, "latest", lambda player: stale_once.pop() if stale_once else latest(player))
    monkeypatch.setattr(store, "load", lambda path, *a, **k: loaded.append(path) or load(path, *a, **k))
    with caplog.at_level("ERROR"):
        assert not policies.maybe_reload(launch)
        assert not policies.maybe_reload(launch)
    assert launch.version == 5  # acting with the version held
    assert loaded == ["p/v0000000010.pt", "p/v0000000015.pt"]  # v15 read once, not again at the second look
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(m.startswith("p/v0000000015.pt (version 15) was not loaded") for m in errors), errors
    assert not any(m.startswith("p/v0000000010.pt") and "v0000000015" in m for m in errors), errors


def test_an_io_error_on_the_newest_weights_keeps_the_version_held(store, monkeypatch):
    """EIO or EACCES on a new version's weights file (not its manifest) came out of a reload as a raw OSError
    and failed the running job, and the next job's start; the same error on the manifest was skipped. Now both
    are: the actor acts with the version it holds and loads the new one once it reads (a review)."""
    import errno

    import common.checkpoint_store as checkpoint_store

    monkeypatch.setattr("actor_service.policy_pool.UNREADABLE_RETRY_S", 0.0)  # (the retry wait: its own test)
    store.publish("p", weights(1), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    store.publish("p", weights(2), 2)
    for error in (OSError(errno.EIO, "Input/output error"), PermissionError(errno.EACCES, "Permission denied")):
        with monkeypatch.context() as patched:
            patched.setattr(checkpoint_store, "_open_regular", _failing_open("v0000000002.pt", error))
            assert not policies.maybe_reload(launch) and launch.version == 1
            assert pool(store).launch_policy(PlayerSlot("p", "p/v0000000002.pt", 2, True)).version == 1
    assert policies.maybe_reload(launch) and launch.version == 2


def test_a_stale_handle_on_a_snapshot_is_no_reason_to_set_it_aside(store, monkeypatch):
    """ESTALE (NFS) on a weights file meant "retention removed it on another machine". A snapshot is never
    retired: there it is a fault of the share, and the job named the historical player unloadable, so the
    league set it aside for good. Now the job fails (retried); a retired version's ESTALE is still NotFound."""
    import errno

    import common.checkpoint_store as checkpoint_store
    from common.checkpoint_store import CheckpointNotFoundError, UnreadableCheckpointError

    store.publish("p", weights(1), 1)
    store.snapshot("p/v0000000001.pt", "h/v0000000001_100.pt")
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    slot = PlayerSlot("h_100", "h/v0000000001_100.pt", 1, False)
    stale = OSError(errno.ESTALE, "Stale file handle")
    with monkeypatch.context() as patched:
        patched.setattr(checkpoint_store, "_open_regular", _failing_open("v0000000001_100.pt", stale))
        with pytest.raises(UnreadableCheckpointError, match="Stale file handle") as err:
            policies.opponent_policy(slot, launch)
        assert not isinstance(err.value, UnloadableOpponentError)
        with pytest.raises(UnreadableCheckpointError):
            store.verify("h/v0000000001_100.pt")
    with monkeypatch.context() as patched:
        patched.setattr(checkpoint_store, "_open_regular", _failing_open("v0000000001.pt", stale))
        with pytest.raises(CheckpointNotFoundError, match="stale file handle"):
            store.load("p/v0000000001.pt")
    assert policies.opponent_policy(slot, launch).version == 1


def test_an_opponent_plays_with_the_activation_its_checkpoint_was_trained_with(store, caplog):
    """A league may change `activation` or `obs_scale` between runs (README). Its snapshots were built from the
    job's current config: frozen players rated as themselves played as networks nobody trained (a review). They
    are built with what their checkpoints record; the launch player acts as its learner trains, with the config's."""
    from common.policy_config import PolicyConfig, play_metadata

    relu = {**POLICY, "model": {**POLICY["model"], "activation": "relu"}}
    recorded = play_metadata(PolicyConfig.from_mapping(relu))
    assert recorded["model.activation"] == "relu"
    store.publish("h", weights(1), 1, metadata=recorded)
    store.publish("p", weights(2), 1, metadata=recorded)
    policies = pool(store)  # the config's: tanh
    launch = policies.launch_policy(PlayerSlot("p", "p/v0000000001.pt", 1, True))
    with caplog.at_level("INFO", logger="actor_service.policy_pool"):
        opponent = policies.opponent_policy(PlayerSlot("h_1", "h/v0000000001.pt", 1, False), launch)
    assert "activation: tanh -> relu" in caplog.text
    as_trained = PolicyPool(store, relu, INFO, PolicySettings(first_checkpoint_wait_s=0.0), StopSignal())
    np.testing.assert_array_equal(value(opponent),
                                  value(as_trained.opponent_policy(PlayerSlot("h_1", "h/v0000000001.pt", 1, False),
                                                                   launch)))
    np.testing.assert_array_equal(value(launch), value(pool(store).launch_policy(PlayerSlot("p", "", 0, True))))
    assert not np.allclose(value(launch), value(as_trained.launch_policy(PlayerSlot("p", "", 0, True))))


def test_a_version_that_cannot_be_read_is_not_read_again_at_every_reload_look(store, monkeypatch):
    """A reload looks every 50 ms: a bad block in the newest weights file was read in full at each look, ~20
    times a second on a failing share (a review). It is tried again after UNREADABLE_RETRY_S."""
    import errno

    import common.checkpoint_store as checkpoint_store

    store.publish("p", weights(1), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    store.publish("p", weights(2), 2)
    opened = []
    failing = _failing_open("v0000000002.pt", OSError(errno.EIO, "Input/output error"))

    def counting(path):
        if path.name == "v0000000002.pt":
            opened.append(path)
        return failing(path)

    monkeypatch.setattr(checkpoint_store, "_open_regular", counting)
    for _ in range(5):
        assert not policies.maybe_reload(launch)
    assert len(opened) == 1 and launch.version == 1
    monkeypatch.setattr("actor_service.policy_pool.time.monotonic", lambda: 1e12)  # the retry time has passed
    assert not policies.maybe_reload(launch) and len(opened) == 2


def test_a_share_that_keeps_failing_warns_once_per_player_and_is_not_remembered_for_ever(store, monkeypatch,
                                                                                      caplog):
    """Under a persistent EIO every new version the learner publishes (one every few seconds) logged a WARNING of
    its own, and each stayed in the actor's memory for its life (a review). One WARNING per player while its
    versions keep failing; a version no reload looks at any more is forgotten."""
    import errno

    import actor_service.policy_pool as policy_pool
    import common.checkpoint_store as checkpoint_store

    clock = [1000.0]
    monkeypatch.setattr(policy_pool.time, "monotonic", lambda: clock[0])
    store.publish("p", weights(1), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    opened = checkpoint_store._open_regular

    def eio(path):
        if path.name.startswith("v") and path.name != "v0000000001.pt" and path.name != "v0000000001.pt.json":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return opened(path)

    monkeypatch.setattr(checkpoint_store, "_open_regular", eio)
    with caplog.at_level("DEBUG", logger="actor_service.policy_pool"):
        for version in range(2, 40):
            store.publish("p", weights(1), version)
            assert not policies.maybe_reload(launch) and launch.version == 1
            clock[0] += 3.0  # a publish every 3 s
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "cannot be read now" in r.message]
    assert len(warnings) == 1
    assert len(policies._unreadable) <= policy_pool.UNREADABLE_FORGET_S / 3.0 + 2


def test_rejected_versions_are_remembered_up_to_a_bound(store, monkeypatch):
    """Each corrupt version stayed in the actor's rejected set for its life; the newest REJECTED_KEPT are kept."""
    monkeypatch.setattr("actor_service.policy_pool.REJECTED_KEPT", 3)
    store.publish("p", weights(1), 1)
    policies = pool(store)
    launch = policies.launch_policy(PlayerSlot("p", "", 0, True))
    for version in range(2, 8):
        ref = store.publish("p", weights(version), version)
        (store.root.root / ref.path).write_bytes(b"not a checkpoint")
        assert not policies.maybe_reload(launch) and launch.version == 1
    assert list(policies._rejected) == [("p/v0000000005.pt", 5), ("p/v0000000006.pt", 6), ("p/v0000000007.pt", 7)]
