"""Wall time of ``fedleak sweep --preset quick`` and the trends its report must show.

Runs the preset from scratch (a fresh run folder) exactly as a person would, through the CLI,
then prints, per defense, attack PSNR/SSIM and test accuracy from the no-defense reference to
the strongest setting, and whether both fall as the defense grows (strictly, point after
point). Exits non-zero when the sweep fails, takes 15 minutes or more, or a trend is missing.

    .venv/bin/python bench/sweep_quick.py                       # into a temporary folder
    .venv/bin/python bench/sweep_quick.py --out runs/sweep-quick --chart docs/img/quick-sweep.png

The machine's load average is printed: on a shared 2-core machine other jobs stretch the time.
"""

from __future__ import annotations

import argparse
import os
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
    if args.chart:
        args.chart.parent.mkdir(parents=True, exist_ok=True)
        # the blind attack's chart (the preset's second [[sweep.attack]]), as docs/ show it
        charts = [out / "report" / name for name in ("privacy-utility-2.png",
                                                     "privacy-utility.png")]
        shutil.copyfile(next(c for c in charts if c.exists()), args.chart)
        print(f"chart copied to {args.chart}")
    print(f"report: {out / 'report.html'}")
    return 0 if ok else 1


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
