"""The public parameters of one secure-aggregation round, known to every user and the server."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedleak.defenses.secagg.fixed_point import FixedPointQuantizer


@dataclass(frozen=True)
class SecAggConfig:
    """Parameters that the server and all users agree on before Round 0.

    Parameters
    ----------
    threshold
        :math:`t`, the Shamir threshold. The sum is recovered while at least
        :math:`t` users survive every round (so up to :math:`n - t` may drop out), and in the
        honest-but-curious model the server together with fewer than :math:`t` users learns
        nothing about the other users' inputs beyond their sum. ``2 <= t <= n``; the paper
        suggests :math:`t > n/2`.
    clip
        :math:`c`, each coordinate is clipped to :math:`[-c, c]` before quantisation.
    vector_length
        :math:`d`, the length of every user's input vector.
    num_users
        :math:`n`, user ids are ``0 .. n-1``; also the :math:`K` of the quantiser.
    session
        a number that differs between protocol runs with the same keys' owners (the
        FL round); bound into every derived key and ciphertext.
    """

    threshold: int
    clip: float
    vector_length: int
    num_users: int
    session: int = 0

    def __post_init__(self) -> None:
        """Refuse parameters outside the ranges above; the message names the parameter."""
        if not 2 <= self.num_users < 2**32 - 1:
            raise ValueError(f"num_users must be in [2, 2^32 - 1), got {self.num_users}")
        if not 2 <= self.threshold <= self.num_users:
            raise ValueError(
                f"threshold must be in [2, num_users={self.num_users}], got {self.threshold} "
                f"(with t = 1 a single share is the secret itself)"
            )
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a positive finite number, got {self.clip!r}")
        if self.vector_length < 1:
            raise ValueError(f"vector_length must be >= 1, got {self.vector_length}")
        if not 0 <= self.session < 2**64:
            raise ValueError(f"session must be in [0, 2^64), got {self.session}")

    @property
    def quantizer(self) -> FixedPointQuantizer:
        """The fixed-point map of :mod:`~fedleak.defenses.secagg.fixed_point` for ``n`` users."""
        return FixedPointQuantizer(clip=self.clip, max_users=self.num_users)

