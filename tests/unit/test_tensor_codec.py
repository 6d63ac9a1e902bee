import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from common.proto.league.v1 import league_pb2
from common.tensor_codec import (
    ChunkHeader,
    CodecError,
    CodecLimits,
    decode_chunk,
    decode_tensor,
    decode_tensors,
    encode_chunk,
    encode_tensor,
    encode_tensors,
)
from common.trajectory import ALLOWED_DTYPES, Trajectory

DTYPES = sorted(ALLOWED_DTYPES)


@settings(max_examples=150, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(DTYPES).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_tensor_round_trip(array):
    message = encode_tensor(array, "/x")
    wire = league_pb2.Tensor.FromString(message.SerializeToString())
    decoded = decode_tensor(wire, "/x")
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint16", "float64"])
def test_a_host_of_the_other_byte_order_decodes_the_values(monkeypatch, dtype):
    """On a big-endian host the wire's little-endian bytes must be swapped, not relabelled (that read every
    multi-byte value wrong, with no error). Here the mirror image: a big-endian wire on this host."""
    from common import tensor_codec

    monkeypatch.setattr(tensor_codec, "_WIRE_DTYPES",
                        {name: np.dtype(name).newbyteorder(">") for name in tensor_codec.ALLOWED_DTYPES})
    sent = np.array([[1, 2, 3], [250, 7, 9]], dtype=dtype)
    got = decode_tensor(encode_tensor(sent))
    np.testing.assert_array_equal(got, sent)
    assert got.dtype.isnative and not got.flags.writeable


def test_non_contiguous_and_big_endian_input_round_trip():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:, ::2].T
    np.testing.assert_array_equal(decode_tensor(encode_tensor(view)), view)
    big = np.arange(5, dtype=">i4")
    decoded = decode_tensor(encode_tensor(big))
    np.testing.assert_array_equal(decoded, big)
    assert decoded.dtype == np.int32


def test_decode_is_zero_copy_and_read_only():
    decoded = decode_tensor(encode_tensor(np.arange(1000, dtype=np.float32)))
    assert not decoded.flags.writeable
    base = decoded
    while isinstance(base, np.ndarray):
        base = base.base
    # The array views the bytes object protobuf handed out: no second copy.
    assert isinstance(base, bytes) and len(base) == 4000


@pytest.mark.parametrize(
    "message, match",
    [
        (league_pb2.Tensor(dtype="object", shape=[1], data=b"\0" * 8), "dtype"),
        (league_pb2.Tensor(dtype="float128", shape=[1], data=b"\0" * 16), "dtype"),
        (league_pb2.Tensor(dtype="<f4", shape=[1], data=b"\0" * 4), "dtype"),
        (league_pb2.Tensor(dtype="float32", shape=[3], data=b"\0" * 8), "12 != 8"),
        (league_pb2.Tensor(dtype="float32", shape=[-1, 2], data=b"\0" * 8), "negative"),
        (league_pb2.Tensor(dtype="uint8", shape=[2**40, 2**40], data=b""), "limit"),
        (league_pb2.Tensor(dtype="float32", shape=[0, 2**62, 2**62], data=b""), "limit"),  # empty, absurd
        (league_pb2.Tensor(dtype="uint8", shape=[1] * 9, data=b"\0"), "dimensions"),
        # Refused before the shape is built (a review: 30M entries cost 1.1 GB and 3 s first).
        (league_pb2.Tensor(dtype="uint8", shape=[257] * 100_000, data=b""), "100000 dimensions exceed"),
        (league_pb2.Tensor(dtype="bool", shape=[2], data=b"\x01\x07"), "bool"),
    ],
)
def test_decode_rejects_bad_tensors_naming_the_key(message, match):
    with pytest.raises(CodecError, match=match) as info:
        decode_tensor(message, "/observations")
    assert info.value.key == "/observations"
    assert str(info.value).startswith("/observations:")
    assert isinstance(info.value, ValueError)


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.text(max_size=10) | st.sampled_from(DTYPES),
    shape=st.lists(st.integers(min_value=-3, max_value=2**33), max_size=5),
    data=st.binary(max_size=64),
)
def test_decode_never_crashes_on_garbage(dtype, shape, data):
    message = league_pb2.Tensor(dtype=dtype, shape=shape, data=data)
    try:
        array = decode_tensor(message, "/k", CodecLimits(max_tensor_bytes=1024))
    except CodecError:
        return
    assert array.nbytes == len(data)


def test_encode_rejects_object_arrays_and_oversize():
    with pytest.raises(CodecError, match="dtype"):
        encode_tensor(np.array([object()]), "/infos/x")
    with pytest.raises(CodecError, match="limit"):
        encode_tensor(np.zeros(100, np.float64), "/infos/x", CodecLimits(max_tensor_bytes=100))
    with pytest.raises(CodecError, match="numpy"):
        encode_tensor([1, 2, 3], "/infos/x")


def make_trajectory(batch=2, steps=3):
    rng = np.random.default_rng(0)
    return Trajectory(
        {
            "/observations/observation": rng.random((batch, steps, 6, 7)).astype(np.float32),
            "/observations/action_mask": rng.random((batch, steps, 7)) > 0.5,
            "/next_observations/observation": rng.random((batch, 6, 7)).astype(np.float32),
            "/next_observations/action_mask": rng.random((batch, 7)) > 0.5,
            "/rewards": rng.random((batch, steps)).astype(np.float32),
            "/terminals": rng.random((batch, steps)) > 0.8,
            "/truncations": np.zeros((batch, steps), bool),
            "/agents/agent/actions": rng.integers(0, 7, (batch, steps)),
            "/agents/agent/artifacts/logp": rng.random((batch, steps)).astype(np.float32),
            "/infos/step": rng.integers(0, 100, (batch, steps)).astype(np.uint16),
        }
    )


def test_chunk_round_trip_over_the_wire():
    traj = make_trajectory()
    header = ChunkHeader("job-1", "main_player_0", "actor-3", seq=7, policy_version=12)
    wire = encode_chunk(traj, header).SerializeToString()
    decoded = decode_chunk(league_pb2.TrajectoryChunk.FromString(wire))
    assert decoded.header == header
    assert set(decoded.trajectory.tensors) == set(traj.tensors)
    for key, value in traj.tensors.items():
        np.testing.assert_array_equal(decoded.trajectory.tensors[key], value)
        assert decoded.trajectory.tensors[key].dtype == value.dtype


def test_chunk_rejects_bad_keys_and_inconsistent_shapes():
    chunk = encode_chunk(make_trajectory(), ChunkHeader("j", "p", "w", 0, 0))
    bad_key = league_pb2.TrajectoryChunk()
    bad_key.CopyFrom(chunk)
    bad_key.tensors["/../etc"].CopyFrom(encode_tensor(np.zeros(1)))
    with pytest.raises(CodecError, match="/../etc"):
        decode_chunk(bad_key)

    bad_shape = league_pb2.TrajectoryChunk()
    bad_shape.CopyFrom(chunk)
    bad_shape.tensors["/rewards"].CopyFrom(encode_tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(CodecError) as info:
        decode_chunk(bad_shape)
    assert info.value.key.startswith("/")

    negative = league_pb2.TrajectoryChunk()
    negative.CopyFrom(chunk)
    negative.seq = -1
    with pytest.raises(CodecError, match="seq"):
        decode_chunk(negative)
    negative.seq = 0
    negative.policy_version = -1  # the learner's staleness metric would count it as newer than its own
    with pytest.raises(CodecError, match="policy_version"):
        decode_chunk(negative)


def test_chunk_limits_count_and_total_size():
    chunk = encode_chunk(make_trajectory(), ChunkHeader("j", "p", "w", 0, 0))
    with pytest.raises(CodecError, match="tensors exceed"):
        decode_chunk(chunk, CodecLimits(max_tensors=3))
    with pytest.raises(CodecError, match="total size"):
        decode_chunk(chunk, CodecLimits(max_total_bytes=200))
    count = len(chunk.tensors)
    assert len(decode_chunk(chunk, CodecLimits(max_tensors=count)).trajectory.tensors) == count  # at the limit
    with pytest.raises(CodecError, match="tensors exceed"):
        decode_tensors(dict(chunk.tensors), CodecLimits(max_tensors=count - 1))
    with pytest.raises(CodecError, match="tensors exceed"):
        encode_tensors(make_trajectory().tensors, CodecLimits(max_tensors=count - 1))


def test_the_per_tensor_limit_is_inclusive_both_ways():
    array = np.zeros(4, np.float32)  # 16 bytes
    exact, under = CodecLimits(max_tensor_bytes=16), CodecLimits(max_tensor_bytes=15)
    assert decode_tensor(encode_tensor(array, "/x", exact), "/x", exact).shape == (4,)
    with pytest.raises(CodecError, match="/x"):
        encode_tensor(array, "/x", under)
    with pytest.raises(CodecError, match="/x"):
        decode_tensor(encode_tensor(array, "/x", exact), "/x", under)


def test_a_key_from_the_network_is_shown_cut_and_escaped():
    """A 20 MB tensor key was echoed whole into the status detail and the log, control characters and all."""
    err = CodecError("/x" * 1_000_000 + "\x1b[2J", "not a trajectory key")
    assert len(str(err)) < 200 and "\\x1b" not in str(err)[:100] and "(2000004 characters)" in str(err)
    assert "\x1b" not in str(CodecError("/a\x1b[2J", "bad"))
    assert str(CodecError("/observations", "bad")) == "/observations: bad"  # a plain key as it is
