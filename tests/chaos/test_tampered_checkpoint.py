"""Chaos: corrupt and tampered checkpoints on the share are detected and never loaded, by real processes.

Two kinds of bad file:
- corrupt: bytes flipped in a published weights file (its manifest no longer matches);
- tampered: the weights file replaced with a malicious pickle whose ``__reduce__`` runs a shell command that
  creates a marker file, *and* the manifest rewritten to match it (an attacker with write access to the share),
  so only the loader's refusal to unpickle anything but plain tensors stands between it and the command. A
  control shows the payload does create the marker when unpickled plainly.

Who must refuse them, and go on: an actor process (acts with the newest version that verifies, plays on, never
fails a job for it), a restarting learner process (resumes from the newest version that verifies and publishes
above the bad ones) and `league eval` (exits with a clear error). The marker never appears, and the league's
invariants hold. The slow version plants a tampered latest version into a running `league run`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from common.algorithms.registry import make_computation_task
from common.checkpoint_store import FORMAT, LATEST, MANIFEST_SUFFIX, CheckpointStore
from common.envs.policy_view import policy_specs
from common.envs.registry import make_env
from league_service.config import config_from_dict
from league_service.coordinator_testing import running_coordinator, server_process
from learner_service.learner_testing import Rollout, learner_command, running_learner
from tests.chaos.invariants import assert_invariants
from tests.integration.test_learner_service import PLAYER, acting_task, player_status, push, solo_config
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
POLICY = {"algorithm": "ppo"}


# ---- making bad checkpoints ----------------------------------------------------------------------------------


class _Payload:
    """Unpickling this runs ``touch <marker>`` (what an attacker's code would do, harmlessly)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def malicious_torch_file(marker: Path, version: int) -> bytes:
    """A torch.save zip with the checkpoint's own layout, plus an object that runs a command when unpickled."""
    buffer = io.BytesIO()
    payload = {"format": FORMAT, "version": version, "tensors": {"w": torch.zeros(2)}, "x": _Payload(marker)}
    torch.save(payload, buffer)
    return buffer.getvalue()


def malicious_plain_pickle(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker))


def assert_payload_is_live(data: bytes, marker: Path, loader: Callable[[bytes], object]) -> None:
    """Control: a plain unpickler does run the payload (so the system checks below prove something)."""
    assert not marker.exists()
    with contextlib.suppress(Exception):
        loader(data)
    assert marker.exists(), "the malicious payload did not run even when unpickled plainly"
    marker.unlink()


def _digest(data: bytes, algorithm: str) -> str:
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    if algorithm == "blake3":
        import blake3

        return blake3.blake3(data).hexdigest()
    raise AssertionError(f"unknown digest algorithm {algorithm!r} in a manifest")


def replace_with_matching_manifest(share: Path, relative: str, data: bytes) -> None:
    """Replace a published weights file with ``data`` and make its manifest describe ``data`` exactly."""
    weights = share / relative
    weights.write_bytes(data)
    manifest_path = weights.with_name(weights.name + MANIFEST_SUFFIX)
    body = json.loads(manifest_path.read_text())
    if "digest" in body:
        algorithm = body["digest"].split(":", 1)[0]
        body["digest"] = f"{algorithm}:{_digest(data, algorithm)}"
    else:
        body["sha256"] = _digest(data, "sha256")
    body["size"] = len(data)
    manifest_path.write_text(json.dumps(body, sort_keys=True))


def flip_bytes(share: Path, relative: str) -> None:
    """Corrupt a published weights file in place, as bit rot would: invert 64 bytes in its middle (same size,
    the manifest stays)."""
    path = share / relative
    with open(path, "r+b") as f:
        middle = os.fstat(f.fileno()).st_size // 2
        f.seek(middle)
        flipped = bytes(b ^ 0xFF for b in f.read(64))
        f.seek(middle)
        f.write(flipped)


# ---- processes -----------------------------------------------------------------------------------------------


def _learner(coordinator: str, share: Path, log: Path):
    return server_process(
        learner_command("--coordinator", coordinator, "--shared-root", str(share), "--worker-id", "learner-t",
                        "--device", "cpu", "--log-level", "INFO"),
        log,
    )


def _eval(share: Path, checkpoint: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "league_cli", "eval", "--checkpoint", checkpoint, "--shared-root", str(share),
            "--games", "2"]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


@contextlib.contextmanager
def _evals(share: Path, checkpoints: list[str]) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        for c in checkpoints:  # started inside the try: one that fails to start leaves none behind
            procs.append(_eval(share, c))
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):  # (whether or not it still runs: what it started)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)


# ---- a restarting learner and league eval --------------------------------------------------------------------


def test_a_restarting_learner_and_league_eval_refuse_bad_checkpoints(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    marker = tmp_path / "PWNED"
    cfg = solo_config(batch_size=128, publish_every=1)
    rollout = Rollout(player_id=PLAYER, env_num=8, unroll_len=16)
    logs = [tmp_path / "learner.log"]

    def context() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in logs if p.exists())

    try:
        with running_coordinator(cfg, share, lease_timeout_s=3.0) as coordinator:
            # The player's first learner (in process: only the restarted one below is under test) trains it to
            # version 3 and hands it back; the league then names version 3 as the player's checkpoint.
            with running_learner(coordinator.address, share, worker_id="learner-t") as first:
                first.learner.wait_published(PLAYER, 0, 60)
                push(first.address, rollout.chunks(acting_task(cfg, share), 3, policy_version=0))
                first.learner.wait_published(PLAYER, 3, 60)
            before = player_status(coordinator.address)
            assert before.checkpoint_version == 3 and not before.learner_worker_id
            earlier = assert_invariants(coordinator.address, shared_root=share)
            store = CheckpointStore(share)
            paths = {ref.version: ref.path for ref in store.versions(PLAYER)}
            assert sorted(paths) == [0, 1, 2, 3]

            torch_payload = malicious_torch_file(marker, 3)
            plain_payload = malicious_plain_pickle(marker)
            assert_payload_is_live(torch_payload, marker, lambda d: torch.load(io.BytesIO(d), weights_only=False))
            assert_payload_is_live(plain_payload, marker, pickle.loads)
            replace_with_matching_manifest(share, paths[3], torch_payload)  # the latest: what the league names
            replace_with_matching_manifest(share, paths[2], plain_payload)
            flip_bytes(share, paths[0])

            evaluated = [paths[3], paths[0]]  # a tampered and a corrupt file (the learner meets the plain pickle)
            with _evals(share, evaluated) as evals, \
                    _learner(coordinator.address, share, logs[0]) as proc:
                wait_until("the learner to resume", lambda: player_status(coordinator.address).checkpoint_version
                           > 3, 90, context)
                text = logs[0].read_text(errors="replace")
                assert f"{paths[3]}: cannot resume from it" in text and f"{paths[2]}: cannot resume from it" in text
                assert f"{paths[3]}: the league's checkpoint cannot be used" in text
                assert f"resuming from {paths[1]} instead" in text, text
                status = player_status(coordinator.address)
                assert status.checkpoint_version == 4 and status.agent_steps >= before.agent_steps
                assert store.load_latest(PLAYER).ref.metadata["agent_steps"] >= before.agent_steps

                push(proc.address, rollout.chunks(acting_task(cfg, share), 1, policy_version=4))
                wait_until("training to go on", lambda: player_status(coordinator.address).checkpoint_version >= 5,
                           60, context)
                for checkpoint, ran in zip(evaluated, evals, strict=True):
                    out, err = ran.communicate(timeout=120)
                    assert ran.returncode != 0, f"league eval accepted {checkpoint}:\n{out}\n{err}"
                    assert checkpoint in err and ("corrupt or tampered" in err or "not a plain-tensor" in err), err
                    assert "Traceback" not in err, err
                assert proc.popen.poll() is None, context()
                assert proc.terminate() == 0, context()
            assert not marker.exists(), "a tampered checkpoint's code ran"
            assert_invariants(coordinator.address, shared_root=share, earlier=earlier)
    finally:
        rollout.close()


# ---- an actor ------------------------------------------------------------------------------------------------


def _short_jobs_config():
    """Solo CartPole with short jobs, so the actor starts (and picks its version for) many of them."""
    import dataclasses

    cfg = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}, "max_active_player_job": 1},
        "env": {"name": "CartPole-v1", "env_num": 2, "episode_num": 2},
    })
    return dataclasses.replace(cfg, policy=POLICY)


def _publisher(share: Path, staging: Path) -> Callable[[int, bool], str]:
    """Publish a version of the player's weights as its learner would; returns the path. A corrupt version is
    prepared in ``staging`` and then moved into place file by file in publishing order (weights, manifest,
    latest.json), so no reader can ever see it intact."""
    inputs, actions = policy_specs(make_env("CartPole-v1").info())
    store = CheckpointStore(share)
    staged = CheckpointStore(staging)

    def publish(version: int, corrupt: bool = False) -> str:
        weights = make_computation_task(POLICY, inputs, actions, "cpu", seed=version).get_weights()
        if not corrupt:
            return store.publish(PLAYER, weights, version).path
        path = staged.publish(PLAYER, weights, version).path
        flip_bytes(staging, path)
        for name in (path, path + MANIFEST_SUFFIX, f"{PLAYER}/{LATEST}"):
            os.replace(staging / name, share / name)
        return path

    return publish


@contextlib.contextmanager
def _actor(address: str, share: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "actor_service.cli", "actor", "--coordinator", address, "--shared-root",
               str(share), "--manager", "base", "--worker-id", "actor-t", "--log-level", "DEBUG"]  # job starts: _acts_with
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):  # (whether or not it still runs: what it started)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _acts_with(log: Path, version: int) -> bool:
    """The actor started a job with, or reloaded, this version of the player."""
    text = log.read_text(errors="replace")
    return f": {PLAYER} v{version} vs" in text or f"reloaded {PLAYER} at version {version}" in text


def _finished(address: str) -> int:
    """Jobs finished so far, with the invariants checked on the way."""
    status = assert_invariants(address)
    assert status is not None
    return status.counters.jobs_finished


def test_an_actor_never_loads_a_bad_checkpoint_and_plays_on_with_a_good_one(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    marker = tmp_path / "PWNED"
    log = tmp_path / "actor.log"
    staging = tmp_path / "staging"
    staging.mkdir()
    publish = _publisher(share, staging)

    def context() -> str:
        return log.read_text(errors="replace")[-6000:] if log.exists() else "(no actor log)"

    publish(1)
    publish(2)
    bad_latest = publish(3)
    replace_with_matching_manifest(share, bad_latest, malicious_torch_file(marker, 3))
    with running_coordinator(_short_jobs_config(), share, needs_learner=False, lease_timeout_s=5.0) as server:
        earlier = assert_invariants(server.address, shared_root=share)
        with _actor(server.address, share, log) as proc:
            # The latest version is tampered: the actor acts with the newest version that verifies.
            wait_until("jobs played with version 2", lambda: _acts_with(log, 2), 90, context)
            wait_until("two finished jobs", lambda: _finished(server.address) >= 2, 60, context)

            # A good version and then a corrupt one: the corrupt one is skipped, the good one used.
            publish(4)
            publish(5, True)
            wait_until("jobs played with version 4", lambda: _acts_with(log, 4), 60, context)
            done = _finished(server.address)
            wait_until("more finished jobs", lambda: _finished(server.address) >= done + 2, 60, context)

            # The learner publishes a good one again: the actor moves on to it.
            publish(6)
            wait_until("version 6 in use", lambda: _acts_with(log, 6), 60, context)
            assert proc.poll() is None, context()
            final = assert_invariants(server.address, shared_root=share, earlier=earlier)
    text = log.read_text(errors="replace")
    assert final.counters.jobs_failed == 0, text  # a bad checkpoint never cost a job
    for bad in (bad_latest, f"{PLAYER}/v{5:010d}.pt"):
        assert text.count(f"{bad} (version") == 1, f"{bad} not reported exactly once:\n{text}"
    assert "will not be read again" in text
    assert not marker.exists(), "a tampered checkpoint's code ran"


# ---- slow: a tampered latest version inside a running league -------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_league_run_survives_a_tampered_latest_checkpoint_and_a_learner_crash(tmp_path):
    from tests.system.test_league_run import LeagueRun, _active, _history, _worker_pid

    marker = tmp_path / "PWNED"
    run = LeagueRun(tmp_path, seconds=120)
    share = run.run_dir / "shared"
    try:
        first = run.wait_for(lambda r: _active(r)["checkpoint_version"] >= 3, 150, "published checkpoints")
        player = _active(first)["player_id"]
        pid = _worker_pid(run.run_dir, "learner-0")
        assert pid is not None
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # no more publishes while we tamper
        store = CheckpointStore(share)
        refs = store.versions(player)
        latest = store.latest(player)
        replace_with_matching_manifest(share, latest.path, malicious_torch_file(marker, latest.version))
        flip_bytes(share, refs[-2].path)
        run.wait_for(lambda r: _active(r)["checkpoint_version"] > latest.version + 2, 150,
                     "the restarted learner to publish above the tampered versions")
        assert run.finish(timeout_s=240) == 0, run.output()
        history = _history(run.run_dir)
        steps = [_active(r)["agent_steps"] for r in history]
        assert steps == sorted(steps), "a player's steps went backwards"
        assert_invariants(status=history[-1], earlier=first, shared_root=share)
        logs = "\n".join(p.read_text(errors="replace") for p in (run.run_dir / "logs").glob("*.log"))
        assert f"{latest.path}: cannot resume from it" in logs
        assert int(history[-1]["counters"].get("jobs_failed", 0) or 0) == 0, "a bad checkpoint cost a job"
        assert not marker.exists(), "a tampered checkpoint's code ran"
    finally:
        run.close()
