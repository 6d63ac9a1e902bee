"""What the learner reports about its training: TensorBoard scalars under <shared_root>/tensorboard/<player_id>/.

Per write (x axis: the player's agent steps): the algorithm's statistics (``train/...``: losses, KL,
...), episode returns (``episode/return_mean``) from ``/infos/episode_return`` when actors send it, else summed
from the pushed rewards per env row across a job's chunks, samples per second received (``throughput/...``),
staleness of the data (``staleness/...`` = learner version - the policy_version it was collected with), and
the learner's version, iteration and buffered samples.

Scalars are written at most every `every_s` seconds (`learner.tensorboard_every_s`), as the mean of the
iterations since the last write: a DQN learner, whose iteration is one gradient step, wrote 14 scalars at each
of ~94 iterations a second, about 200 MB of events an hour (measured on solo CartPole), and TensorBoard itself
shows only a sample of 1,000 points per curve. The first iteration is written at once; `close` writes what is left.

The event files live on the shared filesystem, which can fill up: a failed write is logged (an ERROR line),
the writer is dropped and a new one opened after `REOPEN_AFTER_S`; training never stops for its telemetry.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.paths import utf8_encodable
from learner_service.chunks import PreparedChunk
from learner_service.trainer import IterationReport, Progress

log = logging.getLogger(__name__)

REOPEN_AFTER_S = 30.0
EVENT_QUEUE = 1024
"""Scalars TensorBoard's writer thread may lag behind by before `add_scalar` waits for it."""


@dataclass
class _RowReturns:
    sums: np.ndarray
    complete: np.ndarray
    """Rows whose running sum started at an episode start (seq 0, or after an episode end)."""
    next_seq: int


class EpisodeTracker:
    """Episode returns summed from rewards, per env row of a (worker, job) stream, across its chunks: the
    fallback for an actor that sends no ``/infos/episode_return`` (this project's always does).

    It holds only for an actor whose rows of consecutive chunks of one job are the same envs, and whose
    episodes start within the job: this project's actor groups rows by length, not by env, and plays a solo
    job's episodes on into its next job, which is why it sends each episode's return itself. A stream first
    seen past seq 0, or with a gap in seq, starts its sums only at the next episode end.
    """

    def __init__(self, max_streams: int = 1024, max_rows: int = 1 << 20) -> None:
        self.max_streams = max_streams
        self.max_rows = max_rows
        """Env rows summed across all streams (~9 bytes each): the oldest streams are forgotten past it, and a
        chunk of more rows is not tracked (its episodes' returns go unreported unless the actor sends them)."""
        self._streams: OrderedDict[tuple[str, str], _RowReturns] = OrderedDict()
        self._rows = 0

    def observe(self, chunk: PreparedChunk) -> np.ndarray:
        """Returns of the episodes that ended in this chunk."""
        if chunk.episode_returns is not None:
            return chunk.episode_returns
        header = chunk.header
        key = (header.worker_id, header.job_id)
        rows = chunk.rewards.shape[0]
        if rows > self.max_rows:
            return np.zeros(0, dtype=np.float64)
        state = self._streams.get(key)
        if state is None or state.sums.shape[0] != rows:
            if state is not None:
                self._rows -= state.sums.shape[0]
            state = _RowReturns(np.zeros(rows), np.full(rows, header.seq == 0), header.seq)
            self._streams[key] = state
            self._rows += rows
            while len(self._streams) > self.max_streams or self._rows > self.max_rows:
                _, forgotten = self._streams.popitem(last=False)
                self._rows -= forgotten.sums.shape[0]
        self._streams.move_to_end(key)
        if header.seq != state.next_seq:
            state.complete[:] = False
        state.next_seq = header.seq + 1
        ended: list[float] = []
        for t in range(chunk.rewards.shape[1]):
            state.sums += chunk.rewards[:, t]
            done = chunk.dones[:, t]
            ended.extend(state.sums[done & state.complete].tolist())
            state.sums[done] = 0.0
            state.complete[done] = True
        return np.asarray(ended, dtype=np.float64)


@dataclass
class _Window:
    """What was received and trained since the last write."""

    samples: int = 0
    chunks: int = 0
    stale_dropped: int = 0
    """Chunks dropped for `learner.max_staleness`."""
    staleness: list[int] = field(default_factory=list)
    staleness_weights: list[int] = field(default_factory=list)
    """Each chunk's agent steps: staleness/mean is per sample (chunks run from 1 to thousands of steps)."""
    returns: list[float] = field(default_factory=list)
    iterations: int = 0
    trained_samples: int = 0
    stat_sums: dict[str, float] = field(default_factory=dict)
    stat_counts: dict[str, int] = field(default_factory=dict)

    def add(self, report: IterationReport) -> None:
        self.iterations += 1
        self.trained_samples += report.samples
        for name, value in report.stats.items():
            self.stat_sums[name] = self.stat_sums.get(name, 0.0) + float(value)
            self.stat_counts[name] = self.stat_counts.get(name, 0) + 1


@dataclass(frozen=True)
class _Latest:
    """Where the learner stood at its latest iteration: what a write reports as current."""

    version: int
    train_iteration: int
    agent_steps: int
    buffered: int


class Telemetry:
    """Accumulates per-chunk and per-iteration figures and writes their means at most every `every_s` seconds;
    also keeps the last values written."""

    def __init__(self, log_dir: Path | None, clock: Callable[[], float] = time.monotonic,
                 every_s: float = 0.0, purge_from: int | None = None) -> None:
        """`purge_from`: TensorBoard hides the older points at and past these agent steps (`purge_step`): a
        learner resuming at a checkpoint's steps trains again the steps a crashed one wrote past them, and the
        curves ran back and overlapped in a zig-zag."""
        self._writer = None
        self._log_dir = log_dir
        self._purge_from = purge_from  # (the first writer only: a reopened one would hide this session's points)
        self._clock = clock
        self._every_s = every_s
        self._latest: _Latest | None = None
        self._reopen_at: float | None = None
        """While the writer is dropped after a failed write: when to open a new one."""
        self.write_failures = 0
        if log_dir is not None:
            self._open()
        self._since = clock()
        self._window = _Window()
        self._episodes = EpisodeTracker()
        self.last: dict[str, float] = {}
        """The scalars of the latest write (for logs and tests); empty until the first."""
        self.writes = 0
        """Writes so far: the learner's progress line is logged at a write, with that write's figures."""
        self.episodes_seen = 0
        self.staleness_max = 0
        self.stale_dropped = 0
        """Chunks dropped for `learner.max_staleness` (all windows)."""
        self.future_versions = 0
        """Chunks whose policy version was more than one above the learner's when it trained on them."""
        self.reset_ahead = 0
        """Chunks exactly one version above the learner's: played by actors under a reset the learner had not
        applied yet."""

    def observe(self, chunk: PreparedChunk, learner_version: int) -> None:
        staleness = learner_version - chunk.header.policy_version
        self._window.samples += chunk.agent_steps
        self._window.chunks += 1
        if staleness >= 0:
            self._window.staleness.append(staleness)
            self._window.staleness_weights.append(chunk.agent_steps)
            self.staleness_max = max(self.staleness_max, staleness)
        elif staleness == -1:
            # The league reset the player to a fresh initialisation, numbered one past the version it last heard
            # of, and actors play that at once; this learner applies the reset when the reply to its next report
            # says so (its version then passes the chunk's). Kept out of staleness, no warning: a healthy league.
            self.reset_ahead += 1
        else:
            # No policy this learner has not reached yet can have acted: the actor reports a wrong version (a
            # bug or another league's checkpoint). Kept out of the staleness figures, which it would swamp.
            self.future_versions += 1
            if self.future_versions % 1000 == 1:
                log.warning("%d chunk(s) so far claim a policy version above the learner's (%d from %s, job %s, "
                            "learner at %d); left out of staleness/*", self.future_versions,
                            chunk.header.policy_version, chunk.header.worker_id, chunk.header.job_id, learner_version)
        returns = self._episodes.observe(chunk)
        self._window.returns.extend(returns.tolist())
        self.episodes_seen += len(returns)

    def dropped_stale(self, chunk: PreparedChunk) -> None:
        """`chunk`, observed, was dropped for its staleness (`learner.max_staleness`)."""
        self._window.stale_dropped += 1
        self.stale_dropped += 1

    def iteration(self, report: IterationReport, progress: Progress, buffered: int) -> dict[str, float]:
        """Count a train iteration; write when `every_s` has passed since the last write. Returns the scalars
        last written."""
        self._window.add(report)
        self._latest = _Latest(report.version, report.train_iteration, progress.agent_steps, buffered)
        now = self._clock()
        if not self.last or now - self._since >= self._every_s:  # the first iteration at once
            self._write(now)
        return self.last

    @property
    def every_s(self) -> float:
        return self._every_s

    def window_scalars(self) -> dict[str, float]:
        """The scalars of the iterations since the last write, up to the latest one, as a write now would give
        them; nothing is written and the window goes on (the progress line between rare writes)."""
        if self._latest is None or not self._window.iterations:
            return dict(self.last)
        return self._scalars(self._window, self._latest, max(self._clock() - self._since, 1e-9))

    def _write(self, now: float) -> None:
        latest = self._latest
        assert latest is not None
        elapsed = max(now - self._since, 1e-9)
        window, self._window, self._since = self._window, _Window(), now
        self.writes += 1
        scalars = self._scalars(window, latest, elapsed)
        if self._writer is None and self._reopen_at is not None and now >= self._reopen_at:
            self._open()
        if self._writer is not None:
            try:
                for tag, value in scalars.items():
                    self._writer.add_scalar(tag, value, global_step=latest.agent_steps)
            except OSError as err:
                self._failed(err)
        self.last = scalars

    @staticmethod
    def _scalars(window: _Window, latest: _Latest, elapsed: float) -> dict[str, float]:
        scalars = {f"train/{k}": total / window.stat_counts[k] for k, total in window.stat_sums.items()}
        scalars.update({
            "learner/version": float(latest.version),
            "learner/train_iteration": float(latest.train_iteration),
            "learner/buffered_samples": float(latest.buffered),
            "throughput/samples_per_s": window.samples / elapsed,
            "throughput/trained_samples": window.trained_samples / window.iterations,
        })
        if window.staleness:
            weights = window.staleness_weights if sum(window.staleness_weights) > 0 else None
            scalars["staleness/mean"] = float(np.average(window.staleness, weights=weights))
            scalars["staleness/max"] = float(np.max(window.staleness))
        if window.stale_dropped:
            scalars["staleness/dropped"] = window.stale_dropped / max(window.chunks, 1)
        if window.returns:
            scalars["episode/return_mean"] = float(np.mean(window.returns))
            scalars["episode/count"] = float(len(window.returns))
        return scalars

    def flush(self) -> None:
        if self._writer is not None:
            try:
                self._writer.flush()
            except OSError as err:
                self._failed(err)

    def close(self) -> None:
        """Write the iterations not written yet, then close the event file."""
        if self._window.iterations:
            self._write(self._clock())
        if self._writer is not None:
            writer, self._writer = self._writer, None
            events = _event_file(writer)
            try:
                writer.close()
            except OSError as err:
                log.error("TensorBoard events under %s: the last scalars were not written (%s)", self._log_dir, err)
            _remove_if_empty(events)

    def _open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imported late: it is slow to import

        assert self._log_dir is not None
        _quiet_event_writer_threads()
        self._reopen_at = None
        before: set[Path] = set()
        if not utf8_encodable(str(self._log_dir)):
            # TensorBoard encodes its file names as UTF-8, strictly: a shared root whose name has other bytes
            # (b"run\xff", from a Latin-1 file system) raised UnicodeEncodeError out of here, and the learner
            # failed at every job, restarted until `league run` gave up. No retry: the name will not change.
            log.error("TensorBoard scalars under %s not written: TensorBoard takes only paths that are valid "
                      "UTF-8; training goes on without them", self._log_dir)
            return
        try:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            # max_queue: TensorBoard's writer thread takes events from a queue of this size, and add_scalar
            # blocks while it is full. At the default (10), every iteration's ~18 scalars waited for that
            # thread one by one: ~9% of a busy learner's time in a league sharing two cores.
            before = _files_in(self._log_dir)
            self._writer = SummaryWriter(log_dir=str(self._log_dir), flush_secs=10, max_queue=EVENT_QUEUE,
                                         purge_step=self._purge_from)
            self._purge_from = None
        except OSError as err:
            self._failed(err)
            for made in _files_in(self._log_dir) - before:  # (a writer failed as it began: nothing else names it)
                _remove_if_empty(made)

    def _failed(self, err: OSError) -> None:
        """A write failed (a full disk, say): report it, drop the writer, try a new one later."""
        self.write_failures += 1
        self._reopen_at = self._clock() + REOPEN_AFTER_S
        log.error("TensorBoard scalars under %s not written: %s; training goes on, retrying in %.0f s",
                  self._log_dir, err, REOPEN_AFTER_S)
        writer, self._writer = self._writer, None
        if writer is not None:
            events = _event_file(writer)
            try:
                writer.close()
            except OSError as close_err:  # the same full disk, most likely; the error above says it already
                log.debug("closing the failed TensorBoard writer: %s", close_err)
            _remove_if_empty(events)


def _event_file(writer: Any) -> Path | None:
    """The event file a SummaryWriter writes (TensorBoard's own attributes; None where they differ)."""
    try:
        return Path(os.fsdecode(writer.file_writer.event_writer._file_name))  # (bytes, as TensorBoard keeps it)
    except (AttributeError, TypeError):
        return None


def _files_in(directory: Path) -> set[Path]:
    try:
        return set(directory.iterdir())
    except OSError:
        return set()


def _remove_if_empty(events: Path | None) -> None:
    """A failed writer's event file, when nothing reached it: on a full disk each retry (every REOPEN_AFTER_S)
    opened a new writer, and each left an empty file behind, thousands a day per learner."""
    if events is None:
        return
    try:
        if events.stat().st_size == 0:
            events.unlink()
    except OSError:
        pass


_WRITER_THREAD = "_AsyncWriterThread"
"""The class of TensorBoard's event writer thread (tensorboard.summary.writer.event_file_writer)."""


def _quiet_event_writer_threads() -> None:
    """Keep the traceback of a failed event write out of the log: TensorBoard's writer thread keeps the error
    for the writer's next call (where `Telemetry._failed` reports it, one ERROR line) and raises it again as it
    dies, so threading's excepthook printed it too: on a full disk, a traceback of ~25 lines every
    REOPEN_AFTER_S beside each ERROR line. Other threads' exceptions go to the hook as before."""
    previous = threading.excepthook
    if getattr(previous, "_quiets_event_writers", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == _WRITER_THREAD:
            log.debug("TensorBoard's writer thread ended: %s", args.exc_value)
            return
        previous(args)

    hook._quiets_event_writers = True  # type: ignore[attr-defined]
    threading.excepthook = hook
