"""The malicious server's probe under SecAgg+: trap weights on the aggregate, and what SecAgg+
buys back.

Under Flower's SecAgg+ the server never holds one node's update, so neither does the probe of
:mod:`~fedleak.harness.flower.probe`: :class:`~fedleak.harness.flower.secagg.aggregate_audit.
AggregateAudit` (``probe="trap-weights"``, ``probe_round=R``) makes workflow round R a probe
round. ``configure_fit`` sends every node the trap weights crafted for the pooled batch (the
first linear layer's units calibrated to fire for p = 1/N of the N = Σ_k n_k inputs behind the
aggregate, :class:`~fedleak.attacks.malicious.crafted_parameters.ServerKnowledge` with ``users =
K``); SecAgg+ masks, quantises and unmasks the nodes' updates as in every round; ``aggregate_fit``
attacks the aggregate with the same attack and returns the parameters from before the probe,
so the round trains nothing (the nodes' updates are discarded); each survivor scores its own
images among the reconstruction, floors included, pooled as the honest rounds are. Its
outcome is recorded under threat model "malicious parameters", apart from the headline: the
images recovered from the aggregate of K nodes, which a per-node probe of the same
deployment without SecAgg+ reads from one node's update alone (bench/flower_probe.py measures
both): the difference is what SecAgg+ buys back against this server. Fishing needs several
probe rounds of one node's update and is refused under SecAgg+.

The workflow runs ``ServerConfig(num_rounds)`` rounds: give it one round more than the
federation trains (``fedleak flower simulate --secagg-plus --probe trap-weights`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedleak.attacks import create_attack
from fedleak.attacks.malicious.crafted_parameters import (
    AttackRefused,
    MaliciousAttack,
    ServerKnowledge,
)
from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.round_outcome import fill_scores, round_record
from fedleak.harness.attacker.update_attack import observation_for
from fedleak.harness.flower.probe import (
    DELTA_OPTIONS,
    PROBE_MARGIN_DB,
    ProbeOutcome,
    ProbeReport,
    public_images,
)
from fedleak.harness.flower.score_answers import ScoreAnswer
from fedleak.harness.metrics.image_metrics import SUCCESS_PSNR
from fedleak.harness.zoo.datasets import DatasetInfo, denormalize, image_shape

AGGREGATE_ATTACKS = ("trap-weights",)


def check_aggregate_probe(attacks: tuple[str, ...]) -> None:
    """ValueError unless every probe attack can run on SecAgg+'s aggregate (module doc)."""
    refused = [a for a in attacks if a not in AGGREGATE_ATTACKS]
    if refused:
        raise ValueError(f"under SecAgg+ the probe runs {', '.join(AGGREGATE_ATTACKS)}; "
                         f"{refused} need(s) several probe rounds of one node's update, which "
                         "the server never holds under SecAgg+")


class AggregateProbe:
    """Trap weights for SecAgg+'s pooled batch, and the outcome of attacking the aggregate."""

    def __init__(self, model: torch.nn.Module, info: DatasetInfo, options: Mapping[str, Any],
                 public: torch.Tensor | None, seed: int, device: str) -> None:
        self.model, self.info, self.seed, self.device = model, info, seed, device
        self.images, source = public_images(info, public)
        attack = create_attack("trap-weights", {**DELTA_OPTIONS["trap-weights"],
                                                **dict(options)})
        assert isinstance(attack, MaliciousAttack)
        self.attack: MaliciousAttack = attack
        self.report = ProbeReport(attacks=["trap-weights"], public_data=source)

    def craft(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
              per_node: int, nodes: int, update_kind: str) -> dict[str, torch.Tensor] | None:
        """θ for the probe round (the honest θ with its first linear layer trapped for the
        N = ``per_node`` · ``nodes`` inputs of the aggregate), or None with the reason
        recorded when the model cannot carry the attack."""
        knowledge = ServerKnowledge(self.model, params, buffers, self.images,
                                    self.report.public_data or "none", image_shape(self.info),
                                    self.info.num_classes, update_kind, per_node, nodes)
        try:
            self.attack.check(knowledge)
            if not len(self.images):
                raise AttackRefused("the server holds no public images like the nodes' to "
                                    "calibrate its traps: pass probe_public= (images on [0, 1])")
            return self.attack.craft(knowledge, [], self.seed)
        except (AttackRefused, ValueError) as err:
            self.report.outcomes.append(ProbeOutcome("trap-weights", "secagg+ aggregate",
                                                     "refused", str(err)))
            return None

    def attack_aggregate(self, server_round: int, received: ReceivedUpdate,
                         params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                         score: Any) -> ProbeOutcome:
        """Attack the probe round's aggregate, have the survivors score it (``score(images,
        labels, padding)`` → their pooled answer) and record the outcome."""
        view = received.metadata.get("server_view", "secagg+ aggregate")
        outcome = ProbeOutcome("trap-weights", view, "attacked", server_round=server_round,
                               probe_rounds=1)
        self.report.outcomes.append(outcome)
        observation = observation_for(self.model, params, buffers, received, self.info,
                                      self.device)
        try:
            found = reconstruct_with_progress(self.attack, observation, device=self.device,
                                              seed=self.seed, label="trap-weights", show=False)
        except Exception as err:  # the probe never stops the audit
            outcome.status, outcome.reason = "failed", f"{type(err).__name__}: {err}"
            return outcome
        images = denormalize(found.images.detach().cpu(), self.info).clamp(0, 1)
        entry = round_record(received, found, None, 0.0)
        answer: ScoreAnswer = score(images, [int(y) for y in found.labels.cpu().tolist()],
                                    list(found.padding))
        fill_scores(entry, answer[0])
        entry.unscored = answer[2]
        entry.server_view = view
        outcome.round = entry
        if entry.images:
            outcome.images = len(entry.images)
            outcome.recovered = sum(
                1 for i in entry.images if not i.padding and i.psnr >= SUCCESS_PSNR
                and i.floor_psnr is not None and i.psnr - i.floor_psnr >= PROBE_MARGIN_DB)
        return outcome
