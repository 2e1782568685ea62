r"""The pseudorandom generator that turns a 32-byte seed into a mask vector.

:math:`\mathrm{PRG}(\text{seed}) \in \mathbb{Z}_{2^{32}}^d` is the AES-256-CTR keystream under
key ``seed`` (counter block starting at zero), read as little-endian ``uint32``. Every seed keys
exactly one stream (a fresh self-mask seed :math:`b_u`, or a pairwise seed :math:`s_{u,v}` that
HKDF derives per session and pair), so the fixed initial counter never repeats a keystream.
Deterministic across machines and library versions: both the user who adds a mask and the server
who removes it expand the same seed.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SEED_BYTES = 32
_ZERO_COUNTER = bytes(16)


def expand(seed: bytes, length: int) -> np.ndarray:
    r""":math:`\mathrm{PRG}(\text{seed})`: ``length`` uniform ``uint32`` values.

    Parameters
    ----------
    seed
        32 secret bytes (an AES-256 key).
    length
        the vector length :math:`d \ge 0`.
    """
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a PRG seed is {SEED_BYTES} bytes, got {len(seed)}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    encryptor = Cipher(algorithms.AES(bytes(seed)), modes.CTR(_ZERO_COUNTER)).encryptor()
    keystream = encryptor.update(bytes(4 * length)) + encryptor.finalize()
    return np.frombuffer(keystream, dtype="<u4").astype(np.uint32)
