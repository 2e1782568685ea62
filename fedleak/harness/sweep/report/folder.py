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

The charts and grids are drawn in :mod:`~fedleak.harness.sweep.report.charts`, the page written
in :mod:`~fedleak.harness.sweep.report.page`; this module places them and writes the CSVs.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

from fedleak.harness.sweep.report.bounds_chart import bounds_rows, plot_bounds, write_bounds_csv
from fedleak.harness.sweep.report.charts import (
    by_context,
    image_grid,
    plot_privacy_utility,
    plot_strength,
)
from fedleak.harness.sweep.report.page import REPORT_FOLDER, report_page
from fedleak.harness.sweep.report.text_charts import (
    TEXT_CHART,
    is_text_result,
    plot_text_privacy_utility,
)
from fedleak.harness.sweep.results import PointResult, load_results
from fedleak.harness.sweep.store import STORE_NAME, ResultStore
from fedleak.harness.sweep.worst_case import (
    ROLES,
    WorstCase,
    by_setting,
    plot_worst_case,
    worst_cases,
)

HTML_NAME = "report.html"
CSV_COLUMNS = ("point_id", "label", "group", "param", "strength", "reference", "attack", "model",
               "dataset", "protocol", "trained", "defenses", "rounds", "images_per_round",
               "mean_psnr", "floor_psnr", "floor_ssim", "floor_margin", "above_floor",
               "mean_ssim", "label_accuracy", "test_accuracy", "initial_accuracy",
               "epsilon", "delta", "epsilon_lb", "epsilon_lb_estimator", "audit_epsilon_claimed",
               "audit_violation", "audit_trials", "audit_canary", "status", "error",
               "success_psnr", "success_rate", "kappa", "reconstruction_bound",
               "fisher_psnr_ceiling", "prior_psnr", "truncated", "rouge1", "rouge2", "rougeL",
               "exact_sentences", "token_precision", "token_recall", "perplexity")


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
    contexts = by_context(results)
    charts: list[tuple[str, Path, Path | None]] = []
    for index, (context, members) in enumerate(contexts.items()):
        suffix = "" if len(contexts) == 1 else f"-{index + 1}"
        if all(is_text_result(r) for r in members):
            pu = plot_text_privacy_utility(
                members, folder / f"{TEXT_CHART}privacy-utility{suffix}.png", context)
            charts.append((context, pu, None))
            continue
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
    page.write_text(report_page(name, run_dir, results, charts, grids,
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
                **{key: getattr(r.measured_attack, key) if r.measured_attack else None
                   for key in ("floor_psnr", "floor_ssim", "floor_margin", "above_floor",
                               "success_psnr", "success_rate", "kappa", "reconstruction_bound",
                               "fisher_psnr_ceiling", "prior_psnr", "rouge1", "rouge2",
                               "rougeL", "exact_sentences", "token_precision",
                               "token_recall")},
                "truncated": "; ".join(r.attack.truncated) if r.attack else "",
                "perplexity": r.utility.perplexity if r.utility else None,
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
