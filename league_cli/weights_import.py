"""`league import`: weights trained elsewhere (a supervised model, as AlphaStar starts every agent from one)
published as a checkpoint a league can start from (`league.pretrain_checkpoint_path`).

Learners and actors load only checkpoints the store published, each with a manifest of its digest and size
beside it; `torch.save(model.state_dict(), path)` writes none, and a league naming such a file failed each of its
jobs. This command loads the file (`torch.load(weights_only=True)`: tensors and containers, nothing else),
checks that it fits the league's network (every name and shape; floating-point tensors are cast to the
network's dtype) and publishes the network's weights at ``--to`` under the shared root (`CheckpointStore.
publish_at`), recording the policy's play settings as a learner's publish does.

`league_network(config)` builds that network, for training it elsewhere in the first place.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import cli_args
from common.exit_codes import FAILURE_EXIT, SETUP_ERROR_EXIT
from common.rpc import SHARED_ROOT_ENV_VAR, env_path

_WRAPPERS = ("state_dict", "model_state_dict", "model", "weights", "params")
"""Keys under which training scripts often nest the state dict in a file of their own."""


class ImportRefused(Exception):
    """What is wrong with the weights, the league or the destination, said to the user (exit 2)."""


@dataclass(frozen=True)
class LeagueNetwork:
    """The network a league trains, as its learners build it: the task that holds it and where it came from."""

    task: Any  # ComputationTask
    policy: dict[str, Any]
    env_name: str
    env_kwargs: dict[str, Any]
    league: Any  # LeagueConfig


def league_network(config: str | Path | None = None) -> Any:
    """The torch module a league's learners train (the embedded league's without `config`), freshly initialised:
    train it as you like, `torch.save(module.state_dict(), path)`, and `league import path --to ...`."""
    return build_league_network(None if config is None else Path(config)).task.algorithm.model


def build_league_network(config: Path | None, checkpoint: str = "") -> LeagueNetwork:
    """The league's policy network for a checkpoint at `checkpoint` (relative to the shared root; its env
    kwargs are the view every player shares unless it lies in an active player's folder)."""
    from common.algorithms.registry import make_computation_task
    from common.envs.policy_view import policy_specs
    from common.envs.registry import make_env
    from league_service.config import load_config
    from league_service.env_fit import checkpoint_env_kwargs

    cfg = load_config(config, for_training=False)
    policy = dict(cfg.policy)
    env_kwargs = checkpoint_env_kwargs(cfg.env.kwargs, cfg.league, checkpoint)
    env = make_env(cfg.env.name, **env_kwargs)
    try:
        info = env.info()
    finally:
        env.close()
    inputs, actions = policy_specs(info, str(policy.get("algorithm", "ppo")))
    task = make_computation_task(policy, inputs, actions, device="cpu", seed=0)
    return LeagueNetwork(task, policy, cfg.env.name, env_kwargs, cfg.league)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("weights", type=cli_args.path,
                        help="a file of torch.save(model.state_dict()) (or a dict holding one under 'state_dict', "
                             "'model', ...), for the league's network (`league_cli.weights_import.league_network`)")
    parser.add_argument("--to", type=cli_args.path_text, required=True, dest="to",
                        help="where to publish it, relative to the shared root, ending in .pt (pretrained/sl.pt); "
                             "the league names it in league.pretrain_checkpoint_path")
    parser.add_argument("--config", type=cli_args.path, default=None,
                        help="league YAML whose network the weights are for (default: the run directory's "
                             "config.yaml with --run-dir, else the embedded league)")
    root = parser.add_mutually_exclusive_group()
    root.add_argument("--shared-root", type=cli_args.path, default=None,
                      help=f"the shared root to publish under (default ${SHARED_ROOT_ENV_VAR})")
    root.add_argument("--run-dir", type=cli_args.path, default=None,
                      help="a `league run` directory (made if new): publish under its shared root, RUN/shared")
    parser.add_argument("--force", action="store_true", help="replace a checkpoint or file at --to")
    parser.add_argument("--json", action="store_true", help="print the published manifest as JSON")


def main(args: argparse.Namespace) -> int:
    import os

    from common.checkpoint_store import CheckpointStore, check_free_standing
    from common.durable_files import full_disk_note, out_of_space
    from common.paths import UnsafePathError

    destination: Path | None = None
    try:
        try:
            check_free_standing(args.to)
        except ValueError as err:  # (UnsafePathError is one)
            raise ImportRefused(f"--to: {err} (a path relative to the shared root)") from None
        root, config = _root_and_config(args)
        tensors = read_weights(args.weights)
        store = CheckpointStore(root)
        destination = store.root.resolve(args.to)  # (inside the root: a link out of it is refused here)
        if not args.force:
            _refuse_to_replace(args.weights, destination, args.to)
        print(f"league import: the network of {config or 'the embedded league'}", file=sys.stderr)
        network = build_league_network(config, args.to)
        weights, cast = fit_weights(network.task, tensors)
        metadata = {**_play_metadata(network.policy), "imported_from": str(Path(os.path.abspath(args.weights)))}
        ref = store.publish_at(args.to, weights, metadata, replace=args.force)
    except ImportRefused as err:
        return _refuse(str(err))
    except OSError as err:
        if out_of_space(err):  # space may come back: a failure (1), not a usage error (2)
            note = "" if destination is None else full_disk_note(destination)
            print(f"league import: --to {args.to}: {err}{note}", file=sys.stderr)
            return FAILURE_EXIT
        return _refuse(f"{err.filename or args.to}: {err.strerror or err}")
    except (UnsafePathError, ValueError) as err:  # a config error, a link out of the root, a model the env refuses
        return _refuse(str(err))
    if args.json:
        print(json.dumps({"path": ref.path, "shared_root": str(store.root.root), "version": ref.version,
                          "digest": ref.digest, "size": ref.size, "metadata": dict(ref.metadata),
                          "cast": cast}, sort_keys=True))
        return 0
    print(f"{args.weights} -> {ref.path} under {store.root.root} ({len(weights)} tensors, {ref.size / 1e6:.1f} MB, "
          f"{network.policy.get('algorithm', 'ppo')} on {network.env_name})")
    if cast:
        print(f"  {len(cast)} of its tensors cast to the network's dtype ({', '.join(cast[:3])}"
              f"{', ...' if len(cast) > 3 else ''})")
    categories = ", ".join(f"{c}: {ref.path}" for c in network.league.player_category)
    print(f"  start a league from it: league.pretrain_checkpoint_path: {{{categories}}}")
    return 0


def _root_and_config(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The shared root to publish under and the league config: --run-dir gives both (RUN/shared, made if new;
    RUN/config.yaml if the run has one)."""
    config = args.config
    if args.run_dir is not None:
        root = args.run_dir / "shared"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ImportRefused(f"--run-dir {args.run_dir}: cannot make {root}: {err.strerror or err}") from None
        if config is None and (args.run_dir / "config.yaml").is_file():
            config = args.run_dir / "config.yaml"
        return root, config
    root = args.shared_root if args.shared_root is not None else env_path(SHARED_ROOT_ENV_VAR)
    refusal = cli_args.shared_root_refusal(root, writes="the weights are published there")
    if refusal is not None:
        raise ImportRefused(f"{refusal} (or give --run-dir)" if root is None else refusal)
    return root, config


def _refuse_to_replace(weights: Path, destination: Path, to: str) -> None:
    """Without --force, a checkpoint published at --to, or another file there, is kept. The weights file itself
    at --to (copied into the share first) is not another file: it is published in place."""
    from common.job_limits import MANIFEST_SUFFIX

    if destination.with_name(destination.name + MANIFEST_SUFFIX).exists():
        raise ImportRefused(f"--to {to} is a published checkpoint already: give --force to replace it")
    try:
        same = destination.exists() and destination.samefile(weights)
    except OSError:
        same = False
    if destination.exists() and not same:
        raise ImportRefused(f"--to {to}: {destination} exists: give --force to replace it")


def read_weights(path: Path) -> dict[str, Any]:
    """The tensors of the weights file at `path` by name: a state dict, or one nested under a common key, or a
    checkpoint store's weights file (its manifest lost). torch's weights-only unpickler: a file holding anything
    but tensors and containers raises instead of running code."""
    import pickle

    import torch

    from common.checkpoint_store import FORMAT

    try:
        if not path.is_file():
            raise ImportRefused(f"{path}: {'not a file' if path.exists() else 'no such file'}")
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except ImportRefused:
        raise
    except OSError as err:
        raise ImportRefused(f"{path}: {err.strerror or err}") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as err:
        raise ImportRefused(f"{path}: not a file of tensors that torch loads safely (weights_only): "
                            f"{_load_failure(err)}; save the model's state_dict() alone (no whole module, no "
                            "objects of your own)") from None
    if isinstance(loaded, dict) and loaded.get("format") == FORMAT and isinstance(loaded.get("tensors"), dict):
        loaded = loaded["tensors"]  # a store's weights file
    if isinstance(loaded, dict) and not _all_tensors(loaded):
        nested = [k for k in _WRAPPERS if isinstance(loaded.get(k), dict) and _all_tensors(loaded[k])]
        if len(nested) == 1:
            loaded = loaded[nested[0]]
    if not isinstance(loaded, dict) or not loaded or not _all_tensors(loaded):
        raise ImportRefused(f"{path}: holds {_describe(loaded)}, not a state dict (a mapping of names to tensors: "
                            "torch.save(model.state_dict(), path))")
    return dict(loaded)


def _load_failure(err: Exception) -> str:
    """torch's reason in a line: for a refused object, the WeightsUnpickler line naming it (the message around
    it advises loading with weights_only=False, which runs whatever the file holds)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if line.startswith("WeightsUnpickler error:")]
    reason = (named or lines or [type(err).__name__])[0]
    return reason.removeprefix("WeightsUnpickler error: ").split(" was not an allowed global")[0]


def _all_tensors(mapping: dict[Any, Any]) -> bool:
    import torch

    return bool(mapping) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in mapping.items())


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        keys = list(value)[:5]
        return f"a dict of {len(value)} entries ({', '.join(repr(k) for k in keys)}{', ...' if len(value) > 5 else ''})"
    return f"a {type(value).__name__}"


def fit_weights(task: Any, tensors: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The network's weights loaded from `tensors` (every name and shape must match; floating-point tensors of
    another dtype are cast to the network's, and listed), as the task holds them."""
    import torch

    from common.computation import WeightsMismatchError

    own = task.algorithm.model.state_dict()
    cast: list[str] = []
    arrays = {}
    for name, value in tensors.items():
        value = value.detach()
        target = own.get(name)
        if target is not None and value.dtype != target.dtype and value.is_floating_point() and target.is_floating_point():
            cast.append(name)
            value = value.to(target.dtype)
        if value.layout != torch.strided:
            raise ImportRefused(f"weights[{name!r}]: a {value.layout} tensor; save dense tensors")
        arrays[name] = value.contiguous().numpy()
    try:
        task.set_weights(arrays, 0)
    except WeightsMismatchError as err:
        raise ImportRefused(f"{err} (the league's network: `league_cli.weights_import.league_network(CONFIG)` "
                            "builds it)") from None
    return task.get_weights(), cast


def _play_metadata(policy: dict[str, Any]) -> dict[str, Any]:
    from common.policy_config import PolicyConfig, play_metadata

    return play_metadata(PolicyConfig.from_mapping(policy))


def _refuse(message: str) -> int:
    print(f"league import: {message}", file=sys.stderr)
    return SETUP_ERROR_EXIT
