"""The federated user: private images, a model architecture, and the local update it sends.

:class:`Victim` is the user's logic without any RPC: it validates what a server sends, runs the
shared local update (:mod:`fedleak.harness.shared.protocol`), remembers which private images each
round used, and scores reconstructions against them without letting them out. The gRPC layer
(:mod:`fedleak.harness.victim.server`) only translates messages and errors.

Private batches: round k uses images ``pool[k·n mod |pool| : … + n]`` of the private pool (the
chosen split, optionally restricted to ``--images`` and shuffled with the seed), so a server that
asks for |pool|/n rounds sees every private image once.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedleak import __version__
from fedleak.defenses import DefenseChain
from fedleak.harness.shared.datasets import DatasetInfo, ImageDataset, normalize
from fedleak.harness.shared.defended_update import defended_update
from fedleak.harness.shared.local_update import CancelCheck, ComputationCancelled
from fedleak.harness.shared.models import ModelSpec
from fedleak.harness.shared.private_update import TrialCanary
from fedleak.harness.shared.protocol import FEDAVG, Protocol, ProtocolChanges, ProtocolError
from fedleak.harness.victim.audit_canary import build_canary
from fedleak.harness.victim.audit_request import AuditRequest
from fedleak.harness.victim.audit_sessions import (
    AuditBook,
    AuditOutcome,
    AuditSession,
    new_session,
    session_claim,
    threat_model,
)
from fedleak.harness.victim.informed_game import InformedGame, TrialDraw
from fedleak.harness.victim.limits import VictimLimits
from fedleak.harness.victim.release import ModelReleaser, ReleaseSettings
from fedleak.harness.victim.rounds import Round, RoundBook
from fedleak.harness.victim.score_budget import ScoreBudget
from fedleak.harness.victim.scoring import RoundScorer
from fedleak.harness.victim.secure_aggregation import SecAggSession
from fedleak.harness.wire.errors import (
    Cancelled,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)
from fedleak.harness.wire.quoting import name_mismatch


@dataclass(frozen=True)
class VictimConfig:
    """Everything that defines a victim; public except the data itself and the token."""

    model: ModelSpec
    protocol: Protocol
    num_images: int = 1
    reveal_enabled: bool = False
    device: str = "cpu"
    defenses: DefenseChain = field(default_factory=DefenseChain)
    num_users: int = 1
    secagg_drops: dict[int, str] = field(default_factory=dict)
    release: ReleaseSettings = field(default_factory=ReleaseSettings)
    limits: VictimLimits = field(default_factory=VictimLimits)
    #: which split of the data set the private pool was drawn from (public: Describe says it)
    split: str = ""
    #: when an update carries the buffers local training left (:data:`BUFFER_MODES`)
    buffers_returned: str = "fedavg"
    #: whether the victim plays the audit game (``--allow-audit``)
    audit_enabled: bool = False

    def __post_init__(self) -> None:
        if self.buffers_returned not in BUFFER_MODES:
            raise ValueError(f"buffers must be one of {', '.join(BUFFER_MODES)}, got "
                             f"{self.buffers_returned!r}")

    def returns_buffers(self, protocol: Protocol) -> bool:
        """Whether a round run under ``protocol`` sends its buffers with the update."""
        return self.buffers_returned == "always" or (
            self.buffers_returned == "fedavg" and protocol.kind == FEDAVG)


#: When a victim's updates carry its buffers: never, in FedAvg rounds (as a FedAvg client
#: sending its ``state_dict`` does; the default), always.
BUFFER_MODES = ("never", "fedavg", "always")


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


class Victim:
    """A federated user holding ``data`` (its private pool) and a model of ``config.model``."""

    def __init__(
        self,
        config: VictimConfig,
        data: ImageDataset,
        model: nn.Module,
        generator: torch.Generator | None = None,
        game: InformedGame | None = None,
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
        # The informed-adversary game (BeginInformedTrial), when this victim plays it.
        self.game = game
        if game is not None:
            if secagg is not None:
                raise ValueError("the informed-adversary game is played by one user; it does "
                                 "not combine with secure aggregation")
            config.limits.check_protocol(config.protocol, game.settings.known + 1,
                                         source="the informed-adversary game's batch")
        self.audits = AuditBook(config.limits.audit_budget, config.limits.max_audit_trials)

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
        _check_finite(update)
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
    ) -> tuple[list[torch.Tensor], dict[str, str]]:
        """Local training (per-example defense inside it), then the update defenses in order."""
        try:
            return defended_update(self.model, params, buffers, images, labels, protocol,
                                   self.config.defenses, self._generator, cancelled,
                                   account=account, canary=canary)
        except ComputationCancelled as err:
            raise Cancelled(f"local training stopped: {err}") from err
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

    # -- the informed-adversary game ------------------------------------------------------

    def begin_informed_trial(
        self,
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        cancelled: CancelCheck | None = None,
    ) -> tuple[TrialDraw, UpdateResult]:
        """One trial: draw public candidates and known records, pick the target with the secret
        coin, and run the defended local update on the known records followed by the target."""
        if self.game is None:
            raise FailedPrecondition("this victim plays no informed-adversary game; start it "
                                     "with --informed-candidates N (and --informed-known M)")
        self._check_classifier()
        params = self._checked("parameter", parameters, dict(self.model.named_parameters()))
        bufs = self._checked("buffer", buffers, dict(self.model.named_buffers()))
        protocol = self.config.protocol
        draw = self.game.draw()
        raw, raw_labels = self.game.batch(draw)
        images = normalize(raw, self.info).to(self.config.device)
        labels = raw_labels.to(self.config.device)
        try:
            for check in self.config.defenses.parameter_checks:
                reason = check.inspect(self.model, params, bufs, images)
                if reason is not None:
                    raise FailedPrecondition(f"{reason}; the user refuses to train on these "
                                             "parameters (defense vet)")
            with self.computation_slot(), self._compute_lock:
                update, metadata = self._defended_update(params, bufs, images, labels,
                                                         protocol, len(labels), cancelled)
            if not all(torch.isfinite(u).all() for u in update):
                raise FailedPrecondition("the local update is not finite at these parameters; "
                                         "send smaller parameters")
        except BaseException:
            self.game.forget(draw.trial_id)
            raise
        return draw, UpdateResult(
            round_id=draw.trial_id, update=[u.cpu() for u in update],
            update_kind=protocol.update_kind(), protocol=protocol, num_images=len(labels),
            local_steps=protocol.local_steps(len(labels)), metadata=metadata)

    # -- Score and Reveal ----------------------------------------------------------------

    def reveal(self, round_id: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's private images on [0, 1] and labels (the caller checks the token)."""
        if not self.config.reveal_enabled:
            raise FailedPrecondition("this victim was started without --allow-reveal; ground "
                                     "truth stays inside it")
        if self.releaser.get(round_id) is not None:  # a release: its training set
            return self.releaser.reveal(round_id)
        round_ = self.rounds.get(round_id)
        return self.data.images[round_.indices], self.data.labels[round_.indices]

    # -- secure aggregation ---------------------------------------------------------------

    def begin_secagg(
        self,
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        changes: ProtocolChanges | None = None,
        cancelled: CancelCheck | None = None,
        audit_id: str = "",
    ) -> tuple[Round, UpdateResult]:
        """Every user computes its defended update on its next private batch and keeps it.

        With ``audit_id`` the round is the audit's next trial (``UpdateResult.audit_trial``): the
        canary enters user 0's computation, or, for a canary client, an extra user sends the
        defended canary update or the defended zero update, by the secret coin.
        """
        secagg = self.config.defenses.transport
        if secagg is None:
            raise FailedPrecondition("this victim does not run secure aggregation; start it "
                                     "with --defense secagg and --users K, or use ComputeUpdate")
        self._check_classifier()
        params = self._checked("parameter", parameters, dict(self.model.named_parameters()))
        bufs = self._checked("buffer", buffers, dict(self.model.named_buffers()))
        protocol = self._protocol_for_round(changes or ProtocolChanges())
        audit = self._audit_round(audit_id, params, bufs, protocol) if audit_id else None
        values = sum(p.numel() for p in self.model.parameters())
        users = self.config.num_users + (1 if audit and audit.canary_user >= 0 else 0)
        self.rounds.check_secagg(users * values * 8, users, values)  # float64 updates
        with self._lock:
            upcoming = [self._next_indices(u, advance=False) for u in range(self.config.num_users)]
        self._vet(params, bufs, upcoming)
        with self._lock:
            user_indices = {u: self._next_indices(u, advance=False)
                            for u in range(self.config.num_users)}
            self._round_counter += 1
            session_number = self._round_counter
        updates: dict[int, np.ndarray] = {}
        metadata: dict[str, str] = {}
        trial: int | None = None
        with self.computation_slot():
            coin = False
            if audit is not None:
                reserved = audit.reserve(1)
                if not reserved:
                    raise FailedPrecondition(f"all {audit.request.trials} trials of this audit "
                                             "have run: submit the scores (SubmitAuditScores)")
                trial = reserved.start
                coin = bool(audit.coins[trial])
            for user, indices in user_indices.items():
                images = normalize(self.data.images[indices], self.info).to(self.config.device)
                labels = self.data.labels[indices].to(self.config.device)
                first = user == min(user_indices)  # every user's ε is the same: account one
                canary = audit.trial_canary if audit is not None and audit.canary_user < 0 \
                    and coin and first else None
                with self._compute_lock:
                    update, user_metadata = self._defended_update(
                        params, bufs, images, labels, protocol, len(indices), cancelled,
                        account=first, canary=canary)
                if first:
                    metadata = user_metadata
                _check_finite(update)  # before any user keeps it: the round is never opened
                updates[user] = torch.cat([u.flatten() for u in update]).double().cpu().numpy()
            if audit is not None and audit.canary_user >= 0:
                with self._compute_lock:
                    updates[audit.canary_user] = self._canary_client_update(audit, coin)
                user_indices[audit.canary_user] = torch.zeros(0, dtype=torch.long)
        config = secagg.session_config(len(updates), len(updates[0]), session_number)
        round_ = Round(uuid.uuid4().hex, torch.cat(list(user_indices.values())), protocol,
                       user_indices, SecAggSession(config, updates, self.config.secagg_drops))
        self.rounds.remember(round_)
        result = UpdateResult(round_.round_id, [], protocol.update_kind(), protocol,
                              self.config.num_images,
                              protocol.local_steps(self.config.num_images), metadata,
                              audit_trial=trial)
        return round_, result

    def _audit_round(self, audit_id: str, params: dict[str, torch.Tensor],
                     buffers: dict[str, torch.Tensor], protocol: Protocol) -> AuditSession:
        """The audit whose next trial this secure-aggregation round is, checked."""
        audit = self.audits.get(audit_id)
        if not audit.secure_aggregation:
            raise FailedPrecondition("this audit's trials run with RunAuditTrials")
        same = all(torch.equal(params[k], audit.parameters[k]) for k in params) and all(
            torch.equal(buffers[k], audit.buffers[k]) for k in buffers)
        if not same or protocol != audit.protocol:
            raise InvalidArgument("an audit round runs at the audit's parameters, buffers and "
                                  "protocol: send the θ and protocol you began the audit with")
        if audit.left <= 0:
            raise FailedPrecondition(f"all {audit.request.trials} trials of this audit have "
                                     "run: submit the scores (SubmitAuditScores)")
        return audit

    def _canary_client_update(self, audit: AuditSession, coin: bool) -> np.ndarray:
        """The canary client's defended update: c or 0 through the chain's update defenses
        (it has no data, so no per-example defense), flattened."""
        canary = audit.trial_canary.gradient
        assert canary is not None
        update = [c.clone() if coin else torch.zeros_like(c) for c in canary]
        for defense in self.config.defenses.update:
            update = defense.apply(update, self._generator)
        return torch.cat([u.flatten() for u in update]).double().cpu().numpy()

    # -- audits -----------------------------------------------------------------------------

    def begin_audit(
        self,
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        changes: ProtocolChanges | None,
        request: AuditRequest,
    ) -> AuditSession:
        """Open an audit at the server's θ: the canary, the secret coins, the chain's claim."""
        if not self.config.audit_enabled:
            raise FailedPrecondition("this victim was started without --allow-audit; it does "
                                     "not play the audit game")
        self.audits.check_open()
        self._check_classifier()
        secure = self.config.defenses.transport is not None
        request = request.checked(self.audits.max_trials, secure)
        params = self._checked("parameter", parameters, dict(self.model.named_parameters()))
        bufs = self._checked("buffer", buffers, dict(self.model.named_buffers()))
        protocol = self._protocol_for_round(changes or ProtocolChanges())
        with self._lock:
            upcoming = self._next_indices(advance=False)
        self._vet(params, bufs, [upcoming])
        chain = self.config.defenses
        with self.computation_slot(), self._compute_lock:
            canary = build_canary(request, chain, self.model, params, bufs, protocol, self.info,
                                  self.config.num_images)
            seed = int(torch.randint(0, 2**63 - 1, (1,), generator=self._generator))
        claim = session_claim(request, chain, canary, protocol, self.config.num_images,
                              self.config.num_users if secure else 1)
        described = threat_model(secure, self.config.num_users, request.canary, protocol)
        canary_user = self.config.num_users if request.canary == "client" else -1
        session = new_session(request, canary, claim, params, bufs, protocol, self.info,
                              described, secure, canary_user, np.random.default_rng(seed))
        self.audits.add(session)
        return session

    def run_audit_trials(
        self, audit_id: str, count: int, cancelled: CancelCheck | None = None,
    ) -> tuple[list[tuple[int, list[torch.Tensor]]], AuditSession, dict[str, str]]:
        """Run up to ``count`` next trials of the audit: each the user's defended update on its
        next private batch, with the canary when the trial's secret coin says so."""
        audit = self.audits.get(audit_id)
        if audit.secure_aggregation:
            raise FailedPrecondition("this victim's users aggregate securely: run each trial "
                                     "as a BeginSecAgg round with the audit_id")
        if audit.left <= 0:
            raise FailedPrecondition(f"all {audit.request.trials} trials of this audit have "
                                     "run: submit the scores (SubmitAuditScores)")
        trials: list[tuple[int, list[torch.Tensor]]] = []
        with self.computation_slot(), self._compute_lock:
            for _ in range(count):
                if cancelled is not None and cancelled():
                    break
                reserved = audit.reserve(1)
                if not reserved:
                    break
                index = reserved.start
                with self._lock:
                    indices = self._next_indices()
                images = normalize(self.data.images[indices], self.info).to(self.config.device)
                labels = self.data.labels[indices].to(self.config.device)
                canary = audit.trial_canary if audit.coins[index] else None
                update, _ = self._defended_update(audit.parameters, audit.buffers, images,
                                                  labels, audit.protocol, len(indices),
                                                  cancelled, account=False, canary=canary)
                if not all(torch.isfinite(u).all() for u in update):
                    raise FailedPrecondition("an audit trial's update is not finite at these "
                                             "parameters; begin the audit at smaller ones")
                trials.append((index, [u.cpu() for u in update]))
            metadata = self._account_trials(audit.protocol, len(trials))
        return trials, audit, metadata

    def _account_trials(self, protocol: Protocol, trials: int) -> dict[str, str]:
        """Charge ``trials`` rounds to the chain's accountants at once. No ε is computed here
        (an accountant's ε over thousands of trials costs minutes and gigabytes with PRV);
        the next ordinary round reports the total, audit trials included."""
        if trials == 0:
            return {}
        metadata: dict[str, str] = {"audit_trials_charged": str(trials)}
        chain, n = self.config.defenses, self.config.num_images
        if chain.per_example is not None:
            q = chain.per_example.sample_rate(n, protocol.batch_size)
            if q is None:
                steps = protocol.local_steps(n)
                first = 1.0 if protocol.kind != FEDAVG else \
                    min(protocol.batch_size or n, n) / n
                rate = first
            else:
                steps = 1 if protocol.kind != FEDAVG else \
                    protocol.local_epochs * max(1, round(1 / q))
                rate = q
            chain.per_example.account(steps * trials, rate, report=False)
        for defense in chain.update:
            defense.account_round(trials, report=False)
        return metadata

    def submit_audit_scores(self, audit_id: str, scores: list[float]) -> AuditOutcome:
        """The bounds for one score per trial run (once per audit)."""
        return self.audits.answer(audit_id, scores)

    def secagg_step(self, round_id: str, user_id: int, phase: str, message: bytes) -> bytes:
        """One user's message of one protocol phase."""
        round_ = self.rounds.get(round_id)
        if round_.secagg_forgotten:
            raise ResourceExhausted(
                f"round {round_id[:16]} was forgotten to keep this victim's secure-aggregation "
                f"state within {self.rounds.secagg_bytes >> 20} MiB (--secagg-memory-mb): "
                "finish a round before starting more, or raise the budget")
        if round_.secagg is None:
            raise FailedPrecondition(f"round {round_id} is not a secure-aggregation round")
        return round_.secagg.step(user_id, phase, message)

    def version(self) -> str:
        return __version__


def _check_finite(update: list[torch.Tensor]) -> None:
    """FAILED_PRECONDITION when a user's update is not finite (training diverged at the
    server's parameters): refused up front, in every path that trains."""
    if not all(torch.isfinite(u).all() for u in update):
        raise FailedPrecondition(
            "the local update is not finite at these parameters (training diverged); "
            "send smaller parameters or a smaller learning rate"
        )
