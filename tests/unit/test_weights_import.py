"""`league import`: weights trained elsewhere (a state dict) published as a checkpoint a league can start from.

Learners and actors load only published checkpoints (a manifest beside the file); a `torch.save(state_dict)`
copied into the share failed every job naming it. The import checks that the file fits the league's network
and publishes it, free-standing, at the path the league names."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from common.checkpoint_store import CheckpointNotFoundError, CheckpointStore
from common.policy_config import PolicyConfig, play_metadata
from league_cli import weights_import
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.coordinator_testing import small_league_config
from learner_service.publisher import CheckpointPublisher
from learner_service.trainer import Progress
from tests.full_disk import pretend_full_disk

REPO = Path(__file__).resolve().parents[2]
SOLO_CARTPOLE = "configs/solo_cartpole.yaml"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    weights_import.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def trained() -> dict[str, torch.Tensor]:
    """The embedded league's network, its weights changed as a training elsewhere would."""
    network = weights_import.league_network()
    with torch.no_grad():
        for p in network.parameters():
            p.add_(0.25)
    return {k: v.clone() for k, v in network.state_dict().items()}


def _league_file(tmp_path, **model) -> Path:
    """The league config the weights are for, as a user writes it: the embedded league starting from them."""
    path = tmp_path / "league.yaml"
    path.write_text(yaml.safe_dump({"league": {"pretrain_checkpoint_path": {"default": "pretrained/sl.pt"}},
                                    **({"policy": {"model": model}} if model else {})}))
    return path


def _import(tmp_path, capsys, weights, *flags: str) -> tuple[int, str, str]:
    torch.save(weights, tmp_path / "sl.pt")
    config = () if "--config" in flags else ("--config", str(_league_file(tmp_path)))
    code = weights_import.main(parse(str(tmp_path / "sl.pt"), "--run-dir", str(tmp_path / "run"), *config, *flags))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_state_dict_is_published_where_the_league_names_it(tmp_path, capsys, trained):
    code, out, _ = _import(tmp_path, capsys, trained, "--to", "pretrained/sl.pt")
    assert code == 0, out
    assert "league.pretrain_checkpoint_path: {default: pretrained/sl.pt}" in out
    store = CheckpointStore(tmp_path / "run" / "shared")
    loaded = store.load("pretrained/sl.pt")
    assert loaded.ref.version == 0 and set(loaded.tensors) == set(trained)
    for name, value in trained.items():
        np.testing.assert_array_equal(loaded.tensors[name], value.numpy())
    # Its play settings recorded as a learner's publish records them: actors build the network with them.
    policy = weights_import.build_league_network(None).policy
    assert play_metadata(PolicyConfig.from_mapping(policy)).items() <= loaded.ref.metadata.items()
    assert loaded.ref.metadata["imported_from"] == str(tmp_path / "sl.pt")
    # A learner the league starts from it takes these weights (its lineage: the league's version 0).
    start = CheckpointPublisher(store, "main_player_default_0", "w").choose_start("pretrained/sl.pt", 0, Progress())
    assert start.lineage_from == 0
    np.testing.assert_array_equal(next(iter(start.weights.values())), next(iter(trained.values())).numpy())


def test_a_wrapped_or_half_precision_state_dict_is_imported(tmp_path, capsys, trained):
    """Training scripts often save {"state_dict": ..., "epoch": n}, and may train in half precision."""
    halves = {k: v.half() for k, v in trained.items()}
    code, out, _ = _import(tmp_path, capsys, {"state_dict": halves, "epoch": 3}, "--to", "sl.pt", "--json")
    assert code == 0
    report = json.loads(out)
    assert sorted(report["cast"]) == sorted(trained) and report["path"] == "sl.pt"
    loaded = CheckpointStore(tmp_path / "run" / "shared").load("sl.pt")
    assert all(v.dtype == np.float32 for v in loaded.tensors.values())


def test_a_league_checkpoint_is_checked_against_its_manifest_before_it_is_imported(tmp_path, capsys, trained):
    """A checkpoint copied out of a league with its manifest, one byte of it changed since: `league eval` refused
    it ("digest does not match the manifest"), `league import` published it again under a fresh, valid digest (a
    review). Intact, it imports; a user's own JSON beside a weights file is no manifest."""
    (tmp_path / "other").mkdir()
    other = CheckpointStore(tmp_path / "other")
    ref = other.publish("p", {k: v.numpy() for k, v in trained.items()}, 3, {})
    source = tmp_path / "other" / ref.path
    config = str(_league_file(tmp_path))

    def imported(to: str) -> int:
        return weights_import.main(parse(str(source), "--run-dir", str(tmp_path / "run"), "--to", to,
                                         "--config", config))

    assert imported("intact.pt") == 0, capsys.readouterr().err
    data = bytearray(source.read_bytes())
    data[-100] ^= 0xFF
    source.write_bytes(bytes(data))
    assert imported("tampered.pt") == 2
    err = capsys.readouterr().err
    assert "digest does not match the manifest" in err and "not imported" in err, err
    assert not (tmp_path / "run" / "shared" / "tampered.pt").exists()
    mine = tmp_path / "mine.pt"
    torch.save(trained, mine)
    (tmp_path / "mine.pt.json").write_text('{"epochs": 3}')
    assert weights_import.main(parse(str(mine), "--run-dir", str(tmp_path / "run"), "--to", "mine.pt",
                                     "--config", config)) == 0, capsys.readouterr().err


@pytest.mark.parametrize("force", [(), ("--force",)], ids=["plain", "force"])
def test_a_file_where_a_folder_of_the_destination_goes_is_named(tmp_path, capsys, trained, force):
    """`--to pre/a.pt/x.pt` under the checkpoint pre/a.pt said "is a published checkpoint already: give --force",
    with --force too (a review)."""
    assert _import(tmp_path, capsys, trained, "--to", "pre/a.pt")[0] == 0
    code, _, err = _import(tmp_path, capsys, trained, "--to", "pre/a.pt/x.pt", *force)
    assert code == 2 and "--to pre/a.pt/x.pt: pre/a.pt is a file, not a directory" in err, err


def test_a_file_in_the_share_is_published_in_place(tmp_path, capsys, trained):
    root = tmp_path / "run" / "shared"
    (root / "pre").mkdir(parents=True)
    torch.save(trained, root / "pre" / "sl.pt")
    assert weights_import.main(parse(str(root / "pre" / "sl.pt"), "--shared-root", str(root), "--to", "pre/sl.pt",
                                     "--config", str(_league_file(tmp_path)))) == 0
    assert CheckpointStore(root).verify("pre/sl.pt").path == "pre/sl.pt"


@pytest.mark.parametrize("weights, flags, message", [
    (torch.nn.Linear(2, 2), (), "Unsupported global: GLOBAL torch.nn.modules.linear.Linear; save the model's state_dict"),
    ({"steps": 3, "lr": 0.1}, (), "holds a dict of 2 entries ('steps', 'lr'), not a state dict"),
    (None, ("--to", "main_player_default_0/v0000000000.pt"), "is the name of a player's version"),
    (None, ("--to", "sl.pth"), "must end with .pt"),
    (None, ("--to", "../sl.pt"), "'..' component"),
    (None, ("--to", "main_player_default_0/sl.pt"), "is the folder of the league's active player"),
    ({"w": torch.zeros(2, dtype=torch.bfloat16), "x": torch.zeros(2, dtype=torch.bfloat16)}, (), "missing ["),
])
def test_what_is_not_imported_is_said_and_nothing_is_written(tmp_path, capsys, trained, weights, flags, message):
    code, _, err = _import(tmp_path, capsys, trained if weights is None else weights, *(flags or ("--to", "sl.pt")))
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()  # (a new run directory is made only for weights that fit)


@pytest.mark.parametrize("content", [b"hello", b"j" + bytes(7), b"", b"{\"w\": [1, 2]}"],
                         ids=["text", "opcode-j", "empty", "json"])
def test_a_file_that_is_no_pickle_is_refused_in_a_line(tmp_path, capsys, content):
    """A file starting with the opcode h or j (b"hello"; a safetensors file with a 104-byte header) made the
    weights-only unpickler raise KeyError: a traceback, exit 1 (a review)."""
    (tmp_path / "w.pt").write_bytes(content)
    code = weights_import.main(parse(str(tmp_path / "w.pt"), "--run-dir", str(tmp_path / "run"), "--to", "sl.pt",
                                     "--config", str(_league_file(tmp_path))))
    err = capsys.readouterr().err
    assert code == 2 and "not a file of tensors that torch loads safely" in err and "Traceback" not in err, err


def test_weights_of_another_network_are_refused_naming_what_differs(tmp_path, capsys, trained):
    code, _, err = _import(tmp_path, capsys, trained, "--to", "sl.pt", "--config", str(REPO / SOLO_CARTPOLE))
    assert code == 2 and "weights do not fit the model: missing [" in err and "league_network(CONFIG)" in err
    assert not (tmp_path / "run" / "shared" / "sl.pt").exists()


def test_every_tensor_of_another_shape_is_named_at_once(tmp_path, capsys, trained):
    names = [k for k, v in trained.items() if v.dim() > 1][:2]
    reshaped = {k: (v.flatten() if k in names else v) for k, v in trained.items()}
    code, _, err = _import(tmp_path, capsys, reshaped, "--to", "sl.pt")
    assert code == 2 and all(f"weights[{name!r}]: shape" in err for name in names), err


def test_a_missing_name_and_a_shape_that_differs_are_named_at_once(tmp_path, capsys, trained):
    """The names were said first and the shapes, once they were fixed, in a second round (a review)."""
    dropped, reshaped = [k for k, v in trained.items() if v.dim() > 1][:2]
    weights = {k: (v.flatten() if k == reshaped else v) for k, v in trained.items() if k != dropped}
    code, _, err = _import(tmp_path, capsys, weights, "--to", "sl.pt")
    assert code == 2, err
    assert f"missing ['{dropped}']" in err and "unknown" not in err and f"weights[{reshaped!r}]: shape" in err


def test_an_integer_tensor_for_a_float_parameter_is_named_with_the_shapes(tmp_path, capsys, trained):
    """It was named by set_weights in a second round, once the shapes were fixed (a review)."""
    reshaped, integer = list(trained)[:2]
    weights = {k: (v.flatten() if k == reshaped else v.long() if k == integer else v) for k, v in trained.items()}
    code, _, err = _import(tmp_path, capsys, weights, "--to", "sl.pt")
    assert code == 2, err
    assert f"weights[{reshaped!r}]: shape" in err and f"weights[{integer!r}]: dtype torch.int64" in err, err


def test_negative_observation_statistics_are_refused(tmp_path, capsys):
    """A negative running variance made every output NaN (sqrt of the standardisation), and the import, eval and
    the league took it without a word (a review)."""
    config = _league_file(tmp_path, obs_norm=True)
    weights = weights_import.league_network(config).state_dict()
    (var,) = [name for name in weights if name.endswith("obs_norm.var")]
    (count,) = [name for name in weights if name.endswith("obs_norm.count")]
    weights[var] = torch.full_like(weights[var], -5.0)
    weights[count] = torch.tensor(-3.0, dtype=weights[count].dtype)
    code, _, err = _import(tmp_path, capsys, weights, "--to", "sl.pt", "--config", str(config))
    assert code == 2, err
    assert f"weights[{var!r}]: a negative running var" in err and f"weights[{count!r}]: a negative running count" in err
    assert not (tmp_path / "run" / "shared" / "sl.pt").exists()


def test_what_is_at_the_destination_is_kept_without_force(tmp_path, capsys, trained):
    assert _import(tmp_path, capsys, trained, "--to", "sl.pt")[0] == 0
    code, _, err = _import(tmp_path, capsys, trained, "--to", "sl.pt")
    assert code == 2 and "is a published checkpoint already: give --force" in err
    before = CheckpointStore(tmp_path / "run" / "shared").verify("sl.pt")
    changed = {k: v + 1 for k, v in trained.items()}
    assert _import(tmp_path, capsys, changed, "--to", "sl.pt", "--force")[0] == 0
    assert CheckpointStore(tmp_path / "run" / "shared").verify("sl.pt").digest != before.digest
    (tmp_path / "run" / "shared" / "other.pt").write_bytes(b"someone's file")
    code, _, err = _import(tmp_path, capsys, trained, "--to", "other.pt")
    assert code == 2 and "exists: give --force" in err
    assert (tmp_path / "run" / "shared" / "other.pt").read_bytes() == b"someone's file"


def test_a_shared_root_is_required(tmp_path, capsys, trained, monkeypatch):
    monkeypatch.delenv("LEAGUE_SHARED_ROOT", raising=False)
    torch.save(trained, tmp_path / "sl.pt")
    assert weights_import.main(parse(str(tmp_path / "sl.pt"), "--to", "sl.pt")) == 2
    assert "--shared-root (or $LEAGUE_SHARED_ROOT) is required (or give --run-dir)" in capsys.readouterr().err


def test_publish_at_writes_a_free_standing_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    weights = {"w": np.ones((2, 2), np.float32)}
    ref = store.publish_at("sl/main.pt", weights, {"note": "x"})
    assert store.verify("sl/main.pt") == ref and ref.metadata == {"note": "x"}
    with pytest.raises(FileExistsError):
        store.publish_at("sl/main.pt", weights)
    replaced = store.publish_at("sl/main.pt", {"w": np.zeros((2, 2), np.float32)}, replace=True)
    assert store.load("sl/main.pt").tensors["w"].sum() == 0 and replaced.digest != ref.digest
    assert sorted(p.name for p in (tmp_path / "sl").iterdir()) == ["main.pt", "main.pt.json"]  # no temp left
    # A symlink planted at the name is replaced, never written through.
    (tmp_path / "elsewhere.pt").write_bytes(b"keep")
    (tmp_path / "sl" / "link.pt").symlink_to(tmp_path / "elsewhere.pt")
    store.publish_at("sl/link.pt", weights)
    assert (tmp_path / "elsewhere.pt").read_bytes() == b"keep" and not (tmp_path / "sl" / "link.pt").is_symlink()


def test_a_bare_weights_file_named_as_pretrained_is_said_with_the_fix(tmp_path, caplog, trained):
    """The coordinator warns at start, and a learner's refusal names `league import`."""
    (tmp_path / "sl").mkdir()
    torch.save(trained, tmp_path / "sl" / "bare.pt")
    cfg = small_league_config({"league": {"pretrain_checkpoint_path": {"default": "sl/bare.pt"}}})
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        Coordinator(cfg, CoordinatorSettings(shared_root=tmp_path, lease_timeout_s=60.0, needs_learner=False)).close()
    assert "sl/bare.pt has no manifest" in caplog.text and "league import FILE --to sl/bare.pt" in caplog.text
    publisher = CheckpointPublisher(CheckpointStore(tmp_path), "main_player_default_0", "w")
    with pytest.raises(CheckpointNotFoundError, match="never published: publish weights trained elsewhere with "
                                                      "`league import FILE --to sl/bare.pt`"):
        publisher.choose_start("sl/bare.pt", 0, Progress())


def test_a_full_disk_fails_the_import_and_leaves_nothing(tmp_path, capsys, trained, monkeypatch):
    """Space may come back: a failure (exit 1), not a usage error, and no temporary file holds space."""
    import common.checkpoint_store as store_module

    def full(payload, tmp):
        tmp.write_bytes(b"part")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    monkeypatch.setattr(store_module, "save_hashed", full)
    pretend_full_disk(monkeypatch)
    code, _, err = _import(tmp_path, capsys, trained, "--to", "pre/sl.pt")
    assert code == 1 and "No space left on device" in err and "disk" in err.split("device", 1)[1], err
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file()]


def test_the_league_config_is_never_assumed(tmp_path, capsys, trained):
    """Its policy decides the network and the play settings recorded: the embedded league's, taken for a league
    of another activation, had learners and actors disagree about the same weights (a review)."""
    torch.save(trained, tmp_path / "sl.pt")
    assert weights_import.main(parse(str(tmp_path / "sl.pt"), "--run-dir", str(tmp_path / "run"), "--to", "sl.pt")) == 2
    assert "--config is required" in capsys.readouterr().err and not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()
    _league_file(tmp_path / "run").rename(tmp_path / "run" / "config.yaml")  # a run directory's own config
    assert weights_import.main(parse(str(tmp_path / "sl.pt"), "--run-dir", str(tmp_path / "run"), "--to", "sl.pt")) == 0


def test_a_wrapper_prefix_is_removed_and_bad_values_are_refused(tmp_path, capsys, trained):
    ddp = {f"module.{k}": v for k, v in trained.items()}
    code, out, _ = _import(tmp_path, capsys, ddp, "--to", "ddp.pt", "--json")
    assert code == 0 and json.loads(out)["prefix_removed"] == "module."
    name = next(iter(trained))
    nan = {**trained, name: torch.full_like(trained[name], float("nan"))}
    code, _, err = _import(tmp_path, capsys, nan, "--to", "nan.pt")
    assert code == 2 and f"weights[{name!r}]: holds NaN or infinite values" in err
    assert not (tmp_path / "run" / "shared" / "nan.pt").exists()


def test_a_directory_at_the_destination_is_named(tmp_path, capsys, trained):
    (tmp_path / "run" / "shared" / "sl.pt").mkdir(parents=True)
    code, _, err = _import(tmp_path, capsys, trained, "--to", "sl.pt", "--force")
    assert code == 2 and "sl.pt is a directory" in err and ".tmp" not in err


def test_the_coordinator_warns_of_a_pretrained_checkpoint_of_other_play_settings(tmp_path, capsys, trained, caplog):
    assert _import(tmp_path, capsys, trained, "--to", "pretrained/sl.pt")[0] == 0  # the default: relu
    cfg = small_league_config({"league": {"pretrain_checkpoint_path": {"default": "pretrained/sl.pt"}},
                               "policy": {"model": {"activation": "tanh"}}})
    settings = CoordinatorSettings(shared_root=tmp_path / "run" / "shared", lease_timeout_s=60.0, needs_learner=False)
    with caplog.at_level(logging.WARNING, logger="league_service.coordinator"):
        Coordinator(cfg, settings).close()
    assert "pretrained/sl.pt was made with other play settings than the league's policy (activation: tanh -> relu" \
        in caplog.text


def test_publish_at_removes_what_a_killed_write_left(tmp_path):
    store = CheckpointStore(tmp_path)
    (tmp_path / "sl").mkdir()
    old, recent = tmp_path / "sl" / ".main.pt.123.abcd.tmp", tmp_path / "sl" / ".main.pt.456.ef01.tmp"
    for leftover in (old, recent):
        leftover.write_bytes(b"half the weights")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    store.publish_at("sl/main.pt", {"w": np.ones(2, np.float32)})
    assert not old.exists() and recent.exists()  # (one that young may be another import's, under way)


def test_a_ctrl_c_mid_save_is_a_keyboard_interrupt(tmp_path, monkeypatch):
    """torch's zip writer, closing on the way out, raised a RuntimeError of its own in the interrupt's place:
    `league import` ended in a 40-line traceback and exit 1 instead of exit 130."""
    from common import checkpoint_hashing

    writes = []

    def interrupted(self, data):
        writes.append(len(data))
        if len(writes) == 3:
            raise KeyboardInterrupt
        return original(self, data)

    original = checkpoint_hashing._HashingWriter.write
    monkeypatch.setattr(checkpoint_hashing._HashingWriter, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        CheckpointStore(tmp_path).publish_at("sl.pt", {f"w{i}": np.ones(1000, np.float32) for i in range(8)})
    assert [p.name for p in tmp_path.iterdir()] == []


def test_the_weights_read_do_not_change_when_their_file_is_rewritten(tmp_path, trained):
    """A training script saving each epoch to one path rewrites the same inode: tensors still mapped from it
    changed under the import, or a shorter file killed it with SIGBUS (a review)."""
    path = tmp_path / "sl.pt"
    torch.save(trained, path)
    tensors = weights_import.read_weights(path)
    torch.save({"w": torch.zeros(1)}, path)  # shorter, in place
    for name, value in trained.items():
        assert torch.equal(tensors[name], value)
