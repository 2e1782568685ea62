"""The victim's side of the ``fedleak.v1`` messages: what :class:`~fedleak.harness.victim.
victim_servicer.VictimServicer` decodes (named tensors, checked against the model before their
bytes are read; tokens in call metadata) and the answers it builds (scores, audits, the
informed game's description).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import grpc
import torch

from fedleak.auditing import DeclarationTest
from fedleak.harness.metrics.floors import FloorSummary
from fedleak.harness.metrics.image_metrics import EXACT_PSNR, SUCCESS_PSNR
from fedleak.harness.victim.audit.claim import TrialClaim
from fedleak.harness.victim.audit.informed_game import ADJACENCY, THREAT_MODEL
from fedleak.harness.victim.audit.plan import covered_groups
from fedleak.harness.victim.audit.sessions import AuditOutcome, AuditSession
from fedleak.harness.victim.federated_victim import Victim
from fedleak.harness.victim.scoring.round import SubmissionScore
from fedleak.harness.wire.codec import (
    check_declared,
    decode_tensor,
    dtype_name,
    dtype_to_pb,
    encode_tensor,
)
from fedleak.harness.wire.protocol_spec import protocol_to_pb
from fedleak.harness.wire.quoting import name_mismatch
from fedleak.harness.wire.request_errors import InvalidArgument, quoted
from fedleak.v1 import victim_pb2 as pb


def score_response(score: SubmissionScore) -> pb.ScoreResponse:
    """A round's scores as the ``Score`` answer: per image and mean, exact and successful
    counts, the Fisher ceilings, label accuracy and feature scores, where each was scored."""
    reply = pb.ScoreResponse()
    if score.images is not None:
        reply.images.extend(
            pb.ImageScore(index=s.index, matched_index=s.matched_index, psnr=s.psnr,
                          ssim=s.ssim, mse=s.mse, padding=s.padding,
                          exact=s.exact_index >= 0, exact_index=max(s.exact_index, 0),
                          floor_psnr=s.floor_psnr or 0.0, floor_ssim=s.floor_ssim or 0.0,
                          floor_guess=s.floor_guess)
            for s in score.images.images
        )
        floors_pb(reply, score.images.floors)
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


def floors_pb(reply: pb.ScoreResponse, floors: FloorSummary | None) -> None:
    """The batch's trivial floors into a ``Score`` answer (``floors_scored``)."""
    if floors is None:
        return
    reply.floors_scored = True
    reply.floors.extend(pb.FloorScore(guess=g, mean_psnr=p, mean_ssim=q)
                        for g, (p, q) in floors.guesses.items())
    reply.mean_floor_psnr, reply.mean_floor_ssim = floors.mean_psnr, floors.mean_ssim
    reply.mean_floor_margin, reply.above_floor = floors.mean_margin, floors.above
    reply.floor_margin_db = floors.margin_db


def begin_audit_response(session: AuditSession, names: list[str], num_images: int,
                         max_trials_per_call: int) -> pb.BeginAuditResponse:
    """The ``BeginAudit`` answer: the public canary, the claim, the threat model and the
    rules the server plays by (``names``: the model's parameter names, in order)."""
    canary = session.canary
    request = session.request
    reply = pb.BeginAuditResponse(
        audit_id=session.audit_id, trials=session.trials, canary=canary.kind,
        direction=canary.direction,
        canary_direction=[encode_tensor(u.cpu(), n)
                          for n, u in zip(names, canary.unit, strict=True)],
        canary_label=canary.label, canary_norm=canary.norm, coordinate=canary.coordinate,
        claim=claim_pb(session.claim), threat_model=session.threat_model,
        delta=session.claim.delta, confidence=session.request.confidence,
        update_kind=session.protocol.update_kind(),
        protocol=protocol_to_pb(session.protocol, num_images),
        secure_aggregation=session.secagg, canary_user=session.canary_user,
        score_sign=canary.score_sign, expected_shift=canary.expected_shift,
        threshold_rule=session.request.threshold_rule,
        threshold=session.threshold if session.threshold is not None else 0.0,
        max_trials_per_call=max_trials_per_call, coverage=covered_groups(session.coverage),
        canaries=len(session.coverage.canaries) if session.coverage is not None else 1,
        false_alarm=request.false_alarm, power=request.power,
        detect_shortfall=request.detect_shortfall)
    if canary.image is not None:
        reply.canary_image.CopyFrom(encode_tensor(canary.image, "canary_image"))
    return reply


def game_spec(victim: Victim) -> pb.InformedGameSpec | None:
    game = victim.game
    if game is None:
        return None
    return pb.InformedGameSpec(candidates=game.settings.candidates,
                               known_records=game.settings.known,
                               prior_split=game.prior_split, threat_model=THREAT_MODEL,
                               adjacency=ADJACENCY)


def claim_pb(claim: TrialClaim) -> pb.AuditClaim:
    return pb.AuditClaim(epsilon=claim.epsilon, delta=claim.delta, mechanism=claim.mechanism,
                         accountant=claim.accountant, mu=claim.mu or 0.0,
                         reported_epsilon=claim.reported_epsilon or 0.0)


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def audit_test_pb(test: DeclarationTest) -> pb.AuditTest:
    return pb.AuditTest(
        test=test.test, group=test.group, p_value=test.p_value, rejected=test.rejected,
        statement=test.statement, samples_in=test.samples_in, samples_out=test.samples_out,
        ratio=_or_nan(test.ratio), ratio_lower=_or_nan(test.ratio_lower),
        detectable_noise=_or_nan(test.detectable_noise), power=_or_nan(test.power),
        epsilon_lb=_or_nan(test.epsilon_lb), level=_or_nan(test.level))


def audit_report_pb(outcome: AuditOutcome) -> pb.AuditReport:
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
            mu=b.mu if b.mu is not None else nan, reference=b.reference, group=b.group,
            interval_low=_or_nan(b.interval_low), interval_high=_or_nan(b.interval_high),
            interval_level=_or_nan(b.interval_level), note=b.note)
            for b in outcome.bounds],
        claim=claim_pb(outcome.claim), violation=outcome.violation, verdict=outcome.verdict,
        histogram=pb.AuditScoreHistogram(edges=outcome.histogram.edges,
                                         canary_in=outcome.histogram.canary_in,
                                         canary_out=outcome.histogram.canary_out),
        trials=outcome.trials, canary=outcome.canary, threat_model=outcome.threat_model,
        tests=[audit_test_pb(t) for t in outcome.tests],
        power_statement=outcome.power_statement,
        detectable_noise=_or_nan(outcome.detectable_noise), false_alarm=outcome.false_alarm,
        coverage=outcome.coverage)


def tensor_info(name: str, shape: Iterable[int], dtype: torch.dtype) -> pb.TensorInfo:
    return pb.TensorInfo(name=name, shape=list(shape), dtype=dtype_to_pb(dtype))


def decode_named(
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


def token_matches(context: grpc.ServicerContext, key: str, token: str | None) -> bool:
    """Whether the call's ``key`` metadata entry is ``token`` (constant-time comparison)."""
    if not token:
        return False
    sent = dict(context.invocation_metadata()).get(key, "")
    return hmac.compare_digest(str(sent).encode(), token.encode())
