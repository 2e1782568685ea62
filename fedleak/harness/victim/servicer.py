"""The victim's gRPC service: translates ``fedleak.v1`` messages to
:class:`~fedleak.harness.victim.federated_victim.Victim` calls.

Every RPC validates what it receives; a bad request is answered with a status code and a
message a person can act on, and the server keeps serving. ``Reveal`` requires the victim's
token in the ``x-fedleak-token`` metadata entry, compared in constant time. The messages are
built in :mod:`~fedleak.harness.victim.victim_messages`; the server that hosts this service is
started by :func:`~fedleak.harness.victim.server.start_server`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import torch

from fedleak.harness.federated.protocol import ProtocolChanges
from fedleak.harness.victim.audit.informed_game import THREAT_MODEL
from fedleak.harness.victim.audit.request import AuditRequest
from fedleak.harness.victim.federated_victim import Victim
from fedleak.harness.victim.release.rpc import release_stream, score_release
from fedleak.harness.victim.scoring.round import Submission
from fedleak.harness.victim.scoring.text_scoring import score_text
from fedleak.harness.victim.text_describe import text_spec
from fedleak.harness.victim.victim_messages import (
    audit_report_pb,
    begin_audit_response,
    decode_named,
    game_spec,
    score_response,
    tensor_info,
    token_matches,
)
from fedleak.harness.wire.admission import ServingLimits, peer_host
from fedleak.harness.wire.channel import SCORE_TOKEN_METADATA_KEY, TOKEN_METADATA_KEY
from fedleak.harness.wire.codec import check_declared, decode_tensor, encode_tensor
from fedleak.harness.wire.protocol_spec import changes_from_pb, protocol_to_pb
from fedleak.harness.wire.request_errors import (
    FailedPrecondition,
    InvalidArgument,
    Unauthenticated,
    answer_errors,
    refuse_long_lists,
)
from fedleak.harness.zoo.text.text_datasets import is_text
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc


class VictimServicer(pb_grpc.VictimServicer):
    """``fedleak.v1.Victim`` backed by a :class:`Victim`."""

    def __init__(self, victim: Victim, token: str | None, serving: ServingLimits,
                 score_token: str | None = None,
                 stopping: threading.Event | None = None) -> None:
        self.victim = victim
        self.token = token
        self.score_token = score_token
        self.serving = serving
        self.stopping = stopping or threading.Event()

    def _cancelled(self, context: grpc.ServicerContext) -> Callable[[], bool]:
        """Whether a call's work should stop: its client went away or the victim is stopping."""
        return lambda: self.stopping.is_set() or not context.is_active()

    async def Describe(
        self, request: pb.DescribeRequest, context: Any
    ) -> pb.DescribeResponse:
        """Answered on the server's event loop, never queued behind workers (cheap, no lock
        held for long), so it answers while every worker computes or calls stall."""
        return self.describe(context)

    def describe(self, context: Any) -> pb.DescribeResponse:
        v = self.victim
        info = v.info
        return pb.DescribeResponse(
            victim_version=v.version(),
            model=pb.ModelSpec(name=v.config.model.name, options=dict(v.config.model.options)),
            data=pb.DataSpec(
                dataset=info.name,
                shape=list(info.shape),
                num_classes=info.num_classes,
                mean=list(info.mean),
                std=list(info.std),
                class_names=list(info.class_names),
                split=v.config.split,
                text=text_spec(v.data, v.model),
            ),
            protocol=protocol_to_pb(v.config.protocol, v.config.num_images),
            defenses=[pb.DefenseSpec(name=name, params=params, stage=stage)
                      for name, params, stage in v.config.defenses.describe()],
            parameters=[tensor_info(*i) for i in v.parameter_infos()],
            buffers=[tensor_info(*i) for i in v.buffer_infos()],
            num_private_images=len(v.data.labels),
            reveal_enabled=v.config.reveal_enabled,
            max_message_bytes=self.serving.max_message_bytes,
            num_users=v.config.num_users,
            score_budget=v.config.limits.score_budget,
            image_score_budget=v.score_budget.image_limit,
            image_scores_left=v.score_budget.image_scores_left(),
            images_score_exhausted=v.score_budget.images_exhausted(),
            buffers_returned=v.config.buffers_returned,
            audit_enabled=v.config.audit_enabled,
            audit_budget=v.audits.budget,
            audits_left=v.audits.left,
            max_audit_trials=v.audits.max_trials,
            score_token_required=bool(self.score_token),
            token_accepted=token_matches(context, TOKEN_METADATA_KEY, self.token),
            score_token_accepted=token_matches(context, SCORE_TOKEN_METADATA_KEY, self.score_token),
            informed_game=game_spec(v),
            limits=self._limits(),
            score_access=self._score_access(),
        )

    def _limits(self) -> pb.VictimLimits:
        limits, serving = self.victim.config.limits, self.serving
        kept = [limits.secagg_memory_mb << 20, limits.feature_memory_mb << 20,
                limits.release_memory_mb << 20]
        return pb.VictimLimits(
            max_local_epochs=limits.max_local_epochs,
            max_local_steps=limits.max_local_steps,
            max_learning_rate=limits.max_learning_rate,
            max_release_epochs=self.victim.config.release.max_epochs,
            request_memory_bytes=serving.request_memory,
            max_calls_per_peer=serving.max_calls_per_peer,
            max_connections_per_peer=serving.max_connections_per_peer,
            receive_timeout_seconds=serving.receive_timeout,
            secagg_memory_bytes=kept[0],
            feature_memory_bytes=kept[1],
            release_memory_bytes=kept[2],
            memory_budget_bytes=serving.request_memory + sum(kept),
        )

    def _score_access(self) -> str:
        if self.score_token:
            return ("Score requires the evaluator's score token (x-fedleak-score-token): a "
                    "round or release id alone spends nothing")
        return (f"round and release ids are bearer tokens: this victim requires no score token, "
                f"so any client holding an id may call Score and spend its answers (each "
                f"private image has {self.victim.score_budget.image_limit} over the victim's "
                "life, shared by every round); keep ids secret or start the victim with "
                "--score-token")

    @answer_errors
    def GetGlobalModel(self, request: Any, context: Any) -> pb.GetGlobalModelResponse:
        params, buffers = self.victim.global_model()
        return pb.GetGlobalModelResponse(
            parameters=[encode_tensor(t, n) for n, t in params.items()],
            buffers=[encode_tensor(t, n) for n, t in buffers.items()],
        )

    @answer_errors
    def ComputeUpdate(
        self, request: pb.ComputeUpdateRequest, context: Any
    ) -> pb.ComputeUpdateResponse:
        params, buffers, changes = self._round_inputs(request)
        result = self.victim.compute_update(params, buffers, changes, self._cancelled(context))
        names = [name for name, *_ in self.victim.parameter_infos()]
        return pb.ComputeUpdateResponse(
            round_id=result.round_id,
            update=[encode_tensor(u, n) for n, u in zip(names, result.update, strict=True)],
            update_kind=result.update_kind,
            protocol=protocol_to_pb(result.protocol, result.num_images),
            num_images=result.num_images,
            local_steps=result.local_steps,
            metadata=result.metadata,
            buffers=[encode_tensor(b, n) for n, b in (result.buffers or {}).items()],
        )

    def _round_inputs(self, request: Any) -> tuple[dict, dict, ProtocolChanges]:
        """Decoded parameters, buffers and the server's protocol changes of a round request."""
        if not request.parameters:
            raise InvalidArgument("the request carries no parameters: send every parameter "
                                  "that Describe lists (the global model θ)")
        params = decode_named(request.parameters, "parameter", self.victim.parameter_infos())
        buffers = decode_named(request.buffers, "buffer", self.victim.buffer_infos())
        changes = ProtocolChanges()
        if request.HasField("protocol"):
            p = request.protocol
            if p.num_images not in (0, self.victim.config.num_images):
                fixed = self.victim.config.num_images
                raise InvalidArgument(f"num_images is fixed at {fixed} by the victim; leave it 0")
            changes = changes_from_pb(p)
        return params, buffers, changes

    @answer_errors
    def BeginSecAgg(self, request: pb.BeginSecAggRequest, context: Any) -> Any:
        params, buffers, changes = self._round_inputs(request)
        round_, result = self.victim.begin_secagg(params, buffers, changes,
                                                  self._cancelled(context), request.audit_id)
        assert round_.secagg is not None
        config = round_.secagg.config
        return pb.BeginSecAggResponse(
            round_id=round_.round_id,
            user_ids=sorted(round_.user_indices),
            threshold=config.threshold,
            clip=config.clip,
            vector_length=config.vector_length,
            session=config.session,
            update_kind=result.update_kind,
            protocol=protocol_to_pb(result.protocol, result.num_images),
            images_per_user=result.num_images,
            local_steps=result.local_steps,
            metadata=result.metadata,
            audit_round=result.audit_trial is not None,
            audit_trial=result.audit_trial or 0,
        )

    # -- the audit game (docs/audit.md) -------------------------------------------------------

    @answer_errors
    def BeginAudit(self, request: pb.BeginAuditRequest, context: Any) -> pb.BeginAuditResponse:
        params, buffers, changes = self._round_inputs(request)
        asked = AuditRequest(
            canary=request.canary, direction=request.direction, seed=request.canary_seed,
            norm=request.canary_norm,
            coordinate=request.coordinate if request.HasField("coordinate") else None,
            trials=request.trials, delta=request.delta, confidence=request.confidence,
            threshold_rule=request.threshold_rule, threshold=request.threshold,
            calibration_fraction=request.calibration_fraction,
            detect_shortfall=request.detect_shortfall, power=request.power,
            false_alarm=request.false_alarm, coverage=not request.single_canary,
            max_chosen_trials=request.max_chosen_trials)
        session = self.victim.begin_audit(
            params, buffers, changes, asked, owner=peer_host(context.peer()),
            evaluator=token_matches(context, SCORE_TOKEN_METADATA_KEY, self.score_token))
        return begin_audit_response(
            session, [name for name, *_ in self.victim.parameter_infos()],
            self.victim.config.num_images, self._trials_per_call())

    def _trials_per_call(self) -> int:
        """Trials one RunAuditTrials answer may carry: half the message limit, at most 4096."""
        per_trial = sum(int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype)
                        .element_size() + 64 + len(name)
                        for name, shape, dtype in self.victim.parameter_infos())
        return max(1, min(4096, (self.serving.max_message_bytes // 2) // max(per_trial, 1)))

    @answer_errors
    def RunAuditTrials(self, request: pb.AuditTrialsRequest, context: Any) \
            -> pb.AuditTrialsResponse:
        if not request.audit_id:
            raise InvalidArgument("audit_id is empty: pass the audit_id BeginAudit returned")
        if request.count < 1:
            raise InvalidArgument("count must be >= 1: how many trials to run")
        count = min(request.count, self._trials_per_call())
        trials, session, metadata = self.victim.run_audit_trials(
            request.audit_id, count, self._cancelled(context))
        names = [name for name, *_ in self.victim.parameter_infos()]
        return pb.AuditTrialsResponse(
            trials=[pb.AuditTrial(index=index, update=[encode_tensor(u, n) for n, u in
                                                       zip(names, update, strict=True)])
                    for index, update in trials],
            trials_left=session.left, update_kind=session.protocol.update_kind(),
            metadata=metadata)

    @answer_errors
    def SubmitAuditScores(self, request: pb.AuditScoresRequest, context: Any) -> pb.AuditReport:
        """Evaluation, as Score: the evaluator's token when the victim has one; once per audit."""
        if self.score_token:
            self._require(context, SCORE_TOKEN_METADATA_KEY, self.score_token, "--score-token")
        if not request.audit_id:
            raise InvalidArgument("audit_id is empty: pass the audit_id BeginAudit returned")
        return audit_report_pb(self.victim.submit_audit_scores(request.audit_id,
                                                          list(request.scores)))

    @answer_errors
    def SecAggStep(self, request: pb.SecAggStepRequest, context: Any) -> Any:
        phases = {pb.ADVERTISE_KEYS: "advertise-keys", pb.SHARE_KEYS: "share-keys",
                  pb.MASKED_INPUT: "masked-input", pb.UNMASKING: "unmasking"}
        if request.phase not in phases:
            raise InvalidArgument("phase is unset or unknown: use ADVERTISE_KEYS, SHARE_KEYS, "
                                  "MASKED_INPUT or UNMASKING")
        reply = self.victim.secagg_step(request.round_id, request.user_id,
                                        phases[request.phase], request.message)
        return pb.SecAggStepResponse(message=reply)

    @answer_errors
    def Score(self, request: pb.ScoreRequest, context: Any) -> pb.ScoreResponse:
        """Evaluation: validated, within the budget, at report precision (docs/security.md)."""
        if self.score_token:
            self._require(context, SCORE_TOKEN_METADATA_KEY, self.score_token, "--score-token")
        if not request.round_id:
            raise InvalidArgument("round_id is empty: pass the round_id ComputeUpdate or "
                                  "BeginSecAgg returned, or the release_id of Release")
        refuse_long_lists(request, what="ScoreRequest")  # by length, before any loop
        if self.victim.releaser.get(request.round_id) is not None:  # KKT candidates
            return score_release(self.victim.releaser, request)
        if is_text(self.victim.info):
            return score_text(self.victim, request)
        if request.HasField("tokens") or request.token_set:
            raise InvalidArgument("this victim holds images: submit the reconstruction as "
                                  "images, not tokens")
        scorer = self.victim.scorer
        user_ids = list(request.user_ids)
        submission = Submission(labels=list(request.labels), user_ids=user_ids,
                                padding=list(request.padding))
        if request.HasField("images"):  # the round and the declared shape first, then decode
            shape = scorer.expected_shape(request.round_id, user_ids)
            check_declared(request.images, "reconstruction", shape,
                           wanted=f"{list(shape)} (n, C, H, W) on [0, 1], as this round had")
            submission.images = decode_tensor(request.images, "images")
        if request.HasField("features"):
            width = scorer.feature_width(request.round_id, request.feature_layer)
            check_declared(request.features, "features", (None, width))
            submission.features = decode_tensor(request.features, "features")
            submission.feature_layer = request.feature_layer
        return score_response(scorer.score(request.round_id, submission))

    def Release(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> Any:
        """Server-streaming model release; see :mod:`fedleak.harness.victim.release.rpc`."""
        yield from release_stream(self.victim.releaser, request, context)

    @answer_errors
    def BeginInformedTrial(self, request: pb.BeginInformedTrialRequest,
                           context: Any) -> pb.InformedTrial:
        """A trial of the informed-adversary game
        (:mod:`~fedleak.harness.victim.audit.informed_game`): public candidates and known records,
        and the update on them plus the secret target."""
        if not request.parameters:
            raise InvalidArgument("the request carries no parameters: send every parameter "
                                  "that Describe lists (the global model θ)")
        params = decode_named(request.parameters, "parameter", self.victim.parameter_infos())
        buffers = decode_named(request.buffers, "buffer", self.victim.buffer_infos())
        draw, result = self.victim.begin_informed_trial(params, buffers,
                                                        self._cancelled(context))
        names = [name for name, *_ in self.victim.parameter_infos()]
        return pb.InformedTrial(
            trial_id=draw.trial_id,
            candidates=encode_tensor(draw.candidates, "candidates"),
            candidate_labels=draw.candidate_labels.tolist(),
            known_images=encode_tensor(draw.known, "known_images"),
            known_labels=draw.known_labels.tolist(),
            update=[encode_tensor(u, n) for n, u in zip(names, result.update, strict=True)],
            update_kind=result.update_kind,
            protocol=protocol_to_pb(result.protocol, result.num_images),
            num_images=result.num_images,
            local_steps=result.local_steps,
            metadata=result.metadata,
            threat_model=THREAT_MODEL,
        )

    @answer_errors
    def ScoreInformedGuess(self, request: pb.InformedGuess, context: Any) -> pb.InformedOutcome:
        """The victim's verdict on a final guess (evaluation: the score token applies)."""
        if self.score_token:
            self._require(context, SCORE_TOKEN_METADATA_KEY, self.score_token, "--score-token")
        if self.victim.game is None:
            raise FailedPrecondition("this victim plays no informed-adversary game")
        if not request.trial_id:
            raise InvalidArgument("trial_id is empty: pass the trial_id BeginInformedTrial "
                                  "returned")
        outcome = self.victim.game.score(request.trial_id, request.candidate)
        return pb.InformedOutcome(success=outcome.success, trials_scored=outcome.trials_scored,
                                  successes=outcome.successes)

    @answer_errors
    def Reveal(self, request: pb.RevealRequest, context: grpc.ServicerContext) -> Any:
        self._require_token(context)
        images, labels = self.victim.reveal(request.round_id)  # text: token ids
        return pb.RevealResponse(images=encode_tensor(images, "images"),
                                 labels=labels.tolist() if labels.dim() == 1 else [])

    def _require_token(self, context: grpc.ServicerContext) -> None:
        if not self.token:
            raise Unauthenticated("this victim has no token, so token-guarded calls are off; "
                                  "start it with --token or --allow-reveal")
        self._require(context, TOKEN_METADATA_KEY, self.token, "--token")

    @staticmethod
    def _require(context: grpc.ServicerContext, key: str, token: str, flag: str) -> None:
        if not token_matches(context, key, token):
            raise Unauthenticated(f"missing or wrong token: send the victim's token in the "
                                  f"{key!r} metadata entry ({flag})")
