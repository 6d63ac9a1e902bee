"""Checkpoint publish + load throughput for a 100 MB state dict against raw `dd` on the same disk, same run.

publish = torch.save streamed to a temp file with BLAKE3 alongside + fsync + rename + fsync(dir) + manifest and
latest.json + retention (removing the version that falls out of keep_last); load = one read into private
memory + BLAKE3 of it + torch's weights-only unpickler handing out that memory as the tensors. Baselines:
`dd if=/dev/zero bs=1M conv=fsync` for writing, `dd of=/dev/null bs=1M` of the just-written file for reading
(page-cache warm like a load right after a publish). The round trip (publish, then load the same bytes) is
compared with its own counterpart, a dd write followed by a dd read of the same size (each round's two times
summed); it used to be compared with the dd write alone, which charged the whole load to the store. Rounds
alternate store and dd so that disk-speed swings hit both; medians reported. Untimed warm-up rounds until
retention is in its steady state (`KEEP_LAST` of them): from then on every timed publish retires one old
version, and the first few 100 MB loads of a process, several times slower while the VM backs fresh memory, are
behind us. Not symmetric with dd: a publish unpublishes and renames the old version and deletes its file in the
background (on this ext4, mounted with `discard` and no journal, removing 100 MB waits ~15 ms for the disk),
which overlaps the timed load and dd rounds here (as it overlaps training in a learner; the next publish waits
for it at its start), where every timed dd truncates its previous file inside its own time.

A row times publishing a small network with many versions kept against the default keep_last
(`many_versions_row`): every publish lists the player's directory. The last one times the same publish with a
learner's full list of trained chunks in its training state against it without one (`trained_ledger_row`).

    python bench/bench_checkpoint.py [--quick] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
# First, even when ROOT is on PYTHONPATH: run as `python bench/X.py`, sys.path[0] is bench/, whose common.py
# would otherwise shadow the project's `common` package.
sys.path.insert(0, str(ROOT))

from bench.common import BenchRow, exit_on_sigterm, print_rows  # noqa: E402
from common.checkpoint_store import CheckpointStore  # noqa: E402

GOAL = 0.7
KEEP_LAST = 2
SMALL_KEEP_LAST = 5
"""The default `learner.keep_last`: the baseline of the many-versions row."""


def state_dict(total_bytes: int) -> dict[str, np.ndarray]:
    """~total_bytes of float32 tensors of 4 MB each (random, so nothing compresses or dedups)."""
    rng = np.random.default_rng(0)
    per = 1_000_000
    count = max(1, total_bytes // (per * 4))
    return {f"layer{i}.weight": rng.random(per, dtype=np.float32) for i in range(count)}


def dd_write(path: pathlib.Path, megabytes: int) -> float:
    return _dd_seconds(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={megabytes}", "conv=fsync"])


def dd_read(path: pathlib.Path) -> float:
    return _dd_seconds(["dd", f"if={path}", "of=/dev/null", "bs=1M"])


def _dd_seconds(argv: list[str]) -> float:
    """How long dd's copy took: its wall clock less that of a dd that copies nothing (starting a process,
    ~1.4 ms here, is ~13% of a 100 MB page-cache read and no part of the baseline's work)."""
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", "of=/dev/null", "count=0"], check=True, capture_output=True)
    spawn = time.perf_counter() - start
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return max(time.perf_counter() - start - spawn, 1e-9)


def main(argv: list[str] | None = None) -> list[BenchRow]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 MB and 2 rounds")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    exit_on_sigterm()  # (its temporary files are removed when stopped so, not only at Ctrl-C)
    total = 20_000_000 if args.quick else 100_000_000
    rounds = args.rounds or (2 if args.quick else 5)
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir))
    try:
        weights = state_dict(total)
        nbytes = sum(a.nbytes for a in weights.values())
        megabytes = nbytes / 1e6
        (work / "share").mkdir()
        store = CheckpointStore(work / "share", keep_last=KEEP_LAST)
        dd_file = work / "dd.bin"
        publish_s, load_s, dd_write_s, dd_read_s = [], [], [], []
        # Warm-up, not timed: the VM backs fresh memory and disk blocks on first touch, and retention reaches
        # its steady state (each later publish removes one version).
        for version in range(KEEP_LAST):
            store.load(store.publish("player", weights, version).path)
            dd_write(dd_file, round(megabytes / 1.048576))
            dd_read(dd_file)
        for version in range(KEEP_LAST, KEEP_LAST + rounds):
            start = time.perf_counter()
            ref = store.publish("player", weights, version)
            publish_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            checkpoint = store.load(ref.path)
            load_s.append(time.perf_counter() - start)
            assert checkpoint.ref.digest == ref.digest
            dd_write_s.append(dd_write(dd_file, round(megabytes / 1.048576)))
            dd_read_s.append(dd_read(dd_file))
        dd_mb = round(megabytes / 1.048576) * 1.048576  # dd counts MiB
        publish = megabytes / statistics.median(publish_s)
        load = megabytes / statistics.median(load_s)
        round_trip = megabytes / statistics.median([p + q for p, q in zip(publish_s, load_s, strict=True)])
        write = dd_mb / statistics.median(dd_write_s)
        read = dd_mb / statistics.median(dd_read_s)
        dd_round_trip = dd_mb / statistics.median([w + r for w, r in zip(dd_write_s, dd_read_s, strict=True)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = f"{megabytes:.0f} MB"
    rows = [
        BenchRow(f"publish {size} (save+blake3+fsync+rename)", publish, "MB/s", "dd conv=fsync write", write,
                 f"ratio >= {GOAL}", publish / write >= GOAL),
        BenchRow(f"publish + load {size} round trip", round_trip, "MB/s", "dd conv=fsync write + dd read",
                 dd_round_trip, f"ratio >= {GOAL}", round_trip / dd_round_trip >= GOAL),
        BenchRow(f"load {size} (read+blake3+weights-only unpickle)", load, "MB/s", "dd read (page cache)", read,
                 "informational", None),
    ]
    rows.append(many_versions_row(500 if args.quick else 2_000, work_dir=args.dir))
    rows.append(trained_ledger_row(work_dir=args.dir))
    print_rows("Checkpoint publish + load", rows)
    return rows


def many_versions_row(versions: int, work_dir: pathlib.Path | None = None, timed: int = 100) -> BenchRow:
    """CPU per publish of a small network (CartPole's PPO, ~40 KB, with its training state) once `versions`
    versions are kept (`learner.keep_last` large: the system benchmark keeps every version to judge them), against
    the same publish with `SMALL_KEEP_LAST` kept, in the same run. Every publish lists the player's directory, so
    the cost grows with the versions kept; it grew with their square before session 40 (125 ms of CPU a publish
    at 2,000 versions against 6 ms)."""
    import torch

    weights = {"layer.weight": torch.zeros(64, 64), "layer.bias": torch.zeros(64),
               "head.weight": torch.zeros(2, 64)}
    state = {"exp_avg": {k: torch.zeros_like(v) for k, v in weights.items()}, "updates": 0}
    costs = {}
    for keep_last, total in ((SMALL_KEEP_LAST, timed + SMALL_KEEP_LAST), (versions + timed, versions + timed)):
        work = pathlib.Path(tempfile.mkdtemp(prefix="bench_ckpt_versions_", dir=work_dir))
        try:
            store = CheckpointStore(work, keep_last=keep_last)
            for version in range(1, total - timed + 1):  # not timed: the versions already on disk
                store.publish("player", weights, version, training_state=state)
            start = time.process_time()
            for version in range(total - timed + 1, total + 1):
                store.publish("player", weights, version, training_state=state)
            costs[keep_last] = (time.process_time() - start) / timed * 1e3
            store.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    many = costs[versions + timed]
    return BenchRow(f"publish a 40 KB network with {versions:,} versions kept, CPU per publish", many, "ms",
                    f"the same with keep_last {SMALL_KEEP_LAST}", costs[SMALL_KEEP_LAST], "informational", None)


def trained_ledger_row(work_dir: pathlib.Path | None = None, timed: int = 200) -> BenchRow:
    """CPU per publish of the small network of `many_versions_row` whose training state carries a full list of
    trained chunks (`learner_service.trainer.TRAINED_LEDGER_STREAMS` streams, ids as long as the coordinator's
    and a worker id's), against the same publish without it, interleaved in the same run: the list's price on
    every publish of a small, often-publishing learner."""
    import torch

    from learner_service.intake import SeqDeduper
    from learner_service.trainer import TRAINED_LEDGER_STREAMS, TRAINED_STATE_KEY

    weights = {"layer.weight": torch.zeros(64, 64), "layer.bias": torch.zeros(64),
               "head.weight": torch.zeros(2, 64)}
    state = {"exp_avg": {k: torch.zeros_like(v) for k, v in weights.items()}, "updates": 0}
    ledger = SeqDeduper(max_streams=TRAINED_LEDGER_STREAMS)
    for job in range(TRAINED_LEDGER_STREAMS):
        for seq in range(40):
            ledger.reserve(f"actor-worker-node-{job % 16:02d}-{1000 + job % 16}", f"job-{job:06d}-3f2a9c1e", seq)
    costs: dict[bool, list[float]] = {False: [], True: []}
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_ckpt_ledger_", dir=work_dir))
    try:
        store = CheckpointStore(work, keep_last=SMALL_KEEP_LAST)
        for version in range(1, 2 * timed + 1):
            with_ledger = version % 2 == 0
            start = time.process_time()
            extra = {TRAINED_STATE_KEY: json.dumps(ledger.export(), separators=(",", ":"))} if with_ledger else {}
            store.publish("player", weights, version, training_state={**state, **extra})
            costs[with_ledger].append(time.process_time() - start)
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with_ms, without_ms = (statistics.mean(costs[key]) * 1e3 for key in (True, False))
    return BenchRow(f"publish a 40 KB network with {TRAINED_LEDGER_STREAMS} streams of trained chunks, CPU per "
                    "publish", with_ms, "ms", "the same without the list", without_ms, "informational", None)


if __name__ == "__main__":
    main(sys.argv[1:])
