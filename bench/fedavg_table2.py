"""FedAvg inversion on the bundled photos: Table 2 and the learning-rate ablation of Fig. 5.

Geiping et al. (2020), Sec. 6: invert the parameter delta of E local epochs over n images in
mini-batches of B at local learning rate τ (supplement eq. 2), with the registered ``fedavg``
attack. Every observation is built as the harness builds it (the victim's ``local_update``
without a graph, the attacker's ``UpdateSimulator`` replaying it); labels are recovered from
the delta, never given; reconstructions are matched one-to-one (Hungarian on MSE) to the truth
and scored on [0, 1] (mean of per-image PSNR, SSIM), as ``Score`` does.

Scaled down from the paper for a shared 2-core CPU, and said so in the output:
- model: lenet-zhu untrained (model seed 0) instead of the ConvNet (width 64) of the paper;
- data: the bundled 32×32 ``photos`` (20 crops of 10 photographs, label = photograph) instead
  of CIFAR-10; a batch holds crops of *different* photographs, as the paper keeps labels
  distinct within a batch; trial t of a setting with n images takes photographs t, t+1, …,
  t+n−1 (mod 10), the first crop for even t and the second for odd t;
- budget: ``--iterations`` (default 1200) signed-Adam steps, one restart, attack seed 0, step
  size 0.1, TV 1e-2, instead of 4800 iterations at step size 1; ``--trials`` (default 2) batches
  per setting instead of 100.

Table 2 settings (E, n, B): (1, 4, 2), (1, 8, 2), (1, 8, 8), (5, 1, 1), (5, 8, 8) at τ =
``--local-lr`` (1e-4, the authors' default). Fig. 5: photos (``--photos``, default 2 =
chelsea), 5 local steps (E = 5, n = B = 1) at τ ∈ {1e-4, 1e-3, 1e-2, 1e-1}, against the FedSGD
attack (inverting-gradients on one gradient) on the same photo with the same budget and seed.
One run of signed Adam is chaotic (the float32 delta θ_{k+l} − θ_k at τ = 1e-4 differs from a
scaled gradient in its last bits, enough to send the same init elsewhere), so compare means
over several photos (``--photos 0,2,4``) or with ``--restarts``.

    OMP_NUM_THREADS=1 .venv/bin/python bench/fedavg_table2.py                 # both parts
    OMP_NUM_THREADS=1 .venv/bin/python bench/fedavg_table2.py --part lr --iterations 600

One JSON line per run, then the tables.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, replace

import click
import torch

from fedleak.attacks import Observation, create_attack
from fedleak.harness.federated.observe import observe as observe_round
from fedleak.harness.federated.protocol import FEDAVG, Protocol
from fedleak.harness.metrics.image_metrics import score_reconstruction
from fedleak.harness.zoo.datasets import DatasetInfo, denormalize, load_dataset
from fedleak.harness.zoo.models import build_model

TABLE2 = [(1, 4, 2), (1, 8, 2), (1, 8, 8), (5, 1, 1), (5, 8, 8)]
#: Geiping et al. Table 2 (ConvNet, CIFAR-10, 100 trials), mean ± std PSNR in dB.
PAPER_TABLE2 = ["16.92 ± 2.10", "14.66 ± 1.12", "16.49 ± 1.02", "25.05 ± 3.28", "16.58 ± 0.96"]
LOCAL_LRS = [1e-4, 1e-3, 1e-2, 1e-1]
MODEL = "lenet-zhu"


@dataclass
class Run:
    """One attack: what was attacked and how well."""

    setting: str
    photos: list[int]
    psnr: float
    ssim: float
    label_accuracy: float
    best_psnr: float
    wall_s: float


def trial_photos(trial: int, n: int) -> list[int]:
    """Crops of n different photographs: photographs trial..trial+n−1 (mod 10)."""
    crop = trial % 2
    return [2 * ((trial + j) % 10) + crop for j in range(n)]


def observe(images: torch.Tensor, labels: torch.Tensor, info: DatasetInfo,
            protocol: Protocol, model_seed: int, model_spec: str = MODEL) -> Observation:
    """The server's view of one round, built with the harness's own local update and replay."""
    torch.manual_seed(model_seed)
    model = build_model(model_spec, info.shape, info.num_classes)
    return observe_round(model, images, labels, info, protocol)


def attack(setting: str, photos: list[int], protocol: Protocol, options: dict,
           model_seed: int, attack_seed: int, model_spec: str = MODEL,
           batchnorm: str = "train") -> Run:
    data = load_dataset("photos", "all")
    images, labels = data.images[photos], data.labels[photos]
    protocol = replace(protocol, batchnorm=batchnorm)
    observation = observe(images, labels, data.info, protocol, model_seed, model_spec)
    name = "fedavg" if protocol.kind == FEDAVG else "inverting-gradients"
    started = time.perf_counter()
    result = create_attack(name, options).reconstruct(observation, seed=attack_seed)
    wall = time.perf_counter() - started
    recovered = denormalize(result.images, data.info).clamp(0, 1)
    score = score_reconstruction(recovered, images, result.labels.tolist(), labels.tolist())
    run = Run(setting, photos, score.mean_psnr, score.mean_ssim, score.label_accuracy or 0.0,
              max(s.psnr for s in score.images), wall)
    print(json.dumps(run.__dict__), flush=True)
    return run


def table2(options: dict, trials: int, local_lr: float, seeds: tuple) -> None:
    rows = []
    for epochs, n, batch in TABLE2:
        protocol = Protocol(FEDAVG, epochs, batch, local_lr)
        runs = [attack(f"E={epochs} n={n} B={batch}", trial_photos(t, n), protocol, options,
                       *seeds) for t in range(trials)]
        rows.append(((epochs, n, batch), runs))
    print(f"\nTable 2 on photos, {seeds[2]} untrained, τ = {local_lr:g}, "
          f"{options['iterations']} iterations, {trials} trial(s) per setting")
    print(f"{'E':>2} {'n':>2} {'B':>2} {'steps':>5} {'PSNR dB (mean ± sd)':>20} {'best img':>9} "
          f"{'SSIM':>6} {'labels':>7} {'s/run':>6}   paper (ConvNet, CIFAR-10)")
    for ((epochs, n, batch), runs), paper in zip(rows, PAPER_TABLE2, strict=True):
        psnrs = [r.psnr for r in runs]
        spread = statistics.stdev(psnrs) if len(psnrs) > 1 else 0.0
        steps = Protocol(FEDAVG, epochs, batch, local_lr).local_steps(n)
        print(f"{epochs:>2} {n:>2} {batch:>2} {steps:>5} "
              f"{statistics.mean(psnrs):>12.2f} ± {spread:<5.2f} "
              f"{max(r.best_psnr for r in runs):>9.2f} "
              f"{statistics.mean(r.ssim for r in runs):>6.3f} "
              f"{statistics.mean(r.label_accuracy for r in runs):>7.0%} "
              f"{statistics.mean(r.wall_s for r in runs):>6.1f}   {paper}")


def lr_ablation(options: dict, photos: list[int], seeds: tuple,
                local_lrs: list[float] = LOCAL_LRS) -> None:
    results = []
    for photo in photos:
        fedsgd = attack(f"photo {photo} fedsgd", [photo], Protocol(), options, *seeds)
        runs = [attack(f"photo {photo} tau={lr:g}", [photo], Protocol(FEDAVG, 5, 1, lr),
                       options, *seeds) for lr in local_lrs]
        results.append((photo, fedsgd, runs))
    print(f"\nFig. 5: photos {photos}, {seeds[2]} untrained, 5 local steps (E=5, n=B=1), "
          f"{options['iterations']} iterations, {options['restarts']} restart(s); "
          "PSNR dB (difference to FedSGD on the same photo)")
    header = "".join(f"{f'τ={lr:g}':>16}" for lr in local_lrs)
    print(f"{'photo':>5} {'FedSGD':>8}{header}")
    for photo, fedsgd, runs in results:
        cells = "".join(f"{r.psnr:>8.2f} ({r.psnr - fedsgd.psnr:+5.2f})" for r in runs)
        print(f"{photo:>5} {fedsgd.psnr:>8.2f}{cells}")
    if len(results) > 1:
        base = statistics.mean(f.psnr for _, f, _ in results)
        means = [statistics.mean(runs[i].psnr for _, _, runs in results)
                 for i in range(len(local_lrs))]
        cells = "".join(f"{m:>8.2f} ({m - base:+5.2f})" for m in means)
        print(f"{'mean':>5} {base:>8.2f}{cells}")


@click.command()
@click.option("--part", type=click.Choice(["all", "table2", "lr"]), default="all",
              show_default=True)
@click.option("--iterations", default=1200, show_default=True)
@click.option("--trials", default=2, show_default=True, help="Batches per Table 2 setting.")
@click.option("--local-lr", default=1e-4, show_default=True, help="τ for Table 2.")
@click.option("--photos", default="2", show_default=True,
              help="Photos of the lr ablation, comma-separated.")
@click.option("--local-lrs", default=",".join(f"{lr:g}" for lr in LOCAL_LRS),
              show_default=True, help="τ values of the lr ablation, comma-separated.")
@click.option("--restarts", default=1, show_default=True,
              help="Attack restarts (vectorised for lenet-zhu); the lowest objective wins.")
@click.option("--tv", default=1e-2, show_default=True)
@click.option("--model-seed", default=0, show_default=True)
@click.option("--seed", default=0, show_default=True, help="Attack seed.")
@click.option("--threads", default=1, show_default=True)
@click.option("--model", "model_spec", default=MODEL, show_default=True,
              help="Model of the zoo, e.g. convnet:width=16.")
@click.option("--batchnorm", type=click.Choice(["train", "eval"]), default="train",
              show_default=True, help="The user's BatchNorm mode (victim --batchnorm).")
def main(part: str, iterations: int, trials: int, local_lr: float, photos: str,
         local_lrs: str, restarts: int, tv: float, model_seed: int, seed: int,
         threads: int, model_spec: str, batchnorm: str) -> None:
    torch.set_num_threads(threads)
    options = {"iterations": iterations, "tv": tv, "lr": 0.1, "restarts": restarts}
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, threads {threads}, load average {load}; {model_spec} "
          f"untrained (seed {model_seed}), photos, attack seed {seed}, {iterations} iterations, "
          f"tv {tv}, step size 0.1, {restarts} restart(s)")
    seeds = (model_seed, seed, model_spec, batchnorm)
    if part in ("all", "lr"):
        lr_ablation(options, [int(p) for p in photos.split(",")], seeds,
                    [float(lr) for lr in local_lrs.split(",")])
    if part in ("all", "table2"):
        table2(options, trials, local_lr, seeds)


if __name__ == "__main__":
    main()
