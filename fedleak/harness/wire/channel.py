"""What both ends of a fedleak channel agree on: message limits and the token's metadata key.

The attacker's client raises gRPC's message limits to 1 GiB by default (a ResNet-152 update,
about 60M float32 values, is about 240 MB); a victim accepts what its own model and data need
(``victim.victim_server.default_message_bytes``, or ``--max-message-mb``), so it refuses anything
larger from the length the message declares. Token-guarded calls carry the victim's secret in
the ``x-fedleak-token`` metadata entry (``x-fedleak-score-token`` for the evaluator's token
when ``Score`` needs one).
"""

from __future__ import annotations

TOKEN_METADATA_KEY = "x-fedleak-token"
#: The evaluator's token, when a victim requires one for Score (``--score-token``).
SCORE_TOKEN_METADATA_KEY = "x-fedleak-score-token"
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30


def message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel/server options raising both message limits to ``max_message_bytes``."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
