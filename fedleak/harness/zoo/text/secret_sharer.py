"""Canary sentences with secrets (Carlini et al., "The Secret Sharer", USENIX Security 2019).

A canary is a sentence of a fixed public format with a random secret in it, "my secret number
is 4 8 1 9 0 3": inserted into a user's private text, it asks whether the secret comes back
out — in a reconstruction of the user's update (the victim counts how many secrets a
submission holds, ``TextScore.secrets_recovered``), or memorised by a model trained on it.

Memorisation is the secret's *exposure* (Carlini et al. Def. 4): with the randomness space R
of the secret (10^6 six-digit secrets here) and rank(s) the secret's position among every
candidate ordered by the model's log-perplexity (1 = lowest),

    exposure(s) = log2 |R| − log2 rank(s).

:func:`sampled_exposure` estimates the rank from ``m`` candidates drawn uniformly from R
(rank ≈ 1 + |R| · #{sampled r: ppl(r) < ppl(s)} / m), as the paper's sampling estimate does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

CANARY_FORMAT = "my secret number is {}"
SECRET_DIGITS = 6


def secret_text(digits: str) -> str:
    """The secret as it appears in a canary: its digits separated by spaces."""
    return " ".join(digits)


def canary_texts(count: int, seed: int) -> tuple[list[str], list[str]]:
    """``count`` canary sentences and their secrets, drawn from ``seed``."""
    if count < 0:
        raise ValueError(f"canaries must be >= 0, got {count}")
    rng = random.Random(seed)
    secrets = ["".join(rng.choice("0123456789") for _ in range(SECRET_DIGITS))
               for _ in range(count)]
    return [CANARY_FORMAT.format(secret_text(s)) for s in secrets], secrets


def secrets_in(texts: list[str], secrets: list[str]) -> int:
    """How many of ``secrets`` appear (as their canary's spaced digits) in any of ``texts``."""
    joined = ["".join(t.split()) for t in texts]
    return sum(any(s in t for t in joined) for s in secrets)


def sampled_exposure(log_perplexity: Callable[[str], float], secret: str, samples: int,
                     seed: int = 0) -> float:
    """Exposure of ``secret``'s canary under ``log_perplexity`` (a trained model's), its rank
    estimated from ``samples`` uniformly drawn secrets (module docstring)."""
    rng = random.Random(seed)
    space = 10 ** SECRET_DIGITS
    target = log_perplexity(CANARY_FORMAT.format(secret_text(secret)))
    below = 0
    for _ in range(samples):
        other = "".join(rng.choice("0123456789") for _ in range(SECRET_DIGITS))
        if log_perplexity(CANARY_FORMAT.format(secret_text(other))) < target:
            below += 1
    rank = 1 + space * below / samples
    return math.log2(space) - math.log2(rank)
