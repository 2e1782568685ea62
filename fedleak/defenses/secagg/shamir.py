r"""t-of-n Shamir secret sharing of short byte strings over a prime field.

Shamir's scheme ("How to Share a Secret", CACM 1979), over :math:`\mathrm{GF}(p)` with
:math:`p = 2^{521} - 1` (a Mersenne prime).

A secret :math:`S` of at most 64 bytes becomes the field element
:math:`a_0 = \mathrm{int}(\texttt{0x01} \,\|\, S)` (the marker byte keeps leading zero bytes;
:math:`a_0 < 2^{513} < p`). :func:`split` draws :math:`a_1, \dots, a_{t-1}` uniformly from
:math:`\mathrm{GF}(p)` and hands out the points :math:`(x_i, f(x_i))` of

.. math::

    f(x) = a_0 + a_1 x + \dots + a_{t-1} x^{t-1} \pmod p, \qquad x_i \ne 0 \text{ distinct}.

Any :math:`t` points determine :math:`f`, and :func:`combine` recovers :math:`a_0 = f(0)` by
Lagrange interpolation at zero,

.. math::

    f(0) = \sum_{i} y_i \prod_{j \ne i} \frac{x_j}{x_j - x_i} \pmod p .

Any :math:`t - 1` points are consistent with *every* secret (for each candidate :math:`a_0`
exactly one polynomial of degree :math:`t - 1` passes through them), so they reveal nothing.
Interpolating them (:func:`interpolate_at_zero`) gives the constant term of the degree
:math:`t - 2` polynomial through them, which is unrelated to the secret. :func:`combine` does not
return such a value: it **raises** :class:`ShamirError` when given fewer than ``threshold``
distinct shares (every share carries the public threshold ``t``), and it raises if the
interpolated value is not a valid encoding (shares from different secrets). It uses the first
``t`` shares by ``x``; extra shares are checked only for duplicate ``x``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PRIME = 2**521 - 1
"""The field modulus :math:`p`."""
FIELD_BYTES = 66
"""Bytes of a field element, big-endian (521 bits)."""
MAX_SECRET_BYTES = 64

RandomBytes = Callable[[int], bytes]


class ShamirError(ValueError):
    """Shares that cannot give back a secret: too few, duplicated, inconsistent, out of range."""


@dataclass(frozen=True)
class Share:
    """One point :math:`(x, y = f(x))` of a degree :math:`t - 1` polynomial over GF(p).

    ``threshold`` is :math:`t`, public: how many shares :func:`combine` needs.
    """

    x: int
    y: int
    threshold: int

    def __post_init__(self) -> None:
        """Refuse a point outside the field (x in [1, p), y in [0, p)) or a bad threshold."""
        if not 0 < self.x < PRIME:
            raise ShamirError(f"share x must be in [1, p), got {self.x}")
        if not 0 <= self.y < PRIME:
            raise ShamirError("share y must be a field element in [0, p)")
        if self.threshold < 1:
            raise ShamirError(f"threshold must be >= 1, got {self.threshold}")


def _encode_secret(secret: bytes) -> int:
    if len(secret) > MAX_SECRET_BYTES:
        raise ShamirError(f"secret is {len(secret)} bytes; at most {MAX_SECRET_BYTES} fit")
    return int.from_bytes(b"\x01" + secret, "big")


def _decode_secret(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    if not raw or raw[0] != 1 or len(raw) > MAX_SECRET_BYTES + 1:
        raise ShamirError("the shares do not interpolate to a valid secret (inconsistent shares)")
    return raw[1:]


def _random_field_element(randbytes: RandomBytes) -> int:
    # 16 extra bytes make the bias of the reduction below 2^-128.
    return int.from_bytes(randbytes(FIELD_BYTES + 16), "big") % PRIME


def split(
    secret: bytes,
    threshold: int,
    num_shares: int,
    *,
    xs: Sequence[int] | None = None,
    randbytes: RandomBytes = os.urandom,
) -> list[Share]:
    """Split ``secret`` into ``num_shares`` shares, any ``threshold`` of which recover it.

    Parameters
    ----------
    secret
        at most 64 bytes.
    threshold
        :math:`t`, ``1 <= t <= num_shares``.
    num_shares
        :math:`n`.
    xs
        the evaluation points, distinct and non-zero (default ``1, ..., n``); secure
        aggregation uses ``user_id + 1``.
    randbytes
        source of the random coefficients; ``os.urandom`` unless testing.
    """
    if not 1 <= threshold <= num_shares:
        raise ShamirError(f"need 1 <= threshold <= num_shares, got t={threshold}, n={num_shares}")
    points = list(range(1, num_shares + 1)) if xs is None else [int(x) for x in xs]
    if len(points) != num_shares or len(set(points)) != num_shares:
        raise ShamirError(f"need {num_shares} distinct evaluation points, got {points}")
    if any(not 0 < x < PRIME for x in points):
        raise ShamirError("evaluation points must be in [1, p)")
    coefficients = [_encode_secret(secret)]
    coefficients += [_random_field_element(randbytes) for _ in range(threshold - 1)]
    shares = []
    for x in points:
        y = 0
        for a in reversed(coefficients):  # Horner
            y = (y * x + a) % PRIME
        shares.append(Share(x, y, threshold))
    return shares


def interpolate_at_zero(points: Sequence[tuple[int, int]]) -> int:
    """:math:`f(0)` of the unique polynomial of degree ``len(points) - 1`` through ``points``."""
    if not points:
        raise ShamirError("need at least one point")
    xs = [x % PRIME for x, _ in points]
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ShamirError("interpolation points must have distinct non-zero x")
    total = 0
    for i, (x_i, y_i) in enumerate(points):
        numerator, denominator = 1, 1
        for j, x_j in enumerate(xs):
            if j != i:
                numerator = numerator * x_j % PRIME
                denominator = denominator * (x_j - x_i) % PRIME
        total = (total + y_i * numerator * pow(denominator, -1, PRIME)) % PRIME
    return total


def combine(shares: Sequence[Share]) -> bytes:
    """Recover the secret behind ``shares`` by Lagrange interpolation at 0.

    Raises
    ------
    ShamirError
        fewer than ``threshold`` distinct shares, mixed thresholds, two different
        ``y`` for one ``x``, or shares that do not interpolate to a valid secret.
    """
    if not shares:
        raise ShamirError("no shares given")
    thresholds = {s.threshold for s in shares}
    if len(thresholds) != 1:
        raise ShamirError(f"shares from different splits (thresholds {sorted(thresholds)})")
    threshold = thresholds.pop()
    by_x: dict[int, int] = {}
    for share in shares:
        if by_x.setdefault(share.x, share.y) != share.y:
            raise ShamirError(f"two different shares at x={share.x}")
    if len(by_x) < threshold:
        raise ShamirError(
            f"need {threshold} distinct shares to reconstruct, got {len(by_x)}; "
            f"{threshold - 1} or fewer reveal nothing about the secret"
        )
    chosen = sorted(by_x.items())[:threshold]
    return _decode_secret(interpolate_at_zero(chosen))
