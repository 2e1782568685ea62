"""Client strings in error messages are quoted, never echoed whole."""

from __future__ import annotations

from fedleak.harness.wire.quoting import QUOTE_LIMIT, name_mismatch, quoted


def test_long_client_text_is_cut_and_its_length_said() -> None:
    text = quoted("x" * 10_000)
    assert len(text) < QUOTE_LIMIT + 40
    assert "10000 characters" in text
    assert quoted("conv.weight") == "'conv.weight'"


def test_name_mismatch_names_missing_and_unknown_tensors() -> None:
    assert name_mismatch("parameter", [], [], 4) is None
    message = name_mismatch("parameter", ["fc.bias"], [f"n{i}" for i in range(8)], 4)
    assert message is not None
    assert "missing parameters 'fc.bias'" in message
    assert "'n0', 'n1', 'n2', 'n3', 'n4' and 3 more" in message
    assert message.endswith("send exactly the 4 parameters that Describe lists")
