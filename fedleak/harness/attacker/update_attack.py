"""The honest-but-curious server against updates: send θ, receive, reconstruct, score, write.

One *round* is: ``ComputeUpdate`` with the global parameters (or a secure-aggregation round
among the victim's users) → an :class:`~fedleak.attacks.Observation` built from what came back
and what ``Describe`` published (:func:`observation_for`) → the attack → ``Score`` (the victim
matches and scores the reconstruction; ground truth stays there) → ``Reveal`` when the victim
allows it and we hold its token, for the picture of ground truth beside reconstruction.

Everything a run produces goes under ``out``: ``metrics.json`` (scores, iterations, wall time,
config; rewritten after every round), and per round ``round-NNN/reconstruction.png``,
``reconstruction.npy`` (images on [0, 1]) and ``comparison.png`` (truth above reconstruction,
when revealed). What each finished round leaves is written by
:mod:`~fedleak.harness.attacker.round_outcome`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import torch

from fedleak.attacks import Attack, Observation, Reconstruction, create_attack
from fedleak.attacks.malicious.crafted_parameters import MaliciousAttack, ServerKnowledge
from fedleak.attacks.malicious.label_flipping import flip_labels
from fedleak.attacks.published import PublishedDefense
from fedleak.harness.attacker.attack_progress import (
    reconstruct_many_with_progress,
    reconstruct_with_progress,
)
from fedleak.harness.attacker.attack_settings import AttackSettings, jsonable
from fedleak.harness.attacker.client import ReceivedUpdate, VictimClient, VictimError
from fedleak.harness.attacker.described import (
    dataset_info,
    defense_specs,
    global_parameters,
    model_spec,
    published_defenses,
    server_model,
    victim_protocol,
)
from fedleak.harness.attacker.pictures import save_reconstruction
from fedleak.harness.attacker.records import RunHeader, UpdateRun
from fedleak.harness.attacker.round_outcome import (
    iterations_used,
    placement,
    round_line,
    round_record,
    save_comparison,
)
from fedleak.harness.attacker.secagg_rounds import (
    as_received_update,
    run_secagg,
)
from fedleak.harness.attacker.server_knowledge import server_knowledge
from fedleak.harness.federated.observe import observation_from_update
from fedleak.harness.federated.protocol import Protocol
from fedleak.harness.federated.replay_fidelity import INEXACT, MODELLED
from fedleak.harness.zoo.datasets import DatasetInfo, denormalize
from fedleak.v1 import victim_pb2 as pb

#: Status codes that mean the victim is gone (not that it refused the request).
GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def run_update_attack(
    client: VictimClient,
    settings: AttackSettings,
    out: Path,
    log: Callable[[str], None] = print,
) -> UpdateRun:
    """Attack ``settings.rounds`` rounds of the victim behind ``client``; write and return them.

    ``metrics.json`` is rewritten after every round, so an interrupted run keeps what it
    measured.
    """
    server = open_server(client, settings, out, log)
    try:
        for first in range(0, settings.rounds, settings.pack):
            attack_packed([(server, index) for index in
                           range(first, min(first + settings.pack, settings.rounds))])
    except KeyboardInterrupt:
        server.close("interrupted")
        raise
    except Exception as err:  # the run ends here: metrics.json must not say "running"
        if server.run.status == "running":  # not already "victim gone"
            server.run.warnings.append(
                f"the run stopped on an error: {type(err).__name__}: {err}")
            server.close("failed")
        raise
    server.close("finished")
    return server.run


def open_server(
    client: VictimClient,
    settings: AttackSettings,
    out: Path,
    log: Callable[[str], None] = print,
) -> Server:
    """The server's side of a run against ``client``: θ from ``Describe``, the attack, and a
    run record already written to ``out`` (a run folder always says what it is)."""
    out.mkdir(parents=True, exist_ok=True)
    described = client.describe()
    info = dataset_info(described)
    model = server_model(described)
    params, buffers = global_parameters(client, described, settings)
    if settings.flip_labels is not None:
        params = flip_labels(params, info.num_classes, *settings.flip_labels)
    attack = create_attack(settings.attack, settings.options)
    protocol = victim_protocol(described).with_changes(settings.protocol)
    secagg = any(d.name == "secagg" for d in described.defenses)
    run = UpdateRun(RunHeader.now(
        client.address, str(model_spec(described)), info.name, settings.attack,
        jsonable(dataclasses.asdict(attack.config)), settings.to_json(), settings.device,
        server_role=attack.server_role))
    knowledge = None
    if isinstance(attack, MaliciousAttack):
        if settings.pack > 1:
            raise ValueError(f"attack {settings.attack!r} crafts θ for every round: it cannot "
                             "be packed; leave --pack at 1")
        users = described.num_users if secagg and settings.secagg_target == "sum" else 1
        knowledge, warning = server_knowledge(
            described, model, params, buffers, info, described.protocol.num_images or 1, users,
            protocol.update_kind())
        if warning:
            run.warnings.append(warning)
            log(f"warning: {warning}")
    run.write(out)
    if knowledge is not None and isinstance(attack, MaliciousAttack):
        try:
            attack.check(knowledge)  # refuses a victim that cannot carry it, before any round
        except ValueError as err:
            run.status = "refused"
            run.warnings.append(str(err))
            run.write(out)
            raise
    return Server(client, settings, described, info, attack, model, params, buffers,
                  protocol, secagg, out, run, log, knowledge)


def attack_packed(rounds: Sequence[tuple[Server, int]]) -> None:
    """Receive round ``index`` from each ``(server, index)``, attack them all as one packed
    computation when there are several (K rounds of one victim, ``--pack``; one round of K
    sweep points' victims, ``--pack-points``), then save, score and record each with its server.

    Each round gets the seed it gets alone (``seed + index`` of its server's settings), so a
    packed round measures what it measures alone, up to float rounding.
    """
    first, start = rounds[0]
    s = first.settings
    pairs = [server.receive(index) for server, index in rounds]
    received = [got for got, _ in pairs]
    observations = [observation for _, observation in pairs]
    last = rounds[-1][1]
    label = f"round {start}" + (f"-{last}" if last != start else "") + f" {s.attack}"
    victims = len({id(server) for server, _ in rounds})
    started = time.perf_counter()
    if len(rounds) == 1:
        reconstructions = [reconstruct_with_progress(
            first.attack, observations[0], device=s.device, seed=s.seed + start, label=label,
            show=s.show_progress)]
    else:
        reconstructions = reconstruct_many_with_progress(
            first.attack, observations, device=s.device,
            seeds=[server.settings.seed + index for server, index in rounds],
            label=label + (" (packed)" if victims == 1 else f" ({victims} victims packed)"),
            show=s.show_progress)
    wall = (time.perf_counter() - started) / len(rounds)
    for observation, reconstruction in zip(observations, reconstructions, strict=True):
        if observation.probes:
            reconstruction.extras["probe_rounds"] = len(observation.probes)
    for (server, index), got, reconstruction in zip(rounds, received, reconstructions,
                                                    strict=True):
        server.finish_round(index, got, reconstruction, wall)


class VictimGone(VictimError):
    """The victim stopped answering mid-run; what was finished is kept on disk."""


@dataclass
class Server:
    """What the honest-but-curious server holds for a run, and how it attacks rounds."""

    client: VictimClient
    settings: AttackSettings
    described: pb.DescribeResponse
    info: DatasetInfo
    attack: Attack[Observation]
    model: torch.nn.Module
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    protocol: Protocol
    secagg: bool
    out: Path
    run: UpdateRun
    log: Callable[[str], None]
    #: what a malicious server knows before crafting θ (None: the server is honest)
    knowledge: ServerKnowledge | None = None

    def close(self, status: str) -> None:
        """Record how the run ended (``finished``, ``interrupted``, ``failed``) in
        ``metrics.json``."""
        self.run.status = status
        self.run.placement = placement(self.run, self.described, self.protocol)
        self.run.write(self.out)

    def receive(self, index: int = 0) -> tuple[ReceivedUpdate, Observation]:
        """Round ``index``'s update and the attack's view of it.

        An honest server sends θ once. A malicious one sends what its attack crafts, round
        after round, until the attack has what it needs; the earlier (probe) rounds travel in
        the observation's ``probes``.
        """
        if self.knowledge is None:
            got = self.exchange(self.params)
            return got, observation_for(self.model, self.params, self.buffers, got, self.info,
                                        self.settings.device, published_defenses(self.described))
        attack = self.attack
        assert isinstance(attack, MaliciousAttack)
        seed = self.settings.seed + index
        probes: list[Observation] = []
        crafted = attack.craft(self.knowledge, probes, seed)
        if crafted is None:
            raise ValueError(f"attack {attack.name!r} crafted no parameters for round {index}")
        while True:
            got = self.exchange(crafted)
            observation = observation_for(self.model, crafted, self.buffers, got, self.info,
                                          self.settings.device,
                                          published_defenses(self.described))
            following = attack.craft(self.knowledge, [*probes, observation], seed)
            if following is None:
                observation.probes = probes
                return got, observation
            probes.append(observation)
            self.log(f"round {index}: probe round {len(probes)} received")
            crafted = following

    def exchange(self, params: dict[str, torch.Tensor]) -> ReceivedUpdate:
        """Send θ = ``params``, receive the update: ComputeUpdate, or a secure-aggregation
        round."""
        if self.secagg:
            aggregation = run_secagg(self.client, params, self.buffers,
                                                 self.protocol)
            return as_received_update(aggregation, list(params),
                                      [tuple(t.shape) for t in params.values()],
                                      self.settings.secagg_target)
        return self.client.compute_update(params, self.buffers, self.protocol)

    def finish_round(self, index: int, received: ReceivedUpdate,
                     reconstruction: Reconstruction, wall: float) -> None:
        """Save the reconstruction, score it, reveal for the picture, record the round.

        The reconstruction is written before ``Score`` is asked, so a victim that dies
        meanwhile still leaves it on disk, recorded as unscored (:class:`VictimGone`).
        """
        out, run = self.out, self.run
        for warning in reconstruction.warnings:
            self.log(f"warning: {warning}")
        round_dir = out / f"round-{index:03d}"
        round_dir.mkdir(parents=True, exist_ok=True)
        files: dict[str, str] = {}
        images = None
        if reconstruction.has_images:
            images = denormalize(reconstruction.images.detach().cpu(), self.info).clamp(0, 1)
            picture = save_reconstruction(round_dir, images)
            files["reconstruction"] = str(picture.relative_to(out))
        features = reconstruction.features
        if features is not None:
            np.save(round_dir / "features.npy", features.detach().cpu().numpy())
            files["features"] = str((round_dir / "features.npy").relative_to(out))
        labels = [int(y) for y in reconstruction.labels.cpu().tolist()]
        try:
            score = self.client.score(
                received.round_id, images, labels, received.user_ids,
                features=None if features is None else features.detach().cpu(),
                feature_layer=reconstruction.feature_layer,
                padding=list(reconstruction.padding) if images is not None else None)
        except VictimError as err:
            if err.code not in GONE:
                raise
            entry = round_record(received, reconstruction, None, wall)
            entry.files = {k: v for k, v in files.items() if k != "features"}
            entry.features_file = files.get("features")
            entry.unscored = f"victim gone: {err.details}"
            run.rounds.append(entry)
            run.status = "victim gone"
            run.write(out)
            raise VictimGone(err.code, f"{err.details}; the reconstruction of round {index} "
                             f"is saved in {round_dir} and recorded unscored in "
                             f"{out / 'metrics.json'}") from None
        entry = round_record(received, reconstruction, score, wall)
        entry.defenses = defense_specs(self.described) or None
        entry.files = {k: v for k, v in files.items() if k != "features"}
        entry.features_file = files.get("features")
        if images is not None:
            save_comparison(self.client, self.described, received, images, score, round_dir,
                            entry, out)
        run.rounds.append(entry)
        run.write(out)
        self.log(round_line(index, score, wall, entry.privacy, entry.replay == INEXACT,
                            modelled=entry.replay == MODELLED,
                            iterations=iterations_used(self.attack, reconstruction),
                            truncated=entry.truncated))


def observation_for(
    model: torch.nn.Module,
    params: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    received: ReceivedUpdate,
    info: DatasetInfo,
    device: str,
    defenses: tuple[PublishedDefense, ...] = (),
) -> Observation:
    """The attack's threat model for a received round: θ sent, the update, the public facts
    (with the defense chain ``Describe`` published, or the one the update itself carries)."""
    return observation_from_update(
        model, params, buffers, received.update, received.protocol, info,
        num_images=received.num_images, update_kind=received.update_kind,
        local_steps=received.local_steps, metadata=received.metadata, device=device,
        defenses=defenses or received.defenses or (),
        returned_buffers=received.buffers)
