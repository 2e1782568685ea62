"""The audit game's public canary: built at the server's θ from its request (a gradient canary
along a Dirac or random direction, an input canary, or a canary client), with its default norm
and how a trial's score is expected to move when the secret coin puts it in — all read from
the chain's declarations, never from a defense's class.

With coverage (the default) an update-stage Dirac canary spreads over the quietest coordinate
of every parameter tensor (:mod:`~fedleak.harness.victim.audit.coverage`), so one canary
probes every tensor and the clip's geometry.
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
    input_canary,
    random_direction,
    split_flat,
)
from fedleak.defenses import DefenseChain
from fedleak.defenses.mechanism import TOTAL
from fedleak.harness.federated.local_update import local_update
from fedleak.harness.federated.private_update import TrialCanary, per_example_gradients
from fedleak.harness.federated.protocol import FEDSGD, Protocol
from fedleak.harness.victim.audit.coverage import declared_clip, quiet_order
from fedleak.harness.victim.audit.request import AuditRequest
from fedleak.harness.victim.audit.steps import step_plan
from fedleak.harness.wire.request_errors import FailedPrecondition, InvalidArgument
from fedleak.harness.zoo.datasets import DatasetInfo, normalize
from fedleak.harness.zoo.text.text_datasets import is_text, random_text_batch

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
    #: Dirac canaries: the canary c as (flat coordinates, values), for the coverage
    sparse: tuple[np.ndarray, np.ndarray] | None = None
    #: |g| per flat coordinate of a public synthetic batch at θ (Dirac canaries)
    quietness: np.ndarray | None = None

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
    names = list(parameters)
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
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
        quiet = _quietness(model, parameters, buffers, info, request.seed) \
            if per_example and request.coverage else None
        return AuditCanary(INPUT, "", 0.0, unit, image=image, label=label,
                           score_sign=1.0 if gradient_kind else -1.0, quietness=quiet)
    norm = request.norm or default_norm(chain, per_example)
    coordinate, sparse, quietness = -1, None, None
    if request.direction == DIRAC:
        quietness = _quietness(model, parameters, buffers, info, request.seed)
        total = sum(sizes)
        if request.coordinate is not None and not 0 <= request.coordinate < total:
            raise InvalidArgument(f"coordinate must lie in [0, {total}) (the model's "
                                  f"parameter count), got {request.coordinate}")
        if per_example or request.coordinate is not None or not request.coverage \
                or len(sizes) == 1:
            coordinate = request.coordinate if request.coordinate is not None else \
                int(np.argmin(quietness))
            sparse = (np.array([coordinate]), np.array([norm]))
        else:  # the update stage's one canary: the quietest coordinate of every tensor
            coords = np.array([int(o[0]) for o in quiet_order(quietness, sizes)])
            sparse = (coords, np.full(coords.size, norm / math.sqrt(coords.size)))
            coordinate = int(coords[0])
        flat = torch.zeros(total)
        flat[torch.from_numpy(sparse[0])] = torch.from_numpy(sparse[1]).float()
        unit = split_flat(flat / flat.norm(), shapes)
    else:
        unit = random_direction(shapes, request.seed)
    unit = [u.to(p.device, p.dtype) for u, p in zip(unit, parameters.values(), strict=True)]
    sign, shift = 1.0, _update_shift(chain, norm)
    if per_example:
        sign = 1.0 if gradient_kind else -1.0
        shift = _per_example_shift(chain, norm, unit, names, sizes, protocol, num_images)
    return AuditCanary(request.canary, request.direction, norm, unit, coordinate,
                       score_sign=sign, expected_shift=shift, sparse=sparse,
                       quietness=quietness)


def default_norm(chain: DefenseChain, per_example: bool) -> float:
    """‖c‖ when the request leaves it 0: ten times the declared clip norm (per-example, or the
    update stage's first), so the clip binds and is tested; 1 without a declared clip."""
    if per_example:
        declared = chain.per_example_mechanism
        if declared is not None and declared.clip is not None:
            return PER_EXAMPLE_CANARY_FACTOR * declared.clip.norm
        return 1.0
    for _, clip in chain.update_composition().clips:
        return PER_EXAMPLE_CANARY_FACTOR * clip.norm
    return 1.0


def _update_shift(chain: DefenseChain, norm: float) -> float:
    """The public (nominal) shift of an update-stage canary: its norm, at most the first
    declared total clip's bound (the canary then dominates what is clipped)."""
    for _, clip in chain.update_composition().clips:
        if clip.geometry == TOTAL:
            return min(norm, clip.norm)
    return norm


def _per_example_shift(chain: DefenseChain, norm: float, unit: list[torch.Tensor],
                       names: list[str], sizes: list[int], protocol: Protocol,
                       num_images: int) -> float:
    """How far a per-example canary moves the score, by the declaration: its declared clip
    along u over the expected batch size per step holding it, times the steps' weights in the
    release (FedAvg: τ and momentum); 0 where nothing is declared."""
    declared = chain.per_example_mechanism
    if declared is None or declared.clip is None:
        return 0.0
    flat = torch.cat([u.detach().double().cpu().flatten() for u in unit])
    coords = torch.nonzero(flat).flatten().numpy()
    values = (norm * flat[coords]).numpy()
    clipped = declared_clip(coords, values, declared.clip, names, sizes)
    along = float(clipped @ (values / np.linalg.norm(values)))
    plan = step_plan(protocol, num_images,
                     declared.sampling.poisson_rate(num_images, protocol.batch_size))
    return plan.shift(along / plan.batch)[0]


def _unit(vectors: list[torch.Tensor]) -> list[torch.Tensor]:
    norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in vectors))
    if not norm > 0:
        raise FailedPrecondition("the input canary has a zero gradient at these parameters; "
                                 "use another canary_seed or a gradient canary")
    return [(v / norm).detach() for v in vectors]


def _quietness(model: nn.Module, parameters: Mapping[str, torch.Tensor],
               buffers: Mapping[str, torch.Tensor], info: DatasetInfo, seed: int) -> np.ndarray:
    """|g_j| of a public synthetic batch (seeded noise images, seeded labels) at θ, per flat
    coordinate: where a Dirac canary stands out from what data does (small is quiet)."""
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
    return torch.cat([g.detach().flatten().abs().double().cpu() for g in gradient]).numpy()
