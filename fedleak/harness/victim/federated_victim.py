"""The victim a server talks to: a :class:`~fedleak.harness.victim.federated_user.
FederatedUser` and the rounds it runs beyond one local update, each at the server's request:
secure-aggregation rounds among its users (``BeginSecAgg``), the audit game's trials
(``BeginAudit``, ``RunAuditTrials``, ``SubmitAuditScores``; docs/audit.md) and the
informed-adversary game's trials (``BeginInformedTrial``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedleak.harness.federated.local_update import CancelCheck
from fedleak.harness.federated.protocol import FEDAVG, Protocol, ProtocolChanges
from fedleak.harness.victim.audit.book import AuditBook
from fedleak.harness.victim.audit.canary import build_canary
from fedleak.harness.victim.audit.informed_game import InformedGame, TrialDraw
from fedleak.harness.victim.audit.plan import stratum
from fedleak.harness.victim.audit.request import AuditRequest
from fedleak.harness.victim.audit.sessions import (
    AuditOutcome,
    AuditSession,
    new_session,
    session_claim,
    threat_model,
)
from fedleak.harness.victim.config import VictimConfig
from fedleak.harness.victim.federated_user import FederatedUser, UpdateResult, check_finite
from fedleak.harness.victim.rounds import Round
from fedleak.harness.victim.secagg_session import SecAggSession
from fedleak.harness.wire.request_errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)
from fedleak.harness.zoo.datasets import normalize
from fedleak.harness.zoo.text.text_datasets import PrivateData


class Victim(FederatedUser):
    """A federated user that also plays the audit game and, when given one, the
    informed-adversary game (:class:`~fedleak.harness.victim.audit.informed_game.InformedGame`)."""

    def __init__(
        self,
        config: VictimConfig,
        data: PrivateData,
        model: nn.Module,
        generator: torch.Generator | None = None,
        game: InformedGame | None = None,
    ) -> None:
        super().__init__(config, data, model, generator)
        # The informed-adversary game (BeginInformedTrial), when this victim plays it.
        self.game = game
        if game is not None:
            if config.defenses.transport is not None:
                raise ValueError("the informed-adversary game is played by one user; it does "
                                 "not combine with secure aggregation")
            config.limits.check_protocol(config.protocol, game.settings.known + 1,
                                         source="the informed-adversary game's batch")
        self.audits = AuditBook(config.limits.audit_budget, config.limits.max_audit_trials)

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
                reserved = self.audits.reserve(audit, 1)
                if not reserved:
                    raise FailedPrecondition(f"all {audit.trials} trials of this audit "
                                             "have run: submit the scores (SubmitAuditScores)")
                trial = reserved.start
                coin = bool(audit.coins[trial])
            for user, indices in user_indices.items():
                images = normalize(self.data.images[indices], self.info).to(self.config.device)
                labels = self.data.labels[indices].to(self.config.device)
                first = user == min(user_indices)  # every user's ε is the same: account one
                carries = audit is not None and audit.canary_user < 0 and first
                canary = audit.canary_for(trial, params) \
                    if carries and audit is not None and trial is not None else None
                observe = self._observer(audit, trial) \
                    if carries and audit is not None and trial is not None else None
                with self._compute_lock:
                    update, user_metadata = self._defended_update(
                        params, bufs, images, labels, protocol, len(indices), cancelled,
                        account=first, canary=canary, observe=observe)
                if first:
                    metadata = user_metadata
                check_finite(update)  # before any user keeps it: the round is never opened
                updates[user] = torch.cat([u.flatten() for u in update]).double().cpu().numpy()
            if audit is not None and audit.canary_user >= 0:
                with self._compute_lock:
                    updates[audit.canary_user] = self._canary_client_update(audit, coin,
                                                                            trial or 0)
                user_indices[audit.canary_user] = torch.zeros(0, dtype=torch.long)
            if audit is not None and audit.coverage is not None and trial is not None:
                audit.coverage.record(trial, torch.from_numpy(sum(updates.values())),
                                      stratum(torch.cat(list(user_indices.values()))))
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
        if not audit.secagg:
            raise FailedPrecondition("this audit's trials run with RunAuditTrials")
        same = all(torch.equal(params[k], audit.parameters[k]) for k in params) and all(
            torch.equal(buffers[k], audit.buffers[k]) for k in buffers)
        if not same or protocol != audit.protocol:
            raise InvalidArgument("an audit round runs at the audit's parameters, buffers and "
                                  "protocol: send the θ and protocol you began the audit with")
        if audit.left <= 0:
            raise FailedPrecondition(f"all {audit.trials} trials of this audit have "
                                     "run: submit the scores (SubmitAuditScores)")
        return audit

    def _canary_client_update(self, audit: AuditSession, coin: bool, trial: int) -> np.ndarray:
        """The canary client's defended update: c or 0 through the chain's update defenses
        (it has no data, so no per-example defense), flattened."""
        canary = audit.trial_canary.gradient
        assert canary is not None
        update = [c.clone() if coin else torch.zeros_like(c) for c in canary]
        observe = self._observer(audit, trial)
        if observe is not None:
            observe(update)
        for defense in self.config.defenses.update:
            update = defense.apply(update, self._generator)
        return torch.cat([u.flatten() for u in update]).double().cpu().numpy()

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

    # -- audits -----------------------------------------------------------------------------

    def begin_audit(
        self,
        parameters: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        changes: ProtocolChanges | None,
        request: AuditRequest,
        owner: str = "",
        evaluator: bool = False,
    ) -> AuditSession:
        """Open an audit at the server's θ: the canary, the secret coins, the chain's claim;
        ``owner`` (a client host) or the ``evaluator`` (the score token's holder) owns it."""
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
        users = self.config.num_users if secure else 1
        noise_users = users + (1 if request.canary == "client" else 0)
        claim = session_claim(request, chain, canary, protocol, self.config.num_images,
                              users, list(params))
        described = threat_model(secure, self.config.num_users, request.canary, protocol)
        canary_user = self.config.num_users if request.canary == "client" else -1
        session = new_session(request, canary, claim, params, bufs, protocol, self.info,
                              described, secure, canary_user, np.random.default_rng(seed),
                              chain, self.config.num_images, noise_users,
                              self.audits.max_trials)
        self.audits.add(session, owner, evaluator)
        return session

    def run_audit_trials(
        self, audit_id: str, count: int, cancelled: CancelCheck | None = None,
    ) -> tuple[list[tuple[int, list[torch.Tensor]]], AuditSession, dict[str, str]]:
        """Run up to ``count`` next trials of the audit: each the user's defended update on its
        next private batch, with the canary when the trial's secret coin says so."""
        audit = self.audits.get(audit_id)
        if audit.secagg:
            raise FailedPrecondition("this victim's users aggregate securely: run each trial "
                                     "as a BeginSecAgg round with the audit_id")
        if audit.left <= 0:
            raise FailedPrecondition(f"all {audit.trials} trials of this audit have "
                                     "run: submit the scores (SubmitAuditScores)")
        trials: list[tuple[int, list[torch.Tensor]]] = []
        with self.computation_slot(), self._compute_lock:
            for _ in range(count):
                if cancelled is not None and cancelled():
                    break
                reserved = self.audits.reserve(audit, 1)
                if not reserved:
                    break
                index = reserved.start
                with self._lock:
                    indices = self._next_indices()
                images = normalize(self.data.images[indices], self.info).to(self.config.device)
                labels = self.data.labels[indices].to(self.config.device)
                canary = audit.canary_for(index, audit.parameters)
                update, _ = self._defended_update(audit.parameters, audit.buffers, images,
                                                  labels, audit.protocol, len(indices),
                                                  cancelled, account=False, canary=canary,
                                                  observe=self._observer(audit, index))
                if not all(torch.isfinite(u).all() for u in update):
                    raise FailedPrecondition("an audit trial's update is not finite at these "
                                             "parameters; begin the audit at smaller ones")
                if audit.coverage is not None:
                    audit.coverage.record(index, torch.cat([u.flatten() for u in update]),
                                          stratum(indices))
                trials.append((index, [u.cpu() for u in update]))
            metadata = self._account_trials(audit.protocol, len(trials))
        return trials, audit, metadata

    def _observer(self, audit: AuditSession, trial: int) \
            -> Callable[[list[torch.Tensor]], None] | None:
        """An update-stage coverage's hook: the declared shift of the trial's update."""
        coverage = audit.coverage
        if coverage is None or coverage.per_example:
            return None
        composition = self.config.defenses.update_composition()
        names = list(audit.parameters)
        coin = bool(audit.coins[trial])

        def observe(update: list[torch.Tensor]) -> None:
            coverage.observe_update(composition, update, names, coin)

        return observe

    def _account_trials(self, protocol: Protocol, trials: int) -> dict[str, str]:
        """Charge ``trials`` rounds to the chain's accountants at once. No ε is computed here
        (an accountant's ε over thousands of trials costs minutes and gigabytes with PRV);
        the next ordinary round reports the total, audit trials included."""
        if trials == 0:
            return {}
        metadata: dict[str, str] = {"audit_trials_charged": str(trials)}
        chain, n = self.config.defenses, self.config.num_images
        epochs = 1 if protocol.kind != FEDAVG else protocol.local_epochs
        q = chain.per_example.sample_rate(n, protocol.batch_size) \
            if chain.per_example is not None else None
        steps_run = protocol.local_steps(n) if q is None else \
            1 if protocol.kind != FEDAVG else protocol.local_epochs * max(1, round(1 / q))
        chain.accountant.local_training(n, protocol.batch_size, epochs, steps_run,
                                        report=False, trials=trials)
        chain.accountant.rounds(trials, report=False)
        return metadata

    def submit_audit_scores(self, audit_id: str, scores: list[float]) -> AuditOutcome:
        """The bounds for one score per trial run (once per audit)."""
        return self.audits.answer(audit_id, scores)
