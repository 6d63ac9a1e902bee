"""numpy arrays <-> protobuf ``Tensor`` and `Trajectory` <-> ``TrajectoryChunk``, validated, never pickled.

Decoding is zero-copy past the one copy protobuf makes when the ``data`` field is read: the array is an
``np.frombuffer`` view of that bytes object, so it is **read-only**; copy it before writing into it.
Everything a peer sends is checked before use: key grammar, dtype allow-list, shape against the byte count,
and size limits, and a failure raises `CodecError` naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.job_limits import shown_id
from common.proto.league.v1 import league_pb2
from common.trajectory import ALLOWED_DTYPES, Trajectory, TrajectoryError, check_key


class CodecError(ValueError):
    """Data that cannot be encoded or decoded; ``key`` names the tensor at fault (empty if none)."""

    def __init__(self, key: str, message: str) -> None:
        # A key from the network may be megabytes or hold control characters: shown escaped and cut then.
        shown = key if len(key) <= 200 and key.isprintable() else shown_id(key)
        super().__init__(f"{shown}: {message}" if key else message)
        self.key = key


@dataclass(frozen=True)
class CodecLimits:
    """Upper bounds on what a peer may make us allocate."""

    max_tensor_bytes: int = 256 * 2**20
    max_total_bytes: int = 1024 * 2**20
    max_tensors: int = 1024
    max_ndim: int = 8


DEFAULT_LIMITS = CodecLimits()

# Explicit little-endian wire order, so a big-endian peer cannot be misread.
_WIRE_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}


def encode_tensor(array: np.ndarray, key: str = "", limits: CodecLimits = DEFAULT_LIMITS) -> league_pb2.Tensor:
    """One array as a Tensor message (C-order, little-endian raw bytes)."""
    if not isinstance(array, np.ndarray):
        raise CodecError(key, f"expected a numpy array, got {type(array).__name__}")
    name = array.dtype.name
    if name not in _WIRE_DTYPES:
        raise CodecError(key, f"dtype {array.dtype} is not allowed (allowed: {sorted(ALLOWED_DTYPES)})")
    if array.ndim > limits.max_ndim:
        raise CodecError(key, f"{array.ndim} dimensions exceed the limit {limits.max_ndim}")
    if array.nbytes > limits.max_tensor_bytes:
        raise CodecError(key, f"{array.nbytes} bytes exceed the per-tensor limit {limits.max_tensor_bytes}")
    wire = np.ascontiguousarray(array, dtype=_WIRE_DTYPES[name])
    return league_pb2.Tensor(dtype=name, shape=list(array.shape), data=wire.tobytes())


def decode_tensor(message: league_pb2.Tensor, key: str = "", limits: CodecLimits = DEFAULT_LIMITS) -> np.ndarray:
    """A read-only array viewing the message's bytes, after checking dtype, shape and size."""
    wire = _WIRE_DTYPES.get(message.dtype)
    if wire is None:
        raise CodecError(key, f"dtype {message.dtype!r} is not allowed (allowed: {sorted(ALLOWED_DTYPES)})")
    if len(message.shape) > limits.max_ndim:  # before building it: a packed shape of millions of entries
        raise CodecError(key, f"{len(message.shape)} dimensions exceed the limit {limits.max_ndim}")
    shape = tuple(int(d) for d in message.shape)
    if any(d < 0 for d in shape):
        raise CodecError(key, f"negative dimension in shape {shape}")
    expected = math.prod(shape) * wire.itemsize  # Python ints: no overflow
    if expected > limits.max_tensor_bytes:
        raise CodecError(key, f"shape {shape} needs {expected} bytes, over the per-tensor limit")
    if math.prod(d for d in shape if d) * wire.itemsize > limits.max_tensor_bytes:
        # Empty, yet with other dimensions no array of data within the limit could have (numpy would refuse
        # the shape with a plain ValueError: "array is too big").
        raise CodecError(key, f"shape {shape} has dimensions over what the per-tensor limit allows")
    data = message.data
    if len(data) != expected:
        raise CodecError(key, f"shape {shape} x {wire.itemsize} bytes = {expected} != {len(data)} bytes of data")
    if wire.kind == "b" and expected and np.frombuffer(data, dtype=np.uint8).max() > 1:
        raise CodecError(key, "bool data holds bytes other than 0 and 1")
    array = np.frombuffer(data, dtype=wire).reshape(shape)
    if wire.isnative:
        return array
    # A host of the other byte order (big-endian): the values swapped into native order, a copy (a view with
    # the dtype relabelled would read the bytes the wrong way round). Read-only like the view above.
    native = array.astype(wire.newbyteorder("="))
    native.flags.writeable = False
    return native


def encode_tensors(
    tensors: Mapping[str, np.ndarray], limits: CodecLimits = DEFAULT_LIMITS
) -> dict[str, league_pb2.Tensor]:
    if len(tensors) > limits.max_tensors:
        raise CodecError("", f"{len(tensors)} tensors exceed the limit {limits.max_tensors}")
    total = 0
    out = {}
    for key, array in tensors.items():
        out[key] = encode_tensor(array, key, limits)
        total += len(out[key].data)
        if total > limits.max_total_bytes:
            raise CodecError(key, f"total size exceeds the limit {limits.max_total_bytes} bytes")
    return out


def decode_tensors(
    messages: Mapping[str, league_pb2.Tensor], limits: CodecLimits = DEFAULT_LIMITS
) -> dict[str, np.ndarray]:
    if len(messages) > limits.max_tensors:
        raise CodecError("", f"{len(messages)} tensors exceed the limit {limits.max_tensors}")
    total = 0
    out = {}
    for key in sorted(messages):
        out[key] = decode_tensor(messages[key], key, limits)
        total += out[key].nbytes
        if total > limits.max_total_bytes:
            raise CodecError(key, f"total size exceeds the limit {limits.max_total_bytes} bytes")
    return out


@dataclass(frozen=True)
class ChunkHeader:
    """Who sent a trajectory chunk and with which policy version."""

    job_id: str
    player_id: str
    worker_id: str
    seq: int
    policy_version: int

    def __post_init__(self) -> None:
        if self.seq < 0:
            raise CodecError("seq", f"must be >= 0, got {self.seq}")
        if self.policy_version < 0:
            raise CodecError("policy_version", f"must be >= 0, got {self.policy_version}")


@dataclass(frozen=True)
class DecodedChunk:
    header: ChunkHeader
    trajectory: Trajectory


def encode_chunk(
    trajectory: Trajectory, header: ChunkHeader, limits: CodecLimits = DEFAULT_LIMITS
) -> league_pb2.TrajectoryChunk:
    chunk = league_pb2.TrajectoryChunk(
        job_id=header.job_id,
        player_id=header.player_id,
        worker_id=header.worker_id,
        seq=header.seq,
        policy_version=header.policy_version,
    )
    for key, tensor in encode_tensors(trajectory.tensors, limits).items():
        chunk.tensors[key].CopyFrom(tensor)
    return chunk


def decode_chunk(chunk: league_pb2.TrajectoryChunk, limits: CodecLimits = DEFAULT_LIMITS) -> DecodedChunk:
    """Checks keys first (cheap), then every tensor, then the trajectory's cross-key consistency."""
    if len(chunk.tensors) > limits.max_tensors:
        raise CodecError("", f"{len(chunk.tensors)} tensors exceed the limit {limits.max_tensors}")
    for key in chunk.tensors:
        try:
            check_key(key)
        except TrajectoryError as e:
            raise CodecError(key, "not a trajectory key") from e
    header = ChunkHeader(chunk.job_id, chunk.player_id, chunk.worker_id, chunk.seq, chunk.policy_version)
    tensors = decode_tensors(chunk.tensors, limits)
    try:
        trajectory = Trajectory(tensors)
    except TrajectoryError as e:
        raise CodecError(str(e).split(":", 1)[0], str(e).split(":", 1)[-1].strip()) from e
    return DecodedChunk(header, trajectory)
