"""Honest-but-curious attacks on batches and secure-aggregation sums: spear, cocktail-party and
Inverting Gradients side by side (docs/honest_batches.md).

For each data set (an MLP with one hidden layer of 512 units, model seed ``--seed``), each batch
size b (one user's FedSGD gradient of the mean loss over b images) and each secure-aggregation
sum U×n (U users' gradients of n images each, summed — what the server unmasks; in process the
masks are left out, they cancel exactly), every attack reconstructs the batch and the round is
scored as the victim scores it: exact recoveries as the largest one-to-one matching at PSNR ≥
40 dB (padding left out), mean PSNR over the Hungarian assignment, images at ≥ 20 dB, and the
attack's wall time. Inverting Gradients runs at one budget (``--iterations``, one restart, tv
0.01); spear within ``--spear-samples`` sampled sets (``--spear-time-limit`` is only a safety
cap: a run it cuts is written with ``truncated``, not as a count); an attack that refuses a
setting (spear on a 64-image sum) is listed with its reason.

    OMP_NUM_THREADS=1 python bench/honest_batches.py                    # everything
    OMP_NUM_THREADS=1 python bench/honest_batches.py --datasets digits --batches 4,16 \\
        --sums none --attacks spear,cocktail-party                       # a subset

Images are the first b (or U·n) of the train split from ``--start`` (photos: the 20 bundled
photographs of its ``all`` split, so b ≤ 20). Results go to ``--out`` as JSON lines, one per
(setting, attack), as they finish.

**Selections nobody picked** (``--windows K --seeds 0,1``): instead of one ``--start``, K
windows of the setting's size spread evenly over the split by a rule fixed before any run —
window i starts at ``round(i · (N − size) / (K − 1))`` (faces, 160 training images, a 64-image
sum, K = 5: 0, 24, 48, 72, 96) — each at every seed; the summary prints, per (data, setting,
attack), the median and range of images at ≥ 20 dB and exact over all of them, and how many
runs reach half the images at ≥ 20 dB. A run whose (data, setting, start, seed, attack) is
already in ``--out`` is skipped, so a cut run resumes where it stopped:

    OMP_NUM_THREADS=1 python bench/honest_batches.py --datasets faces --batches none \
        --sums 4x16 --attacks cocktail-party --windows 5 --seeds 0,1 \
        --out docs/results/cocktail-party-faces-windows.jsonl
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import click
import torch

from fedleak.attacks import Observation, create_attack
from fedleak.harness.federated.observe import observe
from fedleak.harness.metrics.image_metrics import score_reconstruction
from fedleak.harness.zoo.datasets import load_dataset
from fedleak.harness.zoo.models import build_model

MODEL = "mlp:width=512,depth=1"
SPLITS = {"photos": "all"}


def setting_observation(dataset: str, users: int, per_user: int, start: int, seed: int
                        ) -> tuple[Observation, torch.Tensor, torch.Tensor] | str:
    """The server's view of one round: one user's gradient (``users`` 1) or the sum of
    ``users`` users' gradients of ``per_user`` images each; the truth beside it. A string says
    why the setting cannot be built."""
    data = load_dataset(dataset, SPLITS.get(dataset, "train"))
    count = users * per_user
    if start + count > data.images.shape[0]:
        return f"{dataset} has {data.images.shape[0]} images; this setting needs {count}"
    info = data.info
    images, labels = data.images[start:start + count], data.labels[start:start + count]
    torch.manual_seed(seed)
    model = build_model(MODEL, info.shape, info.num_classes)
    generator = torch.Generator().manual_seed(seed)
    if users == 1:
        return observe(model, images, labels, info, generator=generator), images, labels
    total = None
    for user in range(users):
        part = slice(user * per_user, (user + 1) * per_user)
        seen = observe(model, images[part], labels[part], info, generator=generator)
        total = seen.update if total is None else [a + b for a, b in zip(total, seen.update,
                                                                         strict=True)]
    whole = observe(model, images, labels, info, generator=generator)
    assert total is not None
    return (dataclasses.replace(whole, update=total,
                                metadata={**whole.metadata, "images_per_user": str(per_user)}),
            images, labels)


def run_attack(name: str, options: dict[str, Any], observation: Observation,
               images: torch.Tensor, labels: torch.Tensor, seed: int) -> dict[str, Any]:
    """Reconstruct, score as the victim does; refusals and errors are results too."""
    info_mean, info_std = observation.mean, observation.std
    started = time.perf_counter()
    try:
        result = create_attack(name, options).reconstruct(observation, seed=seed)
    except ValueError as err:
        return {"refused": str(err), "seconds": time.perf_counter() - started}
    seconds = time.perf_counter() - started
    if not result.has_images:
        return {"refused": "no images (features only)", "seconds": seconds}
    mean = torch.tensor(info_mean).view(1, -1, 1, 1)
    std = torch.tensor(info_std).view(1, -1, 1, 1)
    recovered = (result.images.detach().cpu() * std + mean).clamp(0, 1)
    score = score_reconstruction(recovered, images, result.labels.cpu(), labels,
                                 padding=result.padding)
    psnrs = [s.psnr for s in score.images]
    return {"exact": score.exact, "mean_psnr": score.mean_psnr,
            "at_20db": sum(p >= 20 for p in psnrs), "best_psnr": score.best_psnr,
            "label_accuracy": score.label_accuracy, "seconds": seconds,
            "warnings": result.warnings, "truncated": result.truncated,
            "extras": {k: v for k, v in result.extras.items()
                       if isinstance(v, int | float | str | bool)}}


def parse_sums(text: str) -> list[tuple[int, int]]:
    if text in ("", "none"):
        return []
    out = []
    for part in text.split(","):
        users, _, per = part.lower().partition("x")
        out.append((int(users), int(per)))
    return out


def window_starts(total: int, size: int, windows: int) -> list[int]:
    """The fixed rule: ``windows`` starts spread evenly over ``total`` images (module doc)."""
    if windows <= 1 or total <= size:
        return [0]
    return sorted({round(i * (total - size) / (windows - 1)) for i in range(windows)})


def done_keys(out: Path) -> set[tuple[str, int, int, int, int, str]]:
    """(data, users, per user, start, seed, attack) of every run already in ``out``."""
    if not out.exists():
        return set()
    keys = set()
    for line in out.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            keys.add((r["dataset"], r["users"], r["per_user"], r["start"], r["seed"],
                      r["attack"]))
    return keys


def summarise(out: Path) -> None:
    """Median and range over the selections and seeds in ``out`` (module docstring)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for line in out.read_text().splitlines():
        r = json.loads(line) if line.strip() else None
        if r is None or "refused" in r:
            continue
        label = f"b={r['per_user']}" if r["users"] == 1 else f"sum {r['users']}x{r['per_user']}"
        groups.setdefault((r["dataset"], label, r["attack"]), []).append(r)
    click.echo("\nover selections and seeds: median [min, max]")
    for (dataset, label, name), rows in groups.items():
        n = rows[0]["images"]
        at20 = [r["at_20db"] for r in rows]
        exact = [r["exact"] for r in rows]
        half = sum(a >= n / 2 for a in at20)
        cut = sum(bool(r.get("truncated")) for r in rows)
        click.echo(f"{dataset:<7} {label:<10} {name:<20} {len(rows)} runs: >=20 dB "
                   f"{statistics.median(at20):g} [{min(at20)}, {max(at20)}] of {n}, exact "
                   f"{statistics.median(exact):g} [{min(exact)}, {max(exact)}]; "
                   f"{half} of {len(rows)} at >= half" + (f"; {cut} truncated" if cut else ""))


@click.command()
@click.option("--datasets", default="digits,photos", show_default=True)
@click.option("--batches", default="4,8,16,32,64,128", show_default=True,
              help="one user's batch sizes b ('none': no single batches)")
@click.option("--sums", default="4x16,8x16", show_default=True,
              help="secure-aggregation sums USERSxN ('none': no sums)")
@click.option("--attacks", default="spear,cocktail-party,inverting-gradients",
              show_default=True)
@click.option("--iterations", default=300, show_default=True,
              help="Inverting Gradients' budget (objective evaluations)")
@click.option("--spear-samples", default=4_000_000, show_default=True)
@click.option("--spear-time-limit", default=3600.0, show_default=True,
              help="safety cap in seconds (a cut run is marked truncated)")
@click.option("--seed", default=0, show_default=True, help="model and attack seed")
@click.option("--start", default=0, show_default=True, help="first image of the selection")
@click.option("--windows", default=0, show_default=True,
              help="K > 0: K evenly spaced selections instead of --start (module docstring)")
@click.option("--seeds", default="", help="seeds to run at each selection (default: --seed)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench_out/honest_batches.jsonl"), show_default=True)
def main(datasets: str, batches: str, sums: str, attacks: str, iterations: int,
         spear_samples: int, spear_time_limit: float, seed: int, start: int, windows: int,
         seeds: str, out: Path) -> None:
    torch.set_num_threads(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, dict[str, Any]] = {
        "spear": {"samples": spear_samples, "time_limit": spear_time_limit},
        "cocktail-party": {},
        "inverting-gradients": {"iterations": iterations, "restarts": 1, "tv": 0.01},
    }
    names = [a for a in attacks.split(",") if a]
    unknown = sorted(set(names) - set(options))
    if unknown:
        raise click.BadParameter(f"unknown attacks {unknown}; choose from {sorted(options)}")
    settings = [(1, int(b)) for b in batches.split(",") if b not in ("", "none")] \
        if batches != "none" else []
    settings += parse_sums(sums)
    click.echo(f"{'data':<7} {'setting @start seed':<18} {'attack':<20} {'exact':>9} "
               f"{'mean dB':>8} {'>=20 dB':>8} {'labels':>7} {'time s':>8}")
    seed_list = [int(v) for v in seeds.split(",") if v] or [seed]
    done = done_keys(out)
    for dataset in [d for d in datasets.split(",") if d]:
        total = load_dataset(dataset, SPLITS.get(dataset, "train")).images.shape[0]
        for users, per in settings:
            label = f"b={per}" if users == 1 else f"sum {users}x{per}"
            starts = window_starts(total, users * per, windows) if windows else [start]
            for first in starts:
                for run_seed in seed_list:
                    run_setting(dataset, users, per, first, run_seed, names, options, out,
                                done, label)
    if windows or len(seed_list) > 1:
        summarise(out)


def run_setting(dataset: str, users: int, per: int, start: int, seed: int, names: list[str],
                options: dict[str, dict[str, Any]], out: Path,
                done: set[tuple[str, int, int, int, int, str]], label: str) -> None:
    """Every attack on one selection at one seed, each row appended to ``out`` (runs already
    there skipped)."""
    todo = [n for n in names if (dataset, users, per, start, seed, n) not in done]
    if not todo:
        click.echo(f"{dataset:<7} {label:<10} start {start} seed {seed}: already in {out}")
        return
    built = setting_observation(dataset, users, per, start, seed)
    if isinstance(built, str):
        click.echo(f"{dataset:<7} {label:<10} skipped: {built}")
        return
    observation, images, labels = built
    for name in todo:
        got = run_attack(name, options[name], observation, images, labels, seed)
        row = {"dataset": dataset, "model": MODEL, "users": users, "per_user": per,
               "images": users * per, "start": start, "seed": seed, "attack": name,
               "options": options[name], **got}
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        where = f"{label} @{start} s{seed}"
        if "refused" in got:
            click.echo(f"{dataset:<7} {where:<18} {name:<20} refused: {got['refused']}")
            continue
        accuracy = got["label_accuracy"]
        click.echo(f"{dataset:<7} {where:<18} {name:<20} "
                   f"{got['exact']:>4}/{users * per:<4} {got['mean_psnr']:>8.2f} "
                   f"{got['at_20db']:>8} {accuracy:>7.0%} {got['seconds']:>8.1f}"
                   + ("  TRUNCATED" if got.get("truncated") else ""))

if __name__ == "__main__":
    main()
