r"""The server's side of SecAgg (Bonawitz et al. 2017, semi-honest variant, double masking).

Each round method takes the messages that arrived (in any order; a user that sent nothing has
dropped) and returns what to send next:

* **Round 0, AdvertiseKeys** → :class:`ShareKeysRequest` to every user of :math:`U_1`.
* **Round 1, ShareKeys** → one :class:`MaskedInputRequest` per user of :math:`U_2`, routing
  :math:`c_{u,v}` from :math:`u` to :math:`v` (the server cannot read them).
* **Round 2, MaskedInputCollection** → :class:`UnmaskingRequest` (:math:`U_3` and
  :math:`U_2 \setminus U_3`) to every user of :math:`U_3`.
* **Round 3, ConsistencyCheck**: skipped (semi-honest).
* **Round 4, Unmasking** → :class:`SecAggResult`. From at least :math:`t` responders it
  reconstructs :math:`b_u` for :math:`u \in U_3` and :math:`s_v^{SK}` for
  :math:`v \in U_2 \setminus U_3`, and computes

  .. math::

      z = \sum_{u \in U_3} y_u - \sum_{u \in U_3} \mathrm{PRG}(b_u)
          - \sum_{u \in U_3} \sum_{v \in U_2 \setminus U_3} \sigma_{u,v}\,
            \mathrm{PRG}(s_{u,v}) = \sum_{u \in U_3} q(x_u) \pmod{2^{32}},

  with :math:`\sigma_{u,v} = +1` if :math:`u < v` else :math:`-1` and
  :math:`s_{u,v} = \mathrm{KA}(s_v^{SK}, s_u^{PK})`: the masks between two survivors cancel in
  the sum, the masks between a survivor and a dropped user are recomputed and removed.

Any round with fewer than :math:`t` users raises :class:`SecAggAbort`. A message that does not
fit the round (unknown or repeated sender, wrong recipients, wrong length or dtype, shares that
do not reconstruct) raises :class:`SecAggViolation` naming the user, before any state changes:
leave that message out (the user counts as dropped) and call the round again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np

from fedleak.defenses.secagg import keys, prg
from fedleak.defenses.secagg.errors import SecAggAbort, SecAggViolation
from fedleak.defenses.secagg.messages import (
    AdvertiseKeys,
    MaskedInput,
    MaskedInputRequest,
    ShareKeys,
    ShareKeysRequest,
    UnmaskingRequest,
    UnmaskingShares,
)
from fedleak.defenses.secagg.round_config import SecAggConfig
from fedleak.defenses.secagg.shamir import ShamirError, Share, combine
from fedleak.defenses.secagg.transcript import SecAggResult, SecAggTranscript

M = TypeVar("M", AdvertiseKeys, ShareKeys, MaskedInput, UnmaskingShares)


class SecAggServer:
    """The aggregation server; :attr:`transcript` holds everything it has seen."""

    def __init__(self, config: SecAggConfig) -> None:
        self.config = config
        self.transcript = SecAggTranscript(config)
        self._stage = "advertise"

    def _require(self, stage: str, round_name: str) -> None:
        if self._stage != stage:
            raise SecAggViolation(f"server: {round_name} called while at stage {self._stage!r}")

    def _by_sender(
        self, messages: Iterable[M], allowed: Sequence[int], round_name: str
    ) -> dict[int, M]:
        received: dict[int, M] = {}
        for message in messages:
            if message.user_id not in allowed:
                raise SecAggViolation(
                    f"{round_name}: message from user {message.user_id}, who is not expected "
                    f"in this round (expected one of {list(allowed)})"
                )
            if message.user_id in received:
                raise SecAggViolation(f"{round_name}: two messages from user {message.user_id}")
            received[message.user_id] = message
        if len(received) < self.config.threshold:
            raise SecAggAbort(
                f"{round_name}: only {len(received)} users left ({sorted(received)}), fewer than "
                f"the threshold t={self.config.threshold}"
            )
        return received

    # Round 0 -----------------------------------------------------------------------------
    def advertise_keys(self, messages: Iterable[AdvertiseKeys]) -> ShareKeysRequest:
        """End of Round 0: :math:`U_1` and the public keys to broadcast."""
        self._require("advertise", "AdvertiseKeys")
        received = self._by_sender(messages, range(self.config.num_users), "AdvertiseKeys")
        for user_id, message in received.items():
            lengths = {len(message.cipher_public_key), len(message.mask_public_key)}
            if lengths != {keys.KEY_BYTES}:
                raise SecAggViolation(
                    f"AdvertiseKeys: user {user_id}'s public keys are not {keys.KEY_BYTES} bytes"
                )
        self.transcript.advertised = dict(sorted(received.items()))
        self._stage = "share"
        return ShareKeysRequest(tuple(self.transcript.advertised.values()))

    # Round 1 -----------------------------------------------------------------------------
    def share_keys(self, messages: Iterable[ShareKeys]) -> dict[int, MaskedInputRequest]:
        r"""End Round 1: return :math:`U_2` and, per user of it, the ciphertexts to deliver.

        For each :math:`v \in U_2` the ciphertexts :math:`c_{u,v}`,
        :math:`u \in U_2 \setminus \{v\}`.
        """
        self._require("share", "ShareKeys")
        u1 = self.transcript.u1
        received = self._by_sender(messages, u1, "ShareKeys")
        for user_id, message in received.items():
            expected = set(u1) - {user_id}
            if set(message.ciphertexts) != expected:
                raise SecAggViolation(
                    f"ShareKeys: user {user_id} must send one ciphertext to each of "
                    f"{sorted(expected)}, sent to {sorted(message.ciphertexts)}"
                )
        self.transcript.share_keys = dict(sorted(received.items()))
        self._stage = "mask"
        u2 = self.transcript.u2
        return {
            v: MaskedInputRequest(v, {u: received[u].ciphertexts[v] for u in u2 if u != v})
            for v in u2
        }

    # Round 2 -----------------------------------------------------------------------------
    def masked_input_collection(self, messages: Iterable[MaskedInput]) -> UnmaskingRequest:
        """End of Round 2: :math:`U_3`, the users whose masked input :math:`y_u` arrived."""
        self._require("mask", "MaskedInputCollection")
        u2 = self.transcript.u2
        received = self._by_sender(messages, u2, "MaskedInputCollection")
        d = self.config.vector_length
        for user_id, message in received.items():
            masked = message.masked
            well_formed = isinstance(masked, np.ndarray) and masked.dtype == np.uint32
            if not well_formed or masked.shape != (d,):
                raise SecAggViolation(
                    f"MaskedInputCollection: user {user_id} must send a uint32 vector of length "
                    f"{d}, sent {getattr(masked, 'dtype', type(masked))} "
                    f"{getattr(masked, 'shape', '')}"
                )
        self.transcript.masked_inputs = {u: received[u].masked for u in sorted(received)}
        self._stage = "unmask"
        u3 = self.transcript.u3
        return UnmaskingRequest(u3, tuple(u for u in u2 if u not in u3))

    # Round 4 -----------------------------------------------------------------------------
    def _check_shares(self, user_id: int, message: UnmaskingShares) -> None:
        survivors = set(self.transcript.u3)
        dropped = set(self.transcript.u2) - survivors
        if set(message.self_mask_shares) != survivors or set(message.mask_key_shares) != dropped:
            raise SecAggViolation(
                f"Unmasking: user {user_id} must send self-mask shares for {sorted(survivors)} "
                f"and mask-key shares for {sorted(dropped)}"
            )
        for share in (*message.self_mask_shares.values(), *message.mask_key_shares.values()):
            if share.x != user_id + 1 or share.threshold != self.config.threshold:
                raise SecAggViolation(f"Unmasking: user {user_id} sent a share that is not its own")

    def _reconstruct(self, shares: list[Share], what: str) -> bytes:
        try:
            secret = combine(shares)
        except ShamirError as error:
            raise SecAggViolation(f"Unmasking: cannot reconstruct {what}: {error}") from error
        if len(secret) != prg.SEED_BYTES:
            raise SecAggViolation(f"Unmasking: {what} reconstructs to {len(secret)} bytes, not 32")
        return secret

    def unmasking(self, messages: Iterable[UnmaskingShares]) -> SecAggResult:
        """End of Round 4: reconstruct the masks and return the sum over :math:`U_3`."""
        self._require("unmask", "Unmasking")
        u3 = self.transcript.u3
        received = self._by_sender(messages, u3, "Unmasking")
        for user_id, message in received.items():
            self._check_shares(user_id, message)
        dropped = tuple(u for u in self.transcript.u2 if u not in u3)
        responders = list(received.values())
        seeds = {
            u: self._reconstruct([m.self_mask_shares[u] for m in responders], f"b_{u}")
            for u in u3
        }
        mask_keys = {}
        for v in dropped:
            raw = self._reconstruct([m.mask_key_shares[v] for m in responders], f"s_{v}^SK")
            private_key = keys.private_key_from_bytes(raw)
            if keys.public_bytes(private_key) != self.transcript.advertised[v].mask_public_key:
                raise SecAggViolation(
                    f"Unmasking: the reconstructed mask key of user {v} does not match its "
                    f"advertised public key (a responder sent a wrong share)"
                )
            mask_keys[v] = raw
        total = self._remove_masks(seeds, mask_keys)
        self.transcript.unmasking_shares = dict(sorted(received.items()))
        result = SecAggResult(
            total=self.config.quantizer.dequantize_sum(total, len(u3)),
            quantized_total=total,
            survivors=u3,
            dropped=dropped,
            self_mask_seeds=seeds,
            mask_keys=mask_keys,
        )
        self.transcript.result = result
        self._stage = "done"
        return result

    def _remove_masks(self, seeds: dict[int, bytes], mask_keys: dict[int, bytes]) -> np.ndarray:
        d, session = self.config.vector_length, self.config.session
        total = np.zeros(d, dtype=np.uint32)
        for masked in self.transcript.masked_inputs.values():
            total += masked
        for seed in seeds.values():
            total -= prg.expand(seed, d)
        for v, raw in mask_keys.items():
            private_key = keys.private_key_from_bytes(raw)
            for u in seeds:  # the survivors
                peer_public = self.transcript.advertised[u].mask_public_key
                seed = keys.pairwise_mask_seed(private_key, peer_public, session, u, v)
                mask = prg.expand(seed, d)
                # y_u carries +PRG(s_{u,v}) when u < v, -PRG(s_{u,v}) when u > v.
                if u < v:
                    total -= mask
                else:
                    total += mask
        return total
