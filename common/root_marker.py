"""Which directory is the league's shared root, as workers can check it.

The coordinator names checkpoints by their paths under its shared root; a worker reads them under its own
`--shared-root`. A worker given another directory (a share mounted on one side only, a typo) found no checkpoint
the league named: an actor played an old version it found there, or failed every job, and nothing said why (a
review). The coordinator keeps a random id in a marker file at its root's top and sends it at registration; a
worker compares it with its own root's marker.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from common.durable_files import fsync_dir, fsync_file
from common.rpc import RegistrationError

ROOT_MARKER = ".league_root.json"
"""The marker's name at the top of a shared root."""
ROOT_MARKER_WAIT_S = 30.0
"""How long a worker waits for its --shared-root's marker to show before it says the root is not the league's: on
NFS a file another machine created may show seconds late."""


def ensure_root_id(root: Path) -> str:
    """The id in `root`'s marker, written first when there is none (created once: of two coordinators starting on
    one root, the second reads the first's). Raises OSError when it can be neither read nor written."""
    marker = Path(root) / ROOT_MARKER
    found = read_root_id(root)
    if found is not None:
        return found
    # Readable by all (0o644 less the umask, as every file the store writes): tempfile.mkstemp's 0o600 kept
    # workers running as another user than the coordinator from reading it, and they stopped saying the root had
    # no marker (a review).
    temp = str(Path(root) / f".{ROOT_MARKER}.{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump({"root_id": secrets.token_hex(16)}, out)
        fsync_file(Path(temp))
        try:
            os.link(temp, marker)  # (never replaces one there: a concurrent start's stays)
        except FileExistsError:
            pass
        fsync_dir(Path(root))
    finally:
        os.unlink(temp)
    found = read_root_id(root)
    if found is None:
        raise OSError(f"{marker}: written, but it does not read back as a shared-root marker")
    return found


def read_root_id(root: Path) -> str | None:
    """The id in `root`'s marker; None when there is none, or it cannot be read or is not one."""
    try:
        return _read_marker(root)
    except PermissionError:
        return None


def _read_marker(root: Path) -> str | None:
    """`read_root_id`, except that a marker this process may not read raises PermissionError: it is there, and
    waiting for it to show would only delay the same refusal."""
    try:
        with open(Path(root) / ROOT_MARKER, "rb") as marker:
            data = json.loads(marker.read(4096))
    except PermissionError:
        raise
    except (OSError, ValueError):
        return None
    root_id = data.get("root_id") if isinstance(data, dict) else None
    return root_id if isinstance(root_id, str) and root_id else None


def check_shared_root(root: Path, expected: str, stopped: Callable[[float], bool],
                      wait_s: float = ROOT_MARKER_WAIT_S) -> None:
    """Raise `RegistrationError` when a worker's `root` is not the coordinator's, whose marker id is `expected`
    (another id in its marker, or none after `wait_s`: a new file may show late on NFS). Nothing is checked when
    `expected` is empty (an older coordinator, or a root it could not mark), nor once `stopped(1.0)` (waits up to
    that many seconds, True once the worker stops) says the worker stopped while waiting."""
    if not expected:
        return
    deadline = time.monotonic() + wait_s
    try:
        found = _read_marker(root)
        while found is None and time.monotonic() < deadline:
            if stopped(1.0):
                return
            found = _read_marker(root)
    except PermissionError as err:
        raise RegistrationError(f"--shared-root {root}: its {ROOT_MARKER} cannot be read ({err.strerror}): this worker "
                                f"runs as uid {os.getuid()}, which must be able to read the shared root's files") from None
    if found == expected:
        return
    held = f"it has no {ROOT_MARKER}" if found is None else f"its {ROOT_MARKER} holds id {found}, the coordinator's root {expected}"
    raise RegistrationError(f"--shared-root {root} is not the coordinator's shared root ({held}): the checkpoints "
                            "the league names would not be found there; give the directory where the coordinator's "
                            "shared root is mounted")
