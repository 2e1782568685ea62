"""Tensors on the wire: raw little-endian bytes with dtype and shape, never pickle.

:func:`decode_tensor` checks everything a peer could get wrong (unknown dtype, negative,
inconsistent or impossibly large shape, too many dimensions, byte count) and raises
:class:`CodecError` with a message naming the tensor (shapes cut to their first dimensions),
so the server can answer ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable

import numpy as np
import torch

from fedleak.harness.wire.quoting import quoted
from fedleak.v1 import victim_pb2 as pb


class CodecError(ValueError):
    """A received tensor message that does not describe a valid tensor."""


_TORCH_TO_PB: dict[torch.dtype, pb.DType] = {
    torch.float32: pb.FLOAT32,
    torch.float64: pb.FLOAT64,
    torch.float16: pb.FLOAT16,
    torch.bfloat16: pb.BFLOAT16,
    torch.int64: pb.INT64,
    torch.int32: pb.INT32,
    torch.uint8: pb.UINT8,
    torch.bool: pb.BOOL,
}
_PB_TO_TORCH: dict[int, torch.dtype] = {v: k for k, v in _TORCH_TO_PB.items()}
# numpy has no bfloat16: it travels as its raw 16-bit pattern.
_NUMPY: dict[int, np.dtype] = {
    pb.FLOAT32: np.dtype("<f4"),
    pb.FLOAT64: np.dtype("<f8"),
    pb.FLOAT16: np.dtype("<f2"),
    pb.BFLOAT16: np.dtype("<i2"),
    pb.INT64: np.dtype("<i8"),
    pb.INT32: np.dtype("<i4"),
    pb.UINT8: np.dtype("u1"),
    pb.BOOL: np.dtype("?"),
}


def dtype_to_pb(dtype: torch.dtype) -> pb.DType:
    """The wire enum for a torch dtype."""
    if dtype not in _TORCH_TO_PB:
        raise CodecError(f"dtype {dtype} cannot travel; use one of {list(_TORCH_TO_PB)}")
    return _TORCH_TO_PB[dtype]


def dtype_from_pb(value: int) -> torch.dtype:
    """The torch dtype for a wire enum value."""
    if value not in _PB_TO_TORCH:
        raise CodecError(f"unknown dtype enum {value}")
    return _PB_TO_TORCH[value]


def dtype_name(value: int) -> str:
    """A readable name for a wire dtype (``FLOAT32``)."""
    try:
        return pb.DType.Name(value)
    except ValueError:
        return str(value)


def encode_tensor(tensor: torch.Tensor, name: str = "") -> pb.Tensor:
    """Serialise ``tensor`` (moved to CPU, made contiguous) as little-endian bytes."""
    wire = dtype_to_pb(tensor.dtype)
    cpu = tensor.detach().to("cpu").contiguous()
    if cpu.dtype == torch.bfloat16:
        cpu = cpu.view(torch.int16)
    array = cpu.numpy()
    array = array.astype(_NUMPY[wire], copy=False)
    return pb.Tensor(name=name, dtype=wire, shape=list(cpu.shape), data=array.tobytes())


FLOAT_DTYPES = frozenset({pb.FLOAT32, pb.FLOAT64, pb.FLOAT16, pb.BFLOAT16})
#: The most bytes a shape's non-zero dimensions may span: numpy (and torch) cannot describe an
#: array beyond it, even an empty one such as ``[0, 2**62]``.
MAX_EXTENT_BYTES = sys.maxsize
#: The most dimensions a tensor may have (numpy's limit).
MAX_DIMS = 64


def shape_text(shape: Iterable[int], limit: int = 8) -> str:
    """A declared shape for a message: its first ``limit`` dimensions, and how many there are
    when cut (a client may declare thousands)."""
    dims = [int(s) for s in shape]
    if len(dims) <= limit:
        return str(dims)
    return f"[{', '.join(map(str, dims[:limit]))}, … ({len(dims)} dimensions)]"


def declared_shape(message: pb.Tensor) -> tuple[int, ...]:
    """The shape a tensor message declares, read without decoding its bytes."""
    return tuple(int(s) for s in message.shape)


def check_declared(message: pb.Tensor, what: str, shape: tuple[int | None, ...],
                   floating: bool = True, wanted: str | None = None) -> None:
    """Refuse a message whose declared dtype or shape is not what is expected, before its
    bytes are decoded (``None`` in ``shape`` accepts any size for that dimension; ``wanted``
    says in words what to send)."""
    got = declared_shape(message)
    if len(got) != len(shape) or any(e is not None and g != e
                                     for g, e in zip(got, shape, strict=True)):
        wanted = wanted or "[" + ", ".join("?" if e is None else str(e) for e in shape) + "]"
        raise CodecError(f"{what} has shape {shape_text(got)}; expected {wanted}")
    if floating and message.dtype not in FLOAT_DTYPES:
        raise CodecError(f"{what} has dtype {dtype_name(message.dtype)}; send floating point "
                         "(FLOAT32)")


def decode_tensor(message: pb.Tensor, what: str = "tensor") -> torch.Tensor:
    """Rebuild a CPU tensor from a wire message, validating dtype, shape and byte count."""
    label = f"{what} {quoted(message.name)}" if message.name else what
    if message.dtype not in _NUMPY:
        raise CodecError(f"{label}: dtype {dtype_name(message.dtype)} is not supported; "
                         f"send one of {', '.join(pb.DType.Name(v) for v in _NUMPY)}")
    shape = tuple(int(s) for s in message.shape)
    if len(shape) > MAX_DIMS:
        raise CodecError(f"{label}: shape {shape_text(shape)} has {len(shape)} dimensions; a "
                         f"tensor has at most {MAX_DIMS}")
    if any(s < 0 for s in shape):
        raise CodecError(f"{label}: shape {shape_text(shape)} has a negative dimension")
    np_dtype = _NUMPY[message.dtype]
    if math.prod(s for s in shape if s) * np_dtype.itemsize > MAX_EXTENT_BYTES:
        raise CodecError(f"{label}: shape {shape_text(shape)} is too large for any tensor (its "
                         f"non-zero dimensions span over {MAX_EXTENT_BYTES} bytes, even with a "
                         "zero dimension); send the tensor's real shape")
    expected = math.prod(shape) * np_dtype.itemsize  # Python ints: no overflow
    if len(message.data) != expected:
        raise CodecError(f"{label}: shape {shape_text(shape)} of {dtype_name(message.dtype)} needs "
                         f"{expected} bytes, got {len(message.data)}")
    array = np.frombuffer(message.data, dtype=np_dtype).reshape(shape)
    tensor = torch.from_numpy(array.copy())
    if message.dtype == pb.BFLOAT16:
        tensor = tensor.view(torch.bfloat16)
    return tensor
