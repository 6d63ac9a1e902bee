"""Chaos: the shared filesystem fills up under a learner that publishes checkpoints, then space returns.

The share is a small tmpfs mounted for the test (root only; skipped otherwise) and filled with a filler file.
What must hold: publishing fails with a clear ERROR line in the learner's log and the learner keeps running
(no crash, no restart loop); nothing of a failed publish becomes visible (no torn or orphan weights file, no
temp file left, latest.json and every manifest name complete files that verify); actors keep the last good
version; once the filler is deleted the learner publishes again, numbered above everything before; and the
league's invariants hold at the end.

Short version: an in-process coordinator (its state file off the share), a real learner process and chunks
pushed by the test. Slow version: `league run` (coordinator, learner, actors as processes) on the small share,
filled twice for a while.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from common.checkpoint_store import LATEST, MANIFEST_SUFFIX, CheckpointError, CheckpointStore
from common.paths import SharedRoot
from common.rpc import ServerOptions, parse_listen_line
from league_service.checkpoint_copy import SnapshotCopier
from league_service.coordinator import Coordinator, CoordinatorSettings
from league_service.server import CoordinatorServer, serve_coordinator
from learner_service.learner_testing import Rollout, learner_command
from learner_service.session import MIN_UNPUBLISHED_UPDATES
from tests.chaos.invariants import assert_invariants, check_status
from tests.integration.test_learner_service import PLAYER, acting_task, player_status, push, solo_config
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
SHARE_BYTES = 32 * 2**20


# ---- the small filesystem ------------------------------------------------------------------------------------


def _mount_tmpfs(path: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of ``size_bytes`` on ``path``; None when done, else why it cannot be (a skip reason)."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}"
    return None


def _unmount(path: Path) -> None:
    """Unmount, lazily if something still holds a file there (a killed process's fd is gone soon after)."""
    done = subprocess.run(["umount", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def small_share(path: Path, size_bytes: int = SHARE_BYTES) -> Iterator[Path]:
    """A tmpfs on ``path`` for the block; unmounted whatever happens (skips the test when it cannot mount)."""
    reason = _mount_tmpfs(path, size_bytes)
    if reason is not None:
        pytest.skip(f"disk-full chaos needs a small filesystem: {reason}")
    try:
        yield path
    finally:
        _unmount(path)


def fill(share: Path) -> Path:
    """Write a filler file until the filesystem says it is full; returns the filler (delete it for space)."""
    filler = share / "filler.bin"
    block = b"\xa5" * (1 << 20)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, block[:size])
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


# ---- what may be visible on the share ------------------------------------------------------------------------


def assert_share_consistent(share: Path, player_id: str) -> list[int]:
    """Everything published verifies and nothing else is there; returns the published versions.

    No temp file, no weights file without its manifest (a half-published version), every manifest's weights
    load with their checksum, and latest.json names the newest of them.
    """
    store = CheckpointStore(share)
    directory = share / player_id
    names = sorted(os.listdir(directory))
    temps = [n for n in names if n.endswith(".tmp")]
    assert not temps, f"temp files left on the share: {temps}"
    weights = [n for n in names if n.endswith(".pt")]
    orphans = [n for n in weights if n + MANIFEST_SUFFIX not in names]
    assert not orphans, f"weights files that no manifest publishes: {orphans}"
    versions = []
    for ref in store.versions(player_id):
        checkpoint = store.load(ref.path, ref.version)  # raises on any torn or mismatched file
        assert checkpoint.tensors
        versions.append(ref.version)
    latest = store.latest(player_id)
    assert latest is not None and versions and latest.version == max(versions), (latest, versions)
    assert json.loads((directory / LATEST).read_text())["path"] == latest.path
    return versions


def assert_share_consistent_while_publishing(share: Path, player_id: str, timeout_s: float = 30.0) -> list[int]:
    """`assert_share_consistent` on a share a live learner keeps publishing to: a look can fall in the middle
    of a publish (its temp file, weights before their manifest, a latest.json newer than the listing), so the
    share must be found consistent at some instant within `timeout_s`; the last failure is reported."""
    failures: list[BaseException] = []

    def consistent() -> list[int] | None:
        try:
            return assert_share_consistent(share, player_id)
        except (AssertionError, CheckpointError) as err:
            failures.append(err)
            return None

    return wait_until("a consistent look at the share between two publishes", consistent, timeout_s,
                      lambda: repr(failures[-1]) if failures else "")


# ---- the short version: one learner process, chunks pushed by the test ------------------------------------


@contextlib.contextmanager
def coordinator_on(share: Path, state_path: Path) -> Iterator[CoordinatorServer]:
    """A real coordinator in process; its SQLite state off the share (a full share is the learner's problem)."""
    coordinator = Coordinator(
        solo_config(batch_size=128, publish_every=1),
        CoordinatorSettings(shared_root=share, state_path=state_path, lease_timeout_s=5.0, rng_seed=0),
    )
    server = serve_coordinator(coordinator, ServerOptions(host="127.0.0.1", port=0))
    try:
        yield server
    finally:
        server.stop(grace_s=1.0)


@contextlib.contextmanager
def learner_process(coordinator: str, share: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = learner_command("--coordinator", coordinator, "--shared-root", str(share), "--worker-id",
                              "learner-df", "--device", "cpu", "--log-level", "INFO")
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):  # (whether or not it still runs: what it started)
            os.killpg(proc.pid, 9)
        proc.wait(30)


def learner_address(log: Path) -> str:
    """The address from the learner's LISTENING line ("" before it is bound)."""
    for line in log.read_text(errors="replace").splitlines():
        parsed = parse_listen_line(line)
        if parsed is not None and parsed[0] == "learner":
            return parsed[1]
    return ""


def test_a_full_share_fails_publishing_clearly_and_training_resumes_when_space_returns(tmp_path):
    share_dir = tmp_path / "share"
    log = tmp_path / "learner.log"
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)

    def context() -> str:
        return log.read_text(errors="replace")[-6000:] if log.exists() else "(no learner log)"

    try:
        with small_share(share_dir) as share, coordinator_on(share, tmp_path / "state.sqlite") as coordinator, \
                learner_process(coordinator.address, share, log) as proc:
            address = wait_until("the learner to listen", lambda: learner_address(log), 90, context)
            wait_until("version 0", lambda: player_status(coordinator.address).checkpoint_path, 90, context)
            chunks = iter(rollout.chunks(acting_task(solo_config(), share), 24, policy_version=0))
            push(address, [next(chunks), next(chunks)])
            wait_until("versions 1 and 2", lambda: player_status(coordinator.address).checkpoint_version >= 2,
                       60, context)
            before = CheckpointStore(share).latest(PLAYER)
            earlier = assert_invariants(coordinator.address, shared_root=share)

            filler = fill(share)
            # 12 chunks, one update each: more than the learner may train ahead of the published version while
            # publishing fails, so the stream waits (backpressure) until space returns.
            late = [next(chunks) for _ in range(12)]
            pushing = threading.Thread(target=push, args=(address, late, 180.0), daemon=True)
            pushing.start()
            wait_until("the publish failure to be logged", lambda: "No space left on device" in context(), 60,
                       context)
            assert proc.poll() is None, f"the learner died on a full disk:\n{context()}"
            failure = next(line for line in context().splitlines() if "publishing version" in line)
            assert " ERROR " in failure and "failed" in failure and "the shared filesystem is full" in failure
            wait_until("training to wait for publishing", lambda: "training waits until publishing" in context(),
                       60, context)
            assert f"{MIN_UNPUBLISHED_UPDATES} updates are not published" in context()
            assert pushing.is_alive(), "every chunk was trained on while nothing could be published"
            assert CheckpointStore(share).latest(PLAYER) == before, "a version was published on a full disk"
            assert player_status(coordinator.address).checkpoint_version == before.version
            assert_share_consistent(share, PLAYER)

            filler.unlink()
            # The learner retries on its own backoff; the first version published then is as far as it trained.
            wait_until("publishing to resume", lambda: player_status(coordinator.address).checkpoint_version
                       > before.version, 60, context)
            assert "publishing works again" in context()
            pushing.join(120)
            assert not pushing.is_alive(), context()
            # One update per chunk (128 samples each), each published: quiet once the last one is.
            final_version = before.version + len(late)
            wait_until(f"version {final_version}", lambda: player_status(coordinator.address).checkpoint_version
                       == final_version, 60, context)
            assert_share_consistent(share, PLAYER)
            again = f"publishing works again: version {before.version + MIN_UNPUBLISHED_UPDATES} published"
            assert again in context()
            status = player_status(coordinator.address)
            assert status.agent_steps > before.metadata["agent_steps"]
            assert proc.poll() is None, context()
            final = assert_invariants(coordinator.address, shared_root=share, earlier=earlier)
            assert final is not None and final.counters.jobs_failed == 0  # the learn job never failed

            proc.terminate()  # SIGTERM: final checkpoint, report, release
            assert proc.wait(60) == 0, context()
            assert "Traceback" not in context().split("No space left on device")[0]
            assert_share_consistent(share, PLAYER)
    finally:
        rollout.close()


# ---- the slow version: a whole league run on a small share ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_league_run_survives_the_share_filling_up_twice(tmp_path):
    from tests.system.test_league_run import LeagueRun, _active, _history

    run_dir = tmp_path / "run"
    with small_share(run_dir / "shared") as share:
        run = LeagueRun(tmp_path, seconds=150)
        try:
            player = _active(run.wait_for(lambda r: _active(r)["checkpoint_version"] >= 2, 150,
                                          "published checkpoints"))["player_id"]
            logs = run_dir / "logs"

            def learner_log() -> str:
                return "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob("learner*.log")))

            earlier = _history(run_dir)[-1]
            for cut in range(2):
                failures_before = learner_log().count("the shared filesystem is full")
                filler = fill(share)
                run.wait_for(lambda _r, n=failures_before: learner_log().count("the shared filesystem is full") > n,
                             90, f"publishing to fail on the full share (cut {cut})")
                at_failure = CheckpointStore(share).latest(player)
                time.sleep(10)  # hold the share full while actors keep playing and the learner keeps training
                assert CheckpointStore(share).latest(player) == at_failure, "published on a full share"
                assert _active(_history(run_dir)[-1])["checkpoint_version"] == at_failure.version
                assert_share_consistent_while_publishing(share, player)  # it keeps trying, and failing
                filler.unlink()
                run.wait_for(lambda r, v=at_failure.version: _active(r)["checkpoint_version"] > v, 120,
                             f"publishing to resume (cut {cut})")
                assert_share_consistent_while_publishing(share, player)
            assert run.finish(timeout_s=240) == 0, run.output()
            history = _history(run_dir)
            check_status(history[-1], earlier=earlier, shared_root=share)
            steps = [_active(r)["agent_steps"] for r in history]
            versions = [_active(r)["checkpoint_version"] for r in history]
            assert steps == sorted(steps) and versions == sorted(versions)
            assert "publishing works again" in learner_log()
            out = run.output(tail=None)
            assert "learner-0 exited" not in out, "the learner crashed on the full share"
            # The run's own output says why publishing stopped, as it happens (not only the learner's log).
            assert any(line.startswith("learner-0: ERROR") and "the shared filesystem is full" in line
                       for line in out.splitlines()), out[-6000:]
            assert_share_consistent(share, player)
        finally:
            run.close()


def test_a_snapshot_that_fails_on_a_full_share_leaves_nothing_and_works_once_space_returns(tmp_path):
    """The hard link of a snapshot needs no space, its manifest does: the failed snapshot left the link behind
    (keeping the source's blocks, matching no cleanup pattern) and every retry failed with FileExistsError."""
    with small_share(tmp_path / "share", size_bytes=4 * 2**20) as share:
        store = CheckpointStore(share)
        ref = store.publish("p", {"w": np.ones(1000, np.float32)}, 1)
        copier = SnapshotCopier(SharedRoot(share))
        dest = "p/v0000000001_100.pt"
        filler = fill(share)
        with pytest.raises(OSError) as err:
            copier(ref.path, dest)
        assert err.value.errno == errno.ENOSPC
        assert not (share / dest).exists() and not (share / (dest + MANIFEST_SUFFIX)).exists()
        filler.unlink()
        copier(ref.path, dest)
        assert store.load(dest, 1).tensors["w"].sum() == 1000
