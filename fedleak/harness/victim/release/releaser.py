"""The victim's side of a model release (Haim et al. 2022): train, publish θ, score candidates.

Threat model: instead of sharing updates, the user trains its binary classifier Φ(θ; ·) to
convergence on a private training set and publishes θ. The server (attacker) may ask for the
training hyperparameters within the victim's budget; the victim owns everything else.

- **Training set**: n samples of the private pool, balanced over the data set's binary task
  (:mod:`fedleak.harness.zoo.binary_tasks`, labels y ∈ {±1}), drawn once with the victim's seed,
  so every release trains on the same set; n = ``ReleaseSettings.size`` (0: the whole pool).
- **Training**: a copy of the victim's seeded model (``kkt-mlp``: one logit) trained by
  :func:`fedleak.harness.release_training.train_release` (full-batch GD on the mean logistic
  loss until a target loss or an epoch budget), inputs mapped [0, 1] → [−1, 1].
- **Defense**: a per-example link in the victim's chain that declares a Gaussian mechanism
  (``dpsgd``, or a plug-in declaring the same; read from the declaration, never the class)
  makes training differentially private (per-sample clipping C, noise σ·C, full batch, RDP
  accounting of ε at δ); the chain is public
  through ``Describe``. Update-level and transport defenses have no meaning for a release and
  are refused rather than silently skipped.
- **Scoring** (``Score`` with the release id): App. B.3's nearest neighbours by NCC and voting
  (:func:`fedleak.harness.kkt_scoring.vote_reconstructions`), SSIM per training sample, and the
  sample's margin y_i Φ(θ; x_i) under the released model (Fig. 4), and each sample beside its
  trivial floors (:func:`fedleak.harness.metrics.kkt_metrics.release_floors`: grey, the private
  pool's mean without the sample, its own mean colour). Ground truth stays here.

Training reports progress through a callback and stops when ``stop`` is set (the client
cancelled); one release trains at a time.
"""

from __future__ import annotations

import copy
import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from fedleak.defenses import DefenseChain
from fedleak.defenses.mechanism import POISSON, TOTAL, Mechanism
from fedleak.harness.federated.release_training import (
    ReleaseTrainingConfig,
    ReleaseTrainingResult,
    to_model_input,
    train_release,
)
from fedleak.harness.metrics.floors import MeanPool
from fedleak.harness.metrics.kkt_metrics import (
    RECOVERED_SSIM,
    ReleaseFloors,
    VotedMatch,
    release_floors,
    vote_reconstructions,
)
from fedleak.harness.victim.limits import VictimLimits
from fedleak.harness.victim.scoring.budget import ScoreBudget
from fedleak.harness.wire.request_errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    quoted,
)
from fedleak.harness.zoo.binary_tasks import TASKS, balanced_subset, binary_task
from fedleak.harness.zoo.text.text_datasets import PrivateData

#: Releases the victim keeps for Score and Reveal (each holds a trained model).
MAX_REMEMBERED_RELEASES = 8
#: Most candidates one Score call may submit.
MAX_CANDIDATES = 200_000


def output_width(model: nn.Module, input_shape: tuple[int, ...], device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> int:
    """How many outputs ``model`` gives per input of ``input_shape`` (C, H, W; text: (T,) of
    ``dtype`` int64, token ids).

    One forward pass in evaluation mode, the mode restored after: in training mode the pass
    would update BatchNorm's running statistics, which are part of the public global model.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(torch.zeros((1, *input_shape), device=device, dtype=dtype)).numel()
    finally:
        model.train(was_training)


class ReleaseCancelled(Exception):
    """The client cancelled the Release call; training stopped."""


@dataclass(frozen=True)
class ReleaseSettings:
    """The victim's release defaults; ``max_epochs`` is also the most a server may ask for."""

    size: int = 0
    seed: int = 0
    lr: float = 0.5
    max_epochs: int = 20_000
    target_loss: float = 1e-5
    report_every: int = 100

    def __post_init__(self) -> None:
        if self.size < 0 or self.size == 1:
            raise ValueError(f"--release-size must be 0 (whole pool) or >= 2, got {self.size}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--release-lr must be positive, got {self.lr}")
        if self.max_epochs < 1 or self.report_every < 1:
            raise ValueError("--release-epochs and the report interval must be >= 1")
        if not (self.target_loss >= 0 and math.isfinite(self.target_loss)):
            raise ValueError(f"--release-target-loss must be >= 0, got {self.target_loss}")


@dataclass
class ReleaseRecord:
    """One release: its id, the training set (pool indices, y), the trained model, the result."""

    release_id: str
    indices: Tensor
    labels: Tensor
    model: nn.Module
    result: ReleaseTrainingResult
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class ReleaseScore:
    """Per training sample scores (App. B.3), the model's margins y_i Φ(θ; x_i) and the
    samples' trivial floors."""

    match: VotedMatch
    margins: Tensor
    threshold: float
    floors: ReleaseFloors

    @property
    def recovered(self) -> int:
        return self.match.recovered(self.threshold)


class ModelReleaser:
    """Trains and releases the victim's model on its private training set; scores candidates."""

    def __init__(
        self,
        data: PrivateData,
        model: nn.Module,
        defenses: DefenseChain,
        settings: ReleaseSettings,
        *,
        limits: VictimLimits | None = None,
        budget: ScoreBudget | None = None,
        device: str = "cpu",
    ) -> None:
        self.data = data
        self.initial_model = model  # the victim's seeded init; only ever copied
        self.defenses = defenses
        self.settings = settings
        self.seed = settings.seed
        self.limits = limits or VictimLimits()
        self.budget = budget or ScoreBudget(self.limits.score_budget,
                                            self.limits.image_score_budget)
        self.device = device
        self._releases: OrderedDict[str, ReleaseRecord] = OrderedDict()
        self._lock = threading.Lock()
        self._training = threading.Lock()
        self._training_set: tuple[Tensor, Tensor] | None = None
        self._pool: MeanPool | None = None
        #: Outputs of the model per input, probed once here: a probe while serving would race
        #: with local training for the model's train/eval mode.
        self.output_width = output_width(model, tuple(data.info.shape), device,
                                         data.images.dtype)
        #: Bytes one remembered release holds (its model's parameters and buffers).
        self.model_bytes = sum(t.numel() * t.element_size()
                               for t in (*model.parameters(), *model.buffers()))

    # -- what may be released ---------------------------------------------------------------

    def task(self) -> str:
        """What y = ±1 mean for this data set; FAILED_PRECONDITION when it has no binary task."""
        name = self.data.info.name
        if name not in TASKS:
            raise FailedPrecondition(f"data set {name!r} has no binary task for a release; "
                                     f"start the victim on one of {', '.join(TASKS)}")
        return TASKS[name]

    def check_releasable(self) -> None:
        """FAILED_PRECONDITION unless the data set has a binary task, the model one output and
        the defense chain only DP training."""
        self.task()
        self._check_model()
        self._dp()
        self.training_set()

    def _check_model(self) -> None:
        if self.output_width != 1:
            raise FailedPrecondition(
                f"Release trains a binary classifier with one output, but this victim's model "
                f"gives {self.output_width}; start the victim with --model kkt-mlp"
            )

    def _dp(self) -> Mechanism | None:
        """The declared per-example mechanism a DP release trains with (None: no DP)."""
        chain = self.defenses
        if chain.update or chain.transport is not None:
            names = [d.name for d in chain.defenses]
            raise FailedPrecondition(
                f"a release can only be defended by a per-example mechanism (DP training, such "
                f"as dpsgd); this victim's chain is {names}: drop the update and transport "
                "defenses"
            )
        if chain.per_example is None:
            return None
        declared = chain.per_example_mechanism
        name = chain.per_example.name
        if declared is None or not declared.gaussian or declared.clip is None:
            raise FailedPrecondition(f"release training needs a per-example Gaussian "
                                     f"mechanism; {name} declares none")
        if declared.clip.geometry != TOTAL or declared.sampling.kind == POISSON \
                or (declared.accountant or "rdp") != "rdp":
            raise FailedPrecondition(
                f"DP release training clips flat, uses the full batch and the RDP accountant; "
                f"{name} declares {declared.words()} (accountant "
                f"{declared.accountant or 'rdp'}): start the victim with e.g. "
                "dpsgd:clipping=flat,poisson=false,accountant=rdp"
            )
        return declared

    def training_set(self) -> tuple[Tensor, Tensor]:
        """Pool indices and labels y ∈ {±1} of the release's training set (fixed per victim)."""
        self.task()
        if self._training_set is None:
            labels = self.data.labels
            if self.settings.size:
                try:
                    self._training_set = balanced_subset(labels, self.data.info.name,
                                                         self.settings.size, seed=self.seed)
                except ValueError as err:
                    raise FailedPrecondition(f"--release-size {self.settings.size}: {err}; "
                                             "lower it or give the victim more --images") from err
            else:
                indices = torch.arange(len(labels))
                self._training_set = indices, binary_task(self.data.info.name)(labels)
        return self._training_set

    def training_config(
        self, lr: float = 0.0, max_epochs: int = 0, target_loss: float = 0.0,
        report_every: int = 0,
    ) -> ReleaseTrainingConfig:
        """The victim's defaults, overridden by the server's non-zero choices (validated)."""
        s = self.settings
        for name, value in (("learning_rate", lr), ("target_loss", target_loss)):
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"{name} must be a finite number >= 0 (0: the victim's "
                                      f"default), got {value}")
        self.limits.check_learning_rate(lr, "learning_rate", source="the server's release request")
        if max_epochs < 0 or max_epochs > s.max_epochs:
            raise InvalidArgument(f"max_epochs must lie in [0, {s.max_epochs}] (0: the victim's "
                                  f"default, the cap is its --release-epochs), got {max_epochs}")
        if report_every < 0:
            raise InvalidArgument(f"report_every must be >= 0, got {report_every}")
        dp = self._dp()
        extra = {}
        if dp is not None:
            extra = {"dp_noise_multiplier": dp.noise_multiplier,
                     "dp_max_grad_norm": dp.clip.norm if dp.clip else 0.0,
                     "dp_delta": dp.delta}
        return ReleaseTrainingConfig(
            lr=lr or s.lr, max_epochs=max_epochs or s.max_epochs,
            target_loss=target_loss or s.target_loss,
            report_every=report_every or s.report_every, **extra,
        )

    # -- Release ------------------------------------------------------------------------------

    def release(
        self,
        config: ReleaseTrainingConfig,
        on_epoch: Callable[[int, float, float], None] | None = None,
        stop: threading.Event | None = None,
    ) -> ReleaseRecord:
        """Train a fresh copy of the seeded model on the training set and remember it."""
        self._check_model()
        indices, y = self.training_set()
        budget = self.limits.release_memory_mb << 20
        if self.model_bytes > budget:
            raise ResourceExhausted(
                f"a released model of this victim holds {self.model_bytes >> 20} MiB, more than "
                f"the {self.limits.release_memory_mb} MiB it keeps for releases "
                "(--release-memory-mb); raise it or use a smaller model")
        if not self._training.acquire(blocking=False):
            raise FailedPrecondition("a release is already training on this victim; wait for it "
                                     "or cancel it")
        try:
            model = copy.deepcopy(self.initial_model).to(self.device)
            inputs = to_model_input(self.data.images[indices]).to(self.device)

            def report(epoch: int, loss: float, accuracy: float) -> None:
                if stop is not None and stop.is_set():
                    raise ReleaseCancelled(f"cancelled at epoch {epoch}")
                if on_epoch is not None:
                    on_epoch(epoch, loss, accuracy)

            result = train_release(model, inputs, y.to(self.device), config, seed=self.seed,
                                   on_epoch=report)
        finally:
            self._training.release()
        if not math.isfinite(result.loss):
            raise FailedPrecondition(f"training diverged (loss {result.loss}); ask for a smaller "
                                     "learning_rate")
        metadata = {"dp": str(config.dp).lower(), "lr": repr(config.lr),
                    "target_loss": repr(config.target_loss),
                    "max_epochs": str(config.max_epochs)}
        if config.dp:
            metadata.update(epsilon=f"{result.epsilon:.6g}", delta=repr(result.delta),
                            noise_multiplier=repr(config.dp_noise_multiplier),
                            max_grad_norm=repr(config.dp_max_grad_norm))
        record = ReleaseRecord(uuid.uuid4().hex, indices, y, model.cpu().eval(), result, metadata)
        with self._lock:
            self._releases[record.release_id] = record
            while len(self._releases) > 1 and (
                    len(self._releases) > MAX_REMEMBERED_RELEASES
                    or len(self._releases) * self.model_bytes > budget):
                self._releases.popitem(last=False)
        return record

    def get(self, release_id: str) -> ReleaseRecord | None:
        with self._lock:
            return self._releases.get(release_id)

    def _record(self, release_id: str) -> ReleaseRecord:
        record = self.get(release_id)
        if record is None:
            raise NotFound(f"unknown release id {quoted(release_id)}: use the release_id that "
                           f"Release returned (the victim keeps the last "
                           f"{MAX_REMEMBERED_RELEASES}, within --release-memory-mb)")
        return record

    # -- Score and Reveal ------------------------------------------------------------------------

    def score(self, release_id: str, candidates01: Tensor, threshold: float = 0.0) -> ReleaseScore:
        """Match candidates (on [0, 1]) to the training set by App. B.3; margins of the model."""
        record = self._record(release_id)
        shape = tuple(self.data.info.shape)
        if candidates01.dim() != 4 or tuple(candidates01.shape[1:]) != shape:
            raise InvalidArgument(f"candidates have shape {list(candidates01.shape)}; submit "
                                  f"[M, {', '.join(map(str, shape))}] on [0, 1]")
        if not candidates01.is_floating_point() or not len(candidates01):
            raise InvalidArgument("submit at least one floating-point candidate")
        if len(candidates01) > MAX_CANDIDATES:
            raise InvalidArgument(f"{len(candidates01)} candidates; submit at most "
                                  f"{MAX_CANDIDATES} (post-process them first)")
        if not bool(torch.isfinite(candidates01).all()):
            raise InvalidArgument("candidates contain NaN or infinite values")
        low, high = float(candidates01.min()), float(candidates01.max())
        if low < -1e-6 or high > 1 + 1e-6:
            raise InvalidArgument(f"candidates span [{low:.3g}, {high:.3g}]; scale each to [0, 1] "
                                  "first (App. B.3 step 1, kkt_postprocess.scale_to_unit)")
        if not (math.isfinite(threshold) and -1 <= threshold <= 1):
            raise InvalidArgument(f"recovered_ssim must lie in [-1, 1] (0: {RECOVERED_SSIM}), "
                                  f"got {threshold}")
        self.budget.spend(("release", release_id), f"release {release_id[:16]}",
                          record.indices.tolist())
        train01 = self.data.images[record.indices]
        match = vote_reconstructions(candidates01.float().clamp(0, 1), train01)
        with torch.no_grad():
            outputs = record.model(to_model_input(train01)).reshape(-1)
        threshold = threshold or RECOVERED_SSIM
        floors = release_floors(match, train01, self.pool, threshold=threshold)
        return ReleaseScore(match, outputs * record.labels, threshold, floors)

    @property
    def pool(self) -> MeanPool:
        """The private pool the floors' data-set mean guess is taken over (each training sample
        left out of its own guess), as the round scorer takes it."""
        if self._pool is None:
            self._pool = MeanPool.of(self.data.images.float())
        return self._pool

    def reveal(self, release_id: str) -> tuple[Tensor, Tensor]:
        """The training set on [0, 1] and its class labels (the caller checks the token)."""
        record = self._record(release_id)
        return self.data.images[record.indices], self.data.labels[record.indices]

