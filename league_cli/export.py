"""`league export`: a published checkpoint as a standalone policy file (`torch.export`), to play it where only
torch is installed (a game server, another framework, an evaluation of one's own).

The checkpoint is found and built as `league eval` does (league_cli/eval.py `load_checkpoint`); the export is
`common.algorithms.policy_export`. The file is written whole or not at all (a temporary file renamed into
place), and an existing file is kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import cli_args
from common.exit_codes import FAILURE_EXIT
from common.job_limits import MANIFEST_SUFFIX, PIN_SUFFIX, TRAINING_STATE_SUFFIX
from common.root_marker import ROOT_MARKER
from common.rpc import SHARED_ROOT_ENV_VAR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=cli_args.path_text, required=True,
                        help="checkpoint path relative to --shared-root, or an absolute path inside a shared root; "
                             "a player's folder stands for its newest version")
    parser.add_argument("--out", type=cli_args.file_path, required=True,
                        help="the file to write (torch.export's archive; .pt2 by convention)")
    parser.add_argument("--config", type=cli_args.path, default=None,
                        help="league YAML whose policy and env the checkpoint belongs to (default: the config.yaml "
                             "of the league run directory the checkpoint lies in, else the embedded league)")
    parser.add_argument("--shared-root", type=cli_args.path, default=None,
                        help=f"the checkpoints' shared root (default ${SHARED_ROOT_ENV_VAR})")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--json", action="store_true", help="print the export's policy.json instead of a summary")
    parser.set_defaults(seed=0)


def main(args: argparse.Namespace) -> int:
    out: Path = args.out
    try:  # (a directory on the way that may not be searched raises, as a PermissionError, rather than answers)
        if out.is_dir():
            return _refuse(f"--out {out} is a directory: name the file to write")
        if not out.parent.is_dir():
            what = "is not a directory" if out.parent.exists() else "does not exist"
            return _refuse(f"--out {out}: its directory {out.parent} {what}")
        if (out.exists() or out.is_symlink()) and not args.force:  # (a dangling link too: the write keeps it)
            return _refuse(f"--out {out} exists: give --force to replace it")
    except OSError as err:
        return _refuse(f"--out {out}: {err.strerror or err}")
    import numpy as np
    import torch

    from common.algorithms.policy_export import ExportError, export_policy
    from common.durable_files import atomic_create, atomic_write, full_disk_note, out_of_space
    from league_cli.eval import CheckpointRefused, load_checkpoint

    torch.set_num_threads(1)
    try:
        loaded = load_checkpoint(args, "export")
    except CheckpointRefused as err:
        return _refuse(str(err))
    ref = loaded.ref
    if loaded.file is not None and _same_file(out, loaded.file, loaded.file.with_name(loaded.file.name + ".json")):
        # --force replaced the published checkpoint (or its manifest) with the export: the league's jobs then
        # failed on it (a review). Never, whatever the flags.
        return _refuse(f"--out {out} is the checkpoint being exported (or its manifest): name another file")
    if args.force and loaded.shared_root is not None and (kept := _league_file(out, loaded.shared_root)):
        # Another version, its training state, another player's checkpoint: each one replaced made the league's
        # jobs (or a learner's resume) fail on it as the checkpoint above did (a review).
        return _refuse(f"--out {out} is {kept} of the league in {loaded.shared_root}: --force does not replace "
                       "the league's files; name another file")
    source = {
        "checkpoint": {"path": ref.path, "version": ref.version,
                       **{k: ref.metadata[k] for k in ("agent_steps", "worker_id") if k in ref.metadata}},
        "env": {"name": loaded.env_name, "kwargs": loaded.env_kwargs},
        "league_config": None if loaded.config is None else str(Path(loaded.config).absolute()),
    }
    print(f"league export: tracing {ref.path} (v{ref.version}) ...", file=sys.stderr, flush=True)
    algorithm = str(loaded.policy.get("algorithm", "ppo"))
    # A Box action is given in the env's dtype, as league eval sends it (float64 for a float64 Box).
    env_dtype = np.dtype(getattr(loaded.info.action_spec, "dtype", np.float32))
    action_dtype = env_dtype.name if env_dtype.kind == "f" else "float32"
    try:
        exported = export_policy(loaded.task.algorithm.model, algorithm, source, action_dtype)
    except ExportError as err:
        return _refuse(f"{ref.path}: {err}")
    try:
        # Without --force, a file made at --out while the export was traced (another export) is kept, not replaced.
        (atomic_write if args.force else atomic_create)(out, exported.data)
    except FileExistsError:
        return _refuse(f"--out {out} exists: give --force to replace it")
    except OSError as err:
        if out_of_space(err):  # space may come back: a failure (1), not a usage error (2)
            print(f"league export: --out {out}: {err}{full_disk_note(out)}", file=sys.stderr)
            return FAILURE_EXIT
        return _refuse(f"--out {out}: {err}")
    meta = exported.metadata
    if args.json:
        print(json.dumps(meta))
        return 0
    print(f"{ref.path} (v{ref.version}, {algorithm}, {loaded.env_name}) -> {out} ({len(exported.data) / 1e6:.1f} MB)")
    print(f"  {meta['call']}")
    print("  load it with torch alone: policy = torch.export.load(PATH).module(); the greedy action comes first")
    return 0


def _same_file(out: Path, *files: Path) -> bool:
    """Whether `out` is one of `files` (by inode: a link or another spelling of the path is the same file)."""
    for file in files:
        try:
            if out.samefile(file):
                return True
        except OSError:  # one of them is not there
            continue
    return False


def _league_file(out: Path, root: Path) -> str:
    """What of the league's files `out` is, when it is one there inside `root` (by real path: a link into it
    counts); "" when it is none (an earlier export, say: `--force` replaces it). The league's: a player's folder's
    files (it has a `latest.json`), a checkpoint with its manifest beside it (a snapshot, a pretrained one), a
    manifest, training state or pin beside a file, the root's marker, the coordinator's state."""
    from common.checkpoint_store import is_manifest
    from league_service.coordinator import STATE_FILE_NAME

    if not (out.exists() or out.is_symlink()):
        return ""
    try:
        where, top = out.parent.resolve(strict=True) / out.name, root.resolve(strict=True)
    except OSError:
        return ""
    if not where.is_relative_to(top):
        return ""
    name, folder = where.name, where.parent
    if (folder / "latest.json").exists():
        return "a file of a player's folder"
    if where.relative_to(top).parts[0] == "tensorboard":
        return "a file of the learners' TensorBoard logs"
    if is_manifest(Path(f"{where}{MANIFEST_SUFFIX}")):
        return "a published checkpoint"
    for suffix, what in ((MANIFEST_SUFFIX, "a checkpoint's manifest"), (TRAINING_STATE_SUFFIX, "a training state"),
                         (PIN_SUFFIX, "a checkpoint's pin")):
        if name.endswith(suffix) and is_manifest(folder / (name[: -len(suffix)] + MANIFEST_SUFFIX)):
            return what
    if name == ROOT_MARKER:
        return "the shared root's marker"
    if name.startswith(STATE_FILE_NAME):
        return "the coordinator's state"
    return ""



def _refuse(message: str) -> int:
    print(f"league export: {message}", file=sys.stderr)
    return 2
