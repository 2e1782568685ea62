"""SPEAR: the exact batch from one gradient of a linear layer followed by ReLU, for small batches.

Dimitrov et al., "SPEAR: Exact Gradient Inversion of Batches in Federated Learning", NeurIPS
2024, arXiv 2403.03945.

For the layer ``Z = X Wᵀ + b`` over a batch ``X`` [n, d] (the flattened images, when it is the
model's first trainable layer),

    ∂L/∂W = (∂L/∂Z)ᵀ X   has rank n,   and   ∂L/∂Z  is sparse:

every input's row of ``∂L/∂Z`` is exactly zero at the units the ReLU switched off for it
(about half of them). Factorising ``∂L/∂W = L R`` (truncated SVD, eq. 3 of the paper), there is
an invertible ``Q`` with ``(∂L/∂Z)ᵀ = L Q`` and ``X = Q⁻¹ R`` (eqs. 4–5); column j of ``Q`` is
the one direction that the rows of ``L`` at input j's inactive units all annihilate.
**Sampling** (Sec. 4.1): the null vector of n − 1 rows of ``L`` chosen at random is such a
column whenever all n − 1 rows lie in one input's inactive set — probability about 2^{−(n−1)}
per input at half the units inactive, hence batches up to about 25 and a cost that doubles with
each image. **Filtering** (Sec. 4.2): a candidate counts only when ``L q`` has many exact zeros
(far more than the n − 1 it was fitted to, distinct rows, a one-dimensional null space that
does not hinge on a few rows) and those zeros are a ReLU pattern some input in the gradient's
row space could have (a linear program: the paper's ReLU-consistency check, which also rejects
the mixtures a two-class model makes look as sparse as inputs). **Solving** (Sec. 4.3): with n
columns found, the bias gradient ``∂L/∂b = (∂L/∂Z)ᵀ 1`` fixes their scales, ``Q 1 = L⁺ ∂L/∂b``,
and ``X = Q⁻¹ R`` exactly — sign and scale included. With n − 1 found, the last input lies on a
line, searched directly (:func:`~fedleak.attacks.exact.relu.direction_search.last_direction`), and
sampled for like the others when that search finds nothing. The maths is
:mod:`~fedleak.attacks.exact.relu.sparsity` (directions found by
:mod:`~fedleak.attacks.exact.relu.direction_search`, solved by
:mod:`~fedleak.attacks.exact.relu.solve`); labels come from the classifier's gradient at the
recovered inputs (:func:`~fedleak.attacks.exact.fc_layer.labels_for_inputs`).

**What fits.** A biased fully-connected first layer over the flattened image, followed by ReLU
(probed: a one-image replay leaves exactly-zero gradient rows), with at least n units and n
input features; a FedSGD gradient or a FedAvg delta of one local step. Anything else is refused
with the reason before the search. A named later layer (``-o layer=NAME``) recovers its input
features instead, scored by the victim against the true ones.

**Budget.** The search is budgeted in work: at most ``samples`` sampled sets, so the same seed
and budget find the same inputs on an idle machine and a busy one. When the budget runs out
before n inputs are found, every slot is padding and a warning says how many were found (that
is the measurement at that budget). ``time-limit`` is only a safety cap (an hour by default):
a search it stops is marked ``truncated`` (:mod:`~fedleak.attacks.safety_limit`) and is not a
measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Attack, Progress, UpdateSetting
from fedleak.attacks.exact.analytic import starts_with_linear
from fedleak.attacks.exact.fc_layer import (
    ModelDoesNotFit,
    check_update,
    expected_sets,
    first_linear_layer,
    gradient_of,
    labels_for_inputs,
    layer_parameters,
    relu_follows,
)
from fedleak.attacks.exact.relu import sparsity as rs
from fedleak.attacks.exact.relu.direction_search import (
    DirectionSet,
    last_direction,
    sample_directions,
)
from fedleak.attacks.exact.relu.solve import solve_checked
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.safety_limit import DEFAULT_SAFETY_SECONDS, SafetyLimit, check_seconds


@dataclass
class SpearConfig:
    """Which layer, and how much to search (in sampled sets; seconds only as a safety cap)."""

    layer: str = field(default="auto", metadata={
        "help": "auto/first: the first fully-connected layer over the image; last, or a module "
                "name: that layer's input features"})
    samples: int = field(default=4_000_000, metadata={
        "help": "at most this many random sets of n-1 rows are tried (the sampling budget)"})
    time_limit: float = field(default=DEFAULT_SAFETY_SECONDS, metadata={
        "help": "safety cap in seconds: a search it stops is marked truncated (not a "
                "measurement); the budget is samples"})
    batch: int = field(default=2048, metadata={"help": "sets solved at once (memory)"})
    margin: int = field(default=0, metadata={
        "help": "distinct zero rows beyond n-1 a direction needs (0: max(8, n/4))"})

    def __post_init__(self) -> None:
        """Check the budget and limits; raise ``ValueError`` naming the bad one."""
        if self.samples < 1 or self.batch < 1 or self.margin < 0:
            raise ValueError("samples and batch must be at least 1, margin at least 0")
        check_seconds(self.time_limit)


#: defenses that leave no exact zero in the update (or add zeros of their own)
INEXACT_DEFENSES = ("dpsgd", "noise", "prune", "quantize")
#: spear refuses a batch whose expected sampling cost exceeds its budget this many times
HOPELESS = 1000.0
#: how often a solve may find a mixture among its directions and search on
MAX_RETRIES = 4
#: the update's singular values beyond the batch size, relative to the largest, above which
#: its exact zeros are lost in rounding
NOISE_FLOOR = 1e-6


def unsuited_reason(update_kind: str, local_steps: int, images: int,
                    defenses: tuple[str, ...], samples: int) -> str | None:
    """Return why spear cannot recover this batch (None: it may)."""
    inexact = [name for name in defenses if name in INEXACT_DEFENSES]
    if inexact:
        return (f"spear needs the exact zeros a ReLU leaves in the gradient; the victim's "
                f"{', '.join(inexact)} perturbs or adds zeros")
    if update_kind == "delta" and local_steps > 1:
        return f"spear reads one gradient; this FedAvg update took {local_steps} local steps"
    expected = expected_sets(images)
    if expected > HOPELESS * samples:
        return (f"a batch of {images} needs about {expected:.1g} sampled sets (doubling with "
                f"every image), over {HOPELESS:g} times the budget of {samples}: spear is for "
                "small batches; use cocktail-party on large batches and sums")
    return None


@register_attack("spear")
class Spear(Attack[Observation]):
    """Exact batch recovery for a linear layer followed by ReLU (module docstring)."""

    Config = SpearConfig
    config: SpearConfig

    def budget(self) -> int | None:
        """Return None: SPEAR spends sampled sets (``samples``), not objective evaluations."""
        return None

    @classmethod
    def unsuited(cls, setting: UpdateSetting) -> str | None:
        """Refuse settings SPEAR cannot recover, with the reason.

        Noise, pruning or quantisation (no exact zeros left), several local steps, or more
        images than sampling reaches (about 2^(n-1) sets).
        """
        return unsuited_reason(setting.update_kind, setting.local_steps, setting.images,
                               setting.defenses, cls.Config().samples)

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Sample, filter, solve (module docstring)."""
        cfg = self.config
        limit = SafetyLimit(cfg.time_limit)
        layer = first_linear_layer(observation, cfg.layer, "spear")
        warnings = check_update(observation, "spear")
        n = observation.num_images
        reason = unsuited_reason(observation.update_kind, observation.local_steps, n,
                                 tuple(d.name for d in observation.defenses), cfg.samples)
        if reason is not None:
            raise ModelDoesNotFit(reason)
        weight_grad, bias_grad = gradient_of(observation, layer)
        m, d = weight_grad.shape
        if n > min(m, d):
            raise ModelDoesNotFit(
                f"spear recovers a batch of n inputs from a layer with at least n units and n "
                f"input features; layer {layer.name} is [{m}, {d}] and the batch has {n}: use "
                "a wider layer, a smaller batch, or cocktail-party/inverting-gradients")
        if not relu_follows(observation, layer):
            raise ModelDoesNotFit(
                f"spear needs a ReLU after layer {layer.name}: a one-image replay left no "
                "exactly-zero gradient row, so the layer's output gradient is not sparse "
                "(sigmoid or tanh?). Use cocktail-party or inverting-gradients")
        if float(bias_grad.abs().max()) == 0.0:
            raise ModelDoesNotFit(f"layer {layer.name}'s bias gradient is zero: no unit was "
                                  "active, nothing to recover")
        weight, bias = layer_parameters(observation, layer)
        grad = rs.factorise(weight_grad.numpy(), bias_grad.numpy(), n)
        spectrum = grad.singular_values
        if n < spectrum.shape[0] and spectrum[n] > NOISE_FLOOR * spectrum[0]:
            raise ModelDoesNotFit(
                f"the update is too coarse for exact zeros: beyond rank {n} its singular values "
                f"stay at {spectrum[n] / spectrum[0]:.1e} of the largest (a float32 gradient "
                f"leaves about 1e-8). A FedAvg delta θ' − θ loses digits when τ·∇ is small "
                "beside θ: attack FedSGD, raise the learning rate, or use cocktail-party")
        if n < spectrum.shape[0] and spectrum[n - 1] < 1e-5 * spectrum[0]:
            warnings.append(f"the gradient has numerical rank below {n} (singular value "
                            f"{n} is {spectrum[n - 1] / spectrum[0]:.1e} of the largest): "
                            "duplicate or near-duplicate inputs; some may not be separable")
        expected = expected_sets(n)
        if expected > cfg.samples:
            warnings.append(f"a batch of {n} needs about {expected:.2g} sampled sets at half "
                            f"the units inactive; the budget is {cfg.samples} "
                            f"(-o samples=...)")
        margin = cfg.margin or rs.default_margin(n)
        found = DirectionSet(n)
        rng = np.random.default_rng(seed)
        forward = (weight.numpy(), bias.numpy())
        report = None if progress is None else \
            (lambda tried, total: progress(tried, total, float(len(found.found))))
        tried = 0
        solved = None
        for _ in range(MAX_RETRIES):
            if limit.expired() or tried >= cfg.samples:
                break
            tried += sample_directions(grad, found, samples=cfg.samples - tried,
                                          seconds=limit.left(), margin=margin, rng=rng,
                                          layer=forward, batch=cfg.batch, progress=report)
            if len(found.found) == n - 1:
                found.add(last_direction(grad, found.columns(), forward, margin))
            if len(found.found) == n - 1 and not limit.expired() and tried < cfg.samples:
                tried += sample_directions(grad, found, samples=cfg.samples - tried,
                                              seconds=limit.left(), margin=margin, rng=rng,
                                              layer=forward, batch=cfg.batch, stop_at=n,
                                              progress=report)
            if len(found.found) < n:
                break
            solved = solve_checked(grad, found, forward)
            if solved is not None:
                break
            warnings.append("a direction that passed the tests was a mixture (its input's ReLU "
                            "pattern disagreed): dropped, the search went on")
        extras: dict[str, object] = {
            "layer": layer.name, "directions_found": len(found.found), "sets_tried": tried,
            "expected_sets": float(expected), "search_s": limit.elapsed()}
        shape = observation.image_shape
        image_input = starts_with_linear(observation, layer)
        if solved is None:
            truncated = limit.reason(f"{tried} of {cfg.samples} sampled sets") \
                if tried < cfg.samples and limit.expired() else None
            warnings.append(
                f"spear found {len(found.found)} of {n} inputs' directions in {tried} sets "
                f"({limit.elapsed():.0f} s): too few to solve the batch, so every slot is "
                + ("padding; the safety time limit cut the search (truncated)" if truncated
                   else "padding; raise samples, or use cocktail-party for large batches"))
            empty = torch.zeros(n, *shape, device=device)
            return Reconstruction(images=empty if image_input else empty[:0],
                                  labels=recover_labels(observation).to(device),
                                  objective=math.inf, iterations=tried, extras=extras,
                                  warnings=warnings,
                                  padding=list(range(n)) if image_input else [],
                                  truncated=truncated)
        assert solved is not None
        inputs, agreement = solved
        extras["relu_agreement_min"] = float(agreement.min())
        recovered = torch.from_numpy(inputs).float()
        if progress is not None:
            progress(tried, cfg.samples, float(n))
        if image_input:
            images = recovered.view(n, *shape).to(device)
            labels = labels_for_inputs(observation, images)
            return Reconstruction(images=images, labels=labels, objective=0.0, iterations=tried,
                                  extras=extras, warnings=warnings)
        return Reconstruction(images=torch.empty(0, *shape, device=device),
                              labels=recover_labels(observation).to(device), objective=0.0,
                              iterations=tried, extras=extras, warnings=warnings,
                              features=recovered.to(device), feature_layer=layer.name)
