"""The sweep report's pictures for text points: per context, ROUGE against utility (a
language model's test perplexity, lower is better; a classifier's test accuracy) and ROUGE
against the ε the defense claims, one curve per defense from the no-defense reference ★.

A point whose attack recovers a token set rather than sentences (token-set) charts the token
recall in place of ROUGE. :func:`~fedleak.harness.sweep.report.folder.write_report` places them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedleak.harness.metrics.chart_layout import place_labels, wrapped  # noqa: E402
from fedleak.harness.sweep.report.charts import REFERENCE_STYLE  # noqa: E402
from fedleak.harness.sweep.results import PointResult, format_epsilon  # noqa: E402

#: the file names' prefix that tells the report page a chart is a text chart
TEXT_CHART = "text-"


def leakage_label(kinds: set[str]) -> str:
    """The y-axis label for the leakage measures drawn (both named when a chart mixes them)."""
    if kinds == {"token set"}:
        return "attack token-set recall"
    if "token set" in kinds:
        return "attack ROUGE-1, or token-set recall (token-set)"
    return "attack ROUGE-1 (mean over private sentences)"


def is_text_result(r: PointResult) -> bool:
    """Whether ``r`` was measured on text (ROUGE or a token set, or a text data set)."""
    from fedleak.harness.zoo.text.corpus import TEXT_CORPORA

    a = r.attack
    return r.point.dataset in TEXT_CORPORA or (a is not None and (
        a.rouge1 is not None or a.token_recall is not None))


def leakage(r: PointResult) -> tuple[float | None, float | None, str]:
    """(ROUGE-1, ROUGE-2, "rouge"), or (token recall, token precision, "token set")."""
    a = r.attack
    if a is None:
        return None, None, "rouge"
    if a.rouge1 is not None:
        return a.rouge1, a.rouge2, "rouge"
    return a.token_recall, a.token_precision, "token set"


def utility(r: PointResult) -> tuple[float | None, str]:
    """(perplexity, "test perplexity") for a language model, else (accuracy, "test accuracy")."""
    u = r.utility
    if u is None:
        return None, "utility"
    if u.perplexity is not None:  # a diverged training (∞) has no place on the axis
        return (u.perplexity if math.isfinite(u.perplexity) else None,
                "test perplexity of the defended federated training (lower: better)")
    return u.test_accuracy, "test accuracy of the defended federated training"


def plot_text_privacy_utility(members: list[PointResult], path: Path, context: str) -> Path:
    """Left: leakage against utility; right: leakage against the claimed ε (∞ undefended)."""
    references = [r for r in members if r.reference]
    groups: OrderedDict[str, list[PointResult]] = OrderedDict()
    for r in members:
        if not r.reference:
            groups.setdefault(r.group, []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    finite = [r.epsilon for r in members if r.epsilon is not None and math.isfinite(r.epsilon)]
    infinity = 2 * max(finite) if finite else 10.0  # where "no DP" is drawn on the ε axis
    kinds: set[str] = set()  # the leakage measures of the points drawn, not of the last read
    xlabel = "utility"
    notes_of: list[list[tuple[str, tuple[float, float], dict[str, object]]]] = [[], []]
    diverged = sorted({r.label for r in members if r.utility is not None and
                       r.utility.perplexity is not None and
                       not math.isfinite(r.utility.perplexity)})
    for panel, ax in enumerate(axes):
        for index, (name, points) in enumerate(groups.items()):
            points = sorted(points, key=lambda r: r.point.strength or 0.0)
            curve = (references[:1] if panel == 0 else []) + points  # ∞ is no point
            xs, ys, notes = [], [], []
            for r in curve:
                first, _, kind = leakage(r)
                x = utility(r)[0] if panel == 0 else (
                    infinity if r.epsilon is None or not math.isfinite(r.epsilon) else r.epsilon)
                if first is None or x is None:
                    continue
                kinds.add(kind)
                xs.append(x)
                ys.append(first)
                notes.append("" if r.reference else f"ε={format_epsilon(r.epsilon)}"
                             if r.epsilon is not None else f"{r.point.strength or ''}")
            param = points[0].point.param
            ax.plot(xs, ys, marker="o", color=f"C{index}",
                    label=name + (f" ({param})" if param else ""))
            notes_of[panel] += [(note, (x, y), {"fontsize": 7, "color": f"C{index}"})
                                for x, y, note in zip(xs, ys, notes, strict=True) if note]
        for r in references:
            first, _, kind = leakage(r)
            x = utility(r)[0] if panel == 0 else infinity
            if first is not None and x is not None:
                kinds.add(kind)
                ax.plot([x], [first], label="no defense (reference)", **REFERENCE_STYLE)
        if panel == 0:
            xlabel = next((utility(r)[1] for r in members if r.utility), "utility")
            ax.set_xlabel(xlabel)
        else:
            ax.set_xlabel(f"ε the defense claims (no DP drawn at {infinity:.3g})")
        ax.set_ylabel(leakage_label(kinds))
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.margins(x=0.15)
    drawn = [v for v in (utility(r)[0] for r in members if r.utility) if v is not None]
    if "perplexity" in xlabel and drawn and all(v > 0 for v in drawn):
        axes[0].set_xscale("log")  # perplexities span orders of magnitude
    handles, labels = axes[0].get_legend_handles_labels()
    unique = OrderedDict(zip(labels, handles, strict=True))
    axes[0].legend(unique.values(), unique.keys(), fontsize=8, loc="best")
    note = f"; not drawn on the left, training diverged (∞ perplexity): {', '.join(diverged)}" \
        if diverged else ""
    fig.suptitle(wrapped(f"text privacy–utility: {context}\n(up leaks more; ε annotated where "
                         f"the defense accounts for it{note})", fig, 10), fontsize=10)
    fig.tight_layout()
    for panel, ax in enumerate(axes):
        place_labels(ax, notes_of[panel])
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
