r"""The whole of SecAgg in one process: users and server exchanging real messages.

:func:`run_secagg_in_memory` plays the rounds of Bonawitz et al. (2017) between
:class:`~.user.SecAggUser` objects and a :class:`~.secagg_server.SecAggServer`, passing every
message through its byte encoding exactly as a transport would, and simulating dropouts at the
three points where the paper's analysis distinguishes them:

==========================  =====================  =======================================
argument                    the user leaves...     effect
==========================  =====================  =======================================
``drop_before_sharing``     after AdvertiseKeys    in U1 only; nobody masks with it
``drop_before_masking``     after ShareKeys        in U2 \ U3; excluded from the sum, its
                                                   pairwise masks removed via
                                                   :math:`s_v^{SK}`
``drop_after_masking``      after sending y_u      in U3 \ U5; **included** in the sum,
                                                   its :math:`b_u` rebuilt from others
==========================  =====================  =======================================

The protocol survives as long as at least :math:`t` users are left at every round, i.e. up to
:math:`n - t` dropouts in all; below that, :class:`~.errors.SecAggAbort`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from fedleak.defenses.secagg.messages import M, decode_as
from fedleak.defenses.secagg.round_config import SecAggConfig
from fedleak.defenses.secagg.secagg_server import SecAggServer
from fedleak.defenses.secagg.transcript import SecAggTranscript
from fedleak.defenses.secagg.user import SecAggUser


def _over_the_wire(message: M) -> M:
    return decode_as(message.to_bytes(), type(message))


def run_secagg_in_memory(
    inputs: Sequence[np.ndarray],
    threshold: int,
    clip: float,
    drop_after_masking: Collection[int] = frozenset(),
    drop_before_masking: Collection[int] = frozenset(),
    drop_before_sharing: Collection[int] = frozenset(),
    *,
    session: int = 0,
    rng: np.random.Generator | int | None = None,
) -> tuple[np.ndarray, SecAggTranscript]:
    """Securely sum ``inputs`` (user ``u`` holds ``inputs[u]``) and return what the server gets.

    Parameters
    ----------
    inputs
        one float vector of length :math:`d` per user; :math:`n` = ``len(inputs)``.
    threshold
        the Shamir threshold :math:`t`, ``2 <= t <= n``.
    clip
        coordinates are clipped to :math:`[-c, c]` before quantisation.
    drop_after_masking, drop_before_masking, drop_before_sharing
        ids of users that leave at that point (see the module docstring); disjoint.
    session
        bound into every key and ciphertext (the FL round).
    rng
        ``None`` for real randomness (``os.urandom``); a seed or numpy ``Generator`` makes
        keys, seeds and shares reproducible (for tests: not secure).

    Returns
    -------
    total : numpy.ndarray
        the dequantised float64 sum over the survivors :math:`U_3` (within
        ``transcript.config.quantizer.error_bound(len(U3))`` of the sum of the clipped inputs).
    transcript : SecAggTranscript
        the server's full view.

    Raises
    ------
    SecAggAbort
        fewer than ``threshold`` users at some round.
    """
    if len(inputs) < 2:
        raise ValueError(f"secure aggregation needs at least 2 users, got {len(inputs)}")
    vectors = [np.asarray(x) for x in inputs]
    if any(v.ndim != 1 or v.shape != vectors[0].shape for v in vectors):
        raise ValueError(f"inputs must be 1-D of one length, got {[v.shape for v in vectors]}")
    n = len(vectors)
    drops = [set(drop_before_sharing), set(drop_before_masking), set(drop_after_masking)]
    if any(not d <= set(range(n)) for d in drops):
        raise ValueError(f"dropped user ids must be in [0, {n})")
    if sum(len(d) for d in drops) != len(set().union(*drops)):
        raise ValueError("a user can only drop out once: the drop sets must be disjoint")
    config = SecAggConfig(threshold, clip, vectors[0].size, n, session)
    streams = np.random.default_rng(rng).spawn(n) if rng is not None else [None] * n
    users = [SecAggUser(u, config, rng=streams[u]) for u in range(n)]
    server = SecAggServer(config)

    request = server.advertise_keys(_over_the_wire(user.advertise_keys()) for user in users)
    request = _over_the_wire(request)
    alive = [u for u in users if u.user_id not in drops[0]]
    routed = server.share_keys(_over_the_wire(u.share_keys(request)) for u in alive)
    alive = [u for u in alive if u.user_id in routed and u.user_id not in drops[1]]
    masked = [
        u.masked_input_collection(_over_the_wire(routed[u.user_id]), vectors[u.user_id])
        for u in alive
    ]
    unmask = _over_the_wire(server.masked_input_collection(_over_the_wire(m) for m in masked))
    alive = [u for u in alive if u.user_id in unmask.survivors and u.user_id not in drops[2]]
    result = server.unmasking(_over_the_wire(u.unmasking(unmask)) for u in alive)
    return result.total, server.transcript
