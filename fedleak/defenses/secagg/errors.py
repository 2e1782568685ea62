"""The two ways secure aggregation stops: too few users left, or a message that breaks the rules.

A transport (the gRPC wiring) maps :class:`SecAggAbort` to ``ABORTED`` / ``FAILED_PRECONDITION``
(the round is over; start a new one) and :class:`SecAggViolation` to ``INVALID_ARGUMENT`` (the
message was refused; the receiver's state is unchanged and it keeps serving).
"""

from __future__ import annotations


class SecAggError(Exception):
    """Base class of every error raised by :mod:`fedleak.defenses.secagg`."""


class SecAggAbort(SecAggError):
    """Fewer than ``threshold`` users are left at some round, so the protocol cannot finish.

    Bonawitz et al. abort whenever ``|U_i| < t``: below the threshold the server could not
    reconstruct the masks, and continuing would only leak.
    """


class SecAggViolation(SecAggError, ValueError):
    """A message breaks the protocol and is refused.

    Raised for malformed bytes, a tampered or misrouted ciphertext (AES-GCM tag), ids or sizes
    that do not match the round, inconsistent Shamir shares, and requests that would be unsafe
    to answer (a server asking for both the self-mask share and the mask-key share of one user).
    """
