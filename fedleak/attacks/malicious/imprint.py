"""Imprint attack of "Robbing the Fed" (Fowl et al., ICLR 2022): exact inputs from an aggregate.

The user runs a model with an imprint block (:mod:`fedleak.attacks.malicious.imprint_block`) that
the server designed; the server sets the block's values for the round (Sec. 3 of the paper):

    W₀[i] = s·m,   b₀[i] = −s·c_i   (i = 1..k, c_1 < … < c_k),   W₁[:, i] = ε·u  for every i,

with ``m`` a unit *measurement* direction (``brightness``: the mean of the normalised pixels;
``random``: a fixed random direction), ``c_i`` cut-offs at the ``i/(k+1)`` quantiles of the
measurement ⟨m, x⟩ over public data (of a normal fitted to it, by default, or the empirical
ones), so the k+1 intervals are about equally likely, and ``u`` a fixed unit vector. Unit i
is active for exactly the inputs with ⟨m, x⟩ > c_i, and since every column of W₁ is the
same, every unit passes the same back-propagated value g_n = ε⟨u, δ_n⟩ for input n (δ_n the loss
gradient at the block's output). For a mean loss over N inputs

    ∂L/∂W₀[i] = (1/N) Σ_{n: ⟨m,x_n⟩ > c_i} g_n x_nᵀ,     ∂L/∂b₀[i] = (1/N) Σ_{n: ⟨m,x_n⟩ > c_i} g_n,

so consecutive rows differ by the inputs of one interval (c_i, c_{i+1}] (the last row alone
holds (c_k, ∞)), and for an interval holding a single input (eq. 3 of the paper)

    x_n = (∂L/∂W₀[i] − ∂L/∂W₀[i+1]) / (∂L/∂b₀[i] − ∂L/∂b₀[i+1])     exactly.

The maths is linear in the update, so it holds unchanged for the **sum of several users'
updates** (secure aggregation: the server sees only the sum, and still reads single inputs), and
for a **FedAvg delta** (E local steps of SGD at rate τ: Δ = −τ Σ_t ∇L_t, and the ratio of the
summed differences is still x_n) as long as no input crosses a cut-off during local training —
true for small τ·E; an input that crosses one is lost or blurred. Intervals with two or more
inputs give a g-weighted mixture. The expected number of single-input intervals is printed
beside each result by :mod:`fedleak.attacks.malicious.imprint_guarantee`.

The reconstruction holds one image per non-empty interval (single inputs first, judged by the
consistency test below), padded with the mean public image up to the number of private images
(those slots marked as padding); the victim then matches and scores them, and counts the exact
recoveries as the largest one-to-one matching at ≥ 40 dB.
An interval's candidate is *consistent* when its own measurement falls inside the interval and
its pixels inside the valid box (a mixture with weights of both signs fails this).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress
from fedleak.attacks.labels import recover_labels
from fedleak.attacks.malicious.crafted_parameters import (
    CUT_METHODS,
    AttackRefused,
    MaliciousAttack,
    ServerKnowledge,
    cut_offs,
)
from fedleak.attacks.malicious.imprint_block import BIAS0, BIAS1, WEIGHT0, WEIGHT1
from fedleak.attacks.malicious.imprint_guarantee import expected_single_bins
from fedleak.attacks.observation import Observation, Reconstruction

MEASUREMENTS = ("brightness", "random")


@dataclass
class ImprintConfig:
    """How the server sets the imprint block's values, and how it reads the bins back."""

    measurement: str = field(default="random", metadata={
        "help": "the direction m every bin measures: brightness (mean normalised pixel) or "
                "random (a fixed random unit direction)"})
    cuts: str = field(default="gaussian", metadata={
        "help": "where the k cut-offs go: gaussian (at the i/(k+1) quantiles of a normal fitted "
                "to the public measurements; smooth even with little public data) or quantiles "
                "(the public measurements' empirical quantiles)"})
    scale: float = field(default=1e-3, metadata={
        "help": "s: W0 rows are s*m, biases -s*c_i (small keeps θ small beside the update: a "
                "FedAvg delta θ' - θ in float32 keeps its precision)"})
    feedback: float = field(default=1.0, metadata={
        "help": "epsilon: every column of W1 is epsilon*u (u a fixed unit vector); larger "
                "makes each bin's gradient larger and the inner model's input more perturbed"})
    threshold: float = field(default=1e-6, metadata={
        "help": "an interval is empty when |bias-gradient difference| <= threshold * the "
                "largest one"})
    box_tolerance: float = field(default=0.02, metadata={
        "help": "a candidate is consistent when its pixels lie within [0, 1] widened by this"})

    def __post_init__(self) -> None:
        """Check the choices and positive numbers; raise ``ValueError`` naming the bad one."""
        if self.cuts not in CUT_METHODS:
            raise ValueError(f"cuts must be one of {CUT_METHODS}, got {self.cuts!r}")
        if self.measurement not in MEASUREMENTS:
            raise ValueError(f"measurement must be one of {MEASUREMENTS}, got "
                             f"{self.measurement!r}")
        for key in ("scale", "feedback", "threshold", "box_tolerance"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a positive number, got {value}")


@register_attack("imprint")
class Imprint(MaliciousAttack):
    """Robbing the Fed's binning attack on a server-designed imprint block."""

    server_role: ClassVar[str] = "malicious-architecture"
    Config = ImprintConfig
    config: ImprintConfig

    def check(self, knowledge: ServerKnowledge) -> None:
        """Refuse a model that does not start with an imprint block (``--model imprint:...``)."""
        missing = [n for n in (WEIGHT0, BIAS0, WEIGHT1, BIAS1) if n not in knowledge.parameters]
        if missing:
            raise AttackRefused(
                "the victim's model has no imprint block (parameters "
                f"{', '.join(missing)} are missing): the imprint attack needs the user to run a "
                "server-designed architecture; start the victim with --model "
                "imprint:bins=256,inner=NAME (malicious architecture), or use trap-weights or "
                "fishing, which only craft parameter values")

    def craft(
        self, knowledge: ServerKnowledge, probes: Sequence[Observation], seed: int
    ) -> dict[str, torch.Tensor] | None:
        """One round: the block set to bins at the public measurement's quantiles."""
        if probes:
            return None
        cfg = self.config
        weight0 = knowledge.parameters[WEIGHT0]
        bins, pixels = weight0.shape
        generator = torch.Generator().manual_seed(seed)
        measurement = self.measurement(pixels, generator)
        values = knowledge.public_images.flatten(1).double() @ measurement
        levels = torch.arange(1, bins + 1, dtype=torch.float64) / (bins + 1)
        cuts = cut_offs(values, levels, cfg.cuts)
        direction = torch.randn(pixels, generator=generator, dtype=torch.float64)
        direction /= direction.norm()
        crafted = {name: tensor.detach().clone() for name, tensor in
                   knowledge.parameters.items()}
        dtype, device = weight0.dtype, weight0.device
        crafted[WEIGHT0] = (cfg.scale * measurement).expand(bins, pixels).to(dtype, copy=True)
        crafted[BIAS0] = (-cfg.scale * cuts).to(dtype)
        crafted[WEIGHT1] = (cfg.feedback * direction)[:, None].expand(pixels, bins) \
            .to(dtype, copy=True)
        crafted[BIAS1] = torch.zeros(pixels, dtype=dtype)
        return {name: tensor.to(device) for name, tensor in crafted.items()}

    def measurement(self, pixels: int, generator: torch.Generator) -> torch.Tensor:
        """Return the unit measurement direction m (float64).

        Brightness (``1/√d`` everywhere) or a random unit vector drawn from ``generator``.
        """
        if self.config.measurement == "brightness":
            return torch.full((pixels,), 1 / math.sqrt(pixels), dtype=torch.float64)
        m = torch.randn(pixels, generator=generator, dtype=torch.float64)
        unit: torch.Tensor = m / m.norm()
        return unit

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Read single inputs from consecutive bins' gradient differences (module docstring)."""
        cfg = self.config
        names = observation.parameter_names
        missing = [n for n in (WEIGHT0, BIAS0) if n not in names]
        if missing:
            raise AttackRefused(f"the observed update has no imprint block ({missing})")
        g_w = observation.gradient(WEIGHT0).detach().double()
        g_b = observation.gradient(BIAS0).detach().double()
        weight0 = observation.parameter(WEIGHT0).detach().double()
        bias0 = observation.parameter(BIAS0).detach().double()
        scale = weight0[0].norm()
        measurement = weight0[0] / scale
        cuts = -bias0 / scale
        order = torch.argsort(cuts)  # rows by increasing cut-off
        g_w, g_b, cuts = g_w[order], g_b[order], cuts[order]
        zero_w, zero_b = g_w.new_zeros(1, g_w.shape[1]), g_b.new_zeros(1)
        d_w = g_w - torch.cat([g_w[1:], zero_w])
        d_b = g_b - torch.cat([g_b[1:], zero_b])
        upper = torch.cat([cuts[1:], cuts.new_full((1,), math.inf)])
        largest = d_b.abs().max()
        nonempty = d_b.abs() > cfg.threshold * largest if float(largest) > 0 else \
            torch.zeros_like(d_b, dtype=torch.bool)
        candidates = d_w[nonempty] / d_b[nonempty, None]
        low, high = observation.image_bounds(candidates.device)
        shape = observation.image_shape
        images = candidates.view(-1, *shape)
        tolerance = cfg.box_tolerance * (high - low)
        in_box = ((images >= low.double() - tolerance) & (images <= high.double() + tolerance)) \
            .flatten(1).all(1)
        measured = candidates @ measurement
        in_bin = (measured > cuts[nonempty] - 1e-6) & (measured <= upper[nonempty] + 1e-6)
        consistent = in_box & in_bin
        ranked = torch.cat([torch.nonzero(consistent).flatten(),
                            torch.nonzero(~consistent).flatten()])
        n = observation.num_images
        chosen = images[ranked[:n]].float()
        fill = n - chosen.shape[0]
        if fill > 0:
            chosen = torch.cat([chosen, torch.zeros(fill, *shape)])  # the data set's mean image
        bins = int(g_b.shape[0])
        expected = expected_single_bins(bins, n)
        warnings = []
        if observation.update_kind == "delta" and observation.local_steps > 1:
            warnings.append(f"the update is a FedAvg delta over {observation.local_steps} local "
                            "steps: exact while no image crosses a bin's cut-off during local "
                            "training (small learning rate)")
        if progress is not None:
            progress(1, 1, 0.0)
        return Reconstruction(
            images=chosen.to(device), labels=recover_labels(observation).to(device),
            objective=0.0, iterations=1, warnings=warnings,
            padding=list(range(n - max(fill, 0), n)),
            extras={"bins": bins, "nonempty_bins": int(nonempty.sum()),
                    "consistent_bins": int(consistent.sum()),
                    "expected_exact_multinomial": expected.multinomial,
                    "expected_exact_paper": expected.paper})
