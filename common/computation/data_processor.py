"""`ComputationDataProcessor`: many callers, one forward pass (FLARE's CDP).

Envs, seats and agents on many threads call `predict` with their own small batches. One worker thread takes
whatever has queued up, packs compatible requests (same input keys and forward kwargs) into one batch, runs
the task once, and hands every caller its own rows back. A request that breaks the batch (a bad shape, say)
is retried alone so that only its caller sees the error. Training data from many sources is packed the same
way (`pack` / `unpack`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.computation.algorithm import ForwardKwargs
from common.computation.computation_task import ComputationTask, LearnResult, Prediction


@dataclass(frozen=True)
class PackedBatch:
    """Arrays concatenated along axis 0 and the row count each part contributed."""

    arrays: dict[str, np.ndarray]
    sizes: tuple[int, ...]


def pack(parts: Sequence[Mapping[str, np.ndarray]]) -> PackedBatch:
    """Concatenate parts with identical keys along the leading axis."""
    if not parts:
        raise ValueError("pack: no parts given")
    keys = set(parts[0])
    if not keys:
        raise ValueError("pack: part 0 has no arrays")
    sizes = []
    for i, part in enumerate(parts):
        if set(part) != keys:
            raise ValueError(f"pack: part {i} keys {sorted(part)} differ from part 0 keys {sorted(keys)}")
        rows = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in part.items()}
        if None in rows.values() or len(set(rows.values())) != 1:
            raise ValueError(f"pack: part {i} arrays disagree on the leading dim {rows}")
        sizes.append(next(iter(rows.values())))
    if len(parts) == 1:
        return PackedBatch({k: np.asarray(v) for k, v in parts[0].items()}, tuple(sizes))
    return PackedBatch({k: np.concatenate([p[k] for p in parts], axis=0) for k in sorted(keys)}, tuple(sizes))


def unpack(arrays: Mapping[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The inverse of `pack`: per-part views (no copies) of the rows each part contributed."""
    bounds = np.cumsum(sizes)[:-1]
    split = {k: np.split(v, bounds, axis=0) for k, v in arrays.items()}
    return [{k: split[k][i] for k in arrays} for i in range(len(sizes))]


@dataclass
class _Request:
    inputs: Mapping[str, np.ndarray]
    states: Mapping[str, np.ndarray]
    kwargs: ForwardKwargs
    rows: int
    future: Future[Prediction] = field(default_factory=Future)

    @property
    def group(self) -> tuple[Any, ...]:
        return (self.kwargs, tuple(sorted(self.inputs)), tuple(sorted(self.states)))


_STOP = object()


class ComputationDataProcessor:
    """Batches concurrent `predict` calls into single forward passes of one `ComputationTask`."""

    def __init__(self, task: ComputationTask, max_batch_rows: int = 1024, gather_window_s: float = 0.0) -> None:
        """``gather_window_s`` > 0 waits that long after the first request for more to join the batch."""
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        if gather_window_s < 0:
            raise ValueError(f"gather_window_s must be >= 0, got {gather_window_s}")
        self.task = task
        self.max_batch_rows = max_batch_rows
        self.gather_window_s = gather_window_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self.forward_passes = 0
        """Forward passes run so far (tests and stats: fewer passes than requests means batching works)."""
        self._thread = threading.Thread(target=self._prediction_loop, name="cdp-predict", daemon=True)
        self._thread.start()

    # ---- callers ----------------------------------------------------------------------------------------
    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        states: Mapping[str, np.ndarray] | None = None,
        forward_kwargs: ForwardKwargs | Mapping[str, Any] | None = None,
    ) -> Future[Prediction]:
        """Queue a batch of rows (every input is (rows, ...)); the future resolves to those rows' prediction."""
        if not inputs:
            raise ValueError("inputs: empty")
        rows = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in inputs.items()}
        if None in rows.values() or len(set(rows.values())) != 1:
            raise ValueError(f"inputs: every array needs the same leading (rows) dim, got {rows}")
        request = _Request(inputs, states or {}, ForwardKwargs.from_mapping(forward_kwargs), next(iter(rows.values())))
        with self._close_lock:
            if self._closed.is_set():
                raise RuntimeError("ComputationDataProcessor is closed")
            self._queue.put(request)
        return request.future

    def predict(
        self,
        inputs: Mapping[str, np.ndarray],
        states: Mapping[str, np.ndarray] | None = None,
        forward_kwargs: ForwardKwargs | Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Prediction:
        """Blocking `submit`."""
        return self.submit(inputs, states, forward_kwargs).result(timeout)

    def learn(self, parts: Sequence[Mapping[str, np.ndarray]]) -> LearnResult:
        """Pack training data from several sources into one batch and run one update."""
        return self.task.learn(pack(parts).arrays)

    def close(self) -> None:
        """Stop the worker after the queued requests; later `submit` calls raise."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self._queue.put(_STOP)
        self._thread.join()

    def __enter__(self) -> ComputationDataProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- worker -----------------------------------------------------------------------------------------
    def _prediction_loop(self) -> None:
        carry: deque[_Request] = deque()
        stopping = False
        while not (stopping and not carry):
            if not carry:
                item = self._queue.get()
                if item is _STOP:
                    stopping = True
                    continue
                carry.append(item)
            stopping = self._gather(carry) or stopping
            batch = [carry.popleft()]
            rows = batch[0].rows
            group = batch[0].group
            # Take every carried request of the same group that fits; the rest waits for the next pass.
            rest: deque[_Request] = deque()
            while carry:
                request = carry.popleft()
                if request.group == group and rows + request.rows <= self.max_batch_rows:
                    batch.append(request)
                    rows += request.rows
                else:
                    rest.append(request)
            carry = rest
            self._run(batch)

    def _gather(self, carry: deque[_Request]) -> bool:
        """Move queued requests into ``carry`` (waiting up to the gather window); True if STOP was seen."""
        rows = sum(r.rows for r in carry)
        deadline = None
        while rows < self.max_batch_rows:
            try:
                if self.gather_window_s > 0:
                    if deadline is None:
                        deadline = time.monotonic() + self.gather_window_s
                    remaining = deadline - time.monotonic()
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                else:
                    item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            carry.append(item)
            rows += item.rows
        return False

    def _run(self, batch: list[_Request]) -> None:
        live = [r for r in batch if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            if len(live) == 1:
                self._run_one(live[0])
                return
            packed_inputs = pack([r.inputs for r in live])
            states = pack([r.states for r in live]).arrays if live[0].states else {}
            self.forward_passes += 1
            prediction = self.task.predict(packed_inputs.arrays, states, live[0].kwargs)
        except Exception:
            # One bad request must not fail its neighbours: run each alone, each gets its own outcome.
            for request in live:
                self._run_one(request)
            return
        sizes = packed_inputs.sizes
        actions = unpack(prediction.actions, sizes)
        artifacts = unpack(prediction.artifacts, sizes)
        states_out = unpack(prediction.states, sizes) if prediction.states else [{} for _ in sizes]
        for i, request in enumerate(live):
            request.future.set_result(Prediction(actions[i], artifacts[i], states_out[i]))

    def _run_one(self, request: _Request) -> None:
        try:
            self.forward_passes += 1
            request.future.set_result(self.task.predict(request.inputs, request.states, request.kwargs))
        except Exception as e:  # delivered to the caller, not swallowed
            request.future.set_exception(e)
