"""A league started from another run's checkpoint: the file and its manifest copied under the new shared root.

A manifest names the path it was published at, and every reader refuses one that names another, so a copy
anywhere else never loaded: the coordinator records a copied pretrained checkpoint at its new place at start,
once its file verifies."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from common.checkpoint_store import CheckpointNotFoundError, CheckpointStore, CorruptCheckpointError
from common.config import ConfigError
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_testing import small_league_config

WEIGHTS = {"layer.weight": np.full((4, 3), 0.5, np.float32), "layer.bias": np.arange(4, dtype=np.int64)}


def _copy(old: CheckpointStore, path: str, new: CheckpointStore, to: str) -> None:
    (new.root.root / to).parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", ".json"):
        shutil.copy(old.root.root / (path + suffix), new.root.root / (to + suffix))


@pytest.fixture
def old(tmp_path_factory) -> CheckpointStore:
    """Another run's shared root, its main player at version 6 and a snapshot of it."""
    store = CheckpointStore(tmp_path_factory.mktemp("old_run"))
    store.publish("main_player_default_0", WEIGHTS, 6)
    store.snapshot("main_player_default_0/v0000000006.pt", "main_player_default_0/v0000000006_1859.pt")
    return store


def test_a_copied_checkpoint_is_recorded_at_its_new_place_once_it_verifies(old, tmp_path):
    new = CheckpointStore(tmp_path)
    _copy(old, "main_player_default_0/v0000000006.pt", new, "pretrained/main.pt")
    with pytest.raises(CorruptCheckpointError, match="manifest describes 'main_player_default_0/"):
        new.load("pretrained/main.pt")
    ref = new.adopt("pretrained/main.pt")
    assert (ref.path, ref.version) == ("pretrained/main.pt", 6)
    assert ref.metadata["copied_from"] == "main_player_default_0/v0000000006.pt"
    loaded = new.load("pretrained/main.pt")
    np.testing.assert_array_equal(loaded.tensors["layer.weight"], WEIGHTS["layer.weight"])
    assert new.adopt("pretrained/main.pt") == new.manifest("pretrained/main.pt")  # recorded once


def test_a_copy_that_does_not_verify_is_not_recorded(old, tmp_path):
    new = CheckpointStore(tmp_path)
    _copy(old, "main_player_default_0/v0000000006.pt", new, "pretrained/main.pt")
    manifest = (tmp_path / "pretrained" / "main.pt.json").read_bytes()
    with open(tmp_path / "pretrained" / "main.pt", "r+b") as f:  # a copy damaged on the way
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(CorruptCheckpointError):
        new.adopt("pretrained/main.pt")
    assert (tmp_path / "pretrained" / "main.pt.json").read_bytes() == manifest
    (tmp_path / "pretrained" / "main.pt.json").unlink()
    with pytest.raises(CheckpointNotFoundError, match="copy a checkpoint with its manifest"):
        new.adopt("pretrained/main.pt")


def _start(tmp_path, pretrained: str) -> Coordinator:
    cfg = small_league_config({"league": {"pretrain_checkpoint_path": {"default": pretrained}}})
    settings = CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=60.0, needs_learner=False)
    return Coordinator(cfg, settings)


def test_the_coordinator_records_a_copied_pretrained_checkpoint_at_start(old, tmp_path):
    _copy(old, "main_player_default_0/v0000000006_1859.pt", CheckpointStore(tmp_path), "sl/main.pt")
    _start(tmp_path, "sl/main.pt").close()
    ref = CheckpointStore(tmp_path).verify("sl/main.pt")
    assert ref.metadata["copied_from"] == "main_player_default_0/v0000000006_1859.pt"


def test_the_coordinator_refuses_a_copied_pretrained_checkpoint_that_does_not_verify(old, tmp_path):
    _copy(old, "main_player_default_0/v0000000006.pt", CheckpointStore(tmp_path), "sl/main.pt")
    (tmp_path / "sl" / "main.pt").write_bytes(b"not the weights")
    with pytest.raises(ConfigError, match=r"^league.pretrain_checkpoint_path.default: 'sl/main.pt', copied "
                                          r"from 'main_player_default_0/v0000000006.pt', cannot be recorded at "
                                          r"its new place: .*size"):
        _start(tmp_path, "sl/main.pt")


def test_a_snapshot_copied_into_a_player_folder_is_no_checkpoint_of_that_player(old, tmp_path, caplog):
    """Copied to the path its manifest names, a snapshot lies in the new league's main player's folder: the
    coordinator warned that the player's learner would resume from it (it does not; it starts from it)."""
    snapshot = "main_player_default_0/v0000000006_1859.pt"
    _copy(old, snapshot, CheckpointStore(tmp_path), snapshot)
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        _start(tmp_path, snapshot).close()
    assert "already holds checkpoints" not in caplog.text
    version = "main_player_default_0/v0000000006.pt"
    _copy(old, version, CheckpointStore(tmp_path), version)
    (tmp_path / "league_state.sqlite").unlink()
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        _start(tmp_path, snapshot).close()
    assert "already holds checkpoints of main_player_default_0" in caplog.text
