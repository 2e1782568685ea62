"""Everything the server sees in one run of SecAgg, kept for attacks and for reports.

The honest-but-curious server of fedleak's threat model receives exactly this: the advertised
public keys, the encrypted share bundles it routes (unreadable to it), one masked vector per
surviving user, the unmasking shares, and what it reconstructs from them (the survivors'
self-mask seeds, the dropped users' mask keys, and the sum). An attack on one user's update
under secure aggregation gets :meth:`SecAggTranscript.masked_update`; on the aggregate,
``result.total``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedleak.defenses.secagg.messages import AdvertiseKeys, ShareKeys, UnmaskingShares
from fedleak.defenses.secagg.round_config import SecAggConfig


@dataclass(frozen=True, eq=False)
class SecAggResult:
    r"""The server's output of Round 4.

    Attributes
    ----------
    total
        :math:`\sum_{u \in U_3} \operatorname{clip}(x_u)`, dequantised (float64).
    quantized_total
        :math:`\sum_{u \in U_3} q(x_u) \bmod 2^{32}` (``uint32``), exact.
    survivors
        :math:`U_3`, whose inputs are in the sum.
    dropped
        :math:`U_2 \setminus U_3`, who shared keys but sent no masked input.
    self_mask_seeds
        :math:`b_u` reconstructed for each survivor.
    mask_keys
        :math:`s_v^{SK}` (raw X25519) reconstructed for each dropped user.
    """

    total: np.ndarray
    quantized_total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    self_mask_seeds: dict[int, bytes]
    mask_keys: dict[int, bytes]


@dataclass(eq=False)
class SecAggTranscript:
    """The server's view, filled round by round by :class:`~.secagg_server.SecAggServer`."""

    config: SecAggConfig
    advertised: dict[int, AdvertiseKeys] = field(default_factory=dict)
    share_keys: dict[int, ShareKeys] = field(default_factory=dict)
    masked_inputs: dict[int, np.ndarray] = field(default_factory=dict)
    unmasking_shares: dict[int, UnmaskingShares] = field(default_factory=dict)
    result: SecAggResult | None = None

    @property
    def u1(self) -> tuple[int, ...]:
        """Users who advertised keys (Round 0)."""
        return tuple(sorted(self.advertised))

    @property
    def u2(self) -> tuple[int, ...]:
        """Users who sent encrypted shares (Round 1)."""
        return tuple(sorted(self.share_keys))

    @property
    def u3(self) -> tuple[int, ...]:
        """Users who sent a masked input (Round 2): the survivors, whose inputs are summed."""
        return tuple(sorted(self.masked_inputs))

    @property
    def u5(self) -> tuple[int, ...]:
        """Users who sent unmasking shares (Round 4)."""
        return tuple(sorted(self.unmasking_shares))

    def masked_update(self, user_id: int) -> np.ndarray:
        """Return user ``user_id``'s masked vector :math:`y_u` read as if it were its update.

        :math:`y_u / s - c` (float64): uniform noise in :math:`[-c, (2^{32}-1)/s - c]`, whatever
        :math:`x_u` was; this is all a server gets to attack a single user with.
        """
        if user_id not in self.masked_inputs:
            raise KeyError(f"no masked input from user {user_id}; survivors are {self.u3}")
        return self.config.quantizer.dequantize_sum(self.masked_inputs[user_id], 1)
