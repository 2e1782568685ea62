"""Training-set reconstruction from a released digits classifier (Haim et al. 2022, Sec. 5).

The victim trains ``kkt-mlp`` on n balanced odd/even 8×8 digits (images mapped to [−1, 1]) by
full-batch gradient descent and releases it; the attacker runs the KKT attack (a random search
of ``--runs`` runs), post-processes the candidates (min–max scaling, λ filter, NCC merging) and
the victim scores them: every training image is matched to its best candidate by SSIM
(:func:`fedleak.harness.kkt_scoring.match_to_training`) and counts as recovered at SSIM ≥ 0.4.

Two controls say how much of that count is leakage. SSIM on 8×8 images (7×7 window, 4
positions) is forgiving, so the same candidates are also matched against n *held-out* digits
from the test split that the model never saw, and the count is repeated for a DP-SGD release
(Opacus, same epochs), where it should collapse to the held-out level.

Outputs (``--out``): ``kkt_digits_ssim_vs_output.png`` (Fig. 4: best SSIM of every training
sample against its output Φ(x_i)·y_i) and ``kkt_digits_best.png`` (best reconstructions above
their training images), for the clean and the DP release.

    .venv/bin/python bench/kkt_digits.py                       # defaults, ~3-10 min on 2 cores
    .venv/bin/python bench/kkt_digits.py --n 100 --attack '{"runs": 2}'
    .venv/bin/python bench/kkt_digits.py --depth 2             # the paper's d-1000-1000-1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from fedleak.attacks import create_attack
from fedleak.attacks.kkt_postprocess import postprocess_candidates
from fedleak.harness.binary_tasks import balanced_subset
from fedleak.harness.datasets import load_dataset
from fedleak.harness.kkt_scoring import RECOVERED_SSIM, TrainingMatch, match_to_training
from fedleak.harness.release_training import (
    ReleaseTrainingConfig,
    build_release_model,
    release,
    to_model_input,
    train_release,
)

SHAPE = (1, 8, 8)
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
    parser.add_argument("--merge-ncc", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    return parser.parse_args()


def digits_split(split: str, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n balanced odd/even digits of ``split`` on [0, 1] and their y ∈ {±1}."""
    data = load_dataset("digits", split)
    indices, y = balanced_subset(data.labels, "digits", n, seed=seed)
    return data.images[indices], y


def attack_release(
    model: torch.nn.Module, n: int, options: dict[str, Any], args: argparse.Namespace
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run the attack and post-process; candidates on [0, 1] and a summary."""
    released = release(model, SHAPE, n)
    start = time.perf_counter()
    result = create_attack("kkt", options).reconstruct(released, device=args.device,
                                                       seed=args.seed)
    seconds = time.perf_counter() - start
    processed = postprocess_candidates(
        result.images.cpu(), result.extras["lambdas"].cpu(), result.labels.cpu(),
        merge_ncc=args.merge_ncc,
    )
    summary = {
        "attack_s": round(seconds, 1),
        "candidates": len(result.images),
        "after_postprocess": len(processed),
        "run_objectives": [round(v, 4) for v in result.extras["run_objectives"]],
        "run_diverged": result.extras["run_diverged"],
    }
    return processed.images, summary


def counts(match: TrainingMatch) -> dict[str, Any]:
    return {
        "recovered@0.4": match.recovered(RECOVERED_SSIM),
        "recovered@0.6": match.recovered(0.6),
        "mean_ssim": round(float(match.ssim.mean()), 3),
    }


def plot(name: str, outputs: torch.Tensor, match: TrainingMatch, held: TrainingMatch,
         train01: torch.Tensor, candidates01: torch.Tensor, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(outputs, match.ssim, s=12, label="training samples")
    ax.axhline(float(held.ssim.mean()), color="0.5", ls="--", label="held-out mean")
    ax.axhline(RECOVERED_SSIM, color="r", ls=":", label="SSIM 0.4")
    ax.set_xlabel("y_i Φ(θ; x_i)")
    ax.set_ylabel("best SSIM of a candidate")
    ax.set_title(f"{name}: {match.recovered()}/{len(match.ssim)} at SSIM ≥ 0.4")
    ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / f"kkt_digits_{name}_ssim_vs_output.png", dpi=120)
    order = torch.argsort(match.ssim, descending=True)[:16]
    figure, axes = plt.subplots(2, len(order), figsize=(len(order) * 0.9, 2.2))
    for column, i in enumerate(order.tolist()):
        axes[0, column].imshow(candidates01[match.index[i], 0], cmap="gray", vmin=0, vmax=1)
        axes[1, column].imshow(train01[i, 0], cmap="gray", vmin=0, vmax=1)
        axes[0, column].set_title(f"{float(match.ssim[i]):.2f}", fontsize=6)
        for row in (0, 1):
            axes[row, column].axis("off")
    figure.suptitle(f"{name}: best reconstructions (top) and training images (bottom)",
                    fontsize=8)
    figure.savefig(out / f"kkt_digits_{name}_best.png", dpi=120)
    plt.close("all")


def experiment(name: str, config: ReleaseTrainingConfig, args: argparse.Namespace,
               train01: torch.Tensor, y: torch.Tensor, held01: torch.Tensor) -> None:
    start = time.perf_counter()
    model = build_release_model(SHAPE, width=args.width, depth=args.depth,
                                init_std=args.init_std, seed=args.seed)
    trained = train_release(model, to_model_input(train01), y, config, seed=args.seed)
    train_s = time.perf_counter() - start
    options = {**ATTACK_DEFAULTS, **args.attack}
    candidates01, summary = attack_release(model, len(train01), options, args)
    match, held = match_to_training(candidates01, train01), match_to_training(candidates01, held01)
    with torch.no_grad():
        outputs = model(to_model_input(train01)).reshape(-1) * y
    plot(name, outputs, match, held, train01, candidates01, args.out)
    report = {
        "release": name, "n": len(train01), "epochs": trained.epochs,
        "train_loss": f"{trained.loss:.2e}", "train_acc": trained.train_accuracy,
        "epsilon": None if trained.epsilon is None else round(trained.epsilon, 1),
        "train_s": round(train_s, 1), **summary,
        "training_set": counts(match), "held_out_control": counts(held),
    }
    print(json.dumps(report), flush=True)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    train01, y = digits_split("train", args.n, args.seed)
    held01, _ = digits_split("test", args.n, args.seed)
    print(json.dumps({"attack_options": {**ATTACK_DEFAULTS, **args.attack},
                      "threads": torch.get_num_threads()}), flush=True)
    start = time.perf_counter()
    clean = ReleaseTrainingConfig(lr=args.train_lr, max_epochs=args.max_epochs,
                                  target_loss=args.target_loss, report_every=1000)
    experiment("clean", clean, args, train01, y, held01)
    if args.dp_noise > 0:
        private = ReleaseTrainingConfig(
            lr=args.train_lr, max_epochs=args.max_epochs, target_loss=args.target_loss,
            report_every=1000, dp_noise_multiplier=args.dp_noise,
            dp_max_grad_norm=args.dp_clip, dp_delta=args.dp_delta,
        )
        experiment("dp", private, args, train01, y, held01)
    print(json.dumps({"wall_s": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
