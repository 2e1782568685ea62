r"""The messages of SecAgg (Bonawitz et al. 2017), one dataclass per message.

Each has an explicit byte encoding (:mod:`~fedleak.defenses.secagg.encoding`; never pickle).

=========================  ===============  ===========================================
round (paper name)         direction        message
=========================  ===============  ===========================================
0 AdvertiseKeys            user → server    :class:`AdvertiseKeys`
1 ShareKeys                server → user    :class:`ShareKeysRequest` (keys of U1)
1 ShareKeys                user → server    :class:`ShareKeys` (encrypted shares)
2 MaskedInputCollection    server → user    :class:`MaskedInputRequest` (shares for u)
2 MaskedInputCollection    user → server    :class:`MaskedInput` (y_u)
3 ConsistencyCheck         —                skipped (semi-honest variant)
4 Unmasking                server → user    :class:`UnmaskingRequest` (U3, U2 \ U3)
4 Unmasking                user → server    :class:`UnmaskingShares`
=========================  ===============  ===========================================

A transport carries ``message.to_bytes()`` and rebuilds it with ``Type.from_bytes(data)`` or
:func:`decode_message` (which reads the type byte). Decoding checks structure only; whether the
content fits the round is checked by :class:`~fedleak.defenses.secagg.user.SecAggUser` and
:class:`~fedleak.defenses.secagg.secagg_server.SecAggServer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from fedleak.defenses.secagg.encoding import Reader, Writer
from fedleak.defenses.secagg.errors import SecAggViolation
from fedleak.defenses.secagg.shamir import Share


@dataclass(frozen=True)
class AdvertiseKeys:
    """Round 0, user → server: :math:`(u, c_u^{PK}, s_u^{PK})`, two raw X25519 public keys.

    Unsigned: the semi-honest variant of the paper needs no signatures (the active variant
    signs this message with a long-term key from a PKI; not implemented).
    """

    MESSAGE_TYPE: ClassVar[int] = 1
    user_id: int
    cipher_public_key: bytes
    mask_public_key: bytes

    def _write(self, writer: Writer) -> Writer:
        return writer.u32(self.user_id).blob(self.cipher_public_key).blob(self.mask_public_key)

    @staticmethod
    def _read(reader: Reader) -> AdvertiseKeys:
        return AdvertiseKeys(reader.u32(), reader.blob(), reader.blob())

    def to_bytes(self) -> bytes:
        """Encode the message in its byte layout (:mod:`~fedleak.defenses.secagg.encoding`)."""
        return self._write(Writer(self.MESSAGE_TYPE)).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> AdvertiseKeys:
        """Decode one message of this type; malformed or trailing bytes are a violation."""
        reader = Reader(data, cls.MESSAGE_TYPE, cls.__name__)
        message = cls._read(reader)
        reader.finish()
        return message


@dataclass(frozen=True)
class ShareKeysRequest:
    """Round 1, server → every user of U1: the advertised keys of all users in U1 (by id)."""

    MESSAGE_TYPE: ClassVar[int] = 2
    public_keys: tuple[AdvertiseKeys, ...]

    @property
    def user_ids(self) -> tuple[int, ...]:
        """U1."""
        return tuple(keys.user_id for keys in self.public_keys)

    def to_bytes(self) -> bytes:
        """Encode the message in its byte layout (:mod:`~fedleak.defenses.secagg.encoding`)."""
        writer = Writer(self.MESSAGE_TYPE).u32(len(self.public_keys))
        for keys in self.public_keys:
            keys._write(writer)
        return writer.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> ShareKeysRequest:
        """Decode one message of this type; malformed or trailing bytes are a violation."""
        reader = Reader(data, cls.MESSAGE_TYPE, cls.__name__)
        message = cls(tuple(AdvertiseKeys._read(reader) for _ in range(reader.u32())))
        reader.finish()
        return message


@dataclass(frozen=True)
class ShareKeys:
    r"""Round 1, user → server: the encrypted shares for every other user of U1.

    :math:`c_{u,v} = \mathrm{AE.enc}(u \| v \| s^{SK}_{u,v} \| b_{u,v})` for every other
    :math:`v \in U1`, keyed by the recipient ``v``.
    """

    MESSAGE_TYPE: ClassVar[int] = 3
    user_id: int
    ciphertexts: dict[int, bytes] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """Encode the message in its byte layout (:mod:`~fedleak.defenses.secagg.encoding`)."""
        return Writer(self.MESSAGE_TYPE).u32(self.user_id).blobs(self.ciphertexts).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> ShareKeys:
        """Decode one message of this type; malformed or trailing bytes are a violation."""
        reader = Reader(data, cls.MESSAGE_TYPE, cls.__name__)
        message = cls(reader.u32(), reader.blobs())
        reader.finish()
        return message


@dataclass(frozen=True)
class MaskedInputRequest:
    """Round 2, server → user ``recipient``: the ciphertexts addressed to it, keyed by sender.

    The senders plus the recipient are U2, the users whose shares reached the server.
    """

    MESSAGE_TYPE: ClassVar[int] = 4
    recipient: int
    ciphertexts: dict[int, bytes] = field(default_factory=dict)

    @property
    def user_ids(self) -> tuple[int, ...]:
        """U2 as this recipient sees it."""
        return tuple(sorted({*self.ciphertexts, self.recipient}))

    def to_bytes(self) -> bytes:
        """Encode the message in its byte layout (:mod:`~fedleak.defenses.secagg.encoding`)."""
        return Writer(self.MESSAGE_TYPE).u32(self.recipient).blobs(self.ciphertexts).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> MaskedInputRequest:
        """Decode one message of this type; malformed or trailing bytes are a violation."""
        reader = Reader(data, cls.MESSAGE_TYPE, cls.__name__)
        message = cls(reader.u32(), reader.blobs())
        reader.finish()
        return message


@dataclass(frozen=True, eq=False)
class MaskedInput:
    r"""Round 2, user → server: the masked input, a ``uint32`` vector of length :math:`d`.

    Bonawitz et al. 2017, §4, Round 2 (MaskedInputCollection):

    .. math::

        y_u = q(x_u) + \mathrm{PRG}(b_u) + \sum_{v \in U2, u < v} \mathrm{PRG}(s_{u,v})
              - \sum_{v \in U2, u > v} \mathrm{PRG}(s_{u,v}) \pmod{2^{32}}.
    """

    MESSAGE_TYPE: ClassVar[int] = 5
    user_id: int
    masked: np.ndarray

    def to_bytes(self) -> bytes:
        """Encode the message in its byte layout (:mod:`~fedleak.defenses.secagg.encoding`)."""
        return Writer(self.MESSAGE_TYPE).u32(self.user_id).vector(self.masked).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> MaskedInput:
        """Decode one message of this type; malformed or trailing bytes are a violation."""
        reader = Reader(data, cls.MESSAGE_TYPE, cls.__name__)
        message = cls(reader.u32(), reader.vector())
        reader.finish()
        return message


@dataclass(frozen=True)
class UnmaskingRequest:
    r"""Round 4, server → every user of U3: which users survived, and which dropped.

    The survivors are U3, whose inputs are summed; the dropped shared keys but sent no masked
    input (U2 \ U3).

    A user answers with shares of :math:`b_v` for the survivors and of :math:`s_v^{SK}` for the
    dropped, and refuses a request naming one user in both lists (or, across requests, asking
    for the other share of a user it already answered for): both shares would unmask
    :math:`x_v`.
    """

    MESSAGE_TYPE: ClassVar[int] = 6
    survivors: tuple[int, ...]
    dropped: tuple[int, ...] = ()

    def to_bytes(self) -> bytes:
        """Encode the message in its byte layout (:mod:`~fedleak.defenses.secagg.encoding`)."""
        return Writer(self.MESSAGE_TYPE).ids(self.survivors).ids(self.dropped).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnmaskingRequest:
        """Decode one message of this type; malformed or trailing bytes are a violation."""
        reader = Reader(data, cls.MESSAGE_TYPE, cls.__name__)
        message = cls(reader.ids(), reader.ids())
        reader.finish()
        return message


@dataclass(frozen=True)
class UnmaskingShares:
    """Round 4, user → server: its Shamir shares of the survivors' and the dropped's secrets.

    :math:`b_{v,u}` of the self-mask seeds of the survivors and :math:`s^{SK}_{v,u}` of the mask
    keys of the dropped, keyed by ``v``.
    """

    MESSAGE_TYPE: ClassVar[int] = 7
    user_id: int
    self_mask_shares: dict[int, Share] = field(default_factory=dict)
    mask_key_shares: dict[int, Share] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """Encode the message in its byte layout (:mod:`~fedleak.defenses.secagg.encoding`)."""
        writer = Writer(self.MESSAGE_TYPE).u32(self.user_id)
        return writer.shares(self.self_mask_shares).shares(self.mask_key_shares).to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnmaskingShares:
        """Decode one message of this type; malformed or trailing bytes are a violation."""
        reader = Reader(data, cls.MESSAGE_TYPE, cls.__name__)
        message = cls(reader.u32(), reader.shares(), reader.shares())
        reader.finish()
        return message


Message = (
    AdvertiseKeys
    | ShareKeysRequest
    | ShareKeys
    | MaskedInputRequest
    | MaskedInput
    | UnmaskingRequest
    | UnmaskingShares
)
_BY_TYPE: dict[int, type[Any]] = {
    cls.MESSAGE_TYPE: cls
    for cls in (
        AdvertiseKeys,
        ShareKeysRequest,
        ShareKeys,
        MaskedInputRequest,
        MaskedInput,
        UnmaskingRequest,
        UnmaskingShares,
    )
}


def decode_message(data: bytes) -> Message:
    """Any SecAgg message from its bytes, dispatching on the type byte (the header's 6th byte)."""
    if len(data) < 6 or data[5] not in _BY_TYPE:
        raise SecAggViolation("not a secure-aggregation message, or an unknown message type")
    message: Message = _BY_TYPE[data[5]].from_bytes(data)
    return message


M = TypeVar("M", AdvertiseKeys, ShareKeysRequest, ShareKeys, MaskedInputRequest, MaskedInput,
            UnmaskingRequest, UnmaskingShares)


def decode_as(data: bytes, kind: type[M]) -> M:
    """Decode a message of type ``kind`` from its bytes; any other type is a violation."""
    message = decode_message(data)
    if not isinstance(message, kind):
        raise SecAggViolation(f"expected a {kind.__name__}, got a {type(message).__name__}")
    return message
