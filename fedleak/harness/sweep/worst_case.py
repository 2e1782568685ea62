"""Worst-case leakage: per defense setting, the strongest attack of a sweep's portfolio.

A defense is only as good as the best attack against it. When a sweep lists several attacks
(``[sweep] portfolio = true`` attacks every point with each applicable one at the same budget;
the store keeps every measurement), the report reads, per *setting* — everything but the
attack: model, data, protocol, training, defense chain — the attack with the highest mean
PSNR, once among honest-but-curious attacks and once among attacks by a malicious server
(``server_role`` of the attack class: ``honest``, ``malicious-parameters``,
``malicious-architecture``), so the two threat models stand side by side and a defense that
only stops the honest server shows as such.
"""

from __future__ import annotations

import textwrap
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedleak.harness.metrics.chart_layout import keep_span, wrapped  # noqa: E402
from fedleak.harness.sweep.results import PointResult  # noqa: E402

ROLES = ("honest", "malicious")
#: one marker per attack (its name in the legend), in order of the names
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "h")
ROLE_COLOR = {"honest": "C0", "malicious": "C3"}


def server_role(attack: str) -> str:
    """``honest`` or ``malicious`` for attack ``attack`` (its class's ``server_role``; an
    attack that is not installed here counts as honest)."""
    from fedleak.attacks import AttackConfigError, attack_class

    try:
        role = getattr(attack_class(attack), "server_role", "honest")
    except AttackConfigError:
        return "honest"
    return "honest" if role == "honest" else "malicious"


def attack_names(results: list[PointResult]) -> dict[str, str]:
    """Point id → the attack as the report names it: its name, plus the options that tell it
    from another entry of the same attack (``inverting-gradients (objective=cosine)``)."""
    options_by_name: dict[str, list[dict[str, object]]] = {}
    for r in results:
        seen = options_by_name.setdefault(r.point.attack, [])
        if r.point.attack_options not in seen:
            seen.append(r.point.attack_options)
    out = {}
    for r in results:
        variants = options_by_name[r.point.attack]
        if len(variants) == 1:
            out[r.point_id] = r.point.attack
            continue
        keys = sorted({k for v in variants for k in v})
        differing = [k for k in keys if len({repr(v.get(k)) for v in variants}) > 1]
        shown = ", ".join(f"{k}={r.point.attack_options.get(k, 'auto')}" for k in differing)
        out[r.point_id] = f"{r.point.attack} ({shown})"
    return out


@dataclass
class Strongest:
    """The strongest attack of one role at one setting."""

    attack: str
    point_id: str
    psnr: float
    ssim: float | None


@dataclass
class WorstCase:
    """One defense setting and, per server role, the attack that leaked most there."""

    setting: str
    label: str
    reference: bool
    attacks: int
    strongest: dict[str, Strongest]


def worst_cases(results: list[PointResult]) -> list[WorstCase]:
    """Per setting (spec order), the strongest measured attack per role; settings attacked by
    a single attack are included (their worst case is that attack)."""
    names = attack_names(results)
    rows: OrderedDict[tuple[str, str], WorstCase] = OrderedDict()
    for r in results:
        key = (r.setting, r.label)
        row = rows.setdefault(key, WorstCase(r.setting, r.label, r.reference, 0, {}))
        if r.psnr is None:
            continue
        row.attacks += 1
        role = server_role(r.point.attack)
        best = row.strongest.get(role)
        if best is None or r.psnr > best.psnr:
            row.strongest[role] = Strongest(names[r.point_id], r.point_id, r.psnr, r.ssim)
    return list(rows.values())


def has_portfolio(results: list[PointResult]) -> bool:
    """Whether some setting was attacked by more than one attack."""
    return any(row.attacks > 1 for row in worst_cases(results))


def plot_worst_case(rows: list[WorstCase], path: Path, setting: str) -> Path:
    """Per defense setting: the strongest honest and malicious attack's PSNR, each attack
    named by its marker in the legend."""
    fig, ax = plt.subplots(figsize=(max(7.0, 1.15 * len(rows) + 3), 5.0), layout="constrained")
    xs = list(range(len(rows)))
    names = sorted({s.attack for row in rows for s in row.strongest.values()})
    shapes = {name: MARKERS[i % len(MARKERS)] for i, name in enumerate(names)}
    values: list[float] = []
    for role in ROLES:
        for name in names:
            points = [(x, row.strongest[role]) for x, row in zip(xs, rows, strict=True)
                      if role in row.strongest and row.strongest[role].attack == name]
            if not points:
                continue
            values += [s.psnr for _, s in points]
            ax.plot([x for x, _ in points], [s.psnr for _, s in points], linestyle="none",
                    markersize=9, marker=shapes[name], color=ROLE_COLOR[role],
                    label=f"strongest {role}: {name}")
    per_column = 0.8 * fig.get_figwidth() * 72 / max(1, len(rows))
    width = max(8, int(per_column / (0.62 * 8)))
    ax.set_xticks(xs, [textwrap.fill("none" if r.reference else r.label, width) for r in rows],
                  fontsize=8)
    ax.set_ylabel("attack PSNR (dB), strongest attack")
    ax.grid(alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center")
    ax.margins(x=0.08, y=0.12)
    keep_span(ax, 4.0, values)
    fig.suptitle(wrapped(f"worst-case leakage per defense setting: {setting}", fig, 10),
                 fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def by_setting(rows: list[WorstCase]) -> OrderedDict[str, list[WorstCase]]:
    """Rows grouped by setting (one chart each)."""
    out: OrderedDict[str, list[WorstCase]] = OrderedDict()
    for row in rows:
        out.setdefault(row.setting, []).append(row)
    return out
