"""List fields of a request are refused by their length, before anything walks them."""

from __future__ import annotations

import pytest

from fedleak.harness.wire.request_errors import (
    MAX_LIST_ENTRIES,
    InvalidArgument,
    refuse_long_lists,
)
from fedleak.v1 import victim_pb2 as pb


def test_every_list_field_is_capped_by_length() -> None:
    request = pb.ScoreRequest(round_id="r")
    request.padding.extend(range(8))
    request.token_set.extend(range(5))
    refuse_long_lists(request, {"padding": 8, "token_set": 5})  # at the caps: fine
    with pytest.raises(InvalidArgument, match="token_set holds 5 entries, at most 4"):
        refuse_long_lists(request, {"token_set": 4}, "ScoreRequest")
    big = pb.ScoreRequest(round_id="r")
    big.user_ids.extend([0] * (MAX_LIST_ENTRIES + 1))  # no cap given: the default one
    with pytest.raises(InvalidArgument, match=f"user_ids holds {MAX_LIST_ENTRIES + 1}"):
        refuse_long_lists(big)


def test_an_eight_million_entry_padding_is_refused_without_a_loop() -> None:
    # round_id (field 1), then padding (field 70) as 8 M packed varints of 0
    wire = b"\x0a\x01r" + _varint(70 << 3 | 2) + _varint(8_000_000) + bytes(8_000_000)
    request = pb.ScoreRequest.FromString(wire)
    assert len(request.padding) == 8_000_000
    with pytest.raises(InvalidArgument, match="padding holds 8000000 entries"):
        refuse_long_lists(request, {"padding": 64}, "ScoreRequest")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
