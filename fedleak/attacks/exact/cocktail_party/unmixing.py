"""Blind source separation of a layer's gradient.

Kariyappa et al., "Cocktail Party Attack", ICML 2023, Sec. 4 (the attack is
:mod:`~fedleak.attacks.exact.cocktail_party.cpa`): whitening and FastICA on the mixtures,
optionally in the finite-difference domain, the paper's refinement of the unmixing, and the sign
and scale of every recovered source (from the bias gradient, or the paper's min–max rescaling).
"""

from __future__ import annotations

import warnings as python_warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedleak.attacks.base import Progress
from fedleak.attacks.exact.cocktail_party.cpa_options import CocktailPartyConfig
from fedleak.attacks.optimisation.priors import total_variation


@dataclass
class Unmixed:
    """One FastICA unmixing: recovered inputs ``[k, d]`` (float64, the layer's input space)."""

    inputs: np.ndarray
    unmixing: np.ndarray


def transformed(mixtures: np.ndarray, image_shape: tuple[int, int, int] | None,
                domain: str) -> np.ndarray:
    """Return the mixtures FastICA sees.

    As they are (``domain=pixels``, or features), or their finite differences along rows and
    columns of every channel (images only).
    """
    if domain == "pixels" or image_shape is None:
        return mixtures
    c, h, w = image_shape
    grid = mixtures.reshape(mixtures.shape[0], c, h, w)
    parts = []
    if w > 1:
        parts.append((grid[..., 1:] - grid[..., :-1]).reshape(mixtures.shape[0], -1))
    if h > 1:
        parts.append((grid[..., 1:, :] - grid[..., :-1, :]).reshape(mixtures.shape[0], -1))
    return np.concatenate(parts, axis=1) if parts else mixtures


def unmix(mixtures: np.ndarray, bias: np.ndarray, count: int, cfg: CocktailPartyConfig,
          image_shape: tuple[int, int, int] | None, seed: int,
          progress: Progress | None = None) -> Unmixed:
    """Unmix ``mixtures`` [m, d] into ``count`` inputs by whitening and FastICA.

    FastICA (then the paper's refinement, :func:`refine`, when ``cfg.iterations`` > 0) learns
    the unmixing ``U`` on the transformed mixtures; the sources ``U G`` have their sign and scale
    resolved by ``cfg.scale`` (:func:`resolve_sign_and_scale`).
    """
    from sklearn.decomposition import FastICA

    samples = transformed(mixtures, image_shape, cfg.domain).T          # [pixels, m]
    ica = FastICA(n_components=count, whiten="unit-variance", fun=cfg.contrast,
                  max_iter=cfg.ica_iterations, tol=cfg.tolerance, random_state=seed % 2**32)
    with python_warnings.catch_warnings():
        python_warnings.simplefilter("ignore")  # ConvergenceWarning: measured, not fatal
        ica.fit(samples)
    unmixing = np.asarray(ica.components_, dtype=np.float64)             # [k, m]
    if cfg.iterations > 0:
        unmixing = refine(samples, ica, cfg, mixtures, image_shape, progress)
    sources = unmixing @ mixtures                                       # [k, d]
    return Unmixed(resolve_sign_and_scale(sources, unmixing @ bias, cfg.scale), unmixing)


def refine(samples: np.ndarray, ica: Any, cfg: CocktailPartyConfig, mixtures: np.ndarray,
           image_shape: tuple[int, int, int] | None,
           progress: Progress | None) -> np.ndarray:
    """Refine FastICA's unmixing in the whitened space by the paper's optimisation.

    Adam, from FastICA's unmixing, on the loss (Kariyappa et al. Sec. 4)
    ``− mean_i (mean_t log cosh s_it)² + decorrelation · mean(exp(T |Ŵ Ŵᵀ|) − 1) + tv · TV``
    with unit-norm rows ``Ŵ``; returns the unmixing rows ``[k, m]`` for the raw mixtures.
    """
    whitening = torch.from_numpy(np.asarray(ica.whitening_, dtype=np.float64))      # [k, m]
    mean = torch.from_numpy(np.asarray(ica.mean_, dtype=np.float64))
    components = torch.from_numpy(np.asarray(ica.components_, dtype=np.float64))
    start = components @ torch.linalg.pinv(whitening)          # the whitened-space unmixing
    white = (torch.from_numpy(samples) - mean) @ whitening.T                 # [t, k]
    raw = torch.from_numpy(mixtures)
    unmixing = start.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([unmixing], lr=cfg.lr)
    for step in range(cfg.iterations):
        rows = unmixing / unmixing.norm(dim=1, keepdim=True)
        sources = white @ rows.T                                             # [t, k]
        negentropy = -(torch.log(torch.cosh(sources)).mean(0) ** 2).mean()
        decorrelation = (torch.exp(cfg.temperature * (rows @ rows.T).abs()) - 1).mean()
        loss = negentropy + cfg.decorrelation * decorrelation
        if cfg.tv > 0 and image_shape is not None:
            images = (rows @ whitening @ raw).view(-1, *image_shape)
            images = images / images.flatten(1).std(1).clamp_min(1e-12).view(-1, 1, 1, 1)
            loss = loss + cfg.tv * total_variation(images)
        optimiser.zero_grad()
        torch.autograd.backward(loss)
        optimiser.step()
        if progress is not None and (step + 1) % 100 == 0:
            progress(step + 1, cfg.iterations, float(loss))
    rows = (unmixing / unmixing.norm(dim=1, keepdim=True)).detach()
    unmixing_rows: np.ndarray = (rows @ whitening).numpy()
    return unmixing_rows


def resolve_sign_and_scale(sources: np.ndarray, totals: np.ndarray, scale: str) -> np.ndarray:
    """Resolve each source's sign and scale.

    ``bias``: ``h = u G / (u g)`` (module docstring); ``minmax``: the sources as they are, left
    for :func:`minmax_images` to rescale to [0, 1] (the paper's rescaling).
    """
    if scale == "bias":
        safe = np.where(np.abs(totals) > 1e-300, totals, 1e-300)
        return sources / safe[:, None]
    return sources


def minmax_images(sources: np.ndarray, mean: np.ndarray, std: np.ndarray,
                  image_shape: tuple[int, int, int]) -> np.ndarray:
    """Rescale each source to [0, 1] per image (the paper's rescaling), as normalised images.

    Of the two signs, the one whose mean pixel is nearer the data set's mean (no oracle).
    """
    c = image_shape[0]
    low = sources.min(axis=1, keepdims=True)
    span = np.maximum(sources.max(axis=1, keepdims=True) - low, 1e-300)
    pixels = (sources - low) / span
    flipped = 1.0 - pixels
    target = float(np.mean(mean))
    use_flip = np.abs(flipped.mean(1) - target) < np.abs(pixels.mean(1) - target)
    chosen = np.where(use_flip[:, None], flipped, pixels).reshape(-1, c, *image_shape[1:])
    normalised = (chosen - mean.reshape(1, c, 1, 1)) / std.reshape(1, c, 1, 1)
    flat: np.ndarray = normalised.reshape(sources.shape[0], -1)
    return flat
