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
import pickle
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
    train it as you like, `torch.save(module.state_dict(), path)`, and `league import path --config CONFIG
    --to ...` with the same config."""
    return build_league_network(None if config is None else Path(config)).task.algorithm.model


def build_league_network(config: Path | None, checkpoint: str = "") -> LeagueNetwork:
    """The league's policy network for a checkpoint at `checkpoint` (relative to the shared root; its env
    kwargs are the view every player shares unless it lies in an active player's folder)."""
    from common.algorithms.registry import make_computation_task
    from common.envs.policy_view import policy_specs
    from common.envs.registry import env_info
    from league_cli.eval import _load_league, _policy_and_env

    cfg = _load_league(config)
    policy, env_name, env_kwargs = _policy_and_env(cfg, checkpoint)
    inputs, actions = policy_specs(env_info(env_name, **env_kwargs), str(policy.get("algorithm", "ppo")))
    task = make_computation_task(policy, inputs, actions, device="cpu", seed=0)
    return LeagueNetwork(task, policy, env_name, env_kwargs, cfg.league)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("weights", type=cli_args.path,
                        help="a file of torch.save(model.state_dict()) (or a dict holding one under 'state_dict', "
                             "'model', ...), for the league's network (`league_cli.weights_import.league_network`)")
    parser.add_argument("--to", type=cli_args.path_text, required=True, dest="to",
                        help="where to publish it, relative to the shared root, ending in .pt (pretrained/sl.pt); "
                             "the league names it in league.pretrain_checkpoint_path")
    parser.add_argument("--config", type=cli_args.path, default=None,
                        help="the league YAML the weights are for, which the league will run with (default with "
                             "--run-dir: the run directory's config.yaml, if it has one)")
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
        if root.is_dir():  # (a new run directory's is made only once the weights are known to fit)
            _refuse_to_replace(args, CheckpointStore(root).root.resolve(args.to))
        tensors = read_weights(args.weights)
        print(f"league import: the network of {config}", file=sys.stderr)
        network = build_league_network(config, args.to)
        _refuse_a_players_folder(args.to, network.league)
        fitted = fit_weights(network.task, tensors)
        metadata = {**_play_metadata(network.policy), "imported_from": str(Path(os.path.abspath(args.weights)))}
        root.mkdir(parents=True, exist_ok=True)
        store = CheckpointStore(root)
        destination = store.root.resolve(args.to)  # (inside the root: a link out of it is refused here)
        _refuse_to_replace(args, destination)
        try:
            ref = store.publish_at(args.to, fitted.weights, metadata, replace=args.force)
        except FileExistsError:  # another import published it meanwhile, or a file stands where a folder goes
            if (blocking := _file_on_the_way(store.root.root, args.to)) is not None:
                raise ImportRefused(f"--to {args.to}: {blocking} is a file, not a directory") from None
            raise ImportRefused(f"--to {args.to} is a published checkpoint already: give --force to replace "
                                "it") from None
    except ImportRefused as err:
        return _refuse(str(err))
    except OSError as err:
        if out_of_space(err):  # space may come back: a failure (1), not a usage error (2)
            note = "" if destination is None else full_disk_note(destination)
            print(f"league import: --to {args.to}: {err}{note}", file=sys.stderr)
            return FAILURE_EXIT
        return _refuse(f"--to {args.to}: {err.strerror or err}")
    except (UnsafePathError, ValueError) as err:  # a config error, a link out of the root, a model the env refuses
        return _refuse(str(err))
    if args.json:
        print(json.dumps({"path": ref.path, "shared_root": str(store.root.root), "version": ref.version,
                          "digest": ref.digest, "size": ref.size, "metadata": dict(ref.metadata),
                          "cast": fitted.cast, "prefix_removed": fitted.prefix_removed}, sort_keys=True))
        return 0
    print(f"{args.weights} -> {ref.path} under {store.root.root} ({len(fitted.weights)} tensors, "
          f"{ref.size / 1e6:.1f} MB, {network.policy.get('algorithm', 'ppo')} on {network.env_name})")
    if fitted.prefix_removed:
        print(f"  the prefix {fitted.prefix_removed!r} of every name removed (DistributedDataParallel, "
              "torch.compile and wrappers of one's own add one)")
    if fitted.cast:
        print(f"  {len(fitted.cast)} of its tensors cast to the network's dtype ({', '.join(fitted.cast[:3])}"
              f"{', ...' if len(fitted.cast) > 3 else ''})")
    categories = ", ".join(f"{c}: {ref.path}" for c in network.league.player_category)
    print(f"  start the league of {config} from it: league.pretrain_checkpoint_path: {{{categories}}}")
    return 0


def _root_and_config(args: argparse.Namespace) -> tuple[Path, Path]:
    """The shared root to publish under (not made yet) and the league config: --run-dir gives both (RUN/shared;
    RUN/config.yaml if the run has one). The config is never assumed: its policy decides the network the
    weights must fit and the play settings recorded with them (the embedded league's, taken for a league of
    another activation, had its learners train the weights with one activation and its actors play them with
    another; a review)."""
    config = args.config
    if args.run_dir is not None:
        root = args.run_dir / "shared"
        if args.run_dir.exists() and not args.run_dir.is_dir():
            raise ImportRefused(f"--run-dir {args.run_dir} is not a directory")
        if config is None and (args.run_dir / "config.yaml").is_file():
            config = args.run_dir / "config.yaml"
    else:
        root = args.shared_root if args.shared_root is not None else env_path(SHARED_ROOT_ENV_VAR)
        refusal = cli_args.shared_root_refusal(root, writes="the weights are published there")
        if refusal is not None:
            raise ImportRefused(f"{refusal} (or give --run-dir)" if root is None else refusal)
    if config is None:
        raise ImportRefused("--config is required: the league config the weights are for, the one the league will "
                            "run with (its policy decides the network they must fit and the play settings recorded "
                            "with them)" + (f"; {args.run_dir} has no config.yaml yet" if args.run_dir else ""))
    return root, config


def _refuse_to_replace(args: argparse.Namespace, destination: Path) -> None:
    """Without --force, a checkpoint published at --to, or another file there, is kept. The weights file itself
    at --to (copied into the share first) is not another file: it is published in place."""
    from common.job_limits import MANIFEST_SUFFIX

    if destination.is_dir():
        raise ImportRefused(f"--to {args.to}: {destination} is a directory")
    if args.force:
        return
    if destination.with_name(destination.name + MANIFEST_SUFFIX).exists():
        raise ImportRefused(f"--to {args.to} is a published checkpoint already: give --force to replace it")
    try:
        same = destination.exists() and destination.samefile(args.weights)
    except OSError:
        same = False
    if destination.exists() and not same:
        raise ImportRefused(f"--to {args.to}: {destination} exists: give --force to replace it")


def _refuse_a_players_folder(to: str, league: Any) -> None:
    """An active player's folder holds its versions and its snapshots, named by the league: an import there
    could take a snapshot's name, or pass for the player's own weights."""
    from league_service.player_factory import active_player_id

    folder = to.split("/", 1)[0] if "/" in to else ""
    players = {active_player_id(t, c, i) for c in league.player_category for t, n in league.active_players.items()
               for i in range(n)}
    if folder in players:
        raise ImportRefused(f"--to {to}: {folder}/ is the folder of the league's active player {folder}, where its "
                            "versions and snapshots go; choose another (pretrained/...)")


def _file_on_the_way(root: Path, relative: str) -> str | None:
    """The first folder of ``relative`` (under ``root``) that is something else than a directory (a checkpoint file:
    `--to pre/a.pt/x.pt`), or None."""
    parts = relative.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        here = root.joinpath(*parts[:depth])
        if here.exists() and not here.is_dir():
            return "/".join(parts[:depth])
    return None


def read_weights(path: Path) -> dict[str, Any]:
    """The tensors of the weights file at `path` by name: a state dict, or one nested under a common key, or a
    checkpoint store's weights file (its manifest lost). torch's weights-only unpickler: a file holding anything
    but tensors and containers raises instead of running code."""
    import warnings

    import torch

    from common.checkpoint_store import FORMAT, CheckpointError, verify_beside

    try:
        if not path.is_file():
            raise ImportRefused(f"{path}: {'not a file' if path.exists() else 'no such file'}")
        try:
            verify_beside(path.resolve())  # a league's checkpoint with its manifest: its digest still holds
        except CheckpointError as err:
            raise ImportRefused(f"{err}: not imported (the manifest beside it, {path.name}.json, says what it "
                                "held when it was published; weights you changed on purpose since: move the file "
                                "away from its manifest, or the manifest away from it)") from None
        with warnings.catch_warnings():  # (a TorchScript archive warned on stderr before it was refused)
            warnings.simplefilter("ignore")
            try:  # mapped: a file that also holds an optimizer's state is not read into memory whole
                loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:
                if "mmap" not in str(err):
                    raise
                loaded = torch.load(path, map_location="cpu", weights_only=True)  # torch's legacy format
    except ImportRefused:
        raise
    except OSError as err:
        raise ImportRefused(f"{path}: {err.strerror or err}") from None
    except Exception as err:  # pickle errors come in many types (a file of "hello": KeyError), all meaning "not ours"
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
    # Copied out of the mapped file now: a training script that saves each epoch with torch.save to this path
    # rewrites the same inode, and mapped tensors then changed under the import (a mix of two epochs published
    # under a good digest), or a shorter file killed it with SIGBUS (a review).
    return {name: tensor.clone() for name, tensor in loaded.items()}


def _load_failure(err: Exception) -> str:
    """torch's reason in a line: for a refused object, what the WeightsUnpickler names (the message around it
    advises loading with weights_only=False, which runs whatever the file holds: never repeated here)."""
    text = " ".join(str(err).split()).split(" Check the documentation")[0]
    if "WeightsUnpickler error:" in text:
        reason = text.split("WeightsUnpickler error:", 1)[1].strip()
        return reason.split(" was not an allowed global")[0].split(". Please")[0].split(" Please")[0]
    if text.startswith("Weights only load failed"):
        return "torch's weights-only loader refused it"
    if not isinstance(err, RuntimeError | pickle.UnpicklingError | EOFError | ValueError) or not text:
        return f"the unpickler failed ({type(err).__name__}{': ' + text[:80] if text else ''})"  # (KeyError: 101)
    return text.split(". ")[0]


def _all_tensors(mapping: dict[Any, Any]) -> bool:
    import torch

    return bool(mapping) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in mapping.items())


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        keys = list(value)[:5]
        return f"a dict of {len(value)} entries ({', '.join(repr(k) for k in keys)}{', ...' if len(value) > 5 else ''})"
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class FittedWeights:
    weights: dict[str, Any]
    """The network's weights, as its task holds them (numpy arrays by name)."""
    cast: list[str]
    """The tensors cast to the network's dtype (floating point of another precision)."""
    prefix_removed: str
    """A prefix every name had and the network's have not ("module." of DistributedDataParallel), or ""."""


def fit_weights(task: Any, tensors: dict[str, Any]) -> FittedWeights:
    """The network's weights loaded from `tensors`: every name and shape must match (a prefix that every name has
    and the network's have not is removed), floating-point tensors of another dtype are cast to the network's,
    and nothing may be NaN or infinite (a league trained from such weights failed every job)."""
    import numpy as np
    import torch

    from common.computation import WeightsMismatchError

    own = task.algorithm.model.state_dict()
    prefix = _wrapper_prefix(tensors, own)
    tensors = {name[len(prefix):]: value for name, value in tensors.items()}
    # Every problem in one go (a review: the names first, then, fixed, the shapes in a second round).
    missing, unknown = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    cast, arrays, problems = [], {}, []
    other_network = bool(missing or unknown)  # (then the problems end with how to build the league's network)
    if missing or unknown:
        removed = f" (once the prefix {prefix!r} of every name is removed)" if prefix else ""
        named = [f"{which} {_names(names)}" for which, names in (("missing", missing), ("unknown", unknown)) if names]
        problems.append(f"weights do not fit the model{removed}: {', '.join(named)}")
    for name, value in tensors.items():
        target = own.get(name)
        if target is None:
            continue
        if tuple(value.shape) != tuple(target.shape):
            problems.append(f"weights[{name!r}]: shape {tuple(value.shape)} != model shape {tuple(target.shape)}")
            other_network = True
            continue
        try:
            if value.layout != torch.strided:
                raise TypeError(f"a {value.layout} tensor; save dense tensors")
            value = value.detach()
            if value.dtype != target.dtype:
                if not (value.is_floating_point() and target.is_floating_point()):
                    # Named with the others, not by set_weights in a second round once they were fixed (a review)
                    problems.append(f"weights[{name!r}]: dtype {value.dtype} != model dtype {target.dtype}")
                    continue
                cast.append(name)
                value = value.to(target.dtype)
            array = value.contiguous().numpy()
        except (TypeError, RuntimeError, NotImplementedError) as err:  # (a quantized or meta tensor, bfloat16
            problems.append(f"weights[{name!r}]: {str(err).splitlines()[0]}")  # meant for an int layer, ...)
            continue
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            problems.append(f"weights[{name!r}]: holds NaN or infinite values")
            continue
        if name.rsplit(".", 2)[-2:] in (["obs_norm", "var"], ["obs_norm", "count"]) and (array < 0).any():
            # sqrt(var) of the observation's standardisation: every output NaN, and nothing said why (a review)
            problems.append(f"weights[{name!r}]: a negative running {name.rsplit('.', 1)[-1]} of the observation "
                            "statistics")
            continue
        arrays[name] = array
    if problems:
        raise ImportRefused("; ".join(problems) + (f" {_NETWORK_HINT}" if other_network else ""))
    try:
        task.set_weights(arrays, 0)
    except WeightsMismatchError as err:
        raise ImportRefused(f"{err} {_NETWORK_HINT}") from None
    return FittedWeights(task.get_weights(), cast, prefix)


_NETWORK_HINT = "(the league's network: `league_cli.weights_import.league_network(CONFIG)` builds it)"


def _wrapper_prefix(tensors: dict[str, Any], own: dict[str, Any]) -> str:
    """The dotted prefix every name of `tensors` has ("module." of DistributedDataParallel, "_orig_mod." of
    torch.compile, a wrapper's own) whose removal gives more of the network's names than the names as they are
    (then what still differs is what a refusal names), or "" for none."""
    if not tensors:
        return ""
    best, matched = "", len(set(tensors) & set(own))
    parts = next(iter(tensors)).split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i]) + "."
        if not all(name.startswith(prefix) for name in tensors):
            break
        found = len({n[len(prefix):] for n in tensors} & set(own))
        if found > matched:
            best, matched = prefix, found
    return best


def _names(names: list[str], most: int = 8) -> str:
    return repr(names) if len(names) <= most else f"{names[:most]!r} and {len(names) - most} more"


def _play_metadata(policy: dict[str, Any]) -> dict[str, Any]:
    from common.policy_config import PolicyConfig, play_metadata

    return play_metadata(PolicyConfig.from_mapping(policy))


def _refuse(message: str) -> int:
    print(f"league import: {message}", file=sys.stderr)
    return SETUP_ERROR_EXIT
