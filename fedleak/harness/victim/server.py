"""The victim's gRPC service: translates ``fedleak.v1`` messages to :class:`Victim` calls.

Every RPC validates what it receives; a bad request is answered with a status code and a
message a person can act on, and the server keeps serving. Health checking and reflection are
enabled so generic gRPC tools (grpcurl, grpc_health_probe) work. ``Reveal`` requires the
victim's token in the ``x-fedleak-token`` metadata entry, compared in constant time.
"""

from __future__ import annotations

import hmac
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import torch

from fedleak.harness.shared.metrics import EXACT_PSNR, SUCCESS_PSNR
from fedleak.harness.shared.protocol import ProtocolChanges
from fedleak.harness.victim.audit_claim import TrialClaim
from fedleak.harness.victim.audit_request import AuditRequest
from fedleak.harness.victim.audit_sessions import AuditOutcome, AuditSession
from fedleak.harness.victim.federated_victim import Victim
from fedleak.harness.victim.informed_game import ADJACENCY, THREAT_MODEL
from fedleak.harness.victim.release import MAX_CANDIDATES
from fedleak.harness.victim.release_rpc import release_stream, score_release
from fedleak.harness.victim.scoring import Submission
from fedleak.harness.wire.admission import ServingLimits
from fedleak.harness.wire.channel import SCORE_TOKEN_METADATA_KEY, TOKEN_METADATA_KEY
from fedleak.harness.wire.codec import (
    check_declared,
    decode_tensor,
    dtype_name,
    dtype_to_pb,
    encode_tensor,
)
from fedleak.harness.wire.errors import (
    FailedPrecondition,
    InvalidArgument,
    Unauthenticated,
    answer_errors,
    quoted,
)
from fedleak.harness.wire.handlers import add_service
from fedleak.harness.wire.protocol import changes_from_pb, protocol_to_pb
from fedleak.harness.wire.quoting import name_mismatch
from fedleak.harness.wire.serving import Server, server_credentials, start_grpc_server
from fedleak.v1 import victim_pb2 as pb
from fedleak.v1 import victim_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["Victim"]
SERVICE_NAME = SERVICE.full_name


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
            ),
            protocol=protocol_to_pb(v.config.protocol, v.config.num_images),
            defenses=[pb.DefenseSpec(name=name, params=params, stage=stage)
                      for name, params, stage in v.config.defenses.describe()],
            parameters=[_info(*i) for i in v.parameter_infos()],
            buffers=[_info(*i) for i in v.buffer_infos()],
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
            token_accepted=_matches(context, TOKEN_METADATA_KEY, self.token),
            score_token_accepted=_matches(context, SCORE_TOKEN_METADATA_KEY, self.score_token),
            informed_game=_game_spec(v),
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
        params = _decode_named(request.parameters, "parameter", self.victim.parameter_infos())
        buffers = _decode_named(request.buffers, "buffer", self.victim.buffer_infos())
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
            calibration_fraction=request.calibration_fraction)
        session = self.victim.begin_audit(params, buffers, changes, asked)
        return self._audit_session_pb(session)

    def _audit_session_pb(self, session: AuditSession) -> pb.BeginAuditResponse:
        canary = session.canary
        names = [name for name, *_ in self.victim.parameter_infos()]
        reply = pb.BeginAuditResponse(
            audit_id=session.audit_id, trials=session.request.trials, canary=canary.kind,
            direction=canary.direction,
            canary_direction=[encode_tensor(u.cpu(), n)
                              for n, u in zip(names, canary.unit, strict=True)],
            canary_label=canary.label, canary_norm=canary.norm, coordinate=canary.coordinate,
            claim=_claim_pb(session.claim), threat_model=session.threat_model,
            delta=session.claim.delta, confidence=session.request.confidence,
            update_kind=session.protocol.update_kind(),
            protocol=protocol_to_pb(session.protocol, self.victim.config.num_images),
            secure_aggregation=session.secure_aggregation, canary_user=session.canary_user,
            score_sign=canary.score_sign, expected_shift=canary.expected_shift,
            threshold_rule=session.request.threshold_rule,
            threshold=session.threshold if session.threshold is not None else 0.0,
            max_trials_per_call=self._trials_per_call())
        if canary.image is not None:
            reply.canary_image.CopyFrom(encode_tensor(canary.image, "canary_image"))
        return reply

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
        return _report_pb(self.victim.submit_audit_scores(request.audit_id,
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
        if self.victim.releaser.get(request.round_id) is not None:  # KKT candidates
            return score_release(self.victim.releaser, request)
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
        score = scorer.score(request.round_id, submission)
        reply = pb.ScoreResponse()
        if score.images is not None:
            reply.images.extend(
                pb.ImageScore(index=s.index, matched_index=s.matched_index, psnr=s.psnr,
                              ssim=s.ssim, mse=s.mse, padding=s.padding,
                              exact=s.exact_index >= 0, exact_index=max(s.exact_index, 0))
                for s in score.images.images
            )
            reply.mean_psnr, reply.mean_ssim = score.images.mean_psnr, score.images.mean_ssim
            reply.mean_mse = score.images.mean_mse
            reply.exact, reply.exact_psnr = score.images.exact, EXACT_PSNR
            reply.successes, reply.success_psnr = score.images.successes, SUCCESS_PSNR
            reply.best_scored = score.images.best_psnr is not None
            reply.best_psnr = score.images.best_psnr or 0.0
        if score.fisher is not None:
            reply.fisher_note = score.fisher.note
            if score.fisher.ceilings is not None:
                reply.fisher_bounded = True
                for image in reply.images:
                    image.fisher_psnr_ceiling = score.fisher.ceilings[image.index]
                values = list(score.fisher.ceilings.values())
                reply.mean_fisher_psnr_ceiling = sum(values) / len(values)
        reply.labels_scored = score.label_accuracy is not None
        reply.label_accuracy = score.label_accuracy or 0.0
        if score.features is not None:
            reply.features_scored = True
            reply.features.extend(
                pb.FeatureScore(index=f.index, matched_index=f.matched_index, cosine=f.cosine,
                                relative_error=f.relative_error)
                for f in score.features.features
            )
            reply.mean_feature_cosine = score.features.mean_cosine
            reply.mean_feature_relative_error = score.features.mean_relative_error
        return reply

    def Release(self, request: pb.ReleaseRequest, context: grpc.ServicerContext) -> Any:
        """Server-streaming model release; see :mod:`fedleak.harness.victim.release_rpc`."""
        yield from release_stream(self.victim.releaser, request, context)

    @answer_errors
    def BeginInformedTrial(self, request: pb.BeginInformedTrialRequest,
                           context: Any) -> pb.InformedTrial:
        """A trial of the informed-adversary game (:mod:`~fedleak.harness.victim.informed_game`):
        public candidates and known records, and the update on them plus the secret target."""
        if not request.parameters:
            raise InvalidArgument("the request carries no parameters: send every parameter "
                                  "that Describe lists (the global model θ)")
        params = _decode_named(request.parameters, "parameter", self.victim.parameter_infos())
        buffers = _decode_named(request.buffers, "buffer", self.victim.buffer_infos())
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
        images, labels = self.victim.reveal(request.round_id)
        return pb.RevealResponse(images=encode_tensor(images, "images"), labels=labels.tolist())

    def _require_token(self, context: grpc.ServicerContext) -> None:
        if not self.token:
            raise Unauthenticated("this victim has no token, so token-guarded calls are off; "
                                  "start it with --token or --allow-reveal")
        self._require(context, TOKEN_METADATA_KEY, self.token, "--token")

    @staticmethod
    def _require(context: grpc.ServicerContext, key: str, token: str, flag: str) -> None:
        if not _matches(context, key, token):
            raise Unauthenticated(f"missing or wrong token: send the victim's token in the "
                                  f"{key!r} metadata entry ({flag})")


def _game_spec(victim: Victim) -> pb.InformedGameSpec | None:
    game = victim.game
    if game is None:
        return None
    return pb.InformedGameSpec(candidates=game.settings.candidates,
                               known_records=game.settings.known,
                               prior_split=game.prior_split, threat_model=THREAT_MODEL,
                               adjacency=ADJACENCY)


def _claim_pb(claim: TrialClaim) -> pb.AuditClaim:
    return pb.AuditClaim(epsilon=claim.epsilon, delta=claim.delta, mechanism=claim.mechanism,
                         accountant=claim.accountant, mu=claim.mu or 0.0)


def _report_pb(outcome: AuditOutcome) -> pb.AuditReport:
    nan = float("nan")
    return pb.AuditReport(
        audit_id=outcome.audit_id,
        bounds=[pb.AuditBound(
            estimator=b.estimator, epsilon=b.epsilon, is_estimate=b.is_estimate,
            confidence=b.confidence or 0.0, trials_in=b.trials_in, trials_out=b.trials_out,
            delta=b.delta, canary=b.canary, threat_model=b.threat_model,
            threshold_rule=b.threshold_rule,
            threshold=b.threshold if b.threshold is not None else nan,
            lower_threshold=b.lower_threshold if b.lower_threshold is not None else nan,
            fpr_upper=b.fpr_upper if b.fpr_upper is not None else nan,
            fnr_upper=b.fnr_upper if b.fnr_upper is not None else nan,
            mu=b.mu if b.mu is not None else nan, reference=b.reference)
            for b in outcome.bounds],
        claim=_claim_pb(outcome.claim), violation=outcome.violation, verdict=outcome.verdict,
        histogram=pb.AuditScoreHistogram(edges=outcome.histogram.edges,
                                         canary_in=outcome.histogram.canary_in,
                                         canary_out=outcome.histogram.canary_out),
        trials=outcome.trials, canary=outcome.canary, threat_model=outcome.threat_model)


def _info(name: str, shape: Iterable[int], dtype: torch.dtype) -> pb.TensorInfo:
    return pb.TensorInfo(name=name, shape=list(shape), dtype=dtype_to_pb(dtype))


def _decode_named(
    messages: Iterable[pb.Tensor], what: str,
    expected: list[tuple[str, tuple[int, ...], torch.dtype]],
) -> dict[str, torch.Tensor]:
    """Tensors by name, each checked against ``expected`` (name, shape, dtype) before its bytes
    are decoded; a missing, unknown or repeated name is refused with the list to send."""
    infos = {name: (shape, dtype) for name, shape, dtype in expected}
    out: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for message in messages:
        if not message.name:
            raise InvalidArgument(f"a {what} tensor has no name: name each tensor as Describe "
                                  "lists it")
        if message.name in out:
            raise InvalidArgument(f"{what} {quoted(message.name)} is sent twice")
        if message.name not in infos:
            unknown.append(message.name)
            continue
        shape, dtype = infos[message.name]
        check_declared(message, f"{what} {quoted(message.name)}", shape, floating=False,
                       wanted=f"{list(shape)}, the model's")
        if message.dtype != dtype_to_pb(dtype):
            raise InvalidArgument(f"{what} {quoted(message.name)} has dtype "
                                  f"{dtype_name(message.dtype)}, the model needs {dtype}")
        out[message.name] = decode_tensor(message, what)
    missing = [name for name in infos if name not in out]
    problem = name_mismatch(what, missing, unknown, len(infos))
    if problem:
        raise InvalidArgument(problem)
    return out


def _matches(context: grpc.ServicerContext, key: str, token: str | None) -> bool:
    """Whether the call's ``key`` metadata entry is ``token`` (constant-time comparison)."""
    if not token:
        return False
    sent = dict(context.invocation_metadata()).get(key, "")
    return hmac.compare_digest(str(sent).encode(), token.encode())


def needed_message_bytes(victim: Victim) -> int:
    """The largest request a legitimate client sends this victim: the model's parameters and
    buffers (ComputeUpdate, BeginSecAgg), a reconstruction of every user's batch in float64
    (Score), and, for a model that is released, the most KKT candidates Score takes."""
    model = sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                for _, shape, dtype in victim.parameter_infos() + victim.buffer_infos())
    pixels = math.prod(victim.info.shape)
    batch = victim.config.num_users * victim.config.num_images * pixels * 8
    released = MAX_CANDIDATES * pixels * 4 if victim.releaser.output_width == 1 else 0
    return max(model, batch, released)


#: The least message limit a victim takes by default, and gRPC's most.
MIN_MESSAGE_BYTES = 64 << 20
MAX_MESSAGE_BYTES = (2 << 30) - (1 << 20)


def default_message_bytes(victim: Victim) -> int:
    """The victim's default message limit: twice what it needs (:func:`needed_message_bytes`)
    and a MiB, at least :data:`MIN_MESSAGE_BYTES`: a larger request is refused by gRPC from its
    declared length before any of it is buffered."""
    return min(MAX_MESSAGE_BYTES, max(MIN_MESSAGE_BYTES, 2 * needed_message_bytes(victim)
                                      + (1 << 20)))


def start_server(
    victim: Victim,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    max_message_bytes: int | None = None,
    tls_cert: bytes | None = None,
    tls_key: bytes | None = None,
    workers: int = 8,
    score_token: str | None = None,
    stopping: threading.Event | None = None,
    limits: ServingLimits | None = None,
) -> tuple[Server, int]:
    """Start serving ``victim``; returns the server and the bound port (``port=0``: a free one).

    ``stopping``, once set, stops every running computation at its next local step (set it
    before stopping the server). ``workers`` threads leave room for Describe and the health
    check while the victim computes (at most 1 + ``max_queued_computations`` compute at once).
    ``limits`` caps what clients may hold (default: :class:`ServingLimits` with
    ``max_message_bytes``, itself by default :func:`default_message_bytes`).
    """
    if limits is None:
        limits = ServingLimits(max_message_bytes=max_message_bytes
                               or default_message_bytes(victim))
    credentials = server_credentials(tls_cert, tls_key)
    servicer = VictimServicer(victim, token, limits, score_token, stopping)
    return start_grpc_server(
        lambda server, pool, admission: add_service(server, servicer, SERVICE, pool, admission),
        SERVICE_NAME, host, port,
        options=[("grpc.max_send_message_length", limits.max_message_bytes)],
        credentials=credentials, workers=workers, limits=limits,
    )
