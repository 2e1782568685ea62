"""What makes a chart readable, written once for every chart fedleak draws: titles wrapped to
the figure, value axes that do not stretch a tiny spread to full height, and a check that no
text is clipped by the figure's edge or lies on other text.

:func:`text_problems` renders a figure and measures every drawn text (titles, axis labels,
tick labels, legend entries, annotations) with matplotlib's renderer
(``Text.get_window_extent``): a text outside the figure is clipped, two texts whose boxes
intersect overlap. The tests render every report chart through it.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.text import Text

#: pixels two text boxes may share, or a text may pass the figure's edge, before it counts
#: (anti-aliasing and rounding of the renderer)
SLACK_PX = 1.0


def wrapped(text: str, fig: Figure, fontsize: float, share: float = 1.0) -> str:
    """``text`` broken into lines no wider than ``share`` of the figure (each of its own lines
    wrapped on its own), at 0.65 em per character (wider than DejaVu Sans' average)."""
    width_px = fig.get_figwidth() * 72 * share * 0.95
    per_line = max(20, int(width_px / (0.65 * fontsize)))
    return "\n".join(textwrap.fill(line, per_line) if line else line
                     for line in text.split("\n"))


def keep_span(ax: Axes, minimum: float, values: list[float] | None = None) -> None:
    """Widen the y-axis to at least ``minimum`` around its data (or ``values``), so that a
    spread far below it does not fill the panel's height."""
    low, high = ax.get_ylim()
    if values:
        finite = [v for v in values if v is not None and math.isfinite(v)]
        if finite:
            low, high = min(finite), max(finite)
    if high - low < minimum:
        middle = (low + high) / 2
        ax.set_ylim(middle - minimum / 2, middle + minimum / 2)


def _drawn_tick_labels(axis: Axis) -> list[Text]:
    low, high = sorted(axis.get_view_interval())
    out = []
    for tick in axis.get_major_ticks():
        location = tick.get_loc()
        if location is None or not low - 1e-9 * (abs(low) + 1) <= location <= \
                high + 1e-9 * (abs(high) + 1):
            continue
        out += [label for label in (tick.label1, tick.label2) if label.get_visible()]
    return out


def drawn_texts(fig: Figure) -> list[Text]:
    """Every visible, non-empty text the figure draws (tick labels only where a tick is)."""
    ticks: set[int] = set()
    texts: list[Text] = []
    for ax in fig.get_axes():
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update(id(label) for label in (tick.label1, tick.label2))
            if ax.get_visible():
                texts += _drawn_tick_labels(axis)
    for found in fig.findobj(Text):
        if id(found) in ticks or not found.get_visible() or not found.get_text().strip():
            continue
        owner: Any = found.axes
        if owner is not None and not owner.get_visible():
            continue
        texts.append(found)
    return [t for t in texts if t.get_text().strip()]


def text_problems(fig: Figure) -> list[str]:
    """Texts clipped by the figure's edge and pairs of texts that overlap (module docstring);
    an empty list when every text is whole and apart."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = fig.bbox
    boxes = [(t, t.get_window_extent(renderer)) for t in drawn_texts(fig)]
    problems = []
    for text, box in boxes:
        if box.x0 < frame.x0 - SLACK_PX or box.y0 < frame.y0 - SLACK_PX or \
                box.x1 > frame.x1 + SLACK_PX or box.y1 > frame.y1 + SLACK_PX:
            problems.append(f"clipped by the figure's edge: {text.get_text()!r}")
    for i, (first, a) in enumerate(boxes):
        for second, b in boxes[i + 1:]:
            if _meet(a, b):
                problems.append(f"overlapping: {first.get_text()!r} and {second.get_text()!r}")
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.get_axes())]
    for legend in (lg for lg in legends if lg is not None and lg.get_visible()):
        frame_box = legend.get_window_extent(renderer)
        own = {id(t) for t in legend.get_texts()} | {id(legend.get_title())}
        for text, box in boxes:
            if id(text) not in own and _meet(frame_box, box):
                problems.append(f"under a legend: {text.get_text()!r}")
    return problems


def _meet(a: Any, b: Any) -> bool:
    """Whether two display boxes share more than :data:`SLACK_PX` both ways."""
    return bool(min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK_PX and
                min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK_PX)


#: where :func:`place_labels` tries a label, in points from its anchor, nearest first
OFFSETS = ((5, 4), (5, -4), (-5, 4), (-5, -4), (5, 14), (5, -14), (-5, 14), (-5, -14),
           (0, 24), (0, -24), (12, 26), (-12, -26))


def place_labels(ax: Axes, items: list[tuple[str, tuple[float, float], dict[str, Any]]]
                 ) -> None:
    """Annotate each ``(text, (x, y), style)`` at the first offset (:data:`OFFSETS`) where
    it stays inside the figure and clear of every text drawn so far; at the last offset when
    none is clear (:func:`text_problems` then says so)."""
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = fig.bbox
    taken = [t.get_window_extent(renderer) for t in drawn_texts(fig)]
    for text, xy, style in items:
        for index, (dx, dy) in enumerate(OFFSETS):
            note = ax.annotate(text, xy, textcoords="offset points", xytext=(dx, dy),
                               ha="left" if dx > 0 else "right" if dx < 0 else "center",
                               va="bottom" if dy >= 0 else "top", **style)
            box = note.get_window_extent(renderer)
            inside = box.x0 >= frame.x0 and box.y0 >= frame.y0 and box.x1 <= frame.x1 and \
                box.y1 <= frame.y1
            clear = not any(min(box.x1, o.x1) - max(box.x0, o.x0) > 0 and
                            min(box.y1, o.y1) - max(box.y0, o.y0) > 0 for o in taken)
            if (inside and clear) or index == len(OFFSETS) - 1:
                taken.append(box)
                break
            note.remove()
