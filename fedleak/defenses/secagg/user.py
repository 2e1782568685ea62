r"""The user's side of SecAgg (Bonawitz et al. 2017, semi-honest variant, double masking).

A :class:`SecAggUser` answers one server message per round and keeps its secrets to itself:

* **Round 0, AdvertiseKeys**: two fresh X25519 key pairs, :math:`(c_u^{PK}, c_u^{SK})` to
  encrypt shares and :math:`(s_u^{PK}, s_u^{SK})` to derive pairwise masks; sends both public
  keys.
* **Round 1, ShareKeys**: given the public keys of :math:`U_1` (at least :math:`t` users, all
  keys distinct, its own among them unchanged), draws the self-mask seed :math:`b_u`, splits
  :math:`s_u^{SK}` and :math:`b_u` into :math:`t`-of-:math:`|U_1|` Shamir shares (user
  :math:`v` gets the point :math:`x = v + 1`), and sends
  :math:`\mathrm{AE.enc}_{c_{u,v}}(u \| v \| s^{SK}_{u,v} \| b_{u,v})` for every other
  :math:`v \in U_1`.
* **Round 2, MaskedInputCollection**: given the ciphertexts addressed to it (their senders
  make :math:`U_2`), checks them (AES-GCM tag, :math:`u \| v` inside) and sends

  .. math::

      y_u = q(x_u) + \mathrm{PRG}(b_u) + \sum_{v \in U_2,\, u < v} \mathrm{PRG}(s_{u,v})
            - \sum_{v \in U_2,\, u > v} \mathrm{PRG}(s_{u,v}) \pmod{2^{32}} .

  The pairwise masks cancel in :math:`\sum_{u \in U_3} y_u` between survivors; :math:`b_u`
  hides :math:`x_u` even when the server later learns :math:`s_u^{SK}` (a user wrongly
  reported dropped).
* **Round 3, ConsistencyCheck**: skipped; it only matters against an active server.
* **Round 4, Unmasking**: given :math:`U_3` (survivors) and :math:`U_2 \setminus U_3`
  (dropped), sends its shares of :math:`b_v` for :math:`v \in U_3` and of :math:`s_v^{SK}`
  for :math:`v \in U_2 \setminus U_3`. It refuses to reveal both shares of any one user, in
  one request or across several: with both, the server could strip all masks off :math:`y_v`.

Every refusal is a :class:`~fedleak.defenses.secagg.errors.SecAggViolation` (or
:class:`~fedleak.defenses.secagg.errors.SecAggAbort` below the threshold) raised before any
state changes, so the user can still answer a correct message afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from fedleak.defenses.secagg import keys, prg
from fedleak.defenses.secagg.encoding import Reader, Writer
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
from fedleak.defenses.secagg.shamir import Share, split

RandomBytes = Callable[[int], bytes]
_SHARE_BUNDLE = 0x10  # the plaintext inside c_{u,v}; never sent in the clear


def as_randbytes(rng: np.random.Generator | RandomBytes | None) -> RandomBytes:
    """Return a source of random bytes for ``rng``.

    ``os.urandom`` for ``None`` (use this outside tests), the ``bytes`` method of a seeded numpy
    ``Generator`` (reproducible, *not* secure), or a callable as given.
    """
    if rng is None:
        return os.urandom
    if isinstance(rng, np.random.Generator):
        return rng.bytes
    if callable(rng):
        return rng
    raise TypeError(f"rng must be None, a numpy Generator or a callable, got {type(rng)}")


def encode_share_bundle(sender: int, recipient: int, mask_key: Share, self_mask: Share) -> bytes:
    r""":math:`u \| v \| s^{SK}_{u,v} \| b_{u,v}`, the plaintext of one ShareKeys ciphertext."""
    writer = Writer(_SHARE_BUNDLE).u32(sender).u32(recipient)
    return writer.share(mask_key).share(self_mask).to_bytes()


def decode_share_bundle(data: bytes) -> tuple[int, int, Share, Share]:
    """Inverse of :func:`encode_share_bundle`: ``(sender, recipient, mask_key, self_mask)``."""
    reader = Reader(data, _SHARE_BUNDLE, "share bundle")
    bundle = (reader.u32(), reader.u32(), reader.share(), reader.share())
    reader.finish()
    return bundle


class SecAggUser:
    """One user :math:`u` of secure aggregation: call the round methods in order.

    Parameters
    ----------
    user_id
        :math:`u`, in ``[0, config.num_users)``.
    config
        the public parameters, the same for every user and the server.
    rng
        where keys, seeds and Shamir coefficients come from; ``None`` (``os.urandom``)
        unless a test needs reproducible runs.
    """

    def __init__(
        self,
        user_id: int,
        config: SecAggConfig,
        rng: np.random.Generator | RandomBytes | None = None,
    ) -> None:
        if not 0 <= user_id < config.num_users:
            raise ValueError(f"user id must be in [0, {config.num_users}), got {user_id}")
        self.user_id = user_id
        self.config = config
        self._randbytes = as_randbytes(rng)
        self._cipher_key = keys.generate_private_key(self._randbytes)
        self._mask_key = keys.generate_private_key(self._randbytes)
        self._advertised = AdvertiseKeys(
            user_id, keys.public_bytes(self._cipher_key), keys.public_bytes(self._mask_key)
        )
        self._stage = "advertise"
        self._peers: dict[int, AdvertiseKeys] = {}  # U1
        self._self_mask_seed = b""
        self._mask_key_shares: dict[int, Share] = {}  # s^SK_{v,u} held for each v in U2
        self._self_mask_shares: dict[int, Share] = {}  # b_{v,u} held for each v in U2
        self._revealed_self_mask: set[int] = set()
        self._revealed_mask_key: set[int] = set()

    def _require(self, stage: str, round_name: str) -> None:
        if self._stage != stage:
            raise SecAggViolation(
                f"user {self.user_id}: got a {round_name} message while at stage {self._stage!r}"
            )

    # Round 0 -----------------------------------------------------------------------------
    def advertise_keys(self) -> AdvertiseKeys:
        """Round 0, AdvertiseKeys: :math:`(u, c_u^{PK}, s_u^{PK})`."""
        return self._advertised

    # Round 1 -----------------------------------------------------------------------------
    def _check_key_list(self, request: ShareKeysRequest) -> dict[int, AdvertiseKeys]:
        peers: dict[int, AdvertiseKeys] = {}
        for entry in request.public_keys:
            if not 0 <= entry.user_id < self.config.num_users or entry.user_id in peers:
                raise SecAggViolation(f"ShareKeysRequest: bad or repeated user id {entry.user_id}")
            peers[entry.user_id] = entry
        if peers.get(self.user_id) != self._advertised:
            raise SecAggViolation(
                f"ShareKeysRequest does not carry user {self.user_id}'s own keys unchanged"
            )
        all_keys = [k for e in peers.values() for k in (e.cipher_public_key, e.mask_public_key)]
        if len(set(all_keys)) != len(all_keys):
            raise SecAggViolation("ShareKeysRequest: two advertised public keys are equal")
        if any(len(k) != keys.KEY_BYTES for k in all_keys):
            raise SecAggViolation(f"ShareKeysRequest: public keys must be {keys.KEY_BYTES} bytes")
        if len(peers) < self.config.threshold:
            raise SecAggAbort(
                f"only {len(peers)} users advertised keys (U1), fewer than the threshold "
                f"t={self.config.threshold}"
            )
        return peers

    def _cipher_key_with(self, peer: int) -> bytes:
        return keys.pairwise_cipher_key(
            self._cipher_key,
            self._peers[peer].cipher_public_key,
            self.config.session,
            self.user_id,
            peer,
        )

    def share_keys(self, request: ShareKeysRequest) -> ShareKeys:
        """Answer Round 1, ShareKeys: encrypted Shamir shares of this user's secrets.

        Shares of :math:`s_u^{SK}` and :math:`b_u` for every other user of :math:`U_1`.
        """
        self._require("advertise", "ShareKeys")
        peers = self._check_key_list(request)
        self._peers = peers
        u1 = sorted(peers)
        t, u = self.config.threshold, self.user_id
        self_mask_seed = self._randbytes(prg.SEED_BYTES)
        xs = [v + 1 for v in u1]
        secret_key = keys.private_bytes(self._mask_key)
        mask_key_shares = dict(zip(u1, split(secret_key, t, len(u1), xs=xs,
                                             randbytes=self._randbytes), strict=True))
        self_mask_shares = dict(zip(u1, split(self_mask_seed, t, len(u1), xs=xs,
                                              randbytes=self._randbytes), strict=True))
        ciphertexts = {}
        for v in u1:
            if v == u:
                continue
            plaintext = encode_share_bundle(u, v, mask_key_shares[v], self_mask_shares[v])
            ciphertexts[v] = keys.encrypt(
                self._cipher_key_with(v),
                plaintext,
                session=self.config.session,
                sender=u,
                recipient=v,
                randbytes=self._randbytes,
            )
        self._self_mask_seed = self_mask_seed
        self._mask_key_shares = {u: mask_key_shares[u]}
        self._self_mask_shares = {u: self_mask_shares[u]}
        self._stage = "shared"
        return ShareKeys(u, ciphertexts)

    # Round 2 -----------------------------------------------------------------------------
    def _open_shares(self, request: MaskedInputRequest) -> dict[int, tuple[Share, Share]]:
        u, t = self.user_id, self.config.threshold
        if request.recipient != u:
            raise SecAggViolation(
                f"MaskedInputRequest for user {request.recipient} delivered to user {u}"
            )
        strangers = set(request.ciphertexts) - (set(self._peers) - {u})
        if strangers:
            raise SecAggViolation(f"MaskedInputRequest: ciphertexts from users {sorted(strangers)}"
                                  f" who are not in U1 or are the recipient")
        if len(request.ciphertexts) + 1 < t:
            raise SecAggAbort(
                f"only {len(request.ciphertexts) + 1} users sent their shares (U2), fewer than "
                f"the threshold t={t}"
            )
        opened = {}
        for v, ciphertext in request.ciphertexts.items():
            plaintext = keys.decrypt(
                self._cipher_key_with(v), ciphertext,
                session=self.config.session, sender=v, recipient=u,
            )
            sender, recipient, mask_key, self_mask = decode_share_bundle(plaintext)
            if (sender, recipient) != (v, u):
                raise SecAggViolation(
                    f"share bundle from user {v} is labelled {sender}→{recipient}"
                )
            for share in (mask_key, self_mask):
                if share.x != u + 1 or share.threshold != t:
                    raise SecAggViolation(f"share from user {v} is not a {t}-of-n share for {u}")
            opened[v] = (mask_key, self_mask)
        return opened

    def masked_input_collection(
        self, request: MaskedInputRequest, update: np.ndarray
    ) -> MaskedInput:
        """Round 2, MaskedInputCollection: :math:`y_u`, the quantised ``update`` under masks.

        Parameters
        ----------
        request
            the ciphertexts from the other users of :math:`U_2`.
        update
            :math:`x_u`, a float vector of length :math:`d` (clipped to
            :math:`[-c, c]` by the quantiser).
        """
        self._require("shared", "MaskedInputCollection")
        update = np.asarray(update)
        if update.shape != (self.config.vector_length,):
            raise ValueError(
                f"update must be a vector of length {self.config.vector_length}, "
                f"got shape {update.shape}"
            )
        quantized = self.config.quantizer.quantize(update)  # refuses NaN / inf
        opened = self._open_shares(request)
        u, d = self.user_id, self.config.vector_length
        masked = quantized + prg.expand(self._self_mask_seed, d)
        for v in sorted(opened):
            seed = keys.pairwise_mask_seed(
                self._mask_key, self._peers[v].mask_public_key, self.config.session, u, v
            )
            if u < v:
                masked += prg.expand(seed, d)
            else:
                masked -= prg.expand(seed, d)
        for v, (mask_key, self_mask) in opened.items():
            self._mask_key_shares[v] = mask_key
            self._self_mask_shares[v] = self_mask
        self._stage = "masked"
        return MaskedInput(u, masked)

    # Round 4 -----------------------------------------------------------------------------
    def _check_unmasking(self, request: UnmaskingRequest) -> None:
        survivors, dropped = set(request.survivors), set(request.dropped)
        both = (survivors & dropped) | (survivors & self._revealed_mask_key) | (
            dropped & self._revealed_self_mask)
        if both:
            raise SecAggViolation(
                f"user {self.user_id} refuses to unmask: asked for both the self-mask share and "
                f"the mask-key share of users {sorted(both)}, which would reveal their inputs"
            )
        if len(survivors) != len(request.survivors) or len(dropped) != len(request.dropped):
            raise SecAggViolation("UnmaskingRequest lists a user twice")
        u2 = set(self._self_mask_shares)
        if survivors | dropped != u2:
            raise SecAggViolation(
                f"UnmaskingRequest: survivors and dropped must split U2={sorted(u2)}, got "
                f"{sorted(survivors)} and {sorted(dropped)}"
            )
        if self.user_id not in survivors:
            raise SecAggViolation(
                f"UnmaskingRequest sent to user {self.user_id}, who it lists as dropped"
            )
        if len(survivors) < self.config.threshold:
            raise SecAggAbort(
                f"only {len(survivors)} masked inputs arrived (U3), fewer than the threshold "
                f"t={self.config.threshold}"
            )

    def unmasking(self, request: UnmaskingRequest) -> UnmaskingShares:
        """Answer Round 4, Unmasking: shares of survivors' :math:`b_v`, dropped :math:`s_v^{SK}`."""
        if self._stage not in ("masked", "unmasked"):
            self._require("masked", "Unmasking")
        self._check_unmasking(request)
        self._revealed_self_mask |= set(request.survivors)
        self._revealed_mask_key |= set(request.dropped)
        self._stage = "unmasked"
        return UnmaskingShares(
            self.user_id,
            {v: self._self_mask_shares[v] for v in request.survivors},
            {v: self._mask_key_shares[v] for v in request.dropped},
        )
