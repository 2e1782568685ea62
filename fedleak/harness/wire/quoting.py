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
