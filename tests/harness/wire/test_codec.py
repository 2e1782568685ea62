"""The wire format of tensors: exact round trips, and clear refusals of malformed messages."""

from __future__ import annotations

import pytest
import torch

from fedleak.harness.wire.codec import CodecError, decode_tensor, encode_tensor
from fedleak.v1 import victim_pb2 as pb


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
     torch.uint8, torch.bool],
)
def test_round_trip_is_exact(dtype: torch.dtype) -> None:
    tensor = (torch.randn(3, 4, 5) * 10).to(dtype)
    back = decode_tensor(encode_tensor(tensor, "t"))
    assert back.dtype == dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor)


def test_bytes_are_little_endian_and_raw() -> None:
    message = encode_tensor(torch.tensor([1.0], dtype=torch.float32))
    assert message.data == b"\x00\x00\x80\x3f"
    assert list(message.shape) == [1] and message.dtype == pb.FLOAT32


def test_scalars_and_empty_tensors() -> None:
    assert decode_tensor(encode_tensor(torch.tensor(2.5))).item() == 2.5
    assert decode_tensor(encode_tensor(torch.zeros(0, 3))).shape == (0, 3)


def test_non_contiguous_tensors_travel_in_logical_order() -> None:
    tensor = torch.arange(12.0).view(3, 4).t()
    assert torch.equal(decode_tensor(encode_tensor(tensor)), tensor)


@pytest.mark.parametrize(
    "message, words",
    [
        (pb.Tensor(name="w", dtype=pb.FLOAT32, shape=[2], data=b"\x00" * 7), ["'w'", "8 bytes"]),
        (pb.Tensor(dtype=pb.DTYPE_UNSPECIFIED, shape=[1], data=b"\x00" * 4), ["dtype"]),
        (pb.Tensor(dtype=77, shape=[1], data=b"\x00" * 4), ["dtype"]),
        (pb.Tensor(dtype=pb.FLOAT32, shape=[-1], data=b""), ["negative"]),
    ],
)
def test_malformed_messages(message: pb.Tensor, words: list[str]) -> None:
    with pytest.raises(CodecError) as err:
        decode_tensor(message)
    for word in words:
        assert word in str(err.value)
