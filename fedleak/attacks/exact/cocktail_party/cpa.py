"""Cocktail Party Attack: a fully-connected layer's inputs unmixed from its aggregated gradient.

Kariyappa et al., "Cocktail Party Attack: Breaking Aggregation-Based Privacy in Federated
Learning Using Independent Component Analysis", ICML 2023: the inputs of a fully-connected layer
unmixed from its aggregated gradient by independent component analysis.

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
(SPEAR's observation, :mod:`~fedleak.attacks.exact.relu.sparsity`). An ICA estimate ``ĥ_j`` predicts
those units (its most negative pre-activations ``W ĥ_j + b``); the null vector of ``G``'s factor
rows there is input j's exact mixing direction when it certifies (many exact zeros, a
one-dimensional null space, a ReLU-consistent pattern). Certified columns are then *deflated*:
projecting ``G`` and ``g`` off their span leaves a mixture of the remaining inputs only, which
FastICA separates again with fewer sources; the last one lies on a line
(:func:`~fedleak.attacks.exact.relu.direction_search.last_direction`). With all n certified, ``H =
Q⁻¹ R`` exactly (SPEAR's solve). Otherwise certified images are their estimates with the other
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

The attack's parts: its options (:mod:`~fedleak.attacks.exact.cocktail_party.cpa_options`), the
unmixing (:mod:`~fedleak.attacks.exact.cocktail_party.unmixing`), the ReLU refinement
(:mod:`~fedleak.attacks.exact.relu.deflation`) and feature inversion
(:mod:`~fedleak.attacks.exact.cocktail_party.feature_inversion`).
"""

from __future__ import annotations

import numpy as np
import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Attack, Progress, UpdateSetting
from fedleak.attacks.exact.analytic import LinearLayer, biased_linear_layers, starts_with_linear
from fedleak.attacks.exact.cocktail_party.cpa_options import CocktailPartyConfig
from fedleak.attacks.exact.cocktail_party.feature_inversion import invert_features
from fedleak.attacks.exact.cocktail_party.unmixing import minmax_images, unmix
from fedleak.attacks.exact.fc_layer import (
    ModelDoesNotFit,
    check_update,
    first_linear_layer,
    gradient_of,
    labels_for_inputs,
    layer_parameters,
    relu_follows,
)
from fedleak.attacks.exact.relu.deflation import relu_refinement
from fedleak.attacks.exact.relu.replay_starts import ReplayStarts, next_layer_head
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.safety_limit import SafetyLimit

#: singular values below this fraction of the largest are the update's rounding, not a source
RANK_TOLERANCE = 1e-6
#: an unmixed image (ICA's alone, no direction certified) with more than this fraction of its
#: pixels far outside the image box had a near-zero bias scale (a poor unmixing row): it is
#: rescaled the paper's way instead
BLOWN_OUT = 0.2


@register_attack("cocktail-party")
class CocktailParty(Attack[Observation]):
    """ICA on a fully-connected layer's aggregated gradient (module docstring)."""

    Config = CocktailPartyConfig
    config: CocktailPartyConfig

    def budget(self) -> int | None:
        """Return None: there are no objective evaluations to count.

        The work budget is ``rounds`` of certify-and-deflate and ``samples`` sampled sets
        (FastICA converges by its tolerance; the refinement and feature inversion steps are
        options).
        """
        return None

    @classmethod
    def unsuited(cls, setting: UpdateSetting) -> str | None:
        """Refuse a FedAvg update of several local steps: it mixes several gradients."""
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
        limit = SafetyLimit(cfg.time_limit)
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
        truncated = None
        if cfg.relu == "auto" and relu_follows(observation, layer):
            head = next_layer_head(observation, layer)
            refined = relu_refinement(
                cfg, mixtures, totals, inputs, count, (weight.numpy(), bias.numpy()), shape, seed,
                replay=ReplayStarts.of(observation, layer) if image_input else None, head=head,
                box=self.input_box(observation) if image_input else None, limit=limit)
            inputs, truncated = refined.inputs, refined.truncated
            extras.update(certified=refined.certified, rounds=refined.rounds,
                          certified_per_round=",".join(map(str, refined.history)),
                          sampled_sets=refined.sets, next_layer_form=head is not None)
            if refined.solved:
                extras["solved_exactly"] = True
        elif cfg.relu == "auto":
            extras["certified"] = 0
            warnings.append(f"no ReLU follows layer {layer.name}: the unmixing is ICA's alone")
        extras["unmix_s"] = limit.elapsed()
        if truncated:
            warnings.append(truncated)
        if image_input:
            result = self.image_result(observation, inputs, count, device, extras, warnings)
        else:
            result = self.feature_result(observation, layer, inputs, mixtures, count, device,
                                         seed, extras, warnings, progress)
        result.truncated = truncated
        return result

    def choose(self, observation: Observation) -> LinearLayer:
        """Return the layer to unmix, by the ``layer`` option.

        ``auto``: the first FC layer over the image when there is one, else the last biased
        linear layer (after the feature extractor).
        """
        choice = self.config.layer
        if choice == "auto":
            layers = biased_linear_layers(observation)
            if layers and not starts_with_linear(observation, layers[0]):
                return layers[-1]
        return first_linear_layer(observation, choice, "cocktail-party")

    def image_result(self, observation: Observation, inputs: np.ndarray, count: int,
                     device: torch.device, extras: dict[str, object],
                     warnings: list[str]) -> Reconstruction:
        """Return the unmixed images, rescaled, clipped to the image box and labelled.

        Unless solved exactly, an image is min-max rescaled (``scale=minmax``, or an ICA-only
        image more than ``BLOWN_OUT`` of whose values lie far outside the box); slots beyond
        ``count`` are zero padding. Labels come from the images when all were unmixed.
        """
        n, shape = observation.num_images, observation.image_shape
        mean = np.asarray(observation.mean, dtype=np.float64)
        std = np.asarray(observation.std, dtype=np.float64)
        if not extras.get("solved_exactly"):
            rescaled = minmax_images(inputs, mean, std, shape)
            if self.config.scale == "minmax":
                inputs = rescaled
            elif not extras.get("certified"):  # ICA's alone: a bias scale near zero (a poor
                # unmixing row) blows the image out of the box. Inputs solved jointly with
                # certified directions keep their scale: a saturated image (a white patch)
                # lies far outside the box and clips back to itself
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
    def input_box(observation: Observation) -> tuple[np.ndarray, np.ndarray]:
        """Return the image box per value of the flattened image, float64 ``([d], [d])``."""
        low, high = observation.image_bounds("cpu")
        count = int(np.prod(observation.image_shape[1:]))
        return (np.repeat(low.double().view(-1).numpy(), count),
                np.repeat(high.double().view(-1).numpy(), count))

    @staticmethod
    def outside_box(inputs: np.ndarray, observation: Observation) -> np.ndarray:
        """Return, per input, the fraction of its values far outside the image box.

        Far: more than a tenth of the box's range outside it.
        """
        low, high = (t.double().view(-1, 1).numpy() for t in observation.image_bounds("cpu"))
        c = low.shape[0]
        grid = inputs.reshape(inputs.shape[0], c, -1)
        margin = 0.1 * (high - low)
        outside = (grid < low - margin) | (grid > high + margin)
        fractions: np.ndarray = outside.reshape(inputs.shape[0], -1).mean(axis=1)
        return fractions

    def feature_result(self, observation: Observation, layer: LinearLayer, inputs: np.ndarray,
                       mixtures: np.ndarray, count: int, device: torch.device, seed: int,
                       extras: dict[str, object], warnings: list[str],
                       progress: Progress | None) -> Reconstruction:
        """Return the layer's features, then images by feature inversion (module docstring)."""
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
