"""Scoring a round's reconstruction inside the victim: validate, spend the budget, then score.

One ``Score`` call is one :class:`Submission` for one round: images on [0, 1] (matched
one-to-one to the private batch, Hungarian on MSE, then PSNR/SSIM/MSE per image; exact
recoveries counted as the largest one-to-one matching at PSNR ≥ 40 dB, the attack's padding
slots left out), each image beside its trivial floors (:mod:`~fedleak.harness.metrics.floors`: a
flat grey image, the mean image of the victim's other private images, the image's own mean
colour; a
success needs 20 dB and the floor margin), recovered
labels (multiset overlap), recovered inputs of a linear layer (matched on cosine to the true
inputs, recomputed at the round's parameters), or several of these at once. Everything is
checked first — an invalid submission spends nothing — then the round's budget is spent
(:class:`~fedleak.harness.victim.scoring.budget.ScoreBudget`; in secure aggregation per set of
users scored against), and only then are scores computed, at report precision
(:mod:`~fedleak.harness.victim.scoring.precision`). The private images never leave.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from fedleak.defenses import DefenseChain
from fedleak.harness.metrics.floors import FloorSummary, MeanPool
from fedleak.harness.metrics.image_metrics import BatchScore, ImageScore, score_reconstruction
from fedleak.harness.metrics.image_metrics import label_accuracy as multiset_accuracy
from fedleak.harness.victim.rounds import FEATURE_ROUNDS, Round, RoundBook
from fedleak.harness.victim.scoring import precision
from fedleak.harness.victim.scoring.budget import ScoreBudget
from fedleak.harness.victim.scoring.features import (
    FeatureBatchScore,
    FeatureScore,
    FeatureScoringError,
    check_features,
    layer_inputs,
    linear_layer,
    score_features,
)
from fedleak.harness.victim.scoring.fisher import FisherAnswer, fisher_ceilings
from fedleak.harness.wire.request_errors import FailedPrecondition, InvalidArgument
from fedleak.harness.zoo.datasets import normalize
from fedleak.harness.zoo.text.text_datasets import PrivateData


@dataclass
class Submission:
    """What a server submits for one round (any of images, labels, features)."""

    images: torch.Tensor | None = None
    labels: list[int] = field(default_factory=list)
    user_ids: list[int] = field(default_factory=list)
    features: torch.Tensor | None = None
    feature_layer: str = ""
    #: indices of submitted images that are the attack's placeholders, not reconstructions
    padding: list[int] = field(default_factory=list)


@dataclass
class SubmissionScore:
    """The victim's answer, at report precision."""

    images: BatchScore | None = None
    label_accuracy: float | None = None
    features: FeatureBatchScore | None = None
    #: the Fisher-information PSNR ceiling of each scored image (by batch position), or why not
    fisher: FisherAnswer | None = None


class RoundScorer:
    """Scores submissions against the private images of the victim's remembered rounds."""

    def __init__(self, data: PrivateData, model: nn.Module, rounds: RoundBook,
                 budget: ScoreBudget, device: str = "cpu",
                 defenses: DefenseChain | None = None) -> None:
        self.data = data
        self.defenses = defenses or DefenseChain()
        self.model = model
        self.rounds = rounds
        self.budget = budget
        self.device = device
        self._pool: MeanPool | None = None

    @property
    def pool(self) -> MeanPool:
        """The private pool the floors' data-set mean guess is taken over (each scored image
        left out of its own guess)."""
        if self._pool is None:
            self._pool = MeanPool.of(self.data.images.float())
        return self._pool

    def expected_shape(self, round_id: str, user_ids: list[int]) -> tuple[int, ...]:
        """``[n, C, H, W]`` a reconstruction of this round must have (NOT_FOUND if unknown)."""
        round_ = self.rounds.get(round_id)
        return (len(self.scored_indices(round_, user_ids)), *self.data.info.shape)

    def feature_width(self, round_id: str, layer: str) -> int:
        """The input width of linear layer ``layer``: what recovered features must have."""
        self.rounds.get(round_id)
        if not layer:
            raise InvalidArgument("feature_layer is empty: name the linear layer whose input "
                                  "the features are (e.g. fc)")
        try:
            return linear_layer(self.model, layer).in_features
        except FeatureScoringError as err:
            raise InvalidArgument(str(err)) from err

    def score(self, round_id: str, submission: Submission) -> SubmissionScore:
        """Validate ``submission``, spend one of the round's budget, and score it."""
        round_ = self.rounds.get(round_id)
        indices = self.scored_indices(round_, submission.user_ids)
        truth, true_labels = self.data.images[indices], self.data.labels[indices]
        images = submission.images
        if images is None and submission.features is None and not submission.labels:
            raise InvalidArgument("no images: submit the reconstruction as a [n, C, H, W] tensor "
                                  "(or recovered layer inputs as features with feature_layer, "
                                  "or recovered labels alone)")
        if images is not None:
            self._check_images(images, tuple(truth.shape))
            self._check_padding(submission.padding, images.shape[0])
        elif submission.padding:
            raise InvalidArgument("padding indices were sent without images: mark padding "
                                  "slots of a submitted reconstruction")
        labels = submission.labels
        if labels:
            self._check_labels(labels, len(true_labels))
        feature_truth = None
        if submission.features is not None:
            feature_truth = self._feature_truth(round_, submission.feature_layer)
            try:
                check_features(submission.features, feature_truth.shape[1])
            except FeatureScoringError as err:
                raise InvalidArgument(str(err)) from err
        # no user ids on a secure-aggregation round scores every user: the same target
        users = tuple(sorted(set(submission.user_ids) or round_.user_indices))
        what = f"round {round_id[:16]}" + (f" (users {list(users)})" if users else "")
        self.budget.spend(("round", round_id, users), what, indices.tolist())
        answer = SubmissionScore()
        if images is not None:
            scored = score_reconstruction(images.float().clamp(0, 1), truth,
                                          predicted_labels=labels or None,
                                          true_labels=true_labels,
                                          padding=submission.padding,
                                          pool=self.pool)
            answer.images = _reported_images(scored)
            answer.label_accuracy = scored.label_accuracy
            if not round_.user_indices:  # one user's round: its own mechanism
                answer.fisher = fisher_ceilings(self.model, self.defenses, round_,
                                                truth.to(self.device),
                                                true_labels.to(self.device), self.data.info)
        elif labels:
            answer.label_accuracy = multiset_accuracy(labels, true_labels)
        if submission.features is not None and feature_truth is not None:
            scored_features = score_features(submission.features.to(feature_truth.device),
                                             feature_truth)
            answer.features = _reported_features(scored_features)
        return answer

    def scored_indices(self, round_: Round, user_ids: list[int]) -> torch.Tensor:
        """Pool indices of the images scored: the round's, or those of ``user_ids``."""
        if not user_ids:
            return round_.indices
        if not round_.user_indices:
            raise InvalidArgument("user_ids only apply to secure-aggregation rounds")
        unknown = sorted(set(user_ids) - set(round_.user_indices))
        if unknown:
            raise InvalidArgument(f"no users {unknown[:8]} in this round; users are "
                                  f"{sorted(round_.user_indices)}")
        return torch.cat([round_.user_indices[u] for u in sorted(set(user_ids))])

    def _check_images(self, images: torch.Tensor, shape: tuple[int, ...]) -> None:
        if tuple(images.shape) != shape:
            raise InvalidArgument(f"reconstruction has shape {list(images.shape)}; this round "
                                  f"had {list(shape)} (n, C, H, W) on [0, 1]")
        if not images.is_floating_point():
            raise InvalidArgument(f"reconstruction dtype {images.dtype} must be floating point")
        if not torch.isfinite(images).all():
            raise InvalidArgument("reconstruction contains NaN or infinite values")

    def _check_padding(self, padding: list[int], count: int) -> None:
        bad = sorted({j for j in padding if not 0 <= j < count})
        if bad:
            raise InvalidArgument(f"padding indices {bad[:8]} lie outside the {count} submitted "
                                  f"images (0 to {count - 1})")
        if len(set(padding)) != len(padding):
            raise InvalidArgument("padding lists an index twice: list each placeholder slot once")

    def _check_labels(self, labels: list[int], count: int) -> None:
        if len(labels) != count:
            raise InvalidArgument(f"{len(labels)} labels submitted for {count} images")
        classes = self.data.info.num_classes
        if any(not 0 <= y < classes for y in labels):
            raise InvalidArgument(f"labels must lie in [0, {classes})")

    def _feature_truth(self, round_: Round, layer: str) -> torch.Tensor:
        """The true inputs of ``layer`` for the round's batch at the round's parameters."""
        if round_.parameters is None or round_.buffers is None:
            raise FailedPrecondition(
                f"features can be scored only for the latest non-secure-aggregation rounds "
                f"(up to {FEATURE_ROUNDS}, {self.rounds.feature_bytes >> 20} MiB of parameters, "
                "--feature-memory-mb); score right after ComputeUpdate"
            )
        if not layer:
            raise InvalidArgument("feature_layer is empty: name the linear layer whose input "
                                  "the features are (e.g. fc)")
        images = normalize(self.data.images[round_.indices], self.data.info).to(self.device)
        try:
            return layer_inputs(self.model, round_.parameters, round_.buffers, images, layer)
        except FeatureScoringError as err:
            raise InvalidArgument(str(err)) from err


def _reported_images(score: BatchScore) -> BatchScore:
    return BatchScore(
        [ImageScore(s.index, s.matched_index, precision.psnr(s.psnr), precision.unit(s.ssim),
                    precision.significant(s.mse), s.padding, s.exact_index,
                    None if s.floor_psnr is None else precision.psnr(s.floor_psnr),
                    None if s.floor_ssim is None else precision.unit(s.floor_ssim),
                    s.floor_guess)
         for s in score.images],
        precision.psnr(score.mean_psnr), precision.unit(score.mean_ssim),
        precision.significant(score.mean_mse), score.label_accuracy, score.exact,
        None if score.best_psnr is None else precision.psnr(score.best_psnr), score.successes,
        _reported_floors(score.floors),
    )


def _reported_floors(floors: FloorSummary | None) -> FloorSummary | None:
    if floors is None:
        return None
    return FloorSummary(
        {g: (precision.psnr(p), precision.unit(q)) for g, (p, q) in floors.guesses.items()},
        precision.psnr(floors.mean_psnr), precision.unit(floors.mean_ssim),
        precision.psnr(floors.mean_margin), floors.above, floors.images, floors.margin_db)


def _reported_features(score: FeatureBatchScore) -> FeatureBatchScore:
    return FeatureBatchScore(
        [FeatureScore(f.index, f.matched_index, precision.unit(f.cosine),
                      precision.significant(f.relative_error)) for f in score.features],
        precision.unit(score.mean_cosine), precision.significant(score.mean_relative_error),
    )
