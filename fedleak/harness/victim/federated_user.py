"""The federated user: private images, a model architecture, and the local update it sends.

:class:`FederatedUser` is the user's logic without any RPC: it validates what a server sends,
runs the shared local update (:mod:`fedleak.harness.federated.protocol`), remembers which private
images each round used, and scores reconstructions against them without letting them out. The
victim a server talks to (:class:`~fedleak.harness.victim.federated_victim.Victim`) adds the
rounds beyond one update; the gRPC layer (:mod:`fedleak.harness.victim.servicer`) only
translates messages and errors.

Private batches: round k uses images ``pool[k·n mod |pool| : … + n]`` of the private pool (the
chosen split, optionally restricted to ``--images`` and shuffled with the seed), so a server that
asks for |pool|/n rounds sees every private image once.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from fedleak import __version__
from fedleak.defenses.accounting import AccountingError
from fedleak.harness.federated.defended_update import defended_update
from fedleak.harness.federated.local_update import CancelCheck, ComputationCancelled
from fedleak.harness.federated.private_update import TrialCanary
from fedleak.harness.federated.protocol import Protocol, ProtocolChanges, ProtocolError
from fedleak.harness.victim.config import VictimConfig
from fedleak.harness.victim.release.releaser import ModelReleaser
from fedleak.harness.victim.rounds import Round, RoundBook
from fedleak.harness.victim.scoring.budget import ScoreBudget
from fedleak.harness.victim.scoring.round import RoundScorer
from fedleak.harness.wire.quoting import name_mismatch
from fedleak.harness.wire.request_errors import (
    Cancelled,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)
from fedleak.harness.zoo.datasets import DatasetInfo, normalize
from fedleak.harness.zoo.text.text_datasets import PrivateData


@dataclass
class UpdateResult:
    round_id: str
    update: list[torch.Tensor]
    update_kind: str
    protocol: Protocol
    num_images: int
    local_steps: int
    metadata: dict[str, str] = field(default_factory=dict)
    #: the buffers local training left, when the victim returns them (else None)
    buffers: dict[str, torch.Tensor] | None = None
    #: an audit round's trial index (secure aggregation with an audit_id), else None
    audit_trial: int | None = None


class FederatedUser:
    """A federated user holding ``data`` (its private pool) and a model of ``config.model``."""

    def __init__(
        self,
        config: VictimConfig,
        data: PrivateData,
        model: nn.Module,
        generator: torch.Generator | None = None,
    ) -> None:
        if not 1 <= config.num_images * config.num_users <= len(data.labels):
            raise ValueError(f"{config.num_users} user(s) × batch size {config.num_images} "
                             f"must fit in the {len(data.labels)} private images")
        secagg = config.defenses.transport
        if (config.num_users > 1) != (secagg is not None):
            raise ValueError("several --users need a secure-aggregation defense "
                             "(--defense secagg) and secagg needs --users >= 2")
        if secagg is not None:
            secagg.threshold(config.num_users)  # refuse an impossible threshold at start
        config.limits.check_protocol(config.protocol, config.num_images,
                                     source="the victim's own protocol")
        config.limits.check_learning_rate(config.release.lr, "release learning rate",
                                          source="the victim's own --release-lr")
        self.config = config
        self.data = data
        self.model = model.to(config.device)
        self._parameter_names = [name for name, _ in model.named_parameters()]
        self._buffer_names = [name for name, _ in model.named_buffers()]
        for defense in config.defenses.update:
            defense.bind(self._parameter_names)
            defense.bind_users(config.num_users)
        self.rounds = RoundBook(config.limits.feature_memory_mb << 20,
                                config.limits.secagg_memory_mb << 20)
        self._round_counter = 0
        # each user's private shard: contiguous slices of the pool
        self._shards = list(torch.arange(len(data.labels)).chunk(config.num_users))
        self._lock = threading.Lock()
        self._compute_lock = threading.Lock()
        # one computation runs, at most max_queued_computations wait; more are refused
        self._slots = threading.BoundedSemaphore(1 + config.limits.max_queued_computations)
        self.score_budget = ScoreBudget(config.limits.score_budget,
                                        config.limits.image_score_budget)
        # The defenses' randomness: secret from the server unless the experiment fixes it.
        self._generator = generator or torch.Generator().manual_seed(secrets.randbits(63))
        # Model release (Release RPC): trains copies of this seeded model on a training set.
        self.releaser = ModelReleaser(data, self.model, config.defenses, config.release,
                                      limits=config.limits, budget=self.score_budget,
                                      device=config.device)
        self.scorer = RoundScorer(data, self.model, self.rounds, self.score_budget,
                                  config.device, config.defenses)

    @property
    def info(self) -> DatasetInfo:
        return self.data.info

    def parameter_infos(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        return [(n, tuple(p.shape), p.dtype) for n, p in self.model.named_parameters()]

    def buffer_infos(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        return [(n, tuple(b.shape), b.dtype) for n, b in self.model.named_buffers()]

    def global_model(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The federation's public starting model (seeded init or checkpoint)."""
        params = {n: p.detach().cpu() for n, p in self.model.named_parameters()}
        buffers = {n: b.detach().cpu() for n, b in self.model.named_buffers()}
        return params, buffers

    # -- ComputeUpdate -------------------------------------------------------------------

    def compute_update(
        self,
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        changes: ProtocolChanges | None = None,
        cancelled: CancelCheck | None = None,
    ) -> UpdateResult:
        """Run the user's local update at the server's ``parameters`` on the next private batch.

        ``cancelled()`` is asked before every local step: the computation of a call whose
        client went away (or of a victim that is stopping) ends there.
        """
        if self.config.defenses.transport is not None:
            raise FailedPrecondition("this victim's users aggregate securely: call BeginSecAgg "
                                     "(fedleak attack does when Describe lists secagg)")
        self._check_classifier()
        params = self._checked("parameter", parameters, dict(self.model.named_parameters()))
        bufs = self._checked("buffer", buffers, dict(self.model.named_buffers()))
        protocol = self._protocol_for_round(changes or ProtocolChanges())
        with self._lock:
            upcoming = self._next_indices(advance=False)
        self._vet(params, bufs, [upcoming])
        with self._lock:
            indices = self._next_indices()
            round_id = uuid.uuid4().hex
            self.rounds.remember(Round(round_id, indices, protocol, parameters=params,
                                 buffers=bufs))
        images = normalize(self.data.images[indices], self.info).to(self.config.device)
        labels = self.data.labels[indices].to(self.config.device)
        started = time.perf_counter()
        with self.computation_slot(), self._compute_lock:  # defenses keep state
            update, metadata = self._defended_update(params, bufs, images, labels, protocol,
                                                     len(indices), cancelled)
        metadata["compute_seconds"] = f"{time.perf_counter() - started:.6f}"
        check_finite(update)
        return UpdateResult(
            round_id=round_id,
            update=[u.cpu() for u in update],
            update_kind=protocol.update_kind(),
            protocol=protocol,
            num_images=len(indices),
            local_steps=protocol.local_steps(len(indices)),
            metadata=metadata,
            buffers={n: b.detach().cpu().clone() for n, b in bufs.items()}
            if self.config.returns_buffers(protocol) else None,
        )

    def _defended_update(
        self,
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        images: torch.Tensor,
        labels: torch.Tensor,
        protocol: Protocol,
        n: int,
        cancelled: CancelCheck | None = None,
        account: bool = True,
        canary: TrialCanary | None = None,
        observe: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> tuple[list[torch.Tensor], dict[str, str]]:
        """Local training (per-example defense inside it), then the update defenses in order."""
        try:
            return defended_update(self.model, params, buffers, images, labels, protocol,
                                   self.config.defenses, self._generator, cancelled,
                                   account=account, canary=canary, observe=observe)
        except ComputationCancelled as err:
            raise Cancelled(f"local training stopped: {err}") from err
        except AccountingError as err:
            raise FailedPrecondition(f"the round was trained but its privacy could not be "
                                     f"accounted: {err}; restart the victim with another "
                                     "noise scale") from err
        except ValueError as err:  # e.g. BatchNorm in training mode on a single value
            raise FailedPrecondition(
                f"local training failed for {self.config.model} on {n} image(s): "
                f"{err}; start the victim with a larger --batch-size or another model"
            ) from err

    def _vet(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
             batches: list[torch.Tensor]) -> None:
        """FAILED_PRECONDITION when a parameter check of the chain (``vet``) refuses θ for any
        user's next batch; nothing is trained and no round is opened."""
        for check in self.config.defenses.parameter_checks:
            for indices in batches:
                images = normalize(self.data.images[indices], self.info).to(self.config.device)
                reason = check.inspect(self.model, params, buffers, images)
                if reason is not None:
                    raise FailedPrecondition(f"{reason}; the user refuses to train on these "
                                             "parameters (defense vet)")

    def _check_classifier(self) -> None:
        """FAILED_PRECONDITION unless the model scores every class of the private labels (a
        one-output model, such as kkt-mlp, only serves Release)."""
        width, classes = self.releaser.output_width, self.info.num_classes
        if width < classes:
            raise FailedPrecondition(
                f"this victim's model {self.config.model} gives {width} output(s) for the "
                f"{classes} classes of {self.info.name}, so it cannot compute a local update: "
                "it only serves Release; start the victim with a classifier (e.g. --model mlp) "
                "for ComputeUpdate and BeginSecAgg")

    def _checked(
        self, what: str, received: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        missing = [n for n in expected if n not in received]
        extra = [n for n in received if n not in expected]
        problem = name_mismatch(what, missing, extra, len(expected))
        if problem:
            raise InvalidArgument(problem)
        out = {}
        for name, ref in expected.items():
            tensor = received[name]
            if tuple(tensor.shape) != tuple(ref.shape):
                raise InvalidArgument(f"{what} {name!r} has shape {list(tensor.shape)}, the "
                                      f"model needs {list(ref.shape)}")
            if tensor.dtype != ref.dtype:
                raise InvalidArgument(f"{what} {name!r} has dtype {tensor.dtype}, the model "
                                      f"needs {ref.dtype}")
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise InvalidArgument(f"{what} {name!r} contains NaN or infinite values")
            out[name] = tensor.to(self.config.device)
        return out

    def _protocol_for_round(self, changes: ProtocolChanges) -> Protocol:
        try:
            protocol = self.config.protocol.with_changes(changes)
        except ProtocolError as err:
            raise InvalidArgument(f"protocol: {err}") from err
        self.config.limits.check_protocol(protocol, self.config.num_images,
                                          source="the server's protocol")
        return protocol

    @contextmanager
    def computation_slot(self) -> Iterator[None]:
        """Hold one of the computation slots, or refuse with ``RESOURCE_EXHAUSTED``."""
        if not self._slots.acquire(blocking=False):
            waiting = self.config.limits.max_queued_computations
            raise ResourceExhausted(f"the victim is busy: one computation runs and {waiting} "
                                    "wait already; retry when one finishes")
        try:
            yield
        finally:
            self._slots.release()

    def _next_indices(self, user: int = 0, advance: bool = True) -> torch.Tensor:
        shard = self._shards[user]
        n = self.config.num_images
        start = (self._round_counter * n) % len(shard)
        if advance:
            self._round_counter += 1
        return shard[torch.arange(start, start + n) % len(shard)]

    # -- Reveal --------------------------------------------------------------------------

    def reveal(self, round_id: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's private images on [0, 1] and labels (the caller checks the token)."""
        if not self.config.reveal_enabled:
            raise FailedPrecondition("this victim was started without --allow-reveal; ground "
                                     "truth stays inside it")
        if self.releaser.get(round_id) is not None:  # a release: its training set
            return self.releaser.reveal(round_id)
        round_ = self.rounds.get(round_id)
        return self.data.images[round_.indices], self.data.labels[round_.indices]

    def version(self) -> str:
        return __version__


def check_finite(update: list[torch.Tensor]) -> None:
    """FAILED_PRECONDITION when a user's update is not finite (training diverged at the
    server's parameters): refused up front, in every path that trains."""
    if not all(torch.isfinite(u).all() for u in update):
        raise FailedPrecondition(
            "the local update is not finite at these parameters (training diverged); "
            "send smaller parameters or a smaller learning rate"
        )
