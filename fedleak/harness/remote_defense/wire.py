"""An update as a stream of ``fedleak.v1.UpdateChunk`` messages, and back.

A tensor travels as one or more chunks in order. Every chunk repeats the tensor's name, dtype
and shape, and carries the bytes ``[offset, offset + len(data))`` of its raw little-endian data
(:mod:`fedleak.harness.wire.codec`), so no message is larger than ``chunk_bytes`` plus a small
header however large the update: a ResNet-152 update (~240 MB) passes under gRPC's default 4 MiB
message limit. :func:`assemble_update` checks everything a peer could get wrong and raises
:class:`UpdateStreamError` naming the tensor and what to change. Given the tensors it expects
(:class:`ExpectedTensor`: a reply carries the names, dtypes and shapes that were sent), it
checks each tensor's header at its first chunk and refuses at the first byte beyond them, so
a reply that declares gigabytes costs its receiver no more than the update it sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from fedleak.harness.wire.codec import (
    MAX_DIMS,
    CodecError,
    decode_tensor,
    dtype_from_pb,
    dtype_name,
    dtype_to_pb,
    encode_tensor,
    shape_text,
)
from fedleak.harness.wire.quoting import quoted
from fedleak.v1 import defense_pb2 as dpb
from fedleak.v1 import victim_pb2 as pb

DEFAULT_CHUNK_BYTES = 1 << 20  # 1 MiB: a quarter of gRPC's default message limit


class UpdateStreamError(CodecError):
    """A chunk stream that does not describe a sequence of whole tensors."""


def update_chunks(
    update: Sequence[torch.Tensor],
    names: Sequence[str],
    seed: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    expected_batch_size: int = 0,
) -> Iterator[dpb.UpdateChunk]:
    """The chunks of ``update`` (tensor ``i`` named ``names[i]``); ``seed`` (and, for a
    per-example service, ``expected_batch_size``) ride on the first."""
    if len(update) != len(names):
        raise ValueError(f"{len(update)} tensors but {len(names)} names")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    first = True
    for tensor, name in zip(update, names, strict=True):
        whole = encode_tensor(tensor, name)
        data = whole.data
        for offset in range(0, max(len(data), 1), chunk_bytes):
            piece = pb.Tensor(name=name, dtype=whole.dtype, shape=whole.shape,
                              data=data[offset:offset + chunk_bytes])
            chunk = dpb.UpdateChunk(piece=piece, offset=offset)
            if first and seed is not None:
                chunk.seed = seed
            if first and expected_batch_size:
                chunk.expected_batch_size = expected_batch_size
            first = False
            yield chunk


@dataclass(frozen=True)
class ExpectedTensor:
    """A tensor a stream must carry: its name, wire dtype and shape."""

    name: str
    dtype: int
    shape: tuple[int, ...] = field(default=())

    @classmethod
    def like(cls, tensor: torch.Tensor, name: str, shape: Sequence[int] | None = None) \
            -> ExpectedTensor:
        """The header of ``tensor`` (or of its dtype at ``shape``), as the wire writes it."""
        return cls(name, int(dtype_to_pb(tensor.dtype)),
                   tuple(int(s) for s in (tensor.shape if shape is None else shape)))

    def words(self) -> str:
        return f"{quoted(self.name)} {shape_text(self.shape)} {dtype_name(self.dtype)}"


@dataclass
class AssembledUpdate:
    """The tensors of a chunk stream in the order they came, and the request's seed."""

    names: list[str]
    tensors: list[torch.Tensor]
    seed: int = 0
    expected_batch_size: int = 0


class _Pending:
    """The tensor being received: its header and the bytes so far."""

    def __init__(self, piece: pb.Tensor, what: str) -> None:
        self.header = pb.Tensor(name=piece.name, dtype=piece.dtype, shape=piece.shape)
        self.what = what
        self.data = bytearray()
        try:
            itemsize = torch.empty((), dtype=dtype_from_pb(piece.dtype)).element_size()
        except CodecError as err:
            raise UpdateStreamError(f"{what} {quoted(piece.name)}: {err}") from None
        shape = [int(s) for s in piece.shape]
        if len(shape) > MAX_DIMS:
            raise UpdateStreamError(f"{what} {quoted(piece.name)}: shape {shape_text(shape)} has "
                                    f"{len(shape)} dimensions; a tensor has at most {MAX_DIMS}")
        if any(s < 0 for s in shape):
            raise UpdateStreamError(f"{what} {quoted(piece.name)}: shape {shape_text(shape)} "
                                    "has a negative dimension")
        self.expected = math.prod(shape) * itemsize  # Python ints: 2**62 dims do not wrap

    def same_tensor(self, piece: pb.Tensor) -> bool:
        return (piece.name == self.header.name and piece.dtype == self.header.dtype
                and list(piece.shape) == list(self.header.shape))

    def add(self, piece: pb.Tensor, offset: int) -> None:
        name = self.header.name
        if offset != len(self.data):
            raise UpdateStreamError(f"{self.what} {quoted(name)}: chunk at byte offset {offset}, "
                                    f"expected {len(self.data)}; send a tensor's chunks in order")
        if len(self.data) + len(piece.data) > self.expected:
            raise UpdateStreamError(
                f"{self.what} {quoted(name)}: more than the {self.expected} bytes that shape "
                f"{shape_text(self.header.shape)} of {dtype_name(self.header.dtype)} holds")
        self.data += piece.data

    def finish(self) -> torch.Tensor:
        message = pb.Tensor(name=self.header.name, dtype=self.header.dtype,
                            shape=self.header.shape, data=bytes(self.data))
        try:
            return decode_tensor(message, self.what)
        except CodecError as err:  # e.g. the stream moved on before the tensor was whole
            raise UpdateStreamError(f"{err}; send every byte of a tensor before the next") \
                from None


def assemble_update(chunks: Iterable[dpb.UpdateChunk], what: str = "update",
                    expected: Sequence[ExpectedTensor] | None = None) -> AssembledUpdate:
    """Rebuild the tensors of a chunk stream, validating order, sizes, dtypes and shapes.

    With ``expected``, the stream must carry exactly those tensors in order: a header that
    differs is refused at its first chunk, a tensor too many at its first byte, and no tensor
    takes more bytes than its expected shape holds (module docstring).
    """
    out = AssembledUpdate([], [])
    pending: _Pending | None = None
    for index, chunk in enumerate(chunks):
        if index == 0:
            out.seed = int(chunk.seed)
            out.expected_batch_size = int(chunk.expected_batch_size)
        piece = chunk.piece
        if pending is not None and chunk.offset > 0:
            if not pending.same_tensor(piece):
                raise UpdateStreamError(
                    f"{what}: chunk at offset {chunk.offset} of {quoted(piece.name)} does not "
                    f"continue {quoted(pending.header.name)}; repeat the tensor's name, dtype "
                    "and shape in every chunk and start each tensor at offset 0")
            pending.add(piece, int(chunk.offset))
            continue
        if pending is not None:
            out.tensors.append(pending.finish())
        if not piece.name:
            raise UpdateStreamError(f"{what}: tensor {len(out.names)} has no name")
        if piece.name in out.names:
            raise UpdateStreamError(f"{what}: tensor {quoted(piece.name)} is sent twice")
        if expected is not None:
            _check_expected(piece, expected, len(out.names), what)
        out.names.append(piece.name)
        pending = _Pending(piece, what)
        pending.add(piece, int(chunk.offset))
    if pending is not None:
        out.tensors.append(pending.finish())
    if expected is not None and len(out.tensors) != len(expected):
        raise UpdateStreamError(f"{what}: {len(out.tensors)} tensor(s), expected "
                                f"{len(expected)}: answer every tensor that was sent")
    return out


def _check_expected(piece: pb.Tensor, expected: Sequence[ExpectedTensor], index: int,
                    what: str) -> None:
    if index >= len(expected):
        raise UpdateStreamError(f"{what}: tensor {index} ({quoted(piece.name)}) is one more "
                                f"than the {len(expected)} sent; answer the same tensors")
    want = expected[index]
    got = ExpectedTensor(piece.name, int(piece.dtype), tuple(int(s) for s in piece.shape))
    if got != want:
        raise UpdateStreamError(f"{what}: tensor {index} is {got.words()}, expected "
                                f"{want.words()}: answer the same names, dtypes and shapes "
                                "in the same order")
