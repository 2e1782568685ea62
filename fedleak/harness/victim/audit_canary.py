"""The audit game's public canary: built at the server's θ from its request (a gradient canary
along a Dirac or random direction, an input canary, or a canary client), with its default norm
and how a trial's score is expected to move when the secret coin puts it in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedleak.auditing.canaries import (
    CLIENT,
    DIRAC,
    INPUT,
    dirac,
    input_canary,
    quiet_coordinate,
    random_direction,
)
from fedleak.defenses import DefenseChain
from fedleak.defenses.dpsgd import DPSGD
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.private_update import TrialCanary, per_example_gradients
from fedleak.harness.federated.protocol import FEDSGD, Protocol, local_batches
from fedleak.harness.victim.audit_request import AuditRequest
from fedleak.harness.wire.request_errors import FailedPrecondition, InvalidArgument
from fedleak.harness.zoo.datasets import DatasetInfo, normalize
from fedleak.harness.zoo.text_datasets import is_text, random_text_batch

#: Images of the public synthetic batch that picks a Dirac canary's coordinate.
SYNTHETIC_BATCH = 16
#: A DP-SGD gradient canary is this many times the clip norm by default (clipping binds).
PER_EXAMPLE_CANARY_FACTOR = 10.0


@dataclass
class AuditCanary:
    """The public canary of an audit, and how a trial's score is expected to move with it."""

    kind: str
    direction: str
    norm: float
    #: the unit direction u the server scores along (input canaries: their gradient at θ)
    unit: list[torch.Tensor]
    coordinate: int = -1
    image: torch.Tensor | None = None  # input canary on [0, 1]
    label: int = -1
    score_sign: float = 1.0
    expected_shift: float = 0.0

    def trial_canary(self, info: DatasetInfo) -> TrialCanary:
        """What a canary-in trial adds to the user's computation."""
        if self.kind == INPUT:
            assert self.image is not None
            return TrialCanary(image=normalize(self.image[None], info)[0], label=self.label)
        return TrialCanary(gradient=[self.norm * u for u in self.unit])


def build_canary(request: AuditRequest, chain: DefenseChain, model: nn.Module,
                 parameters: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor],
                 protocol: Protocol, info: DatasetInfo, num_images: int) -> AuditCanary:
    """The public canary of ``request`` at θ, its default norm, and the score's orientation and
    expected shift (0 where public settings do not determine it)."""
    shapes = [tuple(p.shape) for p in parameters.values()]
    per_example = chain.per_example is not None and request.canary != CLIENT
    gradient_kind = protocol.kind == FEDSGD
    if request.canary == INPUT:
        if is_text(info):
            raise InvalidArgument("input canaries are crafted images; audit a text victim "
                                  "with a gradient canary (or a client canary under secagg)")
        image, label = input_canary(info.shape, info.num_classes, request.seed)
        x = normalize(image[None], info).to(next(iter(parameters.values())).device)
        y = torch.tensor([label], device=x.device)
        grads = per_example_gradients(model, dict(parameters), dict(buffers), x, y)
        unit = _unit([g[0] for g in grads])
        return AuditCanary(INPUT, "", 0.0, unit, image=image, label=label,
                           score_sign=1.0 if gradient_kind else -1.0)
    coordinate = -1
    if request.direction == DIRAC:
        coordinate = request.coordinate if request.coordinate is not None else \
            _quiet_coordinate(model, parameters, buffers, info, request.seed)
        total = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
        if not 0 <= coordinate < total:
            raise InvalidArgument(f"coordinate must lie in [0, {total}) (the model's "
                                  f"parameter count), got {coordinate}")
        unit = dirac(shapes, coordinate)
    else:
        unit = random_direction(shapes, request.seed)
    unit = [u.to(p.device, p.dtype) for u, p in zip(unit, parameters.values(), strict=True)]
    norm = request.norm or default_norm(chain, per_example)
    sign, shift = 1.0, norm
    if per_example:
        sign = 1.0 if gradient_kind else -1.0
        shift = _per_example_shift(chain, norm, request.direction, len(shapes), protocol,
                                   num_images)
    return AuditCanary(request.canary, request.direction, norm, unit, coordinate,
                       score_sign=sign, expected_shift=shift)


def default_norm(chain: DefenseChain, per_example: bool) -> float:
    """‖c‖ when the request leaves it 0: DP-SGD's clip norm × 10 (clipping binds), else the
    first clip norm an update defense claims, else 1."""
    if per_example and isinstance(chain.per_example, DPSGD):
        return PER_EXAMPLE_CANARY_FACTOR * chain.per_example.config.max_grad_norm
    for defense in chain.update:
        claim = defense.gaussian_claim()
        if claim is not None and claim.clip_norm is not None:
            return claim.clip_norm
    return 1.0


def _per_example_shift(chain: DefenseChain, norm: float, direction: str, layers: int,
                       protocol: Protocol, num_images: int) -> float:
    """How far a DP-SGD canary moves the score: min(‖c‖, C)/B per step holding it (× τ and
    the steps holding it for FedAvg); 0 where it is not determined (per-layer clipping of a
    random direction, another per-example defense)."""
    defense = chain.per_example
    if not isinstance(defense, DPSGD):
        return 0.0
    c = defense.config
    if c.clipping == "per-layer":
        if direction != DIRAC:
            return 0.0
        clip = c.max_grad_norm / math.sqrt(layers)
    else:
        clip = c.max_grad_norm
    q = defense.sample_rate(num_images, protocol.batch_size)
    if q is not None:
        batch = max(round(q * num_images), 1)
    elif protocol.kind == FEDSGD:
        batch = num_images
    else:
        last = local_batches(num_images, protocol.batch_size)[-1]
        batch = last.stop - last.start
    per_step = min(norm, clip) / batch
    if protocol.kind == FEDSGD:
        return per_step
    steps = protocol.local_epochs if q is None else \
        q * protocol.local_epochs * max(1, round(1 / q))
    return protocol.learning_rate * steps * per_step


def _unit(vectors: list[torch.Tensor]) -> list[torch.Tensor]:
    norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in vectors))
    if not norm > 0:
        raise FailedPrecondition("the input canary has a zero gradient at these parameters; "
                                 "use another canary_seed or a gradient canary")
    return [(v / norm).detach() for v in vectors]


def _quiet_coordinate(model: nn.Module, parameters: Mapping[str, torch.Tensor],
                      buffers: Mapping[str, torch.Tensor], info: DatasetInfo, seed: int) -> int:
    """The coordinate a public synthetic batch (seeded noise images, seeded labels) moves
    least at θ: where a Dirac canary stands out from what data does."""
    generator = torch.Generator().manual_seed(seed)
    if is_text(info):  # seeded random token sequences (text: random sentences)
        inputs, labels = random_text_batch(info, SYNTHETIC_BATCH, generator)
    else:
        inputs = normalize(torch.rand((SYNTHETIC_BATCH, *info.shape), generator=generator),
                           info)
        labels = torch.randint(0, info.num_classes, (SYNTHETIC_BATCH,), generator=generator)
    device = next(iter(parameters.values())).device
    gradient = local_update(model, parameters, {k: v.clone() for k, v in buffers.items()},
                            inputs.to(device), labels.to(device), Protocol())
    return quiet_coordinate(gradient)
