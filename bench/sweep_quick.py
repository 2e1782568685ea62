"""Wall time of ``fedleak sweep --preset quick`` and the trends its report must show.

Runs the preset from scratch (a fresh run folder) exactly as a person would, through the CLI,
then prints, per defense, attack PSNR/SSIM and test accuracy from the no-defense reference to
the strongest setting, and whether both fall as the defense grows (strictly, point after
point). Exits non-zero when the sweep fails, takes 15 minutes or more, or a trend is missing.

    .venv/bin/python bench/sweep_quick.py                       # into a temporary folder
    .venv/bin/python bench/sweep_quick.py --out runs/sweep-quick --chart docs/img/quick-sweep.png \
        --bounds-chart docs/img/quick-bounds.png

The machine's load average is printed: on a shared 2-core machine other jobs stretch the time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedleak.harness.sweep.results import format_epsilon, load_results
from fedleak.harness.sweep.worst_case import worst_cases

LIMIT_S = 15 * 60
DEFENSES = ("dpsgd", "prune", "noise")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: a temp one)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--chart", type=Path, default=None,
                        help="copy the privacy-utility chart here (e.g. docs/img/quick-sweep.png)")
    parser.add_argument("--bounds-chart", type=Path, default=None,
                        help="copy the DP points' bounds chart here (docs/img/quick-bounds.png)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="fedleak-quick-")) / "run"
    if out.exists():
        shutil.rmtree(out)
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} before the run")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedleak", "sweep", "--preset", "quick",
                           "--out", str(out), "--jobs", str(args.jobs), "--quiet"])
    wall = time.perf_counter() - started
    print(f"\nfedleak sweep --preset quick --jobs {args.jobs}: {wall:.0f} s wall "
          f"(limit {LIMIT_S} s), load average {os.getloadavg()[0]:.2f} after")
    if done.returncode != 0:
        print("the sweep failed")
        return 1
    ok = wall < LIMIT_S and trends_hold(out)
    dp_points(out)
    if args.chart:
        args.chart.parent.mkdir(parents=True, exist_ok=True)
        # the blind attack's FedSGD chart (the preset's second [[sweep.attack]]), as docs/
        # show it; the DP-SGD points where deployments sit are in report/bounds.png
        shutil.copyfile(blind_chart(out), args.chart)
        print(f"chart copied to {args.chart}")
    bounds = out / "report" / "bounds.png"
    if args.bounds_chart and bounds.exists():
        args.bounds_chart.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bounds, args.bounds_chart)
        print(f"bounds chart copied to {args.bounds_chart}")
    print(f"report: {out / 'report.html'}")
    return 0 if ok else 1


def blind_chart(out: Path) -> Path:
    """The privacy-utility chart of the blind attack (objective=cosine) on the FedSGD points,
    found by the context the report names in its alt text."""
    page = (out / "report.html").read_text()
    for match in re.finditer(r'<img src="(report/privacy-utility[^"]*)" alt="([^"]*)"', page):
        if "objective=cosine" in match.group(2) and "fedsgd" in match.group(2):
            return out / match.group(1)
    return out / "report" / "privacy-utility.png"


def dp_points(out: Path) -> None:
    """The DP-SGD settings with their ε (the deployment's; the accountant's for one audited
    trial and the audit's ε lower bound for it), utility, success at 20 dB and the DP bound."""
    from fedleak.harness.sweep.report.bounds_chart import bounds_rows

    rows = bounds_rows(load_results(out))
    print(f"\nDP points: {'setting':>28}  {'ε':>8}  {'ε trial':>7}  {'ε_LB':>6}  "
          f"{'test acc':>8}  {'success':>7}  {'DP bound':>8}  {'κ':>6}  {'PSNR':>6}  "
          "Fisher ceiling")
    for r in rows:
        trial = "–" if r.epsilon_trial is None else f"{r.epsilon_trial:.3g}"
        lb = "–" if r.epsilon_lb is None else f"{r.epsilon_lb:.3g}"
        print(f"{'':11}{r.label[:28]:>28}  {format_epsilon(r.epsilon):>8}  {trial:>7}  "
              f"{lb:>6}  {r.accuracy or 0:>8.1%}  {r.successes}/{r.images:<5}  "
              f"{r.bound or 0:>8.3f}  {r.kappa or 0:>6.3f}  {r.psnr or 0:>6.2f}  "
              f"{r.fisher_ceiling or 0:.2f} dB")
    deployed = [r for r in rows if r.epsilon is not None and r.epsilon <= 10]
    print(f"{len(deployed)} DP point(s) at ε <= 10 with utility")


def trends_hold(out: Path) -> bool:
    """Print each defense's curve of worst-case leakage (the strongest attack of the
    portfolio per setting, named) and utility; True when PSNR, SSIM and accuracy all fall."""
    results = load_results(out)
    worst = {row.label: row.strongest["honest"] for row in worst_cases(results)
             if "honest" in row.strongest}
    reference = next(r for r in results if r.reference)
    ok = True
    for name in DEFENSES:
        members = {r.label: r for r in results if r.group == name}
        curve = [reference] + sorted(members.values(), key=lambda r: r.point.strength or 0.0)
        print(f"\n{name}: {'setting':>30}  {'PSNR dB':>7}  {'SSIM':>6}  {'test acc':>8}  ε  "
              "strongest attack")
        rows = []
        for r in curve:
            best = worst[r.label]
            rows.append((best.psnr, best.ssim or 0.0, r.accuracy or 0.0))
            print(f"{'':7}{r.label:>30}  {best.psnr:>7.2f}  {best.ssim or 0.0:>6.3f}  "
                  f"{r.accuracy or 0.0:>8.1%}  {format_epsilon(r.epsilon)}  {best.attack}")
        for index, metric in enumerate(("psnr", "ssim", "accuracy")):
            values = [row[index] for row in rows]
            falling = all(a > b for a, b in zip(values, values[1:], strict=False))
            ok &= falling
            print(f"{'':7}{metric} falls as {name} grows: {'yes' if falling else 'NO'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
