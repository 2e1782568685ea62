"""The explicit byte layout of secure-aggregation messages (no pickle).

Every message is ``b"FLSA"``, a version byte, a message-type byte, then its fields in a fixed
order, each in one of these forms (all integers little-endian, unsigned):

========== ==============================================================
``u32``    4 bytes
``u64``    8 bytes
``blob``   ``u32`` length, then the bytes
``ids``    ``u32`` count, then that many ``u32``
``blobs``  ``u32`` count, then ``(u32 id, blob)`` pairs, ids strictly increasing
``share``  ``u32`` x, ``u32`` threshold, 66-byte big-endian y (a Shamir share)
``shares`` ``u32`` count, then ``(u32 id, share)`` pairs, ids strictly increasing
``vector`` ``u64`` length d, then ``4 d`` bytes of little-endian ``uint32``
========== ==============================================================

Decoding checks the header, every length against what is left, and that nothing trails; any
problem is a :class:`~fedleak.defenses.secagg.errors.SecAggViolation`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import numpy as np

from fedleak.defenses.secagg.errors import SecAggViolation
from fedleak.defenses.secagg.shamir import FIELD_BYTES, PRIME, ShamirError, Share

MAGIC = b"FLSA"
VERSION = 1
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
T = TypeVar("T")


class Writer:
    """Appends fields to a message body."""

    def __init__(self, message_type: int) -> None:
        self._parts: list[bytes] = [MAGIC, bytes([VERSION, message_type])]

    def u32(self, value: int) -> Writer:
        """Append ``value`` as 4 little-endian bytes (refused unless 0 ≤ value < 2³²)."""
        if not 0 <= value < 2**32:
            raise ValueError(f"{value} does not fit in an unsigned 32-bit field")
        self._parts.append(_U32.pack(value))
        return self

    def blob(self, value: bytes) -> Writer:
        """Append ``value``'s length, then its bytes."""
        self.u32(len(value))
        self._parts.append(bytes(value))
        return self

    def ids(self, values: Iterable[int]) -> Writer:
        """Append a count, then each id as ``u32``, in the order given."""
        values = list(values)
        self.u32(len(values))
        for value in values:
            self.u32(value)
        return self

    def blobs(self, values: Mapping[int, bytes]) -> Writer:
        """Append a count, then ``(id, blob)`` pairs by increasing id."""
        self.u32(len(values))
        for key in sorted(values):
            self.u32(key).blob(values[key])
        return self

    def share(self, share: Share) -> Writer:
        """Append a Shamir share: x, threshold, then y as 66 big-endian bytes."""
        self.u32(share.x).u32(share.threshold)
        self._parts.append(share.y.to_bytes(FIELD_BYTES, "big"))
        return self

    def shares(self, values: Mapping[int, Share]) -> Writer:
        """Append a count, then ``(id, share)`` pairs by increasing id."""
        self.u32(len(values))
        for key in sorted(values):
            self.u32(key).share(values[key])
        return self

    def vector(self, values: np.ndarray) -> Writer:
        """Append a ``u64`` length d, then the d values as little-endian ``uint32``."""
        values = np.ascontiguousarray(values, dtype="<u4")
        self._parts.append(_U64.pack(values.size))
        self._parts.append(values.tobytes())
        return self

    def to_bytes(self) -> bytes:
        """Return the message: header and every field appended so far."""
        return b"".join(self._parts)


class Reader:
    """Reads the fields of one message of an expected type, refusing malformed bytes."""

    def __init__(self, data: bytes, message_type: int, name: str) -> None:
        self._data = memoryview(bytes(data))
        self._at = 0
        self._name = name
        header = bytes(self._take(len(MAGIC) + 2))
        if header[: len(MAGIC)] != MAGIC:
            raise SecAggViolation(f"not a secure-aggregation message (expected {name})")
        if header[-2] != VERSION:
            raise SecAggViolation(f"{name}: wire version {header[-2]}, this code speaks {VERSION}")
        if header[-1] != message_type:
            raise SecAggViolation(f"expected a {name} message, got message type {header[-1]}")

    def _take(self, size: int) -> memoryview:
        if size > len(self._data) - self._at:
            raise SecAggViolation(f"{self._name}: truncated message ({len(self._data)} bytes)")
        chunk = self._data[self._at : self._at + size]
        self._at += size
        return chunk

    def u32(self) -> int:
        """Read a little-endian unsigned 32-bit integer."""
        value: int = _U32.unpack(self._take(4))[0]
        return value

    def blob(self) -> bytes:
        """Read a length, then that many bytes."""
        return bytes(self._take(self.u32()))

    def ids(self) -> tuple[int, ...]:
        """Read a count, then that many ``u32`` ids."""
        return tuple(self.u32() for _ in range(self.u32()))

    def _keys_in_order(self, count: int, read_value: Callable[[], T]) -> dict[int, T]:
        result: dict[int, T] = {}
        last = -1
        for _ in range(count):
            key = self.u32()
            if key <= last:
                raise SecAggViolation(f"{self._name}: user ids not strictly increasing")
            result[key], last = read_value(), key
        return result

    def blobs(self) -> dict[int, bytes]:
        """Read ``(id, blob)`` pairs; ids must strictly increase."""
        return self._keys_in_order(self.u32(), self.blob)

    def share(self) -> Share:
        """Read a Shamir share; a y outside the field is a violation."""
        x, threshold = self.u32(), self.u32()
        y = int.from_bytes(self._take(FIELD_BYTES), "big")
        if y >= PRIME:
            raise SecAggViolation(f"{self._name}: share value outside the field")
        try:
            return Share(x, y, threshold)
        except ShamirError as error:
            raise SecAggViolation(f"{self._name}: {error}") from error

    def shares(self) -> dict[int, Share]:
        """Read ``(id, share)`` pairs; ids must strictly increase."""
        return self._keys_in_order(self.u32(), self.share)

    def vector(self) -> np.ndarray:
        """Read a ``u64`` length d, then d ``uint32`` values (refused when truncated)."""
        length = _U64.unpack(self._take(8))[0]
        if length > (len(self._data) - self._at) // 4:
            raise SecAggViolation(f"{self._name}: vector of {length} values is truncated")
        return np.frombuffer(self._take(4 * length), dtype="<u4").astype(np.uint32)

    def finish(self) -> None:
        """Refuse the message if any bytes trail its last field."""
        if self._at != len(self._data):
            raise SecAggViolation(
                f"{self._name}: {len(self._data) - self._at} unexpected trailing bytes"
            )
