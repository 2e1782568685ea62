"""Training-set reconstruction from a released binary image classifier (Haim et al. 2022, Sec. 5).

The victim trains ``kkt-mlp`` on n balanced images of a binary task (``--dataset digits``: 8×8
odd/even digits, the default; ``--dataset faces``: 25×25 LFW face/non-face; images mapped to
[−1, 1], the input shape is the data set's) by full-batch gradient descent and releases it; the
attacker runs the KKT attack (a random search of ``runs`` runs, candidates pooled), scales every
candidate to [0, 1], and the candidates are scored exactly as the victim's ``Score`` does
(App. B.3, :func:`fedleak.harness.kkt_scoring.vote_reconstructions`): per training image, the
candidates of NCC ≥ 0.9 × the best NCC are averaged and the mean's SSIM is its score; recovered
at SSIM ≥ 0.4.

Two controls say how much of that count is leakage. SSIM on small images is forgiving (on 8×8
digits the 11×11 window shrinks to 7×7, 2×2 positions: a blurry digit-shaped blob scores 0.4).
So the same candidates are also voted against n *held-out* images that the model never saw (a
count there is not leakage), and everything is repeated for a DP-SGD release (Opacus, same
epochs), where the training count should fall to the held-out level. The held-out set never
overlaps the training set:

- digits: the training set is drawn from the train split, the control (n balanced odd/even)
  from the test split, both with ``balanced_subset(..., seed)``.
- faces: only 200 images (100 faces, 100 non-faces), so both come from split ``all``: the
  training set is ``balanced_subset(all, n, seed)`` (⌈n/2⌉ faces, ⌊n/2⌋ non-faces) and the
  control is ``balanced_subset`` of the remaining 200 − n images with seed + 1, again ⌈n/2⌉
  faces and ⌊n/2⌋ non-faces (n ≤ 100).

Outputs (``--out``), for the clean and the DP release: ``kkt_DATASET_NAME_ssim_vs_margin.png``
(Fig. 4: SSIM of every training sample against its margin y_i Φ(θ; x_i), held-out mean as a
line) and ``kkt_DATASET_NAME_best.png`` (training images above their voted reconstructions);
a ``kkt_DATASET_NAME_held.png`` shows the held-out images above theirs. Every count stands
beside its trivial floor, as the victim's ``Score`` gives it (``floor``: grey, the pool's mean
image without the sample, the sample's own mean colour; ``constant_guess@0.4`` how many
samples the best of those guesses already scores at SSIM ≥ 0.4; ``recovered@0.4_above_floor``
the samples at SSIM ≥ 0.4 *and* 3 dB of PSNR above their floor).

    .venv/bin/python bench/kkt_digits.py                       # defaults, ~3-10 min on 2 cores
    .venv/bin/python bench/kkt_digits.py --n 100 --attack '{"runs": 2}'
    .venv/bin/python bench/kkt_digits.py --depth 2             # the paper's d-1000-1000-1
    .venv/bin/python bench/kkt_digits.py --dataset faces --attack '{"iterations": 3000}'
    .venv/bin/python bench/kkt_digits.py --n 50 --floors-only  # the floors alone, seconds

``--floors-only`` trains and attacks nothing: it prints the floors of the training set and the
held-out control (they depend on the images alone), e.g. how many samples a constant guess
already scores at SSIM ≥ 0.4.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from fedleak.attacks import create_attack
from fedleak.attacks.kkt.postprocess import scale_to_unit
from fedleak.harness.attacker.pictures import save_grid
from fedleak.harness.attacker.release.kkt_plots import plot_ssim_vs_margin
from fedleak.harness.federated.release_training import (
    ReleaseTrainingConfig,
    build_release_model,
    release,
    to_model_input,
    train_release,
)
from fedleak.harness.metrics.floors import MeanPool, floor_words
from fedleak.harness.metrics.image_metrics import floor_scores, ssim_per_image
from fedleak.harness.metrics.kkt_metrics import (
    RECOVERED_SSIM,
    VotedMatch,
    release_floors,
    vote_reconstructions,
)
from fedleak.harness.zoo.binary_tasks import TASKS, balanced_subset
from fedleak.harness.zoo.datasets import load_dataset

DATASETS = ("digits", "faces")
#: Narrowed App. B.2 ranges that move the candidates within a short CPU budget (see --help).
ATTACK_DEFAULTS: dict[str, Any] = {
    "optimizer": "adam",
    "iterations": 6000,
    "runs": 3,
    "lambda_init": 1.0,
    "lr_low": 1e-3,
    "lr_high": 1e-2,
    "sigma_x_low": 1e-4,
    "sigma_x_high": 1e-2,
    "alpha_low": 50.0,
    "alpha_high": 300.0,
    "lambda_min_low": 1e-4,
    "lambda_min_high": 1e-2,
    "log_every": 250,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits",
                        help="binary task: digits odd/even (8x8) or faces face/non-face (25x25)")
    parser.add_argument("--n", type=int, default=50, help="training-set size (balanced)")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=1,
                        help="hidden layers (paper: 2; 1 is 5x cheaper and closer to KKT here)")
    parser.add_argument("--init-std", type=float, default=1e-4)
    parser.add_argument("--train-lr", type=float, default=0.5)
    parser.add_argument("--max-epochs", type=int, default=20000)
    parser.add_argument("--target-loss", type=float, default=1e-5)
    parser.add_argument("--dp-noise", type=float, default=1.0, help="0 skips the DP release")
    parser.add_argument("--dp-clip", type=float, default=1.0)
    parser.add_argument("--dp-delta", type=float, default=1e-5)
    parser.add_argument("--attack", type=json.loads, default={},
                        help="JSON of kkt options overriding ATTACK_DEFAULTS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--floors-only", action="store_true",
                        help="print the training and held-out sets' floors; no training, no "
                             "attack")
    return parser.parse_args()


def training_and_held_out(
    dataset: str, n: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """n balanced training images on [0, 1], their y ∈ {±1}, n balanced held-out images, and
    every image not in the training set that the held-out draw came from (a larger control).

    digits: training from the train split, held-out from the test split (all of it the larger
    control). faces: both from the 200 images of split ``all``, the held-out ones drawn
    (seed + 1) from the 200 − n images not chosen for training, so the sets are disjoint and
    equally balanced; the larger control is those 200 − n images.
    """
    if dataset == "digits":
        train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
        indices, y = balanced_subset(train.labels, "digits", n, seed=seed)
        held, _ = balanced_subset(test.labels, "digits", n, seed=seed)
        return train.images[indices], y, test.images[held], test.images
    data = load_dataset(dataset, "all")
    indices, y = balanced_subset(data.labels, dataset, n, seed=seed)
    rest = torch.ones(len(data.labels), dtype=torch.bool)
    rest[indices] = False
    remaining = torch.nonzero(rest).flatten()
    held, _ = balanced_subset(data.labels[remaining], dataset, n, seed=seed + 1)
    return data.images[indices], y, data.images[remaining[held]], data.images[remaining]


def attack_release(
    model: torch.nn.Module, n: int, options: dict[str, Any], args: argparse.Namespace
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run the attack; every finite candidate scaled to [0, 1], and a summary."""
    released = release(model, tuple(args.shape), n)
    start = time.perf_counter()
    result = create_attack("kkt", options).reconstruct(released, device=args.device,
                                                       seed=args.seed)
    seconds = time.perf_counter() - start
    candidates01 = scale_to_unit(result.images.detach().cpu().float())
    candidates01 = candidates01[torch.isfinite(candidates01.flatten(1)).all(1)]
    summary = {
        "attack_s": round(seconds, 1),
        "candidates": len(result.images),
        "finite": len(candidates01),
        "run_objectives": [round(v, 4) for v in result.extras["run_objectives"]],
        "run_stationarity_relative": [
            round(v / sum(float(p.detach().square().sum()) for p in model.parameters()), 4)
            for v in result.extras["run_stationarity"]],
        "run_diverged": result.extras["run_diverged"],
    }
    return candidates01, summary


def residual_at_truth(model: torch.nn.Module, inputs: torch.Tensor, y: torch.Tensor) -> float:
    """How far the release is from a KKT point *of its own training set*:

    min_{λ ≥ 0} ‖θ − Σ_i λ_i y_i ∇_θ Φ(θ; x_i)‖² / ‖θ‖² (eq. (2), true ReLU derivative),
    by projected gradient descent on the n×n normal equations. Near 0: the training set
    satisfies stationarity and is what the attack should find; large: θ has not converged in
    direction and the attack's objective does not single the training set out.
    """
    params = [p for p in model.parameters()]
    theta = torch.cat([p.detach().flatten() for p in params]).double()
    rows = []
    for x, label in zip(inputs, y, strict=True):
        grads = torch.autograd.grad(model(x[None]).sum() * label, params)
        rows.append(torch.cat([g.flatten() for g in grads]).double())
    gradients = torch.stack(rows)
    gram, target = gradients @ gradients.T, gradients @ theta
    lambdas = torch.linalg.lstsq(gram, target).solution.clamp_min(0)
    step = 1 / torch.linalg.eigvalsh(gram).max()
    for _ in range(20_000):
        lambdas = (lambdas - step * (gram @ lambdas - target)).clamp_min(0)
    residual = (theta - gradients.T @ lambdas).square().sum() / theta.square().sum()
    return float(residual)


def own_image_first(match: VotedMatch, images01: torch.Tensor) -> float:
    """Specificity: the fraction of samples i whose reconstruction r_i is more similar to x_i
    than to every other image of the same set, SSIM(r_i, x_i) > max_{j≠i} SSIM(r_i, x_j).

    A generic average image chosen by NCC scores well against many images of its class, so
    this fraction stays low (near that of the held-out set) unless r_i carries x_i's likeness.
    """
    n = len(images01)
    table = torch.stack([ssim_per_image(r.expand_as(images01), images01)
                         for r in match.reconstructions])  # [n, n]: row i = SSIM(r_i, x_j)
    own = table.diagonal().clone()
    table.fill_diagonal_(float("-inf"))
    return round(float((own > table.max(1).values).sum()) / n, 3)


def counts(match: VotedMatch, images01: torch.Tensor, pool: torch.Tensor) -> dict[str, Any]:
    """Recovered counts, SSIM summary, distinct nearest candidates (of n), specificity, and
    the floors the victim's ``Score`` stands them beside (``pool``: the images the data-set mean
    guess is taken over, each image left out of its own)."""
    floors = release_floors(match, images01, MeanPool.of(pool.float()))
    f = floors.summary
    return {
        "recovered@0.4": match.recovered(RECOVERED_SSIM),
        "recovered@0.6": match.recovered(0.6),
        "mean_ssim": round(float(match.ssim.mean()), 3),
        "max_ssim": round(float(match.ssim.max()), 3),
        "distinct_nearest": int(match.nearest.unique().numel()),
        "own_image_first": own_image_first(match, images01),
        "mean_psnr": round(float(match.psnr.mean()), 2),
        "floor": {"mean_psnr": round(f.mean_psnr, 2), "mean_ssim": round(f.mean_ssim, 3),
                  "guesses": {g: [round(p, 2), round(q, 3)] for g, (p, q) in f.guesses.items()},
                  "constant_guess@0.4": int((floors.scores.best_ssim >= RECOVERED_SSIM).sum()),
                  "mean_margin_db": round(f.mean_margin, 2), "above": f.above,
                  "recovered@0.4_above_floor": floors.recovered_above,
                  "words": floor_words(f)},
    }


def floors_alone(images01: torch.Tensor, pool: torch.Tensor) -> dict[str, Any]:
    """The floors of ``images01`` against ``pool`` with no reconstruction: each guess's mean
    PSNR and SSIM, the per-image floor's, and how many images a guess scores at SSIM ≥ 0.4."""
    floors = floor_scores(images01.float(), MeanPool.of(pool.float()))
    return {"images": len(images01),
            "mean_psnr": round(float(floors.best_psnr.mean()), 2),
            "mean_ssim": round(float(floors.best_ssim.mean()), 3),
            "guesses": {g: [round(float(floors.psnr[g].mean()), 2),
                            round(float(floors.ssim[g].mean()), 3)] for g in floors.made},
            "constant_guess@0.4": int((floors.best_ssim >= RECOVERED_SSIM).sum()),
            "constant_guess@0.6": int((floors.best_ssim >= 0.6).sum())}


def pools(dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The images the data-set mean guess is taken over: for the training set the pool it was
    drawn from (digits: the train split, as the victim holds it; faces: all 200), for the
    held-out control the one it came from (digits: the test split)."""
    if dataset == "digits":
        return load_dataset("digits", "train").images, load_dataset("digits", "test").images
    images = load_dataset(dataset, "all").images
    return images, images


def plot(name: str, margins: torch.Tensor, match: VotedMatch, held: VotedMatch,
         train01: torch.Tensor, held01: torch.Tensor, args: argparse.Namespace,
         epsilon: float | None) -> None:
    prefix = args.out / f"kkt_{args.dataset}_{name}"
    task = TASKS[args.dataset]
    title = (f"{args.dataset} ({task}), {name}" + (f" (ε={epsilon:.3g})" if epsilon else "")
             + f": {match.recovered()}/{len(match.ssim)} at SSIM ≥ 0.4, held-out "
             f"{held.recovered()}")
    plot_ssim_vs_margin(Path(f"{prefix}_ssim_vs_margin.png"), margins, match.ssim,
                        control=float(held.ssim.mean()), title=title)
    for suffix, voted, originals, who in (("best", match, train01, "training"),
                                          ("held", held, held01, "held-out")):
        order = torch.argsort(voted.ssim, descending=True)[:20]
        save_grid(Path(f"{prefix}_{suffix}.png"), voted.reconstructions[order],
                  originals[order], [f"{float(voted.ssim[i]):.2f}" for i in order],
                  title=f"{name}: {who} images (top), KKT reconstructions (bottom), SSIM")


def experiment(name: str, config: ReleaseTrainingConfig, args: argparse.Namespace,
               train01: torch.Tensor, y: torch.Tensor, held01: torch.Tensor,
               rest01: torch.Tensor) -> None:
    start = time.perf_counter()
    model = build_release_model(tuple(args.shape), width=args.width, depth=args.depth,
                                init_std=args.init_std, seed=args.seed)
    trained = train_release(model, to_model_input(train01), y, config, seed=args.seed)
    train_s = time.perf_counter() - start
    options = {**ATTACK_DEFAULTS, **args.attack}
    candidates01, summary = attack_release(model, len(train01), options, args)
    match = vote_reconstructions(candidates01, train01)
    held = vote_reconstructions(candidates01, held01)
    rest = vote_reconstructions(candidates01, rest01)
    with torch.no_grad():
        margins = model(to_model_input(train01)).reshape(-1) * y
    plot(name, margins, match, held, train01, held01, args, trained.epsilon)
    on_margin = margins <= 1.5 * margins.min()
    report = {
        "dataset": args.dataset, "release": name, "n": len(train01), "epochs": trained.epochs,
        "train_loss": f"{trained.loss:.2e}", "train_acc": trained.train_accuracy,
        "epsilon": None if trained.epsilon is None else round(trained.epsilon, 1),
        "train_s": round(train_s, 1),
        "stationarity_at_truth": round(residual_at_truth(model, to_model_input(train01), y), 4),
        **summary,
        "training_set": counts(match, train01, args.pools[0]),
        "held_out_control": counts(held, held01, args.pools[1]),
        "all_held_out": {"images": len(rest01),
                         "recovered@0.4": rest.recovered(RECOVERED_SSIM),
                         "recovered@0.6": rest.recovered(0.6),
                         "mean_ssim": round(float(rest.ssim.mean()), 3)},
        "mean_ssim_on_margin": round(float(match.ssim[on_margin].mean()), 3),
        "mean_ssim_off_margin": round(float(match.ssim[~on_margin].mean()), 3)
        if bool((~on_margin).any()) else None,
    }
    print(json.dumps(report), flush=True)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    train01, y, held01, rest01 = training_and_held_out(args.dataset, args.n, args.seed)
    args.shape = tuple(train01.shape[1:])
    args.pools = pools(args.dataset)
    if args.floors_only:
        print(json.dumps({"dataset": args.dataset, "n": len(train01),
                          "training_set_floor": floors_alone(train01, args.pools[0]),
                          "held_out_floor": floors_alone(held01, args.pools[1])}))
        return
    print(json.dumps({"attack_options": {**ATTACK_DEFAULTS, **args.attack},
                      "threads": torch.get_num_threads()}), flush=True)
    start = time.perf_counter()
    clean = ReleaseTrainingConfig(lr=args.train_lr, max_epochs=args.max_epochs,
                                  target_loss=args.target_loss, report_every=1000)
    experiment("clean", clean, args, train01, y, held01, rest01)
    if args.dp_noise > 0:
        private = ReleaseTrainingConfig(
            lr=args.train_lr, max_epochs=args.max_epochs, target_loss=args.target_loss,
            report_every=1000, dp_noise_multiplier=args.dp_noise,
            dp_max_grad_norm=args.dp_clip, dp_delta=args.dp_delta,
        )
        experiment("dp", private, args, train01, y, held01, rest01)
    print(json.dumps({"wall_s": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
