"""Quoting what a client sent in an error message, never whole.

An error that echoes a client's string in full can itself exceed a message limit (a 1 MiB
round id turned ``NOT_FOUND`` into ``RESOURCE_EXHAUSTED``): quote at most :data:`QUOTE_LIMIT`
characters and say how long the rest was.
"""

from __future__ import annotations

#: Longest client-supplied text an error message quotes in full.
QUOTE_LIMIT = 64
#: Longest error message a server sends (a last guard: a message that quotes a client's input
#: whole, by mistake, is cut here rather than turned into RESOURCE_EXHAUSTED by gRPC's limits).
DETAILS_LIMIT = 2048


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters, with the full length said when cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(str(value))} characters)"


def quoted_names(names: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, each :func:`quoted`, and how many more there are."""
    shown = ", ".join(quoted(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def name_mismatch(what: str, missing: list[str], unknown: list[str], expected: int) -> str | None:
    """The error for a set of named tensors that is not the set Describe lists, or ``None``
    when nothing is missing and nothing is unknown."""
    parts = []
    if missing:
        parts.append(f"missing {what}s {quoted_names(missing)}")
    if unknown:
        parts.append(f"unknown {what}s {quoted_names(unknown)}")
    if not parts:
        return None
    return f"{'; '.join(parts)}: send exactly the {expected} {what}s that Describe lists"


def short_details(text: str, limit: int = DETAILS_LIMIT) -> str:
    """``text`` when it is at most ``limit`` characters, else its start and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (the message was cut: {len(text)} characters)"
