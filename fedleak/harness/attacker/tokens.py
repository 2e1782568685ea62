"""Check the tokens the attacker holds against the victim's, before any work is done.

``Describe`` says whether the tokens sent with it (``x-fedleak-token``,
``x-fedleak-score-token``) are the victim's, and whether ``Score`` needs the evaluator's. A
token that does not match is an error at once (exit 1, nothing attacked): a wrong token used to
be accepted silently, the run finishing without its ground-truth pictures. A missing token
where the victim would reveal ground truth is only a warning, printed and kept in
``metrics.json``: the attack is measured all the same, without ``comparison.png``.
"""

from __future__ import annotations

import grpc

from fedleak.harness.attacker.client import VictimClient, VictimError
from fedleak.v1 import victim_pb2 as pb


def check_tokens(client: VictimClient, described: pb.DescribeResponse) -> list[str]:
    """Raise :class:`VictimError` for a wrong or missing required token; return warnings."""
    if client.token and not described.token_accepted:
        raise VictimError(grpc.StatusCode.UNAUTHENTICATED,
                          f"the --token given is not the token of the victim at "
                          f"{client.address} (Describe says it does not match); fix --token "
                          "(or $FEDLEAK_TOKEN) or drop it")
    if described.score_token_required and not described.score_token_accepted:
        held = "the --score-token given does not match" if client.score_token else \
            "none was given"
        raise VictimError(grpc.StatusCode.UNAUTHENTICATED,
                          f"the victim at {client.address} scores only for the evaluator: "
                          f"Score needs its --score-token ($FEDLEAK_SCORE_TOKEN), and {held}")
    warnings = []
    if described.reveal_enabled and not client.token:
        warnings.append("the victim allows Reveal but no --token was given: no comparison "
                        "pictures (ground truth beside reconstruction) will be drawn")
    return warnings
