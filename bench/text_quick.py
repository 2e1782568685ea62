"""Wall time of ``fedleak sweep --preset text-quick`` and what its report must show.

Runs the preset from scratch through the CLI, as a person would, then prints per point the
attacks' ROUGE-1/2 (token-set recall for token-set), the test perplexity of the defended
training, the claimed ε and the audited ε_LB, and checks the trends the preset exists to show:
undefended, DAGER recovers every sentence (ROUGE-1 = ROUGE-2 = 1) and token-set the whole
token set; the strongest DP-SGD point leaves less of both and a higher perplexity. Exits
non-zero when the sweep fails, takes 10 minutes or more, or a trend is missing.

    .venv/bin/python bench/text_quick.py [--out runs/sweep-text-quick] \
        [--chart docs/img/text-quick.png]

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

from fedleak.harness.sweep.results import PointResult, format_epsilon, load_results

LIMIT_S = 10 * 60


def leakage(r: PointResult) -> float | None:
    a = r.attack
    if a is None:
        return None
    return a.rouge1 if a.rouge1 is not None else a.token_recall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--chart", type=Path, default=None,
                        help="copy the text privacy-utility chart here")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="fedleak-text-quick-")) / "run"
    if out.exists():
        shutil.rmtree(out)
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} before the run")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fedleak", "sweep", "--preset", "text-quick",
                           "--out", str(out), "--quiet"])
    wall = time.perf_counter() - started
    print(f"\nfedleak sweep --preset text-quick: {wall:.0f} s wall (limit {LIMIT_S} s), "
          f"load average {os.getloadavg()[0]:.2f} after")
    if done.returncode != 0:
        print("the sweep failed")
        return 1
    results = load_results(out)
    for r in results:
        u = r.utility
        perplexity = "–" if u is None or u.perplexity is None else f"{u.perplexity:.1f}"
        print(f"{r.point.attack:<10} {r.label:<30} leakage {leakage(r)}  perplexity "
              f"{perplexity}  ε {format_epsilon(r.epsilon)}  ε_LB {r.epsilon_lb}")
    ok = wall < LIMIT_S and trends_hold(results)
    if args.chart:
        args.chart.parent.mkdir(parents=True, exist_ok=True)
        for chart in sorted((out / "report").glob("text-privacy-utility*.png")):
            target = args.chart.with_name(f"{args.chart.stem}-{chart.stem.split('-')[-1]}"
                                          f"{args.chart.suffix}") \
                if chart.stem[-1].isdigit() else args.chart
            shutil.copyfile(chart, target)
            print(f"chart copied to {target}")
    print(f"report: {out / 'report.html'}")
    return 0 if ok else 1


def trends_hold(results: list[PointResult]) -> bool:
    ok = True
    for attack in sorted({r.point.attack for r in results}):
        mine = [r for r in results if r.point.attack == attack]
        reference = next((r for r in mine if r.reference), None)
        dp = sorted((r for r in mine if r.group == "dpsgd"),
                    key=lambda r: r.point.strength or 0.0)
        if reference is None or not dp or leakage(reference) is None:
            print(f"{attack}: no reference or DP-SGD points")
            return False
        if leakage(reference) != 1.0:
            print(f"{attack}: undefended leakage {leakage(reference)}, expected 1.0")
            ok = False
        strongest = leakage(dp[-1])
        if strongest is None or strongest >= 1.0:
            print(f"{attack}: the strongest DP-SGD point still leaks {strongest}")
            ok = False
        ref_u, dp_u = reference.utility, dp[-1].utility
        if ref_u and dp_u and ref_u.perplexity and dp_u.perplexity and \
                dp_u.perplexity <= ref_u.perplexity:
            print(f"{attack}: DP-SGD did not cost perplexity ({dp_u.perplexity:.1f} vs "
                  f"{ref_u.perplexity:.1f})")
            ok = False
    return ok


if __name__ == "__main__":
    sys.exit(main())
