"""The score histograms an audit's answer may show without giving its coins away.

The scores are the server's own numbers, so a server may choose them freely — the trial's
index, say. A histogram with a bin per trial then gives each trial's coin (40 of 40 in a
40-trial audit, with the 40 equal-width bins the answer used to have). What the answer shows
here instead, as a function of the scores and coins:

- **none below** :data:`MIN_TRIALS_PER_BIN` × 2 trials (the edges and both counts empty): a
  small audit's answer has no histogram, so its histogram tells nothing of any coin;
- above, **equal-count bins of at least** :data:`MIN_TRIALS_PER_BIN` trials (at most
  :data:`MAX_BINS`), cut at the quantiles of the scores and merged until every bin holds that
  many whatever the scores are (ties included). A bin says how many of its trials had the
  canary in — an aggregate of at least 100 coins, like the counts behind every bound: the best
  guess of one coin from it (the bin's majority) is right with probability
  ½ + E|Bin(100, ½) − 50| / 100 ≈ 0.54 at most.

The bounds are aggregates too; :func:`withheld_rates` keeps a bound's error rates and one-run
guess counts out of the answer when its threshold leaves fewer than :data:`MIN_CELL` trials
on one side (a server that declares a threshold above all its scores but one would read that
one trial's coin from the false-negative rate). The coins are drawn afresh for every audit and
the scores are submitted once, so what an answer tells of its own coins after the fact cannot
change that audit's bounds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedleak.auditing import AuditBound, ScoreHistogram

#: The fewest trials a released bin holds (and half the fewest an audit needs for one).
MIN_TRIALS_PER_BIN = 100
#: The fewest evaluated trials on either side of a bound's threshold for its error rates and
#: guess counts to be shown.
MIN_CELL = 10
#: The most bins an answer's histogram has.
MAX_BINS = 20


def released_histogram(scores: np.ndarray, coins: np.ndarray) -> ScoreHistogram:
    """Canary-in and canary-out counts over bins of at least :data:`MIN_TRIALS_PER_BIN`
    trials each; empty below twice that many trials (module docstring)."""
    scores = np.asarray(scores, dtype=float)
    coins = np.asarray(coins, dtype=bool)
    bins = min(MAX_BINS, scores.size // MIN_TRIALS_PER_BIN)
    if bins < 2:
        return ScoreHistogram([], [], [])
    quantiles = np.quantile(scores, np.linspace(0, 1, bins + 1))
    edges = [float(quantiles[0])]
    for edge in quantiles[1:-1]:
        if edge > edges[-1]:
            edges.append(float(edge))
    edges.append(float(quantiles[-1]))
    if edges[-1] <= edges[0]:  # every score the same: one bin
        return ScoreHistogram([], [], [])
    totals = np.histogram(scores, edges)[0]
    merged = [edges[0]]
    held = 0
    for right, count in zip(edges[1:], totals, strict=True):
        held += int(count)
        if held >= MIN_TRIALS_PER_BIN:
            merged.append(right)
            held = 0
    if held:  # the last bin is short: it joins the one before
        merged[-1] = edges[-1]
    if len(merged) < 3:  # one bin: the split of all trials, said by the bounds already
        return ScoreHistogram([], [], [])
    return ScoreHistogram(merged,
                          [int(c) for c in np.histogram(scores[coins], merged)[0]],
                          [int(c) for c in np.histogram(scores[~coins], merged)[0]])


def withheld_rates(bounds: list[AuditBound], scores: np.ndarray,
                   evaluated: np.ndarray) -> list[AuditBound]:
    """``bounds`` with ``fpr_upper``, ``fnr_upper``, ``guesses`` and ``correct`` left out of
    any bound whose thresholds leave fewer than :data:`MIN_CELL` of the ``evaluated`` trials
    on one side (their ε and the totals stay: aggregates over all evaluated trials)."""
    shown = np.asarray(scores, dtype=float)[np.asarray(evaluated, dtype=bool)]
    out = []
    for bound in bounds:
        cells = []
        for threshold, above in ((bound.threshold, True), (bound.lower_threshold, False)):
            if threshold is None:
                continue
            picked = int((shown >= threshold).sum() if above else (shown <= threshold).sum())
            cells += [picked, shown.size - picked]
        if cells and min(cells) < MIN_CELL:
            bound = dataclasses.replace(bound, fpr_upper=None, fnr_upper=None, guesses=None,
                                        correct=None)
        out.append(bound)
    return out
