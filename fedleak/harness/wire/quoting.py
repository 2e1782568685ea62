"""Quoting what a client sent in an error message, never whole.

An error that echoes a client's string in full can itself exceed a message limit (a 1 MiB
round id turned ``NOT_FOUND`` into ``RESOURCE_EXHAUSTED``): quote at most :data:`QUOTE_LIMIT`
characters and say how long the rest was.
"""

from __future__ import annotations

#: Longest client-supplied text an error message quotes in full.
QUOTE_LIMIT = 64


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters, with the full length said when cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(str(value))} characters)"
