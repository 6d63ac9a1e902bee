"""`ComputationTask`: numpy in, numpy out; the only place torch meets the rest of the code (FLARE's CT).

predict/learn: convert numpy arrays by the model's (or algorithm's) specs into torch tensors on the task's
device, call the algorithm, and detach the results back to numpy. Weights travel as ``{name: ndarray}``
with a version number, which is what the checkpoint store publishes and actors load.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from common.computation.algorithm import Algorithm, ForwardKwargs
from common.computation.specs import TensorSpec

if TYPE_CHECKING:
    from common.checkpoint_store import CheckpointRef, CheckpointStore


class WeightsMismatchError(ValueError):
    """Weights that do not fit the model (names, shapes or dtypes): most often a checkpoint of another league's
    network, which a caller can say instead of only which tensor differs."""


def resolve_device(device: str) -> torch.device:
    """``"auto"`` picks CUDA when available, else CPU; an explicit CUDA device must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device {device!r}: {e}") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: only 'cpu', 'cuda[:N]' and 'auto' are supported")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} requested but this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return resolved


def describe_device(device: torch.device) -> str:
    """What a log line says a worker computes on: `cpu`, or the GPU by index and name (`auto` is a guess the
    user should be able to check)."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


@dataclass(frozen=True)
class Prediction:
    """One batched act: actions and artifacts per row, and the next recurrent states."""

    actions: dict[str, np.ndarray]
    artifacts: dict[str, np.ndarray]
    states: dict[str, np.ndarray]

    @property
    def batch_size(self) -> int:
        return len(next(iter(self.actions.values())))


@dataclass(frozen=True)
class LearnResult:
    stats: dict[str, float]
    priorities: np.ndarray | None
    version: int
    """The task's weight version after this update."""


class ComputationTask:
    """Wraps an `Algorithm` (and its `Model`) behind numpy; thread-safe (one call at a time)."""

    def __init__(self, algorithm: Algorithm, device: str = "auto", seed: int | None = None) -> None:
        self.algorithm = algorithm
        self._device = resolve_device(device)
        self.algorithm.to(self._device)
        if seed is not None:
            self.algorithm.generator.manual_seed(seed)
        self._lock = threading.RLock()
        self._version = 0
        self._training_mode: bool | None = None
        self.input_specs: tuple[TensorSpec, ...] = tuple(algorithm.model.get_input_specs())
        self.state_specs: tuple[TensorSpec, ...] = tuple(algorithm.model.get_state_specs())
        self.action_specs: tuple[TensorSpec, ...] = tuple(algorithm.model.get_action_specs())
        self.artifact_specs: tuple[TensorSpec, ...] = tuple(algorithm.get_artifact_specs())
        self.learn_specs: tuple[TensorSpec, ...] = tuple(algorithm.get_learn_specs())

    @property
    def device(self) -> str:
        return str(self._device)

    @property
    def version(self) -> int:
        """Number of the weights: +1 per `learn`, or the version given to `set_weights`."""
        return self._version

    # ---- acting and learning ----------------------------------------------------------------------------
    def initial_states(self, batch_size: int) -> dict[str, np.ndarray]:
        return {s.name: np.zeros((batch_size, *s.shape), dtype=s.dtype) for s in self.state_specs}

    def predict(
        self,
        inputs: Mapping[str, np.ndarray],
        states: Mapping[str, np.ndarray] | None = None,
        forward_kwargs: ForwardKwargs | Mapping[str, Any] | None = None,
    ) -> Prediction:
        """Act on a batch: every input is (batch, *spec.shape)."""
        kwargs = ForwardKwargs.from_mapping(forward_kwargs)
        with self._lock:
            tensors = self._to_torch(inputs, self.input_specs, "inputs", leading_dims=1)
            batch = _common_leading(tensors, "inputs")
            state_tensors = self._to_torch(states or {}, self.state_specs, "states", leading_dims=1)
            self._set_training(False)
            with torch.inference_mode():
                outputs, next_states = self.algorithm.predict(tensors, state_tensors, kwargs)
            actions = self._to_numpy(outputs, self.action_specs, batch, "action")
            artifacts = self._to_numpy(outputs, self.artifact_specs, batch, "artifact")
            new_states = self._to_numpy(next_states, self.state_specs, batch, "state")
        return Prediction(actions, artifacts, new_states)

    def policy_and_value(self, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's probability of every action (batch, num_actions) and state value (batch,), for a search at
        play time; NotImplementedError where the algorithm has none (`Algorithm.policy_and_value`)."""
        with self._lock:
            tensors = self._to_torch(inputs, self.input_specs, "inputs", leading_dims=1)
            _common_leading(tensors, "inputs")
            self._set_training(False)
            with torch.inference_mode():
                probs, values = self.algorithm.policy_and_value(tensors)
            return probs.to("cpu").numpy(), values.to("cpu").numpy()

    def learn(self, batch: Mapping[str, np.ndarray]) -> LearnResult:
        """One training update; the batch keys are the algorithm's learn specs."""
        with self._lock:
            tensors = self._to_torch(batch, self.learn_specs, "learn batch", leading_dims=None)
            self._set_training(True)
            output = self.algorithm.learn(tensors)
            self._version += 1
            priorities = None
            if output.priorities is not None:
                priorities = output.priorities.detach().to("cpu").numpy()
            return LearnResult({k: float(v) for k, v in output.stats.items()}, priorities, self._version)

    # ---- weights ----------------------------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        """A copy of the model's parameters and buffers (safe to publish while training continues)."""
        with self._lock:
            return {k: v.detach().to("cpu", copy=True).numpy() for k, v in self.algorithm.model.state_dict().items()}

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        """Load weights produced by `get_weights` (of an identically built task) and adopt their version; raises
        WeightsMismatchError if they were not."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        with self._lock:
            own = self.algorithm.model.state_dict()
            missing, unknown = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
            if missing or unknown:
                raise WeightsMismatchError(f"weights do not fit the model: missing {missing}, unknown {unknown}")
            state, problems = {}, []
            for name, target in own.items():
                array = np.asarray(weights[name])
                if tuple(array.shape) != tuple(target.shape):
                    problems.append(f"weights[{name!r}]: shape {array.shape} != model shape {tuple(target.shape)}")
                elif str(array.dtype) != str(target.dtype).removeprefix("torch."):
                    problems.append(f"weights[{name!r}]: dtype {array.dtype} != model dtype {target.dtype}")
                else:
                    state[name] = torch.from_numpy(array if array.flags.writeable else array.copy())
            if problems:  # every one: weights made elsewhere (`league import`) are fixed in one go, not one a try
                raise WeightsMismatchError("; ".join(problems))
            self.algorithm.model.load_state_dict(state)
            self.algorithm.on_weights_loaded()
            self._version = version

    def get_training_state(self) -> dict[str, Any]:
        """A copy (on the CPU) of what training needs besides the weights to go on exactly: optimizer state,
        target network, update counter, random generator. Opaque to callers: it goes to the checkpoint store
        and back to `set_training_state` of an identically built task."""
        with self._lock:
            return _cpu_copy(self.algorithm.get_training_state())

    def set_training_state(self, state: Mapping[str, Any]) -> None:
        """Adopt a `get_training_state` (after the weights it was saved with); raises ValueError if it does
        not fit this task's algorithm."""
        with self._lock:
            self.algorithm.load_training_state(state)

    def publish(
        self, store: CheckpointStore, player_id: str, metadata: Mapping[str, Any] | None = None,
        training_state: bool = False, extra_state: Mapping[str, Any] | None = None,
    ) -> CheckpointRef:
        """Publish the current weights as version `version` of ``player_id``; with ``training_state`` (a
        learner) also the training state, in a file of its own that actors never read. ``extra_state``: the
        caller's own entries beside the algorithm's in that file (keys the algorithm does not use)."""
        with self._lock:
            weights, version = self.get_weights(), self._version
            state = self.get_training_state() if training_state else None
        if state is not None and extra_state:
            if clash := state.keys() & extra_state.keys():
                raise ValueError(f"extra_state: {sorted(clash)} are the algorithm's own training state keys")
            state.update(extra_state)
        return store.publish(player_id, weights, version, metadata, training_state=state)

    def restore(self, store: CheckpointStore, path: str) -> CheckpointRef:
        """Load a published checkpoint's weights (path relative to the shared root) and adopt its version."""
        checkpoint = store.load(path)
        self.set_weights(checkpoint.tensors, checkpoint.ref.version)
        return checkpoint.ref

    # ---- conversion -------------------------------------------------------------------------------------
    def _set_training(self, training: bool) -> None:
        if self._training_mode is not training:
            self.algorithm.model.train(training)
            self._training_mode = training

    def _to_torch(
        self, arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec], what: str, leading_dims: int | None
    ) -> dict[str, torch.Tensor]:
        names = {s.name for s in specs}
        unknown = sorted(set(arrays) - names)
        if unknown:
            raise ValueError(f"{what}: unknown key(s) {unknown}; expected {sorted(names)}")
        out = {}
        for spec in specs:
            if spec.name not in arrays:
                if spec.optional:
                    continue
                raise ValueError(f"{what}: missing {spec.name!r}")
            array = spec.check(arrays[spec.name], leading_dims)
            if not array.flags.writeable or not array.flags.c_contiguous:
                array = np.ascontiguousarray(array).copy()  # torch wants writable memory
            out[spec.name] = torch.from_numpy(array).to(self._device, non_blocking=True)
        return out

    def _to_numpy(
        self, tensors: Mapping[str, torch.Tensor], specs: Sequence[TensorSpec], batch: int, what: str
    ) -> dict[str, np.ndarray]:
        out = {}
        for spec in specs:
            if spec.name not in tensors:
                raise RuntimeError(f"algorithm did not return {what} {spec.name!r}")
            value = tensors[spec.name].detach().to("cpu").numpy()
            if value.shape != (batch, *spec.shape):
                raise RuntimeError(f"{what} {spec.name!r}: shape {value.shape} != {(batch, *spec.shape)}")
            out[spec.name] = value.astype(spec.dtype, copy=False)
        return out


def _common_leading(tensors: Mapping[str, torch.Tensor], what: str) -> int:
    sizes = {name: t.shape[0] for name, t in tensors.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"{what}: batch sizes differ {sizes}")
    return next(iter(sizes.values()))


def _cpu_copy(value: Any) -> Any:
    """``value`` with every tensor copied to the CPU (so the copy stays as it is while training goes on)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_cpu_copy(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value
