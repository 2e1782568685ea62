"""fedleak's update-stage defenses as Flower client mods.

A mod wraps the ClientApp's train handler: it remembers the θ the server sent, lets the
ClientApp train, reads the update the reply carries (:mod:`~fedleak.harness.flower.update`:
Δ = θ′ − θ, or g for one-step FedSGD), applies the defenses in order, Δ ← D_k(Δ), exactly as
fedleak's victim does (:func:`~fedleak.harness.federated.defended_update.defended_update`),
replies with the state that carries the defended update, and publishes its chain in the reply
(:mod:`~fedleak.harness.flower.node.published_defenses`), as a victim's ``Describe`` does:

    app = ClientApp(mods=[DefenseMod("clip:max-norm=1", "prune:p=0.9")])

Any registered update defense works (``clip``, ``noise``, ``prune``, ``quantize``, ``remote``,
plug-ins from the ``fedleak.defenses`` entry point). Two stages cannot be mods, and are
refused with the reason: per-example defenses (DP-SGD clips and noises every example's
gradient inside the training loop: use :func:`fedleak.harness.flower.node.train.train` with
``dpsgd``), and transport defenses (secure aggregation masks updates between nodes: use
Flower's own SecAgg+, under which the server sees only the aggregate).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

import torch
from flwr.app import ArrayRecord, Context, Error, Message
from flwr.clientapp.typing import ClientAppCallable

from fedleak.defenses import DefenseChain
from fedleak.defenses.chain import build_chain, parse_defense_spec
from fedleak.harness.flower.arrays import mismatch, record_of, tensors
from fedleak.harness.flower.node.published_defenses import publish
from fedleak.harness.flower.procedure import procedure_from_config
from fedleak.harness.flower.update import state_carrying, update_of

#: Flower error code of a reply a mod refused to defend (the ClientApp's own codes are < 100)
DEFENSE_ERROR = 120
#: names that mark BatchNorm buffers in a state dict (not part of the update)
BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


class DefenseModError(ValueError):
    """A defense that cannot run as a mod, or a bad spec; the message says what to use."""


def update_chain(specs: Sequence[str]) -> DefenseChain:
    """The defense chain of ``specs`` (``name:key=value,...``), update stage only."""
    chain = build_chain([parse_defense_spec(spec) for spec in specs])
    if chain.per_example is not None:
        raise DefenseModError(
            f"{chain.per_example.name} is a per-example defense: it clips and noises every "
            "example's gradient inside the training loop, which a mod (acting on the finished "
            "reply) cannot reach; train with fedleak.harness.flower.node.train.train(..., "
            f"defenses=['{chain.per_example.name}:...']) in the ClientApp instead")
    if chain.transport is not None:
        raise DefenseModError(
            f"{chain.transport.name} is a transport defense: it masks updates between nodes, "
            "which one node's mod cannot do; use Flower's SecAgg+ (secaggplus_mod on the "
            "ClientApp, SecAggPlusWorkflow on the ServerApp), under which the server, and so "
            "the audit, sees only the aggregate")
    return chain


class DefenseMod:
    """A Flower client mod applying fedleak's update defenses to every train reply.

    ``parameter_names`` names the state-dict entries that are parameters (the update); by
    default every floating-point array except BatchNorm buffers. ``seed`` makes the defenses'
    randomness reproducible (one generator per mod, drawn on in round order); None draws a
    secret seed.
    """

    def __init__(self, *specs: str, parameter_names: Sequence[str] | None = None,
                 seed: int | None = None) -> None:
        if not specs:
            raise DefenseModError("name at least one defense, e.g. DefenseMod('prune:p=0.9')")
        self.specs = tuple(specs)
        self.chain = update_chain(self.specs)
        self.parameter_names = None if parameter_names is None else list(parameter_names)
        self.generator = torch.Generator().manual_seed(
            secrets.randbits(63) if seed is None else seed)
        self._bound: list[str] | None = None

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if not msg.metadata.message_type.startswith("train"):
            return call_next(msg, context)
        sent_record = _single(msg.content.array_records)
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        try:
            return self._defend(msg, reply, sent_record)
        except (DefenseModError, ValueError) as err:
            return Message(Error(DEFENSE_ERROR, f"DefenseMod {list(self.specs)}: {err}"),
                           reply_to=msg)

    def _defend(self, msg: Message, reply: Message, sent_record: tuple[str, ArrayRecord] | None
                ) -> Message:
        if sent_record is None:
            raise DefenseModError("the train message must carry exactly one ArrayRecord (θ)")
        got_record = _single(reply.content.array_records)
        if got_record is None or got_record[0] != sent_record[0]:
            raise DefenseModError(f"the reply must carry one ArrayRecord under "
                                  f"{sent_record[0]!r}, like the message it answers")
        sent, got = tensors(sent_record[1]), tensors(got_record[1])
        problem = mismatch(sent, got)
        if problem:
            raise DefenseModError(f"the ClientApp's reply: {problem}")
        configs = msg.content.config_records
        config = dict(next(iter(configs.values()))) if len(configs) == 1 else {}
        protocol = procedure_from_config(config).protocol
        names = self.parameter_names or [k for k, t in sent.items() if t.is_floating_point()
                                         and not k.endswith(BUFFER_SUFFIXES)]
        if self._bound != names:
            for defense in self.chain.update:
                defense.bind(names)
            self._bound = names
        update = update_of(sent, got, names, protocol)
        for defense in self.chain.update:
            update = defense.apply(update, self.generator)
        reply.content[got_record[0]] = record_of(state_carrying(sent, update, names, protocol))
        publish(reply.content, self.chain.describe())  # Kerckhoffs: the server may know it
        return reply


def _single(records: Mapping[str, ArrayRecord]) -> tuple[str, ArrayRecord] | None:
    """(key, record) of the only ArrayRecord, or None when there are 0 or several."""
    return next(iter(records.items())) if len(records) == 1 else None
