"""The informed-adversary game, played by the victim (Balle et al. 2022; Hayes et al. 2023).

Per trial the victim draws N candidates and m known records from the *public prior* — the
data set's other split (``test`` when the private pool is ``train``, and the reverse), never
its private pool — flips its secret coin to pick the target among the candidates, runs its
local update and defense chain on the known records followed by the target, and sends the
server the candidates, the known records and the update. The coin stays here: a trial keeps
the target's position, and :meth:`InformedGame.score` compares the server's one final guess
with it. κ = 1/N is the prior's baseline (a blind guess's success).

The game's reference for its bound is the same mechanism without the target (add/remove
adjacency: :mod:`fedleak.auditing.reconstruction.bounds`).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import torch

from fedleak.harness.wire.request_errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    quoted,
)
from fedleak.harness.zoo.datasets import ImageDataset

#: The trials a victim remembers (a guess for an older one is refused).
MAX_TRIALS = 4096
ADJACENCY = "add-remove"
THREAT_MODEL = (
    "informed adversary (Balle, Cherubin & Hayes 2022): the server knows the N public "
    "candidates (one is the target, chosen by the victim's secret coin), every other record of "
    "the user's batch (the known records, public, in the batch before the target), the global "
    "parameters and the published mechanism (protocol and defense chain); it does not know "
    "which candidate is the target, nor the defense's noise")


def prior_split(private_split: str) -> str:
    """The public split the game draws from: the one the private pool did not come from."""
    if private_split == "train":
        return "test"
    if private_split == "test":
        return "train"
    raise ValueError(f"the informed-adversary game draws its public candidates from the split "
                     f"the private pool did not use; with --split {private_split} there is none: "
                     "start the victim with --split train (candidates from test) or test")


@dataclass(frozen=True)
class GameSettings:
    """N candidates per trial (κ = 1/N) and m known records; 0 candidates: no game."""

    candidates: int = 0
    known: int = 0

    def __post_init__(self) -> None:
        if self.candidates < 0 or self.known < 0:
            raise ValueError("informed-game candidates and known records must be >= 0")
        if self.candidates == 1:
            raise ValueError("the informed-adversary game needs at least 2 candidates "
                             "(κ = 1/N < 1)")
        if self.known and not self.candidates:
            raise ValueError("--informed-known needs --informed-candidates N (N >= 2)")

    @property
    def enabled(self) -> bool:
        return self.candidates > 0


@dataclass
class TrialDraw:
    """One trial's public records and its secret target."""

    trial_id: str
    candidates: torch.Tensor        # [N, C, H, W] on [0, 1]
    candidate_labels: torch.Tensor
    known: torch.Tensor             # [m, C, H, W] on [0, 1]
    known_labels: torch.Tensor
    target: int                     # secret: the position among the candidates
    guessed: bool = False


@dataclass(frozen=True)
class Outcome:
    success: bool
    trials_scored: int
    successes: int


class InformedGame:
    """Draws trials from the public prior with the victim's coins and scores final guesses."""

    def __init__(self, prior: ImageDataset, settings: GameSettings,
                 coins: torch.Generator, split: str = "test") -> None:
        needed = settings.candidates + settings.known
        if needed > len(prior.labels):
            raise ValueError(f"the game needs {settings.candidates} candidates + "
                             f"{settings.known} known records from the public prior, which has "
                             f"{len(prior.labels)} images; use fewer")
        self.prior = prior
        self.prior_split = split
        self.settings = settings
        self._coins = coins
        self._trials: OrderedDict[str, TrialDraw] = OrderedDict()
        self._lock = threading.Lock()
        self.trials_scored = 0
        self.successes = 0

    def draw(self) -> TrialDraw:
        """A fresh trial: N + m distinct prior images, the target picked by the coin."""
        s = self.settings
        with self._lock:
            order = torch.randperm(len(self.prior.labels), generator=self._coins)
            target = int(torch.randint(s.candidates, (1,), generator=self._coins))
        chosen, known = order[:s.candidates], order[s.candidates:s.candidates + s.known]
        draw = TrialDraw(uuid.uuid4().hex, self.prior.images[chosen],
                         self.prior.labels[chosen], self.prior.images[known],
                         self.prior.labels[known], target)
        with self._lock:
            self._trials[draw.trial_id] = draw
            while len(self._trials) > MAX_TRIALS:
                self._trials.popitem(last=False)
        return draw

    def batch(self, draw: TrialDraw) -> tuple[torch.Tensor, torch.Tensor]:
        """The user's batch of the trial on [0, 1]: the known records, then the target."""
        images = torch.cat([draw.known, draw.candidates[draw.target:draw.target + 1]])
        labels = torch.cat([draw.known_labels,
                            draw.candidate_labels[draw.target:draw.target + 1]])
        return images, labels

    def forget(self, trial_id: str) -> None:
        """Drop a trial whose update was never sent (training failed)."""
        with self._lock:
            self._trials.pop(trial_id, None)

    def score(self, trial_id: str, candidate: int) -> Outcome:
        """The verdict on the server's final guess for ``trial_id``."""
        with self._lock:
            draw = self._trials.get(trial_id)
            if draw is None:
                raise NotFound(f"unknown trial id {quoted(trial_id)}: guess for a trial_id "
                               f"BeginInformedTrial returned (the last {MAX_TRIALS} are kept)")
            if not 0 <= candidate < len(draw.candidate_labels):
                raise InvalidArgument(f"candidate {candidate} is not a position among the "
                                      f"trial's {len(draw.candidate_labels)} candidates")
            if draw.guessed:
                raise FailedPrecondition(f"trial {trial_id[:16]} was already guessed: a guess "
                                         "is final (begin another trial)")
            draw.guessed = True
            success = candidate == draw.target
            self.trials_scored += 1
            self.successes += int(success)
            return Outcome(success, self.trials_scored, self.successes)
