"""Success at a threshold, and where an ordinary attack sits under the reconstruction bound.

An attack "succeeds" on an image when its matched reconstruction reaches η dB PSNR
(:data:`SUCCESS_PSNR` by default). To read that success rate against what DP permits, the
prior's baseline κ(η) is estimated on the *public* prior — the data set's other split, the one
the private images did not come from (:func:`prior_kappa`, by
:func:`fedleak.auditing.reconstruction.prior_baseline.prior_baseline`) — and the published DP-SGD
mechanism of the attacked round (σ from ``Describe``, q and T from the round's metadata) gives
β(κ) (:func:`fedleak.auditing.reconstruction.bounds.reconstruction_bound`), evaluated at κ's
upper confidence end so that the sample does not make the bound look tighter than it is.

Counts use the victim's one-to-one matching (Hungarian on MSE): for one image per round it is
the largest matching that meets η; for several it may count fewer (said beside the figure).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from fedleak.auditing.reconstruction.bounds import reconstruction_bound
from fedleak.auditing.reconstruction.prior_baseline import PriorBaseline, prior_baseline
from fedleak.harness.metrics.floors import FLOOR_MARGIN_DB
from fedleak.harness.metrics.image_metrics import SUCCESS_PSNR
from fedleak.harness.zoo.datasets import load_dataset

#: The prior is subsampled (seeded) to this many images for κ (N² pairwise distances).
MAX_PRIOR = 2000


@dataclass(frozen=True)
class Mechanism:
    """The DP-SGD mechanism one round ran: σ, the sample rate q and the DP steps T."""

    noise_multiplier: float
    sample_rate: float
    steps: int


def public_split(private_split: str) -> str | None:
    """The split the private images did not come from (None for ``all``: no public prior)."""
    return {"train": "test", "test": "train"}.get(private_split)


def _public_prior(dataset: str, private_split: str, data_root: str | None) -> torch.Tensor | None:
    """The public prior's images, flattened (float64; a fixed subsample of at most
    :data:`MAX_PRIOR`), or None when the private split leaves no public one."""
    split = public_split(private_split)
    if split is None:
        return None
    images = load_dataset(dataset, split, data_root).images.double()
    if len(images) > MAX_PRIOR:
        keep = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
        images = images[keep[:MAX_PRIOR]]
    return images.flatten(1)


@functools.lru_cache(maxsize=16)
def prior_kappa(dataset: str, private_split: str, threshold: float = SUCCESS_PSNR,
                data_root: str | None = None) -> PriorBaseline | None:
    """κ̂(η) of the public prior at PSNR threshold η; None when there is no public split."""
    flat = _public_prior(dataset, private_split, data_root)
    if flat is None:
        return None
    guesses = torch.cat([flat, flat.mean(0, keepdim=True)])
    mse = torch.cdist(guesses, flat).square() / flat.shape[1]
    psnr = 10 * torch.log10(1 / mse.clamp_min(1e-12))
    return prior_baseline(psnr.numpy(), threshold, "psnr")


@functools.lru_cache(maxsize=16)
def prior_mean_psnr(dataset: str, private_split: str,
                    data_root: str | None = None) -> float | None:
    """Mean PSNR of the public prior's mean image against the public prior's images (the
    same subsample as :func:`prior_kappa`); None when there is no public split."""
    flat = _public_prior(dataset, private_split, data_root)
    if flat is None:
        return None
    mse = (flat - flat.mean(0, keepdim=True)).square().mean(1)
    return float((10 * torch.log10(1 / mse.clamp_min(1e-12))).mean())


def round_mechanism(metadata: Mapping[str, str],
                    defenses: Iterable[tuple[str, Mapping[str, str]]],
                    target_steps: int = 1) -> Mechanism | None:
    """The round's per-example Gaussian mechanism as it touched one image, read from the
    published declaration (``declared.*``: σ = noise std / clip norm, the sampling), or None
    without one.

    Poisson sampling (``poisson = true``): every one of the round's T steps (``dp_steps`` of the
    metadata) draws the image with probability q (``sample_rate``). In-order batches: the image
    is in exactly ``target_steps`` steps (one per local epoch; 1 for FedSGD) with q = 1 — the
    other steps do not touch it, and the metadata's sample rate is then a batch fraction, not a
    sampling probability.
    """
    declared = next((dict(params) for _, params in defenses
                     if params.get("declared.stage") == "per-example"), None)
    if declared is not None:  # what the per-example defense declares (any plug-in)
        try:
            std, clip = float(declared["declared.noise-std"]), float(declared["declared.clip-norm"])
            if declared.get("declared.noise", "gaussian") != "gaussian" or not clip > 0:
                return None
            sigma, poisson = std / clip, declared.get("declared.sampling") == "poisson"
        except (KeyError, ValueError):
            return None
    else:  # a victim older than declarations publishes dpsgd's own parameters
        dp = next((dict(params) for name, params in defenses if name == "dpsgd"), None)
        if dp is None or "noise-multiplier" not in dp:
            return None
        try:
            sigma = float(dp["noise-multiplier"])
        except ValueError:
            return None
        poisson = dp.get("poisson", "false").lower() == "true"
    try:
        if not poisson:
            return Mechanism(sigma, 1.0, max(1, target_steps))
        return Mechanism(sigma, float(metadata.get("sample_rate", "1")),
                         int(metadata.get("dp_steps", "1")))
    except ValueError:
        return None


@dataclass
class SuccessPlacement:
    """Success at η over the scored images, κ(η) on the public prior, and β(κ) beside it."""

    success_psnr: float
    images: int
    successes: int
    success_rate: float
    kappa: float | None = None
    kappa_upper: float | None = None
    prior_images: int | None = None
    #: the public prior's mean image scored against the public prior (mean PSNR): a biased
    #: guess that reads nothing of the update — the baseline the Fisher ceiling, which binds
    #: unbiased reconstructions only, is read against
    prior_psnr: float | None = None
    bound: float | None = None
    bound_standard_error: float | None = None
    bound_method: str | None = None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    dp_steps: int | None = None
    note: str = ""


def place(psnrs: list[float], baseline: PriorBaseline | None, mechanism: Mechanism | None,
          threshold: float = SUCCESS_PSNR, samples: int = 100_000,
          successes: int | None = None) -> SuccessPlacement:
    """Success at ``threshold`` over ``psnrs`` and, with a prior and a mechanism, the bound.

    ``successes``: the victim's count (the largest one-to-one matching at ``threshold`` and the
    floor margin); without
    it the matched images at ``threshold`` are counted, which may be fewer."""
    if successes is None:
        successes = sum(1 for p in psnrs if p >= threshold)
        notes = ["counted on the victim's least-MSE matching (may undercount a batch)"]
    else:
        notes = ["counted by the victim: the largest one-to-one matching at the threshold "
                 f"and at least {FLOOR_MARGIN_DB:g} dB above each image's floor (the best "
                 "constant guess)"]
    out = SuccessPlacement(threshold, len(psnrs), successes,
                           successes / len(psnrs) if psnrs else 0.0)
    if baseline is not None:
        out.kappa, out.kappa_upper = baseline.kappa, baseline.upper
        out.prior_images = baseline.prior_size
        notes.append(f"κ by the best of {baseline.guesses} fixed guesses on {baseline.prior_size}"
                     " public images (a better guess may exist)")
    if mechanism is not None:
        out.noise_multiplier = mechanism.noise_multiplier
        out.sample_rate, out.dp_steps = mechanism.sample_rate, mechanism.steps
    if baseline is not None and mechanism is not None:
        kappa = min(baseline.upper, 1 - 1e-12)
        bound = reconstruction_bound(kappa, mechanism.noise_multiplier, mechanism.sample_rate,
                                     mechanism.steps, samples=samples)
        out.bound, out.bound_method = bound.value, bound.method
        out.bound_standard_error = bound.standard_error or None
    elif mechanism is None:
        notes.append("no DP-SGD published: no bound")
    out.note = "; ".join(notes)
    return out
