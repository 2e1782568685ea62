"""The sweep report's HTML page (``RUN/report.html``): the charts, the worst-case and DP-bounds
sections, the results table and each point's reconstructions, linked with paths relative to the
run folder. :func:`~fedleak.harness.sweep.report.folder.write_report` writes it.
"""

from __future__ import annotations

import html
from datetime import datetime
from pathlib import Path

from fedleak.harness.metrics.floors import NOTHING_RECOVERED
from fedleak.harness.sweep.report.bounds_chart import BoundsRow
from fedleak.harness.sweep.results import PointResult, format_audit, format_epsilon
from fedleak.harness.sweep.runner import SPEC_NAME
from fedleak.harness.sweep.worst_case import ROLES, WorstCase

#: The folder under the run folder that holds the report's files; the page links into it.
REPORT_FOLDER = "report"

def _rel(path: Path | None, run_dir: Path) -> str:
    return "" if path is None else path.relative_to(run_dir).as_posix()


def _fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else format(value, pattern)


def report_page(name: str, run_dir: Path, results: list[PointResult],
          charts: list[tuple[str, Path, Path | None]], grids: dict[str, Path | None],
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
        if st is None:  # a text context (fedleak.harness.sweep.report.text_charts)
            parts += [f"<h2>Privacy–utility: {e(context)}</h2>",
                      f'<figure><img src="{_rel(pu, run_dir)}" alt="attack ROUGE against '
                      f'utility and ε, {e(context)}"><figcaption>Attack ROUGE-1 (token-set '
                      "recall for token-set) against the defended training's test perplexity "
                      "(or accuracy), and against the claimed ε; ★ is the no-defense "
                      "reference.</figcaption></figure>"]
            continue
        parts += [
            f"<h2>Privacy–utility: {e(context)}</h2>",
            f'<figure><img src="{_rel(pu, run_dir)}" alt="attack PSNR and SSIM against test '
            f'accuracy, {e(context)}"><figcaption>Attack PSNR and SSIM against test accuracy; '
            "★ is the no-defense reference.</figcaption></figure>",
            f'<figure><img src="{_rel(st, run_dir)}" alt="attack PSNR and test accuracy '
            f'against defense strength, {e(context)}"><figcaption>Attack success (PSNR) and '
            "utility (test accuracy) against each defense's strength.</figcaption></figure>",
        ]
    cut = [r for r in results if r.truncated and r.attack is not None]
    if cut:
        parts.append("<h2>Truncated (not measurements)</h2><p>A safety time limit cut these "
                     "points' attacks before they spent their work budget; they are left out "
                     "of every chart, figure and worst case above and below.</p><ul>"
                     + "".join(f"<li>{e(r.point_id)} {e(r.label)}: {e(reason)}</li>"
                               for r in cut for reason in r.attack.truncated)  # type: ignore[union-attr]
                     + "</ul>")
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
                     f"{_fmt(r.psnr, '.2f')} dB{e(_floor_note(r))} · SSIM "
                     f"{_fmt(r.ssim, '.3f')} · test accuracy "
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


def _floor_note(r: PointResult) -> str:
    """The point's floor beside its PSNR, in words when nothing is above it."""
    a = r.measured_attack
    if a is None or a.floor_psnr is None:
        return ""
    words = f": {NOTHING_RECOVERED}" if a.above_floor == 0 else \
        f", {a.above_floor} of {a.images} image(s) above it"
    return f" (floor {a.floor_psnr:.2f} dB{words})"


def _table(results: list[PointResult]) -> str:
    e = html.escape
    rows = ['<table><tr><th class="l">point</th><th class="l">defense</th><th>PSNR dB</th>'
            '<th title="the best constant guess of each attacked image: grey, the mean of the '
            'victim&#39;s other private images, its own mean colour">floor dB</th>'
            "<th>SSIM</th><th>labels</th>"
            "<th>test accuracy</th><th>ε</th><th>ε_LB</th>"
            '<th class="l">status</th></tr>']
    for r in results:
        rows.append(
            f'<tr><td class="l"><a href="#p-{r.point_id}">{r.point_id}</a></td>'
            f'<td class="l">{e(r.label)}</td><td>{_fmt(r.psnr, ".2f")}</td>'
            f'<td>{_fmt(r.floor_psnr, ".2f")}</td><td>{_fmt(r.ssim, ".3f")}</td>'
            f'<td>{_fmt(r.label_accuracy, ".0%")}</td>'
            f'<td>{_fmt(r.accuracy, ".1%")}</td><td>{e(format_epsilon(r.epsilon))}</td>'
            f'<td title="{e(_audit_title(r))}">{e(format_audit(r))}</td>'
            f'<td class="l">{e(r.shown_status)}</td></tr>')
    rows.append("</table>")
    return "\n".join(rows)
