r"""Secure aggregation: Bonawitz et al. 2017's semi-honest protocol with double masking.

"Practical Secure Aggregation for Privacy-Preserving Machine Learning" (CCS 2017), as real
messages between users and a server, so that a transport can carry them. User u sends
y_u = x_u + PRG(b_u) + Σ_{v>u} PRG(s_{u,v}) − Σ_{v<u} PRG(s_{v,u}) (mod R) (their §4, Round 2
MaskedInputCollection): the pairwise masks cancel in Σ_u y_u, and the server removes the
self-masks PRG(b_u) of survivors and the pairwise masks of dropped users from Shamir shares
of b_u and s_u^{SK} (Round 4 Unmasking), learning z = Σ_{u∈U3} x_u and nothing else.

One idea per module: :mod:`.fixed_point` (floats to :math:`\mathbb{Z}_{2^{32}}`), :mod:`.prg`
(seed to mask), :mod:`.shamir` (t-of-n sharing), :mod:`.keys` (X25519, HKDF, AES-GCM),
:mod:`.messages` and :mod:`.encoding` (the wire), :mod:`.user` and :mod:`.secagg_server` (the
rounds), :mod:`.transcript` (the server's view), :mod:`.in_memory` (everything in one process).

Implemented: Rounds 0 AdvertiseKeys, 1 ShareKeys, 2 MaskedInputCollection, 4 Unmasking, with
dropouts at any round down to the threshold. Left out: signatures on the advertised keys and
Round 3 ConsistencyCheck (both only matter against an actively malicious server).
"""

from fedleak.defenses.secagg.errors import SecAggAbort, SecAggError, SecAggViolation
from fedleak.defenses.secagg.fixed_point import MODULUS, FixedPointQuantizer
from fedleak.defenses.secagg.in_memory import run_secagg_in_memory
from fedleak.defenses.secagg.messages import (
    AdvertiseKeys,
    MaskedInput,
    MaskedInputRequest,
    Message,
    ShareKeys,
    ShareKeysRequest,
    UnmaskingRequest,
    UnmaskingShares,
    decode_message,
)
from fedleak.defenses.secagg.round_config import SecAggConfig
from fedleak.defenses.secagg.secagg_server import SecAggServer
from fedleak.defenses.secagg.shamir import ShamirError, Share
from fedleak.defenses.secagg.transcript import SecAggResult, SecAggTranscript
from fedleak.defenses.secagg.user import SecAggUser

__all__ = [
    "MODULUS",
    "AdvertiseKeys",
    "FixedPointQuantizer",
    "MaskedInput",
    "MaskedInputRequest",
    "Message",
    "SecAggAbort",
    "SecAggConfig",
    "SecAggError",
    "SecAggResult",
    "SecAggServer",
    "SecAggTranscript",
    "SecAggUser",
    "SecAggViolation",
    "ShamirError",
    "Share",
    "ShareKeys",
    "ShareKeysRequest",
    "UnmaskingRequest",
    "UnmaskingShares",
    "decode_message",
    "run_secagg_in_memory",
]
