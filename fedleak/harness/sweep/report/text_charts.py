"""The sweep report's pictures for text points: per context, ROUGE against utility (a
language model's test perplexity, lower is better; a classifier's test accuracy) and ROUGE
against the ε the defense claims, one curve per defense from the no-defense reference ★.

A point whose attack recovers a token set rather than sentences (token-set) charts the token
recall in place of ROUGE. A chart draws one measure, one kind of ε (the deployment's where
the sweep trains for utility, else the attacked rounds'), and one curve per defense table; a
point of a partial sweep not measured yet for either is left out, never drawn at another kind.
:func:`~fedleak.harness.sweep.report.folder.write_report` places them.
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


def chart_measure(members: list[PointResult]) -> str:
    """The one leakage measure of a chart (a context: one attack): ``"rouge"`` when its attack
    scores sentences, ``"token set"`` when it recovers a token set only. Read from every
    measured point, not from the ones drawn, so a partial sweep is labelled as the whole
    one; before any is measured, from the attack's name."""
    attacks = [r.attack for r in members if r.attack is not None]
    if any(a.rouge1 is not None for a in attacks):
        return "rouge"
    if any(a.token_recall is not None for a in attacks):
        return "token set"
    return "token set" if members and all(r.point.attack == "token-set" for r in members) \
        else "rouge"


def deployment_epsilon(members: list[PointResult]) -> bool:
    """Whether a chart's ε axis is the deployment's (some point trains for utility: the ε of
    every round of that training) rather than the attacked rounds' (no utility training)."""
    return any(r.point.utility_settings.enabled for r in members)


def claimed_epsilon(r: PointResult, deployment: bool) -> float | None:
    """``r``'s ε of the chart's one kind: the utility training's (``deployment``) or the
    attack's; ∞ where that record claims none, None where it is not measured yet (a partial
    sweep: the point is not drawn, rather than drawn at the other kind's ε)."""
    record = r.utility if deployment else r.attack
    if record is None:
        return None
    return math.inf if record.epsilon is None else float(record.epsilon)


def _fixed(r: PointResult) -> str:
    """The chain of ``r``'s defense table without the swept parameter (its fixed settings)."""
    p = r.point
    parts = []
    for spec in p.defenses:
        name, _, params = spec.partition(":")
        kept = [kv for kv in params.split(",") if kv and kv.split("=", 1)[0] != p.param]
        parts.append(name + (":" + ",".join(kept) if kept else ""))
    return " + ".join(parts) + (f" ({p.users} users)" if p.users > 1 else "")


def text_curves(members: list[PointResult]) -> OrderedDict[str, list[PointResult]]:
    """The non-reference points by curve, each from weakest to strongest: one curve per
    defense table (its group, swept parameter and fixed settings), so two tables of one
    defense (dpsgd at two clips) are two curves, named apart by their fixed settings."""
    keyed: OrderedDict[tuple[str, str | None, str], list[PointResult]] = OrderedDict()
    for r in members:
        if not r.reference:
            key = (r.group, r.point.param, "" if r.point.victim else _fixed(r))
            keyed.setdefault(key, []).append(r)
    shared = [group for group, _, _ in keyed]
    out: OrderedDict[str, list[PointResult]] = OrderedDict()
    for (group, param, fixed), points in keyed.items():
        name = group + (f" ({param})" if param else "")
        if shared.count(group) > 1 and fixed:
            name += f", {fixed}"
        out[name] = sorted(points, key=lambda r: r.point.strength or 0.0)
    return out


def is_text_result(r: PointResult) -> bool:
    """Whether ``r`` was measured on text (ROUGE or a token set, or a text data set)."""
    from fedleak.harness.zoo.text.corpus import TEXT_CORPORA

    a = r.attack
    return r.point.dataset in TEXT_CORPORA or (a is not None and (
        a.rouge1 is not None or a.token_recall is not None))


def leakage(r: PointResult, measure: str | None = None
            ) -> tuple[float | None, float | None, str]:
    """(ROUGE-1, ROUGE-2, "rouge"), or (token recall, token precision, "token set"): the
    chart's ``measure`` when given, else ROUGE where the point has it."""
    a = r.attack
    kind = measure or ("rouge" if a is not None and a.rouge1 is not None else "token set")
    if a is None:
        return None, None, kind
    if kind == "rouge":
        return a.rouge1, a.rouge2, kind
    return a.token_recall, a.token_precision, kind


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
    """Left: leakage against utility; right: leakage against the claimed ε (∞ undefended).

    One measure on the y-axis (:func:`chart_measure`), one kind of ε on the right
    (:func:`deployment_epsilon`), one curve per defense table (:func:`text_curves`)."""
    references = [r for r in members if r.reference]
    groups = text_curves(members)
    measure = chart_measure(members)
    deployment = deployment_epsilon(members)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    finite = [e for e in (claimed_epsilon(r, deployment) for r in members)
              if e is not None and math.isfinite(e)]
    infinity = 2 * max(finite) if finite else 10.0  # where "no DP" is drawn on the ε axis
    xlabel = "utility"
    notes_of: list[list[tuple[str, tuple[float, float], dict[str, object]]]] = [[], []]
    diverged = sorted({r.label for r in members if r.utility is not None and
                       r.utility.perplexity is not None and
                       not math.isfinite(r.utility.perplexity)})
    for panel, ax in enumerate(axes):
        for index, (name, points) in enumerate(groups.items()):
            curve = (references[:1] if panel == 0 else []) + points  # ∞ is no point
            xs, ys, notes = [], [], []
            for r in curve:
                first = leakage(r, measure)[0]
                epsilon = claimed_epsilon(r, deployment)
                x = utility(r)[0] if panel == 0 else None if epsilon is None else (
                    epsilon if math.isfinite(epsilon) else infinity)
                if first is None or x is None:
                    continue
                xs.append(x)
                ys.append(first)
                notes.append("" if r.reference else
                             f"ε={format_epsilon(epsilon)}" if epsilon is not None and
                             math.isfinite(epsilon) else f"{r.point.strength or ''}")
            ax.plot(xs, ys, marker="o", color=f"C{index}", label=name)
            notes_of[panel] += [(note, (x, y), {"fontsize": 7, "color": f"C{index}"})
                                for x, y, note in zip(xs, ys, notes, strict=True) if note]
        for r in references:
            first = leakage(r, measure)[0]
            x = utility(r)[0] if panel == 0 else infinity
            if first is not None and x is not None:
                ax.plot([x], [first], label="no defense (reference)", **REFERENCE_STYLE)
        if panel == 0:
            xlabel = next((utility(r)[1] for r in members if r.utility), "utility")
            ax.set_xlabel(xlabel)
        else:
            over = "the whole deployment" if deployment else "the attacked rounds"
            ax.set_xlabel(wrapped(f"ε the defense claims over {over} (no DP drawn at "
                                  f"{infinity:.3g})", fig, 9, 0.45))
        ax.set_ylabel(leakage_label({measure}))
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
