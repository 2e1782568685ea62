"""Cocktail Party Attack (Kariyappa et al., "Cocktail Party Attack: Breaking Aggregation-Based
Privacy in Federated Learning Using Independent Component Analysis", ICML 2023): the inputs of
a fully-connected layer unmixed from its aggregated gradient by independent component analysis.

**The mixture (Sec. 3).** For a layer ``z = W h + b`` (``W`` [m, d]) and a batch — or the
secure-aggregation sum of several users' batches, which is only a larger batch — of n inputs,

    G := ∂L/∂W = Σ_j δ_j h_jᵀ = A H,        A = [δ_1 … δ_n]  [m, n],   H = [h_1 … h_n]ᵀ,

so each of the m rows of ``G`` is a linear mixture of the n inputs: m microphones, n speakers.
Blind source separation recovers ``H`` up to the order, sign and scale of its rows by finding an
unmixing ``U`` [n, m] with ``U G ≈ diag(c) P H``.

**Unmixing (Sec. 4).** The rows of ``G`` are centred and whitened (PCA to n components: the
mixture has rank n), then an orthogonal unmixing maximises the *non-Gaussianity* of every
recovered source (negentropy, approximated with the contrast ``G(u) = log cosh u`` or
``−exp(−u²/2)``) while keeping the sources *mutually independent* (decorrelated) — FastICA
(scikit-learn's ``FastICA``: whitening and the fixed-point iteration, not written here). The
paper's own optimiser adds, beside those two priors, a total-variation prior on image sources;
``iterations`` > 0 refines the unmixing with the paper's loss (negentropy + ``decorrelation`` ·
mean(exp(T·``|cos(u_i, u_j)|``) − 1) + ``tv`` · TV(source images), Adam over the unmixing in the
whitened space) after FastICA.

**Sign and scale.** ICA leaves each source's sign and scale open. The paper rescales each image
to [0, 1] (min–max) and, in its evaluation, picks the sign that matches the ground truth — an
oracle a server does not have. fedleak resolves both exactly from the bias gradient
``g = ∂L/∂b = A 1``: an exact unmixing row ``u`` gives ``u G = c hᵀ`` and ``u g = c``, so

    h = u G / (u g)        (``scale=bias``, the default)

— the identity of analytic inversion (Geiping et al. Prop. D.1) applied to the unmixed row.
``scale=minmax`` is the paper's rescaling, with the sign chosen by the data set's mean pixel
(the image whose mean is nearer the normalisation mean), for layers without a bias; with
``scale=bias`` an image the bias scale blows out of the box (over a fifth of its pixels far
outside it: ``u g`` near zero for a poor unmixing row) is rescaled that way too.

**Images have structure the pixels hide (``domain``).** ICA needs sources that are independent
and non-Gaussian, and many more samples (pixels) than sources. Photographs of one kind (aligned
faces) are strongly correlated as pixel vectors — their whitened unmixing is far from
orthogonal — and 8×8 digits have fewer pixels (64, several always dark) than a 4 × 16 sum has
images, so their mixture does not even have rank n. The unmixing is a linear map of the rows, so
it may be *learnt* on any linear transform of the pixels and *applied* to the pixels: with
``domain=gradients`` (default for images) FastICA runs on the finite differences along rows and
columns of every mixture — sparse, far less correlated sources (edges) — and ``U`` is then
applied to ``G`` itself. ``domain=pixels`` is the paper's setting.

**ReLU refinement (``relu=auto``, an extension beyond the paper).** When a ReLU follows the
layer, every column δ_j of the mixing matrix is exactly zero at the units inactive for input j
(SPEAR's observation, :mod:`~fedleak.attacks.relu_sparsity`). An ICA estimate ``ĥ_j`` predicts
those units (its most negative pre-activations ``W ĥ_j + b``); the null vector of ``G``'s factor
rows there is input j's exact mixing direction when it certifies (many exact zeros, a
one-dimensional null space, a ReLU-consistent pattern). Certified columns are then *deflated*:
projecting ``G`` and ``g`` off their span leaves a mixture of the remaining inputs only, which
FastICA separates again with fewer sources; the last one lies on a line
(:func:`~fedleak.attacks.relu_sparsity.last_direction`). With all n certified, ``H = Q⁻¹ R``
exactly (SPEAR's solve). Otherwise certified images are their estimates with the other
certified inputs projected out, and the rest are the last ICA estimates. ``relu=off`` is the
paper's attack alone.

**Convolutional models (Sec. 4.3, feature inversion).** When the first trainable layer is not
fully connected, the layer after the feature extractor is unmixed instead (``layer=last``, the
classifier of the zoo's CNNs: n ≤ its m rows); the recovered inputs are features ``ĥ_j``, scored
by the victim against the true ones, and images are found by *feature inversion*: images ``x``
minimise ``1 − cos(h(x_j), ĥ_j)`` + ``fi-tv`` · TV(x) (+ ``fi-gm`` · the gradient-matching
cosine of the whole batch), with ``h(x)`` read from a one-image replay of the user's update
(``h = ∂L/∂W_i / ∂L/∂b_i``, exact for one input), Adam, the image box enforced. For the
classifier the mixing columns are ``p_j − e_{y_j}``: each label is its column's negative entry.

Works on FedSGD gradients, secure-aggregation sums (``--secagg-target sum``) and FedAvg deltas
of one local step (several steps are refused: the mixture changes between them).
"""

from __future__ import annotations

import math
import time
import warnings as python_warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedleak.attacks import relu_sparsity as rs
from fedleak.attacks.analytic import LinearLayer, biased_linear_layers, starts_with_linear
from fedleak.attacks.base import Attack, Progress, UpdateSetting
from fedleak.attacks.fc_layer import (
    ModelDoesNotFit,
    check_update,
    expected_sets,
    first_linear_layer,
    gradient_of,
    labels_for_inputs,
    layer_parameters,
    relu_follows,
)
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.priors import total_variation
from fedleak.attacks.registry import register_attack

DOMAINS = ("gradients", "pixels")
CONTRASTS = ("logcosh", "exp", "cube")
SCALES = ("bias", "minmax")
RELU_CHOICES = ("auto", "off")
#: singular values below this fraction of the largest are the update's rounding, not a source
RANK_TOLERANCE = 1e-6
#: sampled sets the certify-and-deflate rounds may add (SPEAR's search for the last inputs of
#: a small batch; only when the expected number is within it)
SAMPLING_BUDGET = 1_000_000
#: an unmixed image with more than this fraction of its pixels far outside the image box had a
#: near-zero bias scale (a poor unmixing row): it is rescaled the paper's way instead
BLOWN_OUT = 0.2


@dataclass
class CocktailPartyConfig:
    """Which layer, how to unmix, how to resolve sign and scale, and the feature inversion."""

    layer: str = field(default="auto", metadata={
        "help": "auto (the first fully-connected layer over the image, else the last linear "
                "layer after the feature extractor), first, last, or a module name"})
    domain: str = field(default="gradients", metadata={
        "help": "what FastICA unmixes: gradients (finite differences of image mixtures) or "
                "pixels (the paper's)"})
    contrast: str = field(default="exp", metadata={
        "help": "FastICA's negentropy contrast: logcosh, exp or cube"})
    ica_iterations: int = field(default=2000, metadata={"help": "FastICA's max_iter"})
    tolerance: float = field(default=1e-6, metadata={"help": "FastICA's tol"})
    iterations: int = field(default=0, metadata={
        "help": "Adam steps refining the unmixing with the paper's loss after FastICA "
                "(negentropy + decorrelation + TV)"})
    lr: float = field(default=1e-3, metadata={"help": "step size of that refinement"})
    decorrelation: float = field(default=1.0, metadata={
        "help": "weight of the paper's decorrelation (mutual independence) penalty"})
    temperature: float = field(default=5.0, metadata={
        "help": "T in the decorrelation penalty exp(T |cos|) - 1"})
    tv: float = field(default=0.0, metadata={
        "help": "weight of the TV prior on source images in the refinement"})
    scale: str = field(default="bias", metadata={
        "help": "bias (exact sign and scale from the bias gradient) or minmax (the paper's "
                "[0, 1] rescaling, sign by the data set's mean pixel)"})
    relu: str = field(default="auto", metadata={
        "help": "auto: certify and deflate inputs through the ReLU's exact zeros when one "
                "follows the layer (exact recovery); off: the paper's unmixing alone"})
    rounds: int = field(default=12, metadata={"help": "rounds of certify-and-deflate"})
    time_limit: float = field(default=300.0, metadata={
        "help": "seconds the certify-and-deflate rounds may take at most"})
    fi_iterations: int = field(default=1000, metadata={
        "help": "feature inversion steps (convolutional models)"})
    fi_lr: float = field(default=0.1, metadata={"help": "feature inversion step size"})
    fi_tv: float = field(default=0.01, metadata={"help": "feature inversion TV weight"})
    fi_gm: float = field(default=0.0, metadata={
        "help": "feature inversion gradient-matching weight (cosine, whole batch)"})

    def __post_init__(self) -> None:
        for name, value, choices in (("domain", self.domain, DOMAINS),
                                     ("contrast", self.contrast, CONTRASTS),
                                     ("scale", self.scale, SCALES),
                                     ("relu", self.relu, RELU_CHOICES)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        if min(self.ica_iterations, self.rounds) < 1 or min(self.iterations,
                                                              self.fi_iterations) < 0:
            raise ValueError("ica-iterations and rounds must be at least 1; iterations and "
                             "fi-iterations at least 0")
        for key, number in (("tolerance", self.tolerance), ("lr", self.lr),
                            ("time-limit", self.time_limit),
                            ("fi-lr", self.fi_lr), ("temperature", self.temperature)):
            if not (number > 0 and math.isfinite(number)):
                raise ValueError(f"{key} must be a positive number, got {number}")
        for key, number in (("decorrelation", self.decorrelation), ("tv", self.tv),
                            ("fi-tv", self.fi_tv), ("fi-gm", self.fi_gm)):
            if not (number >= 0 and math.isfinite(number)):
                raise ValueError(f"{key} must be a non-negative number, got {number}")


@dataclass
class Unmixed:
    """One FastICA unmixing: recovered inputs ``[k, d]`` (float64, the layer's input space)."""

    inputs: np.ndarray
    unmixing: np.ndarray


def transformed(mixtures: np.ndarray, image_shape: tuple[int, int, int] | None,
                domain: str) -> np.ndarray:
    """The mixtures FastICA sees: as they are, or their finite differences along rows and
    columns of every channel (images only)."""
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
    """Whitening + FastICA (+ the paper's refinement) on ``mixtures`` [m, d] → ``count``
    inputs, sign and scale resolved by ``cfg.scale``."""
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
    """The paper's optimisation of the unmixing in the whitened space, from FastICA's:
    − mean_i (mean_t log cosh s_it)² + decorrelation · mean(exp(T ``|Ŵ Ŵᵀ|``) − 1) + tv · TV."""
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
        loss.backward()
        optimiser.step()
        if progress is not None and (step + 1) % 100 == 0:
            progress(step + 1, cfg.iterations, float(loss))
    rows = (unmixing / unmixing.norm(dim=1, keepdim=True)).detach()
    return (rows @ whitening).numpy()


def resolve_sign_and_scale(sources: np.ndarray, totals: np.ndarray, scale: str) -> np.ndarray:
    """``bias``: ``h = u G / (u g)`` (module docstring); ``minmax``: the paper's [0, 1]
    rescaling in units of the source, left for :func:`minmax_images` to finish."""
    if scale == "bias":
        safe = np.where(np.abs(totals) > 1e-300, totals, 1e-300)
        return sources / safe[:, None]
    return sources


def minmax_images(sources: np.ndarray, mean: np.ndarray, std: np.ndarray,
                  image_shape: tuple[int, int, int]) -> np.ndarray:
    """The paper's rescaling of each source to [0, 1] per image, as normalised images; of the
    two signs, the one whose mean pixel is nearer the data set's mean (no oracle)."""
    c = image_shape[0]
    low = sources.min(axis=1, keepdims=True)
    span = np.maximum(sources.max(axis=1, keepdims=True) - low, 1e-300)
    pixels = (sources - low) / span
    flipped = 1.0 - pixels
    target = float(np.mean(mean))
    use_flip = np.abs(flipped.mean(1) - target) < np.abs(pixels.mean(1) - target)
    chosen = np.where(use_flip[:, None], flipped, pixels).reshape(-1, c, *image_shape[1:])
    normalised = (chosen - mean.reshape(1, c, 1, 1)) / std.reshape(1, c, 1, 1)
    return normalised.reshape(sources.shape[0], -1)


@register_attack("cocktail-party")
class CocktailParty(Attack[Observation]):
    """ICA on a fully-connected layer's aggregated gradient (module docstring)."""

    Config = CocktailPartyConfig
    config: CocktailPartyConfig

    def budget(self) -> int | None:
        """None: FastICA converges by its tolerance; the refinement and feature inversion
        steps are options, not a gradient-matching budget."""
        return None

    @classmethod
    def unsuited(cls, setting: UpdateSetting) -> str | None:
        """A FedAvg update of several local steps mixes several gradients."""
        if setting.update_kind == "delta" and setting.local_steps > 1:
            return (f"cocktail-party unmixes one gradient; this FedAvg update took "
                    f"{setting.local_steps} local steps")
        return None

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Unmix, resolve sign and scale, refine through the ReLU, invert features."""
        cfg = self.config
        started = time.perf_counter()
        layer = self.choose(observation)
        warnings = check_update(observation, "cocktail-party")
        n = observation.num_images
        weight_grad, bias_grad = gradient_of(observation, layer)
        mixtures, totals = weight_grad.numpy(), bias_grad.numpy()
        m, d = mixtures.shape
        image_input = starts_with_linear(observation, layer)
        if n > m:
            raise ModelDoesNotFit(
                f"cocktail-party separates at most as many inputs as layer {layer.name} has "
                f"units ({m}); the update mixes {n}. Use a layer with more units (a wider "
                "first layer), a smaller batch, or inverting-gradients")
        spectrum = np.linalg.svd(mixtures, compute_uv=False)
        rank = int(np.sum(spectrum > RANK_TOLERANCE * spectrum[0]))
        count = min(n, rank)
        if count < n:
            warnings.append(
                f"the update mixes {n} inputs but has numerical rank {rank}: at most {count} can "
                f"be unmixed (layer inputs of {d} values" + (
                    ", fewer than the images" if d < n else ", linearly dependent") +
                "); the other slots are padding")
        if count == 0:
            raise ModelDoesNotFit(f"layer {layer.name}'s gradient is zero: nothing mixed")
        shape = observation.image_shape if image_input else None
        estimate = unmix(mixtures, totals, count, cfg, shape, seed, progress)
        extras: dict[str, object] = {"layer": layer.name, "unmixed": count,
                                     "domain": cfg.domain if image_input else "features"}
        inputs = estimate.inputs
        weight, bias = layer_parameters(observation, layer)
        if cfg.relu == "auto" and relu_follows(observation, layer):
            inputs, history = self.relu_refinement(
                mixtures, totals, inputs, count, (weight.numpy(), bias.numpy()), shape, seed)
            extras["certified"] = sum(history)
            extras["certified_per_round"] = ",".join(map(str, history))
            if sum(history) == count:
                extras["solved_exactly"] = True
        elif cfg.relu == "auto":
            extras["certified"] = 0
            warnings.append(f"no ReLU follows layer {layer.name}: the unmixing is ICA's alone")
        extras["unmix_s"] = time.perf_counter() - started
        if image_input:
            return self.image_result(observation, inputs, count, device, extras, warnings)
        return self.feature_result(observation, layer, inputs, mixtures, count, device, seed,
                                   extras, warnings, progress)

    def choose(self, observation: Observation) -> LinearLayer:
        """``auto``: the first FC layer over the image when there is one, else the last
        biased linear layer (after the feature extractor)."""
        choice = self.config.layer
        if choice == "auto":
            layers = biased_linear_layers(observation)
            if layers and not starts_with_linear(observation, layers[0]):
                return layers[-1]
        return first_linear_layer(observation, choice, "cocktail-party")

    def relu_refinement(self, mixtures: np.ndarray, totals: np.ndarray, inputs: np.ndarray,
                        count: int, forward: tuple[np.ndarray, np.ndarray],
                        shape: tuple[int, int, int] | None, seed: int
                        ) -> tuple[np.ndarray, list[int]]:
        """Certify, deflate, repeat; solve exactly when every input is certified (module
        docstring). Returns the inputs and how many were certified in each round (a last
        entry for the sampling search, when it ran).

        Each estimate's direction starts at its estimated mixing column, ``q = L⁺ a_j`` with
        ``A = G X̂⁺`` (after deflation: the projected mixture's, moved only along the certified
        directions), and is refined to the input's zero set
        (:func:`~fedleak.attacks.relu_sparsity.direction_near`); failing that, from the n − 1
        rows its pre-activations rank most negative. When the rounds stop short with an input
        certified (so the update has exact zeros) and the batch is small enough for SPEAR's
        sampling (``expected_sets`` within its budget), the remaining directions are sampled
        within the time left.
        """
        cfg = self.config
        grad = rs.factorise(mixtures, totals, count)
        margin = rs.default_margin(count)
        found = rs.DirectionSet(count)
        estimates = inputs.copy()
        seen: list[np.ndarray] = list(inputs)     # every estimate made, for partial results
        projected = mixtures
        left_pinv = np.linalg.pinv(grad.left)
        history: list[int] = []
        started = time.perf_counter()
        for round_ in range(cfg.rounds):
            if time.perf_counter() - started > cfg.time_limit:
                break
            known = found.columns()
            starts = left_pinv @ (projected @ np.linalg.pinv(estimates))       # [n, k]
            added = 0
            for j, x in enumerate(estimates):
                direction = rs.direction_near(grad, starts[:, j], margin, forward,
                                              known=known if known.shape[1] else None)
                if direction is None:
                    ranked = np.argsort(x @ forward[0].T + forward[1])
                    direction = rs.direction_from_ranked_rows(grad, ranked, margin, forward,
                                                              pools=(1.0,))
                added += found.add(direction)
            if count - len(found.found) == 1:
                added += found.add(rs.last_direction(grad, found.columns(), forward, margin))
            history.append(added)
            remaining = count - len(found.found)
            if remaining == 0:
                return rs.solve_inputs(grad, found.columns()), history
            if added == 0 and round_ > 0:
                break
            known_mixing = grad.left @ found.columns()
            projector = np.eye(mixtures.shape[0]) - known_mixing @ np.linalg.pinv(known_mixing)
            projected = projector @ mixtures
            estimates = unmix(projected, projector @ totals, remaining, cfg, shape,
                              seed + round_ + 1).inputs
            seen += list(estimates)
        left = cfg.time_limit - (time.perf_counter() - started)
        if left > 0 and expected_sets(count) <= SAMPLING_BUDGET and \
                found.found:  # an input certified: the update has exact zeros to sample
            before = len(found.found)
            rs.sample_directions(grad, found, samples=SAMPLING_BUDGET, seconds=left,
                                 margin=margin, rng=np.random.default_rng(seed), layer=forward)
            if count - len(found.found) == 1:
                found.add(rs.last_direction(grad, found.columns(), forward, margin))
            history.append(len(found.found) - before)
            if len(found.found) == count:
                return rs.solve_inputs(grad, found.columns()), history
        return self.partial(grad, found, seen, estimates, forward), history

    @staticmethod
    def partial(grad: rs.FactoredGradient, found: rs.DirectionSet, seen: list[np.ndarray],
                estimates: np.ndarray, forward: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """When not every input was certified. Certified input k: the estimate (of all made)
        whose ReLU pattern agrees best with its direction's zero set, with the other certified
        inputs projected out (``x = r R``, ``r ⊥ q_j`` for the other certified j, nearest the
        estimate); the rest: the last deflated ICA estimates."""
        columns = found.columns()
        right_pinv = np.linalg.pinv(grad.right)
        pool = np.stack(seen)
        active = pool @ forward[0].T + forward[1] > 0                       # [estimates, m]
        live = grad.live
        out = []
        for j in range(columns.shape[1]):
            zeros = grad.zero_set(columns[:, j])
            agreement = ((~active[:, live]) == zeros[live]).mean(axis=1)
            x = pool[int(np.argmax(agreement))]
            others = np.delete(columns, j, axis=1)
            coefficients = x @ right_pinv
            if others.shape[1]:
                coefficients = coefficients - (coefficients @ others) @ np.linalg.pinv(others)
            projected = coefficients @ grad.right
            scale = float(projected @ x) / max(float(projected @ projected), 1e-300)
            out.append(scale * projected)
        out += list(estimates[: grad.rank - len(out)])
        return np.stack(out) if out else estimates

    def image_result(self, observation: Observation, inputs: np.ndarray, count: int,
                     device: torch.device, extras: dict[str, object],
                     warnings: list[str]) -> Reconstruction:
        n, shape = observation.num_images, observation.image_shape
        mean = np.asarray(observation.mean, dtype=np.float64)
        std = np.asarray(observation.std, dtype=np.float64)
        if not extras.get("solved_exactly"):
            rescaled = minmax_images(inputs, mean, std, shape)
            if self.config.scale == "minmax":
                inputs = rescaled
            else:  # a bias scale near zero (a poor unmixing row) blows the image out of the box
                outside = self.outside_box(inputs, observation)
                blown = outside > BLOWN_OUT
                inputs = np.where(blown[:, None], rescaled, inputs)
                if blown.any():
                    extras["minmax_fallback"] = int(blown.sum())
        images = torch.zeros(n, *shape)
        images[:count] = torch.from_numpy(inputs[:count]).float().view(count, *shape)
        low, high = observation.image_bounds("cpu")
        images[:count] = torch.maximum(torch.minimum(images[:count], high), low)
        images = images.to(device)
        labels = labels_for_inputs(observation, images) if count == n else \
            recover_labels(observation)
        return Reconstruction(images=images, labels=labels.to(device), objective=0.0,
                              iterations=1, extras=extras, warnings=warnings,
                              padding=list(range(count, n)))

    @staticmethod
    def outside_box(inputs: np.ndarray, observation: Observation) -> np.ndarray:
        """Per input, the fraction of its values more than a tenth of the range outside the
        image box."""
        low, high = (t.double().view(-1, 1).numpy() for t in observation.image_bounds("cpu"))
        c = low.shape[0]
        grid = inputs.reshape(inputs.shape[0], c, -1)
        margin = 0.1 * (high - low)
        outside = (grid < low - margin) | (grid > high + margin)
        return outside.reshape(inputs.shape[0], -1).mean(axis=1)

    def feature_result(self, observation: Observation, layer: LinearLayer, inputs: np.ndarray,
                       mixtures: np.ndarray, count: int, device: torch.device, seed: int,
                       extras: dict[str, object], warnings: list[str],
                       progress: Progress | None) -> Reconstruction:
        """Features of the layer, then images by feature inversion (module docstring)."""
        n = observation.num_images
        features = torch.from_numpy(inputs[:count]).float()
        mixing = mixtures @ np.linalg.pinv(inputs[:count])                # [m, count]
        if mixing.shape[0] == observation.num_classes:                    # the classifier
            labels = torch.from_numpy(np.argmin(mixing, axis=0)).long()
            labels = torch.cat([labels, recover_labels(observation).cpu()[count:]])
        else:
            labels = recover_labels(observation).cpu()
        labels = labels[:n].to(device)
        images = torch.empty(0, *observation.image_shape, device=device)
        if self.config.fi_iterations > 0:
            images = invert_features(observation, layer, features.to(device), labels,
                                     self.config, seed, progress)
            extras["feature_inversion_steps"] = self.config.fi_iterations
        return Reconstruction(images=images, labels=labels, objective=0.0, iterations=1,
                              extras=extras, warnings=warnings, features=features.to(device),
                              feature_layer=layer.name,
                              padding=list(range(count, n)) if images.shape[0] else [])


def replayed_input(observation: Observation, layer: LinearLayer, image: torch.Tensor,
                   label: torch.Tensor) -> torch.Tensor:
    """The layer's input for one image, from its one-image replay: ``∂L/∂W_i / ∂L/∂b_i``
    combined over the rows by least squares (exact for one input), differentiable in
    ``image``."""
    update = observation.simulate(image, label)
    weight, bias = update[layer.weight_index], update[layer.bias_index]
    return (bias[:, None] * weight).sum(0) / bias.square().sum().clamp_min(1e-30)


def invert_features(observation: Observation, layer: LinearLayer, features: torch.Tensor,
                    labels: torch.Tensor, cfg: CocktailPartyConfig, seed: int,
                    progress: Progress | None) -> torch.Tensor:
    """Images whose layer inputs point along ``features`` (cosine), with TV and optional
    gradient matching; slots without a feature keep the mean image."""
    n, count = observation.num_images, features.shape[0]
    device = features.device
    low, high = observation.image_bounds(device)
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn((n, *observation.image_shape), generator=generator).to(device)
    images = torch.maximum(torch.minimum(images, high), low)
    images[count:] = 0.0
    variable = images[:count].clone().requires_grad_(True)
    optimiser = torch.optim.Adam([variable], lr=cfg.fi_lr)
    target = [u.detach() for u in observation.gradient_direction()]
    for step in range(cfg.fi_iterations):
        optimiser.zero_grad()
        with torch.enable_grad():
            loss = variable.new_zeros(())
            for j in range(count):
                h = replayed_input(observation, layer, variable[j:j + 1], labels[j:j + 1])
                loss = loss + (1 - torch.nn.functional.cosine_similarity(
                    h, features[j], dim=0)) / count
            if cfg.fi_tv > 0:
                loss = loss + cfg.fi_tv * total_variation(variable)
            if cfg.fi_gm > 0:
                full = torch.cat([variable, images[count:]])
                replay = observation.simulate(full, labels)
                dot = torch.stack([(a * b).sum() for a, b in zip(replay, target,
                                                                 strict=True)]).sum()
                norms = torch.stack([a.square().sum() for a in replay]).sum().sqrt() * \
                    torch.stack([b.square().sum() for b in target]).sum().sqrt()
                loss = loss + cfg.fi_gm * (1 - dot / norms.clamp_min(1e-30))
            loss.backward()
        optimiser.step()
        with torch.no_grad():
            variable.copy_(torch.maximum(torch.minimum(variable, high), low))
        if progress is not None and ((step + 1) % 50 == 0 or step + 1 == cfg.fi_iterations):
            progress(step + 1, cfg.fi_iterations, float(loss))
    images[:count] = variable.detach()
    return images
