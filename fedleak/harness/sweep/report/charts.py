"""The sweep report's pictures: per context, the privacy–utility chart (attack PSNR and SSIM
against test accuracy, one curve per defense from the no-defense reference ★) and the strength
chart (attack PSNR and test accuracy against the defense's strength), each with the trivial
floor of the attacked images as a grey band (the best constant guess: a point inside or below
it recovered nothing beyond that guess); per point, the image grid of its attacked rounds.
:func:`~fedleak.harness.sweep.report.folder.write_report` places them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedleak.harness.metrics.chart_layout import keep_span, place_labels, wrapped  # noqa: E402
from fedleak.harness.sweep.results import PointResult, format_epsilon  # noqa: E402
from fedleak.harness.sweep.worst_case import attack_names  # noqa: E402

REFERENCE_STYLE = dict(marker="*", color="black", markersize=16, linestyle="none", zorder=5)
FLOOR_LABEL = "trivial floor (best constant guess)"
FLOOR_STYLE = dict(color="0.6", alpha=0.3, zorder=0, linewidth=0)
#: a PSNR axis spans at least this many dB: a spread of hundredths of a dB between points at
#: the floor is not stretched to the panel's height
MIN_PSNR_SPAN = 4.0


def by_context(results: list[PointResult]) -> OrderedDict[str, list[PointResult]]:
    """Points by context; two tables of one attack (a portfolio) are told apart by the
    options in which they differ, so each gets its own curves."""
    names = attack_names(results)
    out: OrderedDict[str, list[PointResult]] = OrderedDict()
    for r in results:
        context = r.context if names[r.point_id] == r.point.attack else \
            r.context.replace(r.point.attack, names[r.point_id], 1)
        out.setdefault(context, []).append(r)
    return out


def _curves(members: list[PointResult]) -> tuple[list[PointResult],
                                                  OrderedDict[str, list[PointResult]]]:
    """The reference point(s) and, per defense, its points from weakest to strongest."""
    references = [r for r in members if r.reference]
    groups: OrderedDict[str, list[PointResult]] = OrderedDict()
    for r in members:
        if not r.reference:
            groups.setdefault(r.group, []).append(r)
    for name, points in groups.items():
        groups[name] = sorted(points, key=lambda r: (r.point.strength is None,
                                                     r.point.strength or 0.0))
    return references, groups


def _point_note(r: PointResult) -> str:
    parts = []
    if r.point.strength is not None and r.point.param:
        parts.append(f"{r.point.strength:g}")
    if r.epsilon is not None:
        parts.append(f"ε={format_epsilon(r.epsilon)}")
    if r.epsilon_lb is not None:
        parts.append(f"ε_LB={r.epsilon_lb:.3g}")
    return ", ".join(parts)


def epsilon_note(members: list[PointResult]) -> str:
    """What the ε annotated on a chart is, and at what δ ('' when no point claims one)."""
    deltas = {r.delta for r in members if r.epsilon is not None and r.delta is not None}
    if not any(r.epsilon is not None for r in members):
        return ""
    at = f"δ = {deltas.pop():g}" if len(deltas) == 1 else "the δ of each accountant"
    return (f"ε: the accountant's over the whole deployment (every round of the utility "
            f"training), at {at}")


def plot_privacy_utility(members: list[PointResult], path: Path, context: str) -> Path:
    """PSNR and SSIM of the attack against test accuracy, one curve per defense."""
    references, groups = _curves(members)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained")
    notes: dict[int, list[tuple[str, tuple[float, float], dict[str, object]]]] = {0: [], 1: []}
    for index_ax, (ax, metric, unit) in enumerate(((axes[0], "psnr", "attack PSNR (dB)"),
                                                   (axes[1], "ssim", "attack SSIM"))):
        for index, (name, points) in enumerate(groups.items()):
            curve = [r for r in (references[:1] + points)
                     if r.accuracy is not None and getattr(r, metric) is not None]
            if not curve:
                continue
            xs = [r.accuracy for r in curve]
            ys = [getattr(r, metric) for r in curve]
            color = f"C{index}"
            param = points[0].point.param
            ax.plot(xs, ys, marker="o", color=color,
                    label=name + (f" ({param})" if param else ""))
            for r in curve:
                if not r.reference and r.accuracy is not None:
                    notes[index_ax].append((_point_note(r), (r.accuracy, getattr(r, metric)),
                                            {"fontsize": 7, "color": color}))
        for r in references:
            if r.accuracy is not None and getattr(r, metric) is not None:
                ax.plot([r.accuracy], [getattr(r, metric)], label="no defense (reference)",
                        **REFERENCE_STYLE)
        floor_band(ax, [getattr(r, f"floor_{metric}") for r in members])
        ax.margins(x=0.15, y=0.08)
        if metric == "psnr":
            keep_span(ax, MIN_PSNR_SPAN)
        ax.set_xlabel("test accuracy of the defended federated training")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if not any(r.accuracy is not None for r in members):
            ax.text(0.5, 0.5, "utility not measured", ha="center", transform=ax.transAxes)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = OrderedDict(zip(labels, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), fontsize=8, loc="outside lower center",
               ncols=min(4, max(1, len(unique))))
    note = epsilon_note(members)
    fig.suptitle(wrapped(f"privacy–utility: {context}\n(up and right leaks more"
                         + (f"; {note})" if note else ")"), fig, 10), fontsize=10)
    for index_ax, ax in enumerate(axes):
        place_labels(ax, notes[index_ax])
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def floor_band(ax: Any, floors: list[float | None]) -> None:
    """The points' trivial floors as a horizontal grey band, from the lowest to the highest
    (a thin band when they agree)."""
    values = [f for f in floors if f is not None]
    if not values:
        return
    low, high = min(values), max(values)
    if high - low < 1e-9:  # one floor: a thick line, which stretches no axis
        ax.axhline(low, label=FLOOR_LABEL, color=FLOOR_STYLE["color"], alpha=0.5,
                   linewidth=5, zorder=0)
    else:
        ax.axhspan(low, high, label=FLOOR_LABEL, **FLOOR_STYLE)


def plot_strength(members: list[PointResult], path: Path, context: str) -> Path:
    """Per defense: attack PSNR and test accuracy against its strength, reference leftmost."""
    references, groups = _curves(members)
    reference = references[0] if references else None
    count = max(1, len(groups))
    fig, axes = plt.subplots(1, count, figsize=(max(6.5, 4.4 * count), 4.2), squeeze=False,
                             layout="constrained")
    notes: list[tuple[Any, list[tuple[str, tuple[float, float], dict[str, Any]]]]] = []
    for ax, (name, points) in zip(axes[0], groups.items(), strict=False):
        curve = ([reference] if reference else []) + points
        xs = np.arange(len(curve))
        psnr = [np.nan if r.psnr is None else r.psnr for r in curve]
        acc = [np.nan if r.accuracy is None else r.accuracy for r in curve]
        ax.plot(xs, psnr, marker="o", color="C0", label="attack PSNR")
        floors = [r.floor_psnr for r in curve if r.floor_psnr is not None]
        if floors:
            floor_band(ax, list(floors))
            ax.legend(loc="best", fontsize=7)
        ax.set_ylabel("attack PSNR (dB)", color="C0")
        keep_span(ax, MIN_PSNR_SPAN, psnr + floors)
        twin = ax.twinx()
        twin.plot(xs, acc, marker="s", color="C1", label="test accuracy")
        twin.set_ylabel("test accuracy", color="C1")
        twin.set_ylim(0, 1)
        if reference:
            ax.plot([0], [psnr[0]], **REFERENCE_STYLE)
        ticks = ["none" if r.reference else f"{r.point.strength:g}"
                 if r.point.strength is not None else r.label for r in curve]
        ax.set_xticks(xs, ticks, fontsize=8)
        ax.set_xlim(-0.4, len(curve) - 0.6)
        param = points[0].point.param or "setting"
        ax.set_xlabel(f"{name}: {param}")
        notes.append((twin, [(f"ε={format_epsilon(r.epsilon)}",
                              (float(x), acc[x] if not math.isnan(acc[x]) else 0.05),
                              {"fontsize": 7, "color": "C1"})
                             for x, r in zip(xs, curve, strict=True)
                             if r.epsilon is not None and not r.reference]))
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    if not groups:
        axes[0][0].text(0.5, 0.5, "no defense points", ha="center",
                        transform=axes[0][0].transAxes)
    note = epsilon_note(members)
    fig.suptitle(wrapped(f"attack success and utility against defense strength: {context}"
                         + (f"\n({note})" if note else ""), fig, 10), fontsize=10)
    for twin, items in notes:
        place_labels(twin, items)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def image_grid(result: PointResult, run_dir: Path, path: Path) -> Path | None:
    """The point's round pictures side by side in one PNG, or None when there are none."""
    pictures = [plt.imread(run_dir / f) for f in result.picture_files()
                if (run_dir / f).exists()]
    if not pictures:
        return None
    height = max(p.shape[0] for p in pictures)
    gap = np.ones((height, 8, 4), dtype=np.float32)
    row = []
    for picture in pictures:
        rgba = _rgba(picture)
        pad = np.ones((height - rgba.shape[0], rgba.shape[1], 4), dtype=np.float32)
        row += [np.concatenate([rgba, pad]), gap]
    plt.imsave(path, np.concatenate(row[:-1], axis=1))
    return path


def _rgba(picture: np.ndarray) -> np.ndarray:
    picture = picture.astype(np.float32)
    if picture.max() > 1:
        picture = picture / 255
    if picture.ndim == 2:
        picture = np.stack([picture] * 3, axis=-1)
    if picture.shape[2] == 3:
        picture = np.concatenate([picture, np.ones(picture.shape[:2] + (1,), np.float32)], 2)
    return picture
