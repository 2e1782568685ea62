"""The report of a sweep run folder: charts, image grids, a CSV and one HTML page tying them.

``write_report(RUN)`` writes, under ``RUN/report/``:

- ``privacy-utility.png``: attack PSNR and SSIM against test accuracy, one curve per defense
  starting at the no-defense reference (★), each point labelled with its strength and, where
  the defense has one, the ε it claims;
- ``strength.png``: per defense, attack PSNR (left axis) and test accuracy (right axis)
  against the defense's strength, the reference at the left;
- ``grids/<point_id>.png``: per point, its attacked rounds side by side (ground truth above
  reconstruction where the victim revealed it);
- ``results.csv``: one row per point;
- when some defense setting was attacked by several attacks (a portfolio):
  ``worst-case.png`` (per setting, the strongest honest and malicious attack's PSNR, named)
  and ``worst-case.csv`` (:mod:`fedleak.harness.sweep.worst_case`);

and ``RUN/report.html``, which links them all with relative paths (one chart pair per context
when the grid spans several attacks, models, protocols or checkpoints).
"""

from __future__ import annotations

import csv
import html
import math
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fedleak.harness.sweep.bounds_chart import (  # noqa: E402
    BoundsRow,
    bounds_rows,
    plot_bounds,
    write_bounds_csv,
)
from fedleak.harness.sweep.results import (  # noqa: E402
    PointResult,
    format_audit,
    format_epsilon,
    load_results,
)
from fedleak.harness.sweep.runner import SPEC_NAME  # noqa: E402
from fedleak.harness.sweep.store import STORE_NAME, ResultStore  # noqa: E402
from fedleak.harness.sweep.worst_case import (  # noqa: E402
    ROLES,
    WorstCase,
    attack_names,
    by_setting,
    plot_worst_case,
    worst_cases,
)

REPORT_FOLDER = "report"
HTML_NAME = "report.html"
CSV_COLUMNS = ("point_id", "label", "group", "param", "strength", "reference", "attack", "model",
               "dataset", "protocol", "trained", "defenses", "rounds", "images_per_round",
               "mean_psnr", "mean_ssim", "label_accuracy", "test_accuracy", "initial_accuracy",
               "epsilon", "delta", "epsilon_lb", "epsilon_lb_estimator", "audit_epsilon_claimed",
               "audit_violation", "audit_trials", "audit_canary", "status", "error",
               "success_psnr", "success_rate", "kappa", "reconstruction_bound",
               "fisher_psnr_ceiling")
REFERENCE_STYLE = dict(marker="*", color="black", markersize=16, linestyle="none", zorder=5)


def write_report(run_dir: Path, audited: Mapping[str, float] | None = None) -> Path:
    """Write every report file for ``run_dir``; returns the HTML page's path.

    ``audited`` maps point ids to audited ε lower bounds, over the ones the sweep's own audit
    game stored (``[sweep.audit]``): the bounds chart draws them beside the accountant's ε.
    """
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    audited = {**{r.point_id: r.epsilon_lb for r in results if r.epsilon_lb is not None},
               **(audited or {})}
    folder = run_dir / REPORT_FOLDER
    (folder / "grids").mkdir(parents=True, exist_ok=True)
    contexts = _by_context(results)
    charts = []
    for index, (context, members) in enumerate(contexts.items()):
        suffix = "" if len(contexts) == 1 else f"-{index + 1}"
        pu = plot_privacy_utility(members, folder / f"privacy-utility{suffix}.png", context)
        st = plot_strength(members, folder / f"strength{suffix}.png", context)
        charts.append((context, pu, st))
    grids = {r.point_id: image_grid(r, run_dir, folder / "grids" / f"{r.point_id}.png")
             for r in results}
    write_csv(results, folder / "results.csv")
    rows = worst_cases(results)
    worst: list[tuple[str, Path]] = []
    if any(row.attacks > 1 for row in rows):
        settings = by_setting(rows)
        for index, (setting, settled) in enumerate(settings.items()):
            suffix = "" if len(settings) == 1 else f"-{index + 1}"
            worst.append((setting, plot_worst_case(settled, folder / f"worst-case{suffix}.png",
                                                   setting)))
        write_worst_csv(rows, folder / "worst-case.csv")
    dp_rows = bounds_rows(results, audited)
    bounds = None
    if dp_rows:
        bounds = (dp_rows, plot_bounds(dp_rows, folder / "bounds.png"))
        write_bounds_csv(dp_rows, folder / "bounds.csv")
    with ResultStore(run_dir / STORE_NAME) as store:
        name = store.meta("name") or run_dir.name
    page = run_dir / HTML_NAME
    page.write_text(_html(name, run_dir, results, charts, grids,
                          (rows, worst) if worst else None, bounds))
    return page


def write_worst_csv(rows: list[WorstCase], path: Path) -> Path:
    """One row per defense setting: the strongest attack per server role and its PSNR."""
    columns = ["setting", "defense", "attacks"] + [f"{role}_{what}" for role in ROLES
                                                   for what in ("attack", "psnr", "ssim")]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            entry: dict[str, object] = {"setting": row.setting, "defense": row.label,
                                        "attacks": row.attacks}
            for role, best in row.strongest.items():
                entry.update({f"{role}_attack": best.attack, f"{role}_psnr": best.psnr,
                              f"{role}_ssim": best.ssim})
            writer.writerow(entry)
    return path


def _by_context(results: list[PointResult]) -> OrderedDict[str, list[PointResult]]:
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


# --------------------------------------------------------------------------- charts


def plot_privacy_utility(members: list[PointResult], path: Path, context: str) -> Path:
    """PSNR and SSIM of the attack against test accuracy, one curve per defense."""
    references, groups = _curves(members)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, metric, unit in ((axes[0], "psnr", "attack PSNR (dB)"),
                             (axes[1], "ssim", "attack SSIM")):
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
                if not r.reference:
                    ax.annotate(_point_note(r), (r.accuracy, getattr(r, metric)),
                                textcoords="offset points", xytext=(5, 5), fontsize=7,
                                color=color)
        for r in references:
            if r.accuracy is not None and getattr(r, metric) is not None:
                ax.plot([r.accuracy], [getattr(r, metric)], label="no defense (reference)",
                        **REFERENCE_STYLE)
        ax.margins(x=0.15, y=0.08)
        ax.set_xlabel("test accuracy of the defended federated training")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if not any(r.accuracy is not None for r in members):
            ax.text(0.5, 0.5, "utility not measured", ha="center", transform=ax.transAxes)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = OrderedDict(zip(labels, handles, strict=True))
    axes[0].legend(unique.values(), unique.keys(), fontsize=8, loc="best")
    fig.suptitle(f"privacy–utility: {context}\n(up and right leaks more; ε annotated where "
                 "the defense accounts for it)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_strength(members: list[PointResult], path: Path, context: str) -> Path:
    """Per defense: attack PSNR and test accuracy against its strength, reference leftmost."""
    references, groups = _curves(members)
    reference = references[0] if references else None
    count = max(1, len(groups))
    fig, axes = plt.subplots(1, count, figsize=(4.2 * count, 3.8), squeeze=False)
    for ax, (name, points) in zip(axes[0], groups.items(), strict=False):
        curve = ([reference] if reference else []) + points
        xs = np.arange(len(curve))
        psnr = [np.nan if r.psnr is None else r.psnr for r in curve]
        acc = [np.nan if r.accuracy is None else r.accuracy for r in curve]
        ax.plot(xs, psnr, marker="o", color="C0", label="attack PSNR")
        ax.set_ylabel("attack PSNR (dB)", color="C0")
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
        for x, r in zip(xs, curve, strict=True):
            if r.epsilon is not None and not r.reference:
                twin.annotate(f"ε={format_epsilon(r.epsilon)}", (x, acc[x] if
                              not math.isnan(acc[x]) else 0.05), textcoords="offset points",
                              xytext=(0, 9), ha="center", fontsize=7, color="C1",
                              bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none",
                                        alpha=0.8))
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    if not groups:
        axes[0][0].text(0.5, 0.5, "no defense points", ha="center",
                        transform=axes[0][0].transAxes)
    fig.suptitle(f"attack success and utility against defense strength: {context}", fontsize=10)
    fig.tight_layout()
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


# --------------------------------------------------------------------------- CSV and HTML


def write_csv(results: list[PointResult], path: Path) -> Path:
    """One row per point (:data:`CSV_COLUMNS`); empty cells where nothing was measured."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for r in results:
            p = r.point
            writer.writerow({
                "point_id": r.point_id, "label": r.label, "group": r.group, "param": p.param,
                "strength": p.strength, "reference": r.reference, "attack": p.attack,
                "model": p.model or (r.attack.model if r.attack else None),
                "dataset": p.dataset or (r.attack.dataset if r.attack else None),
                "protocol": p.protocol.kind if p.protocol else None, "trained": p.trained,
                "defenses": " | ".join(p.defenses or (r.attack.defenses if r.attack else [])),
                "rounds": p.rounds, "images_per_round": p.batch_size, "mean_psnr": r.psnr,
                "mean_ssim": r.ssim, "label_accuracy": r.label_accuracy,
                "test_accuracy": r.accuracy,
                "initial_accuracy": r.utility.initial_accuracy if r.utility else None,
                "epsilon": r.epsilon, "delta": r.delta, **_audit_columns(r),
                "status": r.status, "error": r.error or "",
                **{key: getattr(r.attack, key) if r.attack else None
                   for key in ("success_psnr", "success_rate", "kappa", "reconstruction_bound",
                               "fisher_psnr_ceiling")},
            })
    return path


def _audit_columns(r: PointResult) -> dict[str, object]:
    """The audit's CSV cells: the largest ε_LB and its estimator, the claim for one trial."""
    audit = r.audit
    best = audit.best if audit else None
    return {"epsilon_lb": best[1] if best else None,
            "epsilon_lb_estimator": best[0] if best else None,
            "audit_epsilon_claimed": audit.epsilon_claimed if audit else None,
            "audit_violation": audit.violation if audit else None,
            "audit_trials": audit.trials if audit else None,
            "audit_canary": audit.canary if audit else None}


def _rel(path: Path | None, run_dir: Path) -> str:
    return "" if path is None else path.relative_to(run_dir).as_posix()


def _fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else format(value, pattern)


def _html(name: str, run_dir: Path, results: list[PointResult],
          charts: list[tuple[str, Path, Path]], grids: dict[str, Path | None],
          worst: tuple[list[WorstCase], list[tuple[str, Path]]] | None = None,
          bounds: tuple[list[BoundsRow], Path] | None = None) -> str:
    e = html.escape
    done = sum(r.status == "done" for r in results)
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>fedleak sweep {e(name)}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "img{max-width:100%;border:1px solid #ddd}table{border-collapse:collapse;"
        "font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:right}"
        "td.l,th.l{text-align:left}section.point{margin:1.5em 0}.failed{color:#b00}"
        "pre{background:#f6f6f6;padding:1em;overflow:auto}</style></head><body>",
        f"<h1>fedleak sweep: {e(name)}</h1>",
        f"<p>{done} of {len(results)} point(s) measured · generated "
        f"{datetime.now():%Y-%m-%d %H:%M} · run folder {e(run_dir.name)} · "
        f"<a href=\"{REPORT_FOLDER}/results.csv\">results.csv</a> · "
        f"<a href=\"{SPEC_NAME}\">{SPEC_NAME}</a></p>",
        "<p>Each point attacks K private batches of a victim process running the point's "
        "defense chain (PSNR/SSIM scored inside the victim after Hungarian matching) and trains "
        "the model federatedly through the same defended path for the test accuracy; ε is the "
        "victim's own accountant's claim. With an audit, ε_LB is the largest ε lower bound the "
        "audit game measured for its canary (a lower bound for that canary and threat model; "
        "'!' marks one above the ε the chain claims for one trial, a violation; "
        "docs/audit.md).</p>",
    ]
    for context, pu, st in charts:
        parts += [
            f"<h2>Privacy–utility: {e(context)}</h2>",
            f'<figure><img src="{_rel(pu, run_dir)}" alt="attack PSNR and SSIM against test '
            f'accuracy, {e(context)}"><figcaption>Attack PSNR and SSIM against test accuracy; '
            "★ is the no-defense reference.</figcaption></figure>",
            f'<figure><img src="{_rel(st, run_dir)}" alt="attack PSNR and test accuracy '
            f'against defense strength, {e(context)}"><figcaption>Attack success (PSNR) and '
            "utility (test accuracy) against each defense's strength.</figcaption></figure>",
        ]
    if worst is not None:
        parts += _worst_html(*worst, run_dir)
    if bounds is not None:
        parts += _bounds_html(*bounds, run_dir)
    parts += ["<h2>Results</h2>", _table(results), "<h2>Reconstructions per point</h2>"]
    for r in results:
        parts.append(f'<section class="point" id="p-{r.point_id}"><h3>{e(r.label)} '
                     f"<small>[{r.point_id}]</small></h3>")
        parts.append(f"<p>{e(r.context)} · defenses: "
                     f"{e(' | '.join(r.point.defenses) or 'none')} · PSNR "
                     f"{_fmt(r.psnr, '.2f')} dB · SSIM {_fmt(r.ssim, '.3f')} · test accuracy "
                     f"{_fmt(r.accuracy, '.1%')} · ε {e(format_epsilon(r.epsilon))}</p>")
        if r.error:
            parts.append(f'<p class="failed">failed: {e(r.error)}</p>')
        grid = grids.get(r.point_id)
        if grid is not None:
            parts.append(f'<img src="{_rel(grid, run_dir)}" alt="rounds of {e(r.label)}: '
                         'ground truth above reconstruction">')
        parts.append("</section>")
    spec = run_dir / SPEC_NAME
    if spec.exists():
        parts += ["<h2>Spec</h2>", f"<pre>{e(spec.read_text())}</pre>"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _worst_html(rows: list[WorstCase], charts: list[tuple[str, Path]],
                run_dir: Path) -> list[str]:
    e = html.escape
    parts = ["<h2>Worst case per defense setting</h2>",
             "<p>Every setting attacked by each attack of the portfolio at the same budget; "
             'the strongest (highest mean PSNR) per server role. <a href="'
             f'{REPORT_FOLDER}/worst-case.csv">worst-case.csv</a></p>']
    for setting, chart in charts:
        parts.append(f'<figure><img src="{_rel(chart, run_dir)}" alt="worst-case leakage, '
                     f'{e(setting)}"><figcaption>{e(setting)}: the strongest honest (●) and '
                     "malicious (▲) attack per defense setting.</figcaption></figure>")
    table = ['<table><tr><th class="l">setting</th><th class="l">defense</th><th>attacks</th>'
             '<th class="l">strongest honest</th><th>PSNR dB</th>'
             '<th class="l">strongest malicious</th><th>PSNR dB</th></tr>']
    for row in rows:
        cells = []
        for role in ROLES:
            best = row.strongest.get(role)
            cells += [f'<td class="l">{e(best.attack) if best else "–"}</td>',
                      f"<td>{_fmt(best.psnr if best else None, '.2f')}</td>"]
        table.append(f'<tr><td class="l">{e(row.setting)}</td><td class="l">{e(row.label)}'
                     f"</td><td>{row.attacks}</td>{''.join(cells)}</tr>")
    table.append("</table>")
    return parts + ["\n".join(table)]


def _bounds_html(rows: list[BoundsRow], chart: Path, run_dir: Path) -> list[str]:
    e = html.escape
    parts = ["<h2>DP points from both sides</h2>",
             "<p>Per DP-SGD setting: the accountant's ε of the deployment (an upper bound on the "
             "privacy loss) and, where an audit ran, the audited ε<sub>LB</sub> of one trial (a "
             "lower bound) beside the accountant's ε for what that trial covers (one round, "
             "the claim the bound tests); the DP bound on any "
             "attack's success at the public prior's baseline κ (reconstruction robustness, "
             "Hayes et al. 2023; an upper bound) and the strongest attack's measured success (a "
             "lower bound on what is possible); the attack's PSNR and the victim's Fisher "
             "ceiling (an upper bound for unbiased reconstructions, Guo et al. 2022). "
             f'<a href="{REPORT_FOLDER}/bounds.csv">bounds.csv</a></p>',
             f'<figure><img src="{_rel(chart, run_dir)}" alt="DP points from both sides: ε, '
             'reconstruction success and PSNR with their bounds"><figcaption>▼ upper bounds, '
             "▲ and ● lower bounds (measured).</figcaption></figure>"]
    table = ['<table><tr><th class="l">setting</th><th>ε</th><th>ε of one trial</th>'
             "<th>ε<sub>LB</sub> of one trial</th><th>test accuracy</th><th>success</th>"
             "<th>DP bound</th><th>κ</th>"
             "<th>PSNR dB</th><th>Fisher ceiling dB</th></tr>"]
    for r in rows:
        success = "–" if r.success_rate is None else \
            f"{r.successes}/{r.images} ≥ {r.success_psnr:g} dB"
        table.append(
            f'<tr><td class="l">{e(r.label)} <small>{e(r.attack)}</small></td>'
            f"<td>{e(format_epsilon(r.epsilon))}</td><td>{_fmt(r.epsilon_trial, '.3g')}</td>"
            f"<td>{_fmt(r.epsilon_lb, '.3g')}</td>"
            f"<td>{_fmt(r.accuracy, '.1%')}</td><td>{e(success)}</td>"
            f"<td>{_fmt(r.bound, '.3f')}</td><td>{_fmt(r.kappa, '.3g')}</td>"
            f"<td>{_fmt(r.psnr, '.2f')}</td><td>{_fmt(r.fisher_ceiling, '.2f')}</td></tr>")
    table.append("</table>")
    return parts + ["\n".join(table)]


def _audit_title(r: PointResult) -> str:
    """Everything an ε_LB cell means, for its tooltip."""
    audit = r.audit
    if audit is None:
        return ""
    bounds = ", ".join(f"{k} {v:.3g}" for k, v in audit.epsilon_lb.items())
    claimed = "∞" if audit.epsilon_claimed is None else f"{audit.epsilon_claimed:.3g}"
    return (f"{bounds} at {audit.confidence:.0%}, δ={audit.delta:g}, {audit.trials} trials, "
            f"{audit.canary}; claimed ε per trial {claimed}")


def _table(results: list[PointResult]) -> str:
    e = html.escape
    rows = ['<table><tr><th class="l">point</th><th class="l">defense</th><th>PSNR dB</th>'
            "<th>SSIM</th><th>labels</th><th>test accuracy</th><th>ε</th><th>ε_LB</th>"
            '<th class="l">status</th></tr>']
    for r in results:
        rows.append(
            f'<tr><td class="l"><a href="#p-{r.point_id}">{r.point_id}</a></td>'
            f'<td class="l">{e(r.label)}</td><td>{_fmt(r.psnr, ".2f")}</td>'
            f'<td>{_fmt(r.ssim, ".3f")}</td><td>{_fmt(r.label_accuracy, ".0%")}</td>'
            f'<td>{_fmt(r.accuracy, ".1%")}</td><td>{e(format_epsilon(r.epsilon))}</td>'
            f'<td title="{e(_audit_title(r))}">{e(format_audit(r))}</td>'
            f'<td class="l">{e(r.status)}</td></tr>')
    rows.append("</table>")
    return "\n".join(rows)
