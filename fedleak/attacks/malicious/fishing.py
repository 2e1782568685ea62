"""Fishing for user data: one image singled out of a large aggregate by θ alone, then inverted.

Wen et al., ICML 2022: single one image out of a large aggregate by the values of θ alone, over
a few probe rounds, then invert it.

Let the classifier be ``z = W h + b`` (K classes, h the features at its input) with softmax
cross-entropy. The server picks a class c, a unit direction v in feature space and a gate
sharpness α, and sends θ(t) with row c replaced (feature fishing, Sec. 3.2 of the paper):

    W_c = α v,    b_c = −α t      ⇒     z_c = α (⟨v, h(x)⟩ − t).

For a large α the gate is hard: p_c ≈ 1 for inputs whose measurement f(x) = ⟨v, h(x)⟩ exceeds
t and p_c ≈ 0 below. Everything but b_c is the same in θ(t₁) and θ(t₂), so the features h and
every other logit are too, and for each input (any label y)

    ∇L(θ(t₁); x, y) − ∇L(θ(t₂); x, y) = ∇_θ z(x)ᵀ (p(θ(t₁); x) − p(θ(t₂); x)),

the one-hot e_y cancels. With t₁ < t₂ that difference vanishes for every input whose gate is
the same in both rounds and is the gradient of the single input with f in (t₁, t₂] when one
input alone lies there: **the difference of two rounds' updates isolates one image**, however
many users' updates the server sees summed (secure aggregation) — linearity again.

*Counting.* With a mean loss over each user's n images, ∂L/∂b_c = (1/n) Σ (p_c − 1[y = c]), so
n·(∂L/∂b_c(t) − ∂L/∂b_c(+∞)) is the number of inputs with f > t (users of equal n, summed).
The server probes t = +∞ once, then bisects t — starting at the public measurements' quantile
for the wanted rank — until it holds a round with exactly ``rank`` inputs above its threshold
and one with ``rank − 1``: the target is the input with the rank-th largest measurement
(``rank`` 1: the largest). Readings that are not near an integer (an input close to a
threshold, its gate half open) do not count as found.

*Inversion.* The observed difference is the target's gradient difference; the server replays
it with the gate *forced* open and closed (b_c = ±B, B far above any α f), which is smooth in x,
and runs Inverting Gradients (:mod:`fedleak.attacks.optimisation.presets.inverting_gradients`) on it
with the cosine objective. The reconstruction holds the inverted image and the mean image in the
other slots, marked as padding (never the "best image" the victim reports).

Needs FedSGD (a gradient; after several local steps the rounds no longer differ only at the
gate) and users that train on the same images in every round (a fixed local data set); the
attack refuses other set-ups before the first round.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedleak.attacks.attack_registry import register_attack
from fedleak.attacks.base import Progress
from fedleak.attacks.malicious.crafted_parameters import (
    AttackRefused,
    MaliciousAttack,
    ServerKnowledge,
    layer_inputs,
)
from fedleak.attacks.malicious.label_flipping import classifier_names
from fedleak.attacks.observation import Observation, Reconstruction
from fedleak.attacks.optimisation.presets.inverting_gradients import (
    InvertingGradients,
    InvertingGradientsConfig,
)
from fedleak.attacks.replay_contract import Relocatable

#: how far from an integer a count reading may be and still count
COUNT_SLACK = 0.05
#: the forced gates of the replay: b_c = ±FORCE·α·(spread of f)
FORCE = 100.0


@dataclass
class FishingConfig:
    """Which image to fish for, how sharp the gate, how many probes; the inversion's budget."""

    rank: int = field(default=1, metadata={
        "help": "fish the input with the rank-th largest measurement (1: the largest)"})
    target_class: int = field(default=0, metadata={"help": "c, the classifier row used as gate"})
    sharpness: float = field(default=200.0, metadata={
        "help": "alpha times the public measurements' standard deviation: larger makes the "
                "gate harder (and the update larger)"})
    max_probes: int = field(default=16, metadata={"help": "probe rounds before giving up"})
    iterations: int = field(default=1200, metadata={"help": "Inverting Gradients steps"})
    restarts: int = field(default=1, metadata={"help": "Inverting Gradients restarts"})
    tv: float = field(default=1e-2, metadata={"help": "total-variation weight of the inversion"})
    lr: float = field(default=0.1, metadata={"help": "signed-Adam step size of the inversion"})

    def __post_init__(self) -> None:
        """Check rank, probes, class and sharpness; raise ``ValueError`` naming the bad one."""
        if self.rank < 1 or self.max_probes < 2 or self.target_class < 0:
            raise ValueError("rank >= 1, max-probes >= 2 and target-class >= 0 are needed")
        if not (math.isfinite(self.sharpness) and self.sharpness > 0):
            raise ValueError(f"sharpness must be a positive number, got {self.sharpness}")


@dataclass(frozen=True)
class Gate:
    """The fishing construction for one run: row ``c`` of ``weight``/``bias``, direction, α."""

    weight: str
    bias: str
    c: int
    direction: torch.Tensor
    alpha: float
    mean: float
    spread: float

    def at(self, parameters: dict[str, torch.Tensor], threshold: float) -> dict[str, torch.Tensor]:
        """Return a copy of ``parameters`` with row c set to the gate at ``threshold``.

        ``W_c = α v`` and ``b_c = −α t`` (feature fishing, Sec. 3.2 of the paper).
        """
        crafted = {name: tensor.detach().clone() for name, tensor in parameters.items()}
        crafted[self.weight][self.c] = (self.alpha * self.direction).to(crafted[self.weight])
        crafted[self.bias][self.c] = -self.alpha * threshold
        return crafted

    def threshold(self, observation: Observation) -> float:
        """Return the threshold t of the θ an observation was received at (``t = −b_c / α``)."""
        bias = observation.parameter(self.bias)
        return float(-bias[self.c].detach()) / self.alpha


@register_attack("fishing")
class Fishing(MaliciousAttack):
    """Wen et al.'s feature fishing through the classifier, then Inverting Gradients."""

    Config = FishingConfig
    config: FishingConfig
    _gates: dict[tuple[int, int], tuple[ServerKnowledge, Gate]] = {}

    def check(self, knowledge: ServerKnowledge) -> None:
        """FedSGD, the same data every round, a biased classifier with the target class."""
        if knowledge.update_kind != "gradient":
            raise AttackRefused(
                "fishing isolates an image as the difference of two rounds' gradients; the "
                f"victim sends {knowledge.update_kind}s (FedAvg): after several local steps the "
                "rounds differ beyond the gate. Attack a FedSGD victim (--protocol fedsgd)")
        if not knowledge.same_data_each_round:
            raise AttackRefused(
                "fishing needs every probe round to train on the same private images (a user "
                "with a fixed local data set); this victim's pool is larger than its batch, so "
                "each round brings other images: start it with --images covering exactly "
                "--batch-size images per user")
        if self.config.target_class >= knowledge.num_classes:
            raise AttackRefused(f"target-class {self.config.target_class} is not one of the "
                                f"{knowledge.num_classes} classes")
        try:
            classifier_names(knowledge.parameters, knowledge.num_classes)
        except ValueError as err:
            raise AttackRefused(f"fishing needs a classifier layer: {err}") from None

    def gate(self, knowledge: ServerKnowledge, seed: int) -> Gate:
        """Return the run's construction from public data (deterministic in ``seed``).

        Computed once per knowledge and seed: every probe round of a run asks for the same one.
        """
        key = (id(knowledge), seed)
        cached = self._gates.get(key)
        if cached is not None and cached[0] is knowledge:
            return cached[1]
        made = self._make_gate(knowledge, seed)
        self._gates = {key: (knowledge, made)}
        return made

    def _make_gate(self, knowledge: ServerKnowledge, seed: int) -> Gate:
        weight, bias = classifier_names(knowledge.parameters, knowledge.num_classes)
        if bias is None:
            raise AttackRefused(f"the classifier {weight!r} has no bias to gate with")
        layer = weight[: -len(".weight")]
        features = layer_inputs(knowledge.model, knowledge.parameters, knowledge.buffers,
                                knowledge.public_images, layer).double()
        generator = torch.Generator().manual_seed(seed)
        direction = torch.randn(features.shape[1], generator=generator, dtype=torch.float64)
        direction /= direction.norm()
        measured = features @ direction
        spread = float(measured.std()) or 1.0
        return Gate(weight, bias, self.config.target_class, direction,
                    self.config.sharpness / spread, float(measured.mean()), spread)

    def craft(
        self, knowledge: ServerKnowledge, probes: Sequence[Observation], seed: int
    ) -> dict[str, torch.Tensor] | None:
        """Craft θ at the next threshold: +∞ first, then bisect towards ``rank``, ``rank − 1``.

        Returns None once both counts were read, or after ``max_probes`` rounds.
        """
        gate = self.gate(knowledge, seed)
        top = gate.mean + 50 * gate.spread
        if not probes:
            return gate.at(knowledge.parameters, top)
        if len(probes) >= self.config.max_probes:
            return None
        readings = self.readings(gate, probes, knowledge.images_per_user)
        rank = self.config.rank
        if all(any(k == want for _, k, _ in readings) for want in (rank, rank - 1)):
            return None
        want = rank if not any(k == rank for _, k, _ in readings) else rank - 1
        above = [t for t, _, value in readings if value > want]  # too many inputs above t
        below = [t for t, _, value in readings if value < want]
        low = max(above) if above else None
        high = min(below) if below else top
        if low is None:
            total = max(knowledge.images_in_aggregate, rank + 1)
            normal = torch.distributions.Normal(0.0, 1.0)
            z = normal.icdf(torch.tensor(1 - (want + 0.5) / total))  # type: ignore[no-untyped-call]
            guess = gate.mean + gate.spread * float(z)
            tried = [t for t, _, _ in readings[1:]]  # the +∞ round aside
            threshold = min(tried) - gate.spread if tried else min(guess, high - gate.spread)
        elif not below[:-1] and high == top:  # only the +∞ round is below: step upwards
            threshold = low + gate.spread
        else:
            threshold = (low + high) / 2
        return gate.at(knowledge.parameters, threshold)

    def readings(self, gate: Gate, probes: Sequence[Observation], per_user: int
                 ) -> list[tuple[float, int | None, float]]:
        """Read each probe: threshold, count of inputs above it, and the raw reading.

        The count is None when the reading is not near an integer; all are relative to the
        first probe (t = +∞).
        """
        def bias_gradient(observation: Observation) -> float:
            return float(observation.gradient(gate.bias)[gate.c])

        base = bias_gradient(probes[0])
        out = []
        for observation in probes:
            value = per_user * (bias_gradient(observation) - base)
            count = round(value)
            exact = count if abs(value - count) <= COUNT_SLACK else None
            out.append((gate.threshold(observation), exact, value))
        return out

    def recover(
        self,
        observation: Observation,
        *,
        device: torch.device,
        seed: int,
        progress: Progress | None,
    ) -> Reconstruction:
        """Invert the difference of the rounds with ``rank`` and ``rank − 1`` inputs above the gate.

        Inverting Gradients runs on that difference, replayed with the gate forced open and
        closed (:class:`GateDifference`).
        """
        cfg = self.config
        rounds = [*observation.probes, observation]
        weight, bias = classifier_names(observation.named_parameters(),
                                        observation.num_classes)
        if bias is None:
            raise AttackRefused(f"the classifier {weight!r} has no bias")
        row = observation.parameter(weight)[cfg.target_class].detach().double()
        alpha = float(row.norm())
        gate = Gate(weight, bias, cfg.target_class, row / alpha, alpha, 0.0, 1.0)
        per_user = int(observation.metadata.get("images_per_user", "0")) or \
            observation.num_images
        readings = self.readings(gate, rounds, per_user)
        n = observation.num_images
        shape = observation.image_shape
        empty = torch.zeros(n, *shape, device=device)
        opened = next((i for i, (_, k, _) in enumerate(readings) if k == cfg.rank), None)
        closed = next((i for i, (_, k, _) in enumerate(readings) if k == cfg.rank - 1), None)
        counts = [value for _, _, value in readings]
        extras = {"probe_readings": ",".join(f"{v:.2f}" for v in counts),
                  "rounds_used": len(rounds)}
        if opened is None or closed is None:
            return Reconstruction(
                images=empty, labels=torch.full((n,), cfg.target_class, device=device),
                objective=math.inf, iterations=0, extras=extras, padding=list(range(n)),
                warnings=[f"fishing found no pair of rounds with exactly {cfg.rank} and "
                          f"{cfg.rank - 1} inputs above the gate in {len(rounds)} rounds "
                          f"(readings {extras['probe_readings']}); raise max-probes or "
                          "sharpness"])
        first, second = rounds[opened], rounds[closed]
        difference = [a - b for a, b in zip(first.update, second.update, strict=True)]
        spread = abs(gate.threshold(first)) + abs(gate.threshold(second)) + 1.0
        forced = FORCE * spread
        theta = first.named_parameters()
        simulate = first.simulate
        if not isinstance(simulate, Relocatable):
            raise AttackRefused("the observation's replay cannot be moved to other parameters")
        target = dataclasses.replace(
            first, update=difference, update_kind=first.update_kind, num_images=1, probes=[],
            labels=torch.tensor([cfg.target_class], device=device),
            simulate=GateDifference(simulate, gate, theta, forced))
        inversion = InvertingGradients(InvertingGradientsConfig(
            iterations=cfg.iterations, restarts=cfg.restarts, tv=cfg.tv, lr=cfg.lr,
            vectorised=False))
        found = inversion.recover(target, device=device, seed=seed, progress=progress)
        images = empty.clone()
        images[0] = found.images[0]
        extras.update({"opened_round": opened, "closed_round": closed})
        return Reconstruction(
            images=images, labels=torch.full((n,), cfg.target_class, device=device),
            objective=found.objective, iterations=found.iterations, extras=extras,
            padding=list(range(1, n)),
            warnings=[f"fishing inverted one image (the {cfg.rank}. largest measurement) from "
                      f"rounds {opened} and {closed} of {len(rounds)}; the other {n - 1} slots "
                      "hold the mean image"])


class GateDifference:
    """Replay of the observed difference for a candidate input.

    The update with the gate forced open minus the update with it forced closed (smooth in the
    input). A plain replay: it offers no restarts, packing or relocation.
    """

    def __init__(self, simulate: Relocatable, gate: Gate, theta: dict[str, torch.Tensor],
                 forced: float) -> None:
        self.opened = simulate.at(gate.at(theta, -forced))
        self.closed = simulate.at(gate.at(theta, forced))

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """Return the open-gate update minus the closed-gate update for ``images``."""
        return [a - b for a, b in zip(self.opened(images, labels), self.closed(images, labels),
                                      strict=True)]
