"""Docs figures written from the result files they come from, and the check that they agree.

A figure block in a docs page names its renderer and a committed result file (under
``docs/results/``, as a run wrote it)::

    <!-- figures: windows results/cocktail-party-faces-windows.jsonl -->
    ...the table or sentence, exactly as the renderer writes it...
    <!-- /figures -->

``python bench/doc_figures.py`` checks every block of every page (exit status 1, naming the
block, when one differs from what its file renders: a figure edited by hand, or a result file
replaced without re-rendering); ``--write`` re-renders them all.
``tests/project/test_docs_figures.py`` runs the check. To refresh a figure: run the command the page
names, copy its result file over the committed one, ``--write``.

Renderers:

- ``windows``: a JSON-lines file of ``bench/honest_batches.py --windows`` → one row per
  selection and seed, and the median and range over them;
- ``targets``: a JSON-lines file of ``bench/honest_targets.py`` → one row per run across
  processes;
- ``quick-bounds``: ``report/bounds.csv`` of ``fedleak sweep --preset quick`` → the DP points'
  table of docs/bounds.md;
- ``dp-floor``: ``report/results.csv`` of the same run → the sentence on the deployment-like
  DP points of docs/sweeps.md;
- ``informed-game``: the ``summary`` of ``fedleak informed-adversary``'s ``metrics.json`` → the
  sentence of docs/bounds.md;
- ``bounds-bench``: ``bench/bounds.py --json``'s rows → the table of docs/bounds.md, rows at or
  below blind guessing marked.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"<!-- figures: (?P<renderer>[a-z-]+) (?P<file>\S+) -->\n(?P<body>.*?)"
                   r"<!-- /figures -->", re.S)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _number(value: str | None, spec: str, missing: str = "–") -> str:
    return missing if value in (None, "") else format(float(value), spec)


def windows(path: Path) -> str:
    """One row per (selection, seed) of a ``--windows`` run, then median [min, max]."""
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = [r for r in runs if "refused" not in r]
    runs.sort(key=lambda r: (r["dataset"], r["users"], r["per_user"], r["start"], r["seed"]))
    lines = ["| data | setting | images | seed | exact | at ≥ 20 dB | mean PSNR dB | "
             "certified | rounds | attack s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        extras = r.get("extras", {})
        setting = f"b = {r['per_user']}" if r["users"] == 1 else \
            f"sum {r['users']} × {r['per_user']}"
        lines.append(f"| {r['dataset']} | {setting} | {r['start']}–{r['start'] + r['images'] - 1}"
                     f" | {r['seed']} | {r['exact']} | {r['at_20db']} | {r['mean_psnr']:.2f} | "
                     f"{extras.get('certified', '–')} | {extras.get('rounds', '–')} | "
                     f"{r['seconds']:.0f}" + (" (truncated)" if r.get("truncated") else "")
                     + " |")
    if runs:
        n = runs[0]["images"]
        at20, exact = [r["at_20db"] for r in runs], [r["exact"] for r in runs]
        half = sum(a >= n / 2 for a in at20)
        lines += ["", f"Over the {len(runs)} runs: at ≥ 20 dB median {statistics.median(at20):g} "
                      f"[{min(at20)}, {max(at20)}] of {n}, exact median "
                      f"{statistics.median(exact):g} [{min(exact)}, {max(exact)}]; {half} of "
                      f"{len(runs)} runs at half the images or more."]
    return "\n".join(lines) + "\n"


def targets(path: Path) -> str:
    """``bench/honest_targets.py``'s rows (a victim process with real secure-aggregation
    masks and ``fedleak attack`` against it): one row per run."""
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = ["| attack | data | images | seed | exact | at ≥ 20 dB | mean PSNR dB | certified "
             "| rounds | attack command s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['attack']} | {r['dataset']} | {r['label'].split()[2]} | "
                         f"{r['seed']} | error: {r['error']} | | | | | |")
            continue
        extras = r.get("extras") or {}
        selection = r["label"].split()[2].replace("-", "–")
        lines.append(f"| {r['attack']} | {r['dataset']}, sum 4 × 16 | {selection} | {r['seed']} |"
                     f" {r['exact']} | {r['at_20db']} | {r['mean_psnr']:.2f} | "
                     f"{extras.get('certified', '–')} | {extras.get('rounds', '–')} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def quick_bounds(path: Path) -> str:
    """The DP points of the quick preset, one row each (docs/bounds.md)."""
    lines = ["| setting | attacked step | ε of the deployment | test accuracy | success ≥ 20 dB "
             "| DP bound β | PSNR dB | Fisher ceiling dB | prior's mean image dB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in _rows(path):
        q = "" if r["sample_rate"] in ("", "1.0") else f", q = {float(r['sample_rate']):.2g}"
        rounds = f" ({r['deployment_rounds']} rounds)" if r.get("deployment_rounds") else ""
        lines.append(
            f"| {r['label']} | σ = {float(r['noise_multiplier']):g}{q}, "
            f"{r['dp_steps'] or 1} step | {_number(r['epsilon'], '.3g')}{rounds} | "
            f"{_number(r['accuracy'], '.1%')} | {r['successes']}/{r['images']} | "
            f"{_number(r['bound'], '.3f')} | {_number(r['psnr'], '.2f')} | "
            f"{_number(r['fisher_ceiling'], '.1f')} | {_number(r.get('prior_psnr'), '.2f')} |")
    delta = {r["delta"] for r in _rows(path) if r["delta"]}
    lines += ["", "ε at δ = " + (", ".join(f"{float(d):g}" for d in sorted(delta)) or "–")
              + "; the DP bound covers the one attacked step, ε the whole deployment."]
    return "\n".join(lines) + "\n"


def dp_floor(path: Path) -> str:
    """The deployment-like DP points (Poisson-sampled dpsgd) of the quick preset: ε and test
    accuracy per σ, and the PSNR range of both attacks against the public prior's mean image
    (docs/sweeps.md)."""
    rows = [r for r in _rows(path) if "poisson=true" in r["defenses"] and r["mean_psnr"]]
    settings: dict[float, dict[str, str]] = {}
    for r in rows:
        settings.setdefault(float(r["strength"]), r)
    sigmas = sorted(settings)
    psnrs = [float(r["mean_psnr"]) for r in rows]
    bounds = [settings[s]["reconstruction_bound"] for s in sigmas]
    hits = sum(round(float(r["success_rate"] or 0) * int(r["rounds"]) *
                     int(r["images_per_round"])) for r in rows)
    prior = {r["prior_psnr"] for r in rows if r.get("prior_psnr")}
    delta = {r["delta"] for r in rows if r["delta"]}
    return (f"σ = {' / '.join(f'{s:g}' for s in sigmas)} claim ε = "
            + " / ".join(_number(settings[s]["epsilon"], ".3g") for s in sigmas)
            + f" (δ = {', '.join(f'{float(d):g}' for d in sorted(delta)) or '–'}, the whole "
            "deployment) and keep "
            + " / ".join(_number(settings[s]["test_accuracy"], ".1%") for s in sigmas)
            + " test accuracy; on the one attacked step both attacks reach "
            f"{min(psnrs):.2f}–{max(psnrs):.2f} dB ({hits} images at 20 dB over the "
            f"{len(rows)} points) under DP bounds of "
            + " / ".join(_number(b, ".3f") for b in bounds)
            + _against_prior(max(psnrs), prior) + ".\n")


def _against_prior(best: float, prior: set[str]) -> str:
    """', below/above the X dB of the public prior's mean image' ('' without one)."""
    if len(prior) != 1:
        return ""
    value = float(prior.pop())
    where = "below" if best < value else "at or above"
    return (f", {where} the {value:.2f} dB of the public prior's mean image, a guess that "
            "reads nothing of the update")


def informed_game(path: Path) -> str:
    """The informed-adversary game's summary sentence (docs/bounds.md)."""
    s = json.loads(path.read_text())["summary"]
    return (f"{s['successes']}/{s['trials']} = {s['success_rate']:.3f} "
            f"[{s['ci_low']:.3f}, {s['ci_high']:.3f}] against a bound of {s['bound']:.3f} "
            f"(ratio {s['ratio']:.2f})\n")


def bounds_bench(path: Path) -> str:
    """``bench/bounds.py --json``'s rows: the table of docs/bounds.md, with the rows at or
    below blind guessing marked."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = ["| mode | N (κ = 1/N) | σ | q | T | DP bound β(κ) | success [95 % CI] | "
             "success / bound |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        se = r["bound_standard_error"]
        bound = f"{r['bound']:.3f}" + (f" ± {se:.3f}" if se else "")
        blind = " (≤ κ: blind guess)" if r["success_rate"] <= r["kappa"] else ""
        lines.append(f"| {'Poisson' if r['mode'] == 'poisson' else 'full batch'} | "
                     f"{r['candidates']} | {r['sigma']:g} | {r['sample_rate']:g} | {r['steps']} | "
                     f"{bound} | {r['success_rate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
                     f"{blind} | {r['ratio'] or 0:.2f} |")
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[Path], str]] = {
    "windows": windows, "targets": targets, "quick-bounds": quick_bounds, "dp-floor": dp_floor,
    "informed-game": informed_game, "bounds-bench": bounds_bench}


def blocks(page: Path) -> list[tuple[str, Path, str, re.Match[str]]]:
    """(renderer, result file, body, match) of every figure block of ``page``."""
    return [(m["renderer"], (page.parent / m["file"]).resolve(), m["body"], m)
            for m in BLOCK.finditer(page.read_text())]


def rendered(renderer: str, path: Path) -> str:
    if renderer not in RENDERERS:
        raise ValueError(f"unknown renderer {renderer!r}; choose one of {sorted(RENDERERS)}")
    if not path.exists():
        raise FileNotFoundError(f"result file {path} is not committed")
    return RENDERERS[renderer](path)


def check(root: Path = DOCS) -> list[str]:
    """Every block whose text differs from what its file renders, named."""
    problems = []
    for page in sorted(root.rglob("*.md")):
        for renderer, path, body, _ in blocks(page):
            try:
                if body != rendered(renderer, path):
                    problems.append(f"{page.relative_to(root)}: the {renderer} block differs "
                                    f"from {path.name} (run bench/doc_figures.py --write)")
            except (OSError, ValueError, KeyError) as err:
                problems.append(f"{page.relative_to(root)}: {renderer} {path.name}: {err}")
    return problems


def write(root: Path = DOCS) -> int:
    """Re-render every block; returns how many pages changed."""
    changed = 0
    for page in sorted(root.rglob("*.md")):
        text = page.read_text()

        def fresh(m: re.Match[str], page: Path = page) -> str:
            body = rendered(m["renderer"], (page.parent / m["file"]).resolve())
            return f"<!-- figures: {m['renderer']} {m['file']} -->\n{body}<!-- /figures -->"

        new = BLOCK.sub(fresh, text)
        if new != text:
            page.write_text(new)
            changed += 1
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="re-render every block")
    args = parser.parse_args()
    if args.write:
        print(f"{write()} page(s) re-rendered")
    problems = check()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
