"""The malicious server's view of the same deployment: a probe round, opt-in.

An honest server's attack on FedAvg over many shuffled images may recover nothing; the
question a deployer must also answer is what a server that crafts its parameters reads from
the same federation. After the federation's last round (and after the honest updates are
attacked and scored), ``LeakageAudit(..., probe=("trap-weights", "fishing"))`` runs fedleak's
malicious-server attacks (:mod:`fedleak.attacks.malicious`, unchanged) against the same nodes,
over the same Flower grid:

1. the server's knowledge (:class:`~fedleak.attacks.malicious.crafted_parameters.ServerKnowledge`):
   the deployment's own model and its final global θ, public images like the nodes' (a bundled
   data set's other split, or ``probe_public`` images the caller holds), each node's batch
   size n as its honest replies stated it, the update kind of the stated procedure;
2. the attack's :meth:`~fedleak.attacks.malicious.crafted_parameters.MaliciousAttack.check` — a
   model or procedure it cannot carry is *said in words* (trap weights need a first linear layer
   over the input followed by ReLU; fishing needs one-step FedSGD on a fixed local data set) and
   nothing is sent;
3. probe rounds: each node receives train messages with the attack's crafted θ (trap weights
   on the first linear layer; fishing's gate thresholds, round after round until it has its
   pair) and the round's train config with its own ``server-round``, trains on its batch as it
   always does, and replies; the replies are **discarded** — never passed to the inner
   strategy, so the model the federation trained is what it was — and read as the honest
   rounds are (:meth:`~fedleak.harness.flower.leakage_audit.LeakageAudit.received`);
4. the attack reconstructs from them, the node scores the reconstruction against the batch it
   trained on in the probe round (floors included), and the outcome is recorded under threat
   model ``malicious parameters`` in ``metrics.json``'s ``malicious_probe``, apart from the
   honest headline (``summary`` never counts it);
5. a node whose ClientApp vets θ (``vet``, :mod:`fedleak.defenses.vet`) refuses the crafted
   round: recorded as what vet buys back (nothing of that node leaks to the probe). Under
   SecAgg+ the server never sees one node's update:
   :class:`~fedleak.harness.flower.secagg.aggregate_audit.AggregateAudit`'s probe attacks the
   aggregate instead and says what it buys back.

Trap weights read exact inputs when every node takes one local step (FedSGD, or FedAvg with
one batch per epoch and one epoch); after several steps the rows mix the trajectory and the
probe says the replay is inexact. On FedAvg deltas the probe groups agreeing rows at a
relative tolerance of 1e-2 (:data:`DELTA_OPTIONS`): the node's θ′ is float32, and a trapped
row's ratio carries its rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedleak.attacks import create_attack
from fedleak.attacks.malicious.crafted_parameters import (
    AttackRefused,
    MaliciousAttack,
    ServerKnowledge,
)
from fedleak.attacks.observation import Observation
from fedleak.harness.attacker.attack_progress import reconstruct_with_progress
from fedleak.harness.attacker.client import ReceivedUpdate
from fedleak.harness.attacker.records import RoundRecord
from fedleak.harness.attacker.round_outcome import fill_scores, round_record
from fedleak.harness.attacker.server_knowledge import BUNDLED, OTHER_SPLIT
from fedleak.harness.attacker.update_attack import observation_for
from fedleak.harness.flower.arrays import record_of, split_state, tensors
from fedleak.harness.flower.score_answers import ask_nodes, read_answer, score_query
from fedleak.harness.metrics.floors import NOTHING_RECOVERED
from fedleak.harness.metrics.image_metrics import SUCCESS_PSNR
from fedleak.harness.zoo.datasets import DatasetInfo, denormalize, image_shape, load_dataset
from fedleak.harness.zoo.datasets import normalize as normalise

THREAT_MODEL = "malicious parameters"
#: options the probe gives an attack on FedAvg deltas unless the caller sets them: a node's
#: θ′ = θ − τg is rounded to float32, so Δ = θ′ − θ carries a relative error of about 1e-3 on
#: a trapped row, and rows that fire for one input agree to about that, not to 1e-4 (measured:
#: 64 digits on mlp:width=1000, one step at τ = 0.1: 1 input confirmed at 1e-4, 64 at 1e-2)
DELTA_OPTIONS: dict[str, dict[str, Any]] = {"trap-weights": {"tolerance": 1e-2}}
PROBE_ATTACKS = ("trap-weights", "fishing")
#: the margin over the floor the probe's headline count asks for (issue 49's figure)
PROBE_MARGIN_DB = 5.0


@dataclass
class ProbeOutcome:
    """One malicious attack on one node (or the aggregate): what it recovered, or why not."""

    attack: str
    node: str
    status: str  # attacked, refused (the attack cannot run here), vetted, failed
    reason: str | None = None
    probe_rounds: int = 0
    server_round: int | None = None
    #: images recovered at >= 20 dB and >= PROBE_MARGIN_DB above their floor (matched images)
    recovered: int | None = None
    images: int | None = None
    round: RoundRecord | None = None

    def line(self) -> str:
        """One line of the probe's summary."""
        if self.status != "attacked" or self.round is None:
            return f"{self.attack} on {self.node}: {self.status}: {self.reason}"
        r = self.round
        if r.mean_psnr is None:
            return (f"{self.attack} on {self.node}: attacked in {self.probe_rounds} probe "
                    f"round(s), unscored: {r.unscored}")
        floor = r.floors.mean_psnr if r.floors is not None else None
        words = f": {NOTHING_RECOVERED}" if r.floors is not None and r.floors.above == 0 else ""
        return (f"{self.attack} on {self.node}: {self.recovered} of {self.images} image(s) at "
                f">= {SUCCESS_PSNR:g} dB and >= {PROBE_MARGIN_DB:g} dB above their floor; "
                f"mean PSNR {r.mean_psnr:.2f} dB"
                + (f", floor {floor:.2f} dB{words}" if floor is not None else "")
                + f" ({self.probe_rounds} probe round(s)"
                + (f", {r.replay} replay" if r.replay != "exact" else "") + ")")


@dataclass
class ProbeReport:
    """The probe's part of ``metrics.json`` (``malicious_probe``), apart from the headline."""

    threat_model: str = THREAT_MODEL
    attacks: list[str] = field(default_factory=list)
    public_data: str | None = None
    #: the probe rounds' node updates never reach the inner strategy
    training: str = ("the probe rounds' node updates were discarded: the model the "
                     "federation trained is unchanged by them")
    outcomes: list[ProbeOutcome] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        """The probe's lines, under their threat model, never the honest headline's."""
        head = (f"malicious server (threat model: {self.threat_model}; probe round(s) after "
                f"the federation, {self.training[len('the probe rounds ') :]}):")
        return [head, *(f"  {o.line()}" for o in self.outcomes)]


@dataclass
class ProbeSettings:
    """What the caller asks of the probe: the attacks, their options, the public images."""

    attacks: tuple[str, ...]
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: public images like the nodes' on [0, 1] (None: the bundled data set's other split)
    public: torch.Tensor | None = None

    @classmethod
    def of(cls, probe: str | Sequence[str] | None,
           options: Mapping[str, Mapping[str, Any]] | None,
           public: torch.Tensor | None) -> ProbeSettings | None:
        """Checked settings (None: no probe); ValueError names what to change."""
        if not probe:
            return None
        attacks = (probe,) if isinstance(probe, str) else tuple(probe)
        unknown = [a for a in attacks if a not in PROBE_ATTACKS]
        if unknown:
            raise ValueError(f"probe attacks are {', '.join(PROBE_ATTACKS)}; got {unknown}")
        for name in attacks:
            create_attack(name, dict((options or {}).get(name, {})))  # bad options: now
        return cls(attacks, dict(options or {}), public)


class Nodes(Protocol):
    """What the probe needs of the audit: the model, reading a reply as the honest rounds'."""

    model: torch.nn.Module
    info: DatasetInfo
    device: str
    seed: int
    score_timeout: float
    log: Callable[[str], None]

    def sent_to(self, node: int, theta: dict[str, torch.Tensor],
                config: dict[str, Any]) -> None:
        """Remember what went to ``node`` this round (the θ its reply answers)."""

    def received(self, server_round: int, reply: Message, name: str
                 ) -> tuple[ReceivedUpdate, dict[str, torch.Tensor], dict[str, torch.Tensor],
                            list[str], list[str]]:
        """The update a reply carries, as the audit reads it for the honest rounds."""


def public_images(info: DatasetInfo, given: torch.Tensor | None) -> tuple[torch.Tensor, str]:
    """The server's public images in the model's input space, and where they come from
    (empty when there are none: an attack that needs them then says so)."""
    if given is not None:
        return normalise(given.float(), info), f"{given.shape[0]} public images (probe_public)"
    if info.name in BUNDLED:
        split = OTHER_SPLIT["train"]
        data = load_dataset(info.name, split)
        return normalise(data.images, info), f"{info.name} {split} split ({len(data)} images)"
    return torch.zeros(0, *info.shape), "none"


class MaliciousProbe:
    """Runs the probe rounds of :class:`ProbeSettings` over a grid (module docstring)."""

    def __init__(self, audit: Nodes, settings: ProbeSettings) -> None:
        self.audit, self.settings = audit, settings
        self.images, source = public_images(audit.info, settings.public)
        self.report = ProbeReport(attacks=list(settings.attacks), public_data=source)

    def run(self, grid: Grid, state: Mapping[str, torch.Tensor], config: Mapping[str, Any],
            nodes: Mapping[int, tuple[str, int]], first_round: int, update_kind: str,
            keys: tuple[str, str] = ("arrays", "config")) -> ProbeReport:
        """Every probe attack on every node (``nodes``: Flower node id → (name, n)), at the
        final θ ``state`` with the honest rounds' train ``config``, from server round
        ``first_round`` on (one per attack); ``update_kind`` as the stated procedure implies
        (``gradient``: one-step FedSGD, ``delta``: FedAvg)."""
        for i, name in enumerate(self.settings.attacks):
            self._attack(name, grid, dict(state), dict(config), nodes, first_round + i,
                         update_kind, keys)
        return self.report

    def _knowledge(self, state: Mapping[str, torch.Tensor], n: int, update_kind: str
                   ) -> ServerKnowledge:
        params, buffers = split_state(self.audit.model, state)
        info = self.audit.info
        return ServerKnowledge(self.audit.model, params, buffers, self.images,
                               self.report.public_data or "none", image_shape(info),
                               info.num_classes, update_kind, n)

    def _attack(self, name: str, grid: Grid, state: dict[str, torch.Tensor],
                config: dict[str, Any], nodes: Mapping[int, tuple[str, int]], server_round: int,
                update_kind: str, keys: tuple[str, str]) -> None:
        """One attack's probe rounds on every node, then its reconstructions scored."""
        options = {**(DELTA_OPTIONS.get(name, {}) if update_kind == "delta" else {}),
                   **self.settings.options.get(name, {})}
        attack = create_attack(name, options)
        assert isinstance(attack, MaliciousAttack)
        knowledge = {node: self._knowledge(state, n, update_kind)
                     for node, (_, n) in nodes.items()}
        active: dict[int, tuple[dict[str, torch.Tensor], list[Observation]]] = {}
        for node, (label, _) in nodes.items():
            try:
                attack.check(knowledge[node])
                if not len(self.images):
                    raise AttackRefused("the server holds no public images like the nodes' to "
                                        "calibrate its parameters: pass probe_public= (images "
                                        "on [0, 1]) to LeakageAudit")
                crafted = attack.craft(knowledge[node], [], self.audit.seed)
            except (AttackRefused, ValueError) as err:
                self._outcome(name, label, "refused", str(err))
                continue
            if crafted is not None:
                active[node] = (crafted, [])
        if active:
            self.audit.log(f"malicious probe: {name} on {len(active)} node(s), server round "
                           f"{server_round} (their updates are discarded from training)")
        finished: dict[int, tuple[Observation, ReceivedUpdate, list[str]]] = {}
        while active:
            got = self._probe_round(grid, state, config, active, nodes, server_round, keys, name)
            for node, (observation, received, inexact) in got.items():
                _, probes = active.pop(node)
                following = attack.craft(knowledge[node], [*probes, observation],
                                         self.audit.seed)
                if following is None:
                    observation.probes = probes
                    finished[node] = (observation, received, inexact)
                else:
                    active[node] = (following, [*probes, observation])
        for node, (observation, received, inexact) in finished.items():
            self._reconstruct(attack, name, grid, node, nodes[node][0], observation, received,
                              inexact, server_round)

    def _probe_round(self, grid: Grid, state: dict[str, torch.Tensor],
                     config: dict[str, Any],
                     active: dict[int, tuple[dict[str, torch.Tensor], list[Observation]]],
                     nodes: Mapping[int, tuple[str, int]], server_round: int,
                     keys: tuple[str, str], name: str
                     ) -> dict[int, tuple[Observation, ReceivedUpdate, list[str]]]:
        """One probe round: each active node's crafted θ sent, its reply read (or its refusal
        recorded, the node then leaving the probe)."""
        sent = {node: {**state, **crafted} for node, (crafted, _) in active.items()}
        sent_config = {**config, "server-round": server_round}
        messages = [Message(RecordDict({keys[0]: record_of(theta),
                                        keys[1]: ConfigRecord(sent_config)}),
                            dst_node_id=node, message_type="train")
                    for node, theta in sent.items()]
        replies = {r.metadata.src_node_id: r for r in
                   grid.send_and_receive(messages, timeout=self.audit.score_timeout)}
        out: dict[int, tuple[Observation, ReceivedUpdate, list[str]]] = {}
        for node in list(active):
            label = nodes[node][0]
            reply = replies.get(node)
            if reply is None:
                self._outcome(name, label, "failed", "the node did not answer the probe round")
                active.pop(node)
                continue
            if reply.has_error():
                reason = reply.error.reason or ""
                vetted = "vet" in reason
                self._outcome(name, label, "vetted" if vetted else "failed",
                              ("the node refused the crafted parameters: " if vetted else
                               "the node failed: ") + reason.strip().splitlines()[-1]
                              if reason.strip() else "no reason given")
                active.pop(node)
                continue
            try:
                self.audit.sent_to(node, sent[node], sent_config)
                received, params, buffers, _, inexact = self.audit.received(server_round, reply,
                                                                            label)
                observation = observation_for(self.audit.model, params, buffers, received,
                                              self.audit.info, self.audit.device)
            except Exception as err:  # recorded, the other nodes go on
                self._outcome(name, label, "failed", f"{type(err).__name__}: {err}")
                active.pop(node)
                continue
            out[node] = (observation, received, inexact)
        return out

    def _reconstruct(self, attack: MaliciousAttack, name: str, grid: Grid, node: int,
                     label: str, observation: Observation, received: ReceivedUpdate,
                     inexact: list[str], server_round: int) -> None:
        """Reconstruct from the node's probe rounds, have the node score it, record it."""
        try:
            found = reconstruct_with_progress(attack, observation, device=self.audit.device,
                                              seed=self.audit.seed, label=name, show=False)
        except Exception as err:  # the probe never stops the audit
            self._outcome(name, label, "failed", f"the attack failed: {type(err).__name__}: "
                                                 f"{err}")
            return
        images = denormalize(found.images.detach().cpu(), self.audit.info).clamp(0, 1)
        labels = [int(y) for y in found.labels.cpu().tolist()]
        entry = _record(dataclasses.replace(received, round_id=f"probe-{server_round}/{label}"),
                        found, inexact)
        query = score_query(server_round, node, images, labels, padding=list(found.padding))
        answers = ask_nodes(grid, [query], self.audit.score_timeout)
        answer, partition = read_answer(next(iter(answers.values()), None),
                                        self.audit.score_timeout)
        score, _, unscored = answer
        fill_scores(entry, score)
        entry.unscored, entry.partition = unscored, partition
        outcome = self._outcome(name, label, "attacked", None)
        outcome.probe_rounds = len(observation.probes) + 1
        outcome.server_round, outcome.round = server_round, entry
        if entry.images:
            outcome.images = len(entry.images)
            outcome.recovered = sum(
                1 for i in entry.images if not i.padding and i.psnr >= SUCCESS_PSNR
                and i.floor_psnr is not None and i.psnr - i.floor_psnr >= PROBE_MARGIN_DB)
        self.audit.log(f"malicious probe: {outcome.line()}")

    def _outcome(self, attack: str, node: str, status: str, reason: str | None
                 ) -> ProbeOutcome:
        outcome = ProbeOutcome(attack, node, status, reason)
        self.report.outcomes.append(outcome)
        if status != "attacked":
            self.audit.log(f"malicious probe: {outcome.line()}")
        return outcome


def _record(received: ReceivedUpdate, found: Any, inexact: list[str]) -> RoundRecord:
    """The probe round's record, its replay marked inexact where the node took several steps
    (or the audit knows the replay differs)."""
    entry = round_record(received, found, None, 0.0)
    steps = received.local_steps
    reasons = list(inexact) + ([f"the node took {steps} local steps: the crafted rows mix its "
                                "trajectory (trap weights and fishing read one step exactly)"]
                               if steps > 1 else [])
    if reasons:
        entry.replay, entry.replay_model = "inexact", None
        entry.inexact_reasons = [*reasons, *(entry.inexact_reasons or [])]
    return entry


def state_of(arrays: ArrayRecord) -> dict[str, torch.Tensor]:
    """θ as a state dict from the federation's final ArrayRecord."""
    return tensors(arrays)
