r"""Key agreement and authenticated encryption between pairs of users.

Each user :math:`u` holds two X25519 key pairs (Round 0, AdvertiseKeys):

* :math:`(c_u^{PK}, c_u^{SK})` for encryption: users :math:`u, v` share the AES-256-GCM key
  :math:`c_{u,v} = \mathrm{HKDF}(\mathrm{KA}(c_u^{SK}, c_v^{PK}))`, used to send each other
  Shamir shares through the server (Round 1, ShareKeys), which cannot read them.
* :math:`(s_u^{PK}, s_u^{SK})` for masking: the pairwise mask seed
  :math:`s_{u,v} = \mathrm{HKDF}(\mathrm{KA}(s_u^{SK}, s_v^{PK}))` (Round 2). Because
  :math:`s_u^{SK}` is Shamir-shared, the server can recompute :math:`s_{u,v}` of a user
  :math:`u` that dropped, from :math:`s_u^{SK}` and the survivors' public keys.

:math:`\mathrm{KA}` is X25519 (:math:`\mathrm{KA}(a^{SK}, b^{PK}) = \mathrm{KA}(b^{SK},
a^{PK})`); HKDF-SHA256 turns the shared point into 32 bytes, with ``info`` binding the purpose
(``mask`` or ``cipher``), the session (FL round) and the unordered pair
:math:`\{u, v\}`, so that :math:`s_{u,v} = s_{v,u}` and no key serves two purposes.

Ciphertexts are ``nonce (12 bytes) || AES-GCM(plaintext)`` with associated data
``(session, sender, recipient)``: a ciphertext moved to another pair, direction or session, or
changed in a single bit, fails its tag and is refused.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedleak.defenses.secagg.errors import SecAggViolation

KEY_BYTES = 32
NONCE_BYTES = 12
_INFO_PREFIX = b"fedleak/secagg/v1/"

RandomBytes = Callable[[int], bytes]


def generate_private_key(randbytes: RandomBytes = os.urandom) -> X25519PrivateKey:
    """Draw a fresh X25519 private key from 32 bytes of ``randbytes``."""
    return X25519PrivateKey.from_private_bytes(randbytes(KEY_BYTES))


def public_bytes(key: X25519PrivateKey) -> bytes:
    """Return the 32-byte raw public key of ``key``."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    """Return the 32-byte raw private key (what is Shamir-shared as :math:`s_u^{SK}`)."""
    return key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )


def private_key_from_bytes(raw: bytes) -> X25519PrivateKey:
    """Inverse of :func:`private_bytes`."""
    if len(raw) != KEY_BYTES:
        raise SecAggViolation(f"an X25519 private key is {KEY_BYTES} bytes, got {len(raw)}")
    return X25519PrivateKey.from_private_bytes(raw)


def _agree(
    private_key: X25519PrivateKey, peer_public: bytes, purpose: bytes, session: int, u: int, v: int
) -> bytes:
    if len(peer_public) != KEY_BYTES:
        raise SecAggViolation(f"an X25519 public key is {KEY_BYTES} bytes, got {len(peer_public)}")
    try:
        shared = private_key.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as error:  # low-order point: the shared secret would be all zeros
        raise SecAggViolation(f"public key of user {v} is not usable for X25519") from error
    info = _INFO_PREFIX + purpose + struct.pack("<QII", session, min(u, v), max(u, v))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def pairwise_mask_seed(
    mask_private_key: X25519PrivateKey, peer_mask_public: bytes, session: int, u: int, v: int
) -> bytes:
    """:math:`s_{u,v}`, the PRG seed of the mask that :math:`u` and :math:`v` share."""
    return _agree(mask_private_key, peer_mask_public, b"mask", session, u, v)


def pairwise_cipher_key(
    cipher_private_key: X25519PrivateKey, peer_cipher_public: bytes, session: int, u: int, v: int
) -> bytes:
    """:math:`c_{u,v}`, the AES-256-GCM key between :math:`u` and :math:`v`."""
    return _agree(cipher_private_key, peer_cipher_public, b"cipher", session, u, v)


def _associated_data(session: int, sender: int, recipient: int) -> bytes:
    return _INFO_PREFIX + b"shares" + struct.pack("<QII", session, sender, recipient)


def encrypt(
    key: bytes,
    plaintext: bytes,
    *,
    session: int,
    sender: int,
    recipient: int,
    randbytes: RandomBytes = os.urandom,
) -> bytes:
    """``nonce || AES-GCM_key(plaintext)`` bound to ``(session, sender, recipient)``."""
    nonce = randbytes(NONCE_BYTES)
    aad = _associated_data(session, sender, recipient)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def decrypt(key: bytes, ciphertext: bytes, *, session: int, sender: int, recipient: int) -> bytes:
    """Inverse of :func:`encrypt`.

    Raises
    ------
    SecAggViolation
        the tag does not verify (tampered, truncated, or not from ``sender``
        to ``recipient`` in ``session``).
    """
    nonce, body = ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:]
    if len(nonce) != NONCE_BYTES:
        raise SecAggViolation(f"ciphertext from user {sender} is too short")
    try:
        return AESGCM(key).decrypt(nonce, body, _associated_data(session, sender, recipient))
    except InvalidTag as error:
        raise SecAggViolation(
            f"ciphertext from user {sender} to user {recipient} failed authentication "
            f"(AES-GCM tag): tampered with or misrouted"
        ) from error
